"""``python -m nmt``: the toolkit's commands, one line each, and how to start (nothing runs from here).

Each command is its own module, ``python -m nmt.X``, with ``--help``. This page only lists them, so a first
``python -m nmt`` (or ``python -m nmt --help``) answers with them instead of Python's "cannot be directly
executed"; anything else given to it is refused in one line that names the command to run instead.
"""

from __future__ import annotations

import sys

from nmt.cli import COMMANDS

# The commands with no Hydra config (argparse), so not in nmt.cli.COMMANDS: (module, one line).
OTHERS = (
    ("nmt.report", "Compare the jobs of a sweep: a table of BLEU, chrF and attention statistics, and heatmaps."),
    ("nmt.data.fetch", "Fetch the default corpus (English-Spanish Tatoeba) into data/spa-eng."),
)


def first_sentence(text: str) -> str:
    """``text`` up to its first colon, full stop or parenthesis: a command's purpose in one line."""
    cut = min((i for i in (text.find(": "), text.find(". "), text.find(" (")) if i > 0), default=len(text))
    return text[:cut].rstrip(".") + "."


def overview() -> str:
    rows = [(c.module, first_sentence(c.purpose)) for c in COMMANDS.values()] + list(OTHERS)
    width = max(len(m) for m, _ in rows) + len("python -m ") + 2
    lines = ["nmt: attention-based RNN translation models. The commands (each with --help):", ""]
    lines += [f"  {('python -m ' + m).ljust(width)}{what}" for m, what in rows]
    lines += [
        "",
        "Start (README's quick start): python -m nmt.train experiment=smoke, a tiny model through the whole pipeline",
        "in about a minute on 2 cores; then python -m nmt.train experiment=cpu_small, the 30-minute CPU preset.",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv and argv[0] not in ("-h", "--help"):
        name = argv[0].removeprefix("nmt.")
        known = [c.name for c in COMMANDS.values()] + [m.removeprefix("nmt.") for m, _ in OTHERS]
        hint = f"python -m nmt.{name} {' '.join(argv[1:])}".rstrip() if name in known else "python -m nmt.train --help"
        print(f"python -m nmt runs nothing itself; each command is a module of its own: {hint}", file=sys.stderr)
        return 2
    print(overview())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
