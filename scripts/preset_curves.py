"""Validation BLEU against training minutes for finished runs, one line each (issue 14's plot of the presets).

    python scripts/preset_curves.py runs/cpu_small=cpu_small runs/cpu_best=cpu_best --plot docs/preset_curves.png

docs/preset_runs/ keeps the ``metrics.jsonl`` of the runs behind docs/preset_curves.png, so the plot redraws without
training: ``python scripts/preset_curves.py docs/preset_runs/cpu_small=cpu_small docs/preset_runs/cpu_best=cpu_best
--plot docs/preset_curves.png``.

Reads each run directory's ``metrics.jsonl`` (the validation records ``nmt.train`` writes: ``elapsed_s``,
training time from the first step with validations included, and ``bleu``, greedy on the run's first
``data.valid_max_sentences`` valid lines) and draws BLEU against minutes. Prints the points as a table too.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nmt.plots import curves


def validations(run: Path) -> list[tuple[float, float]]:
    """(minutes of training, validation BLEU) of every validation record in ``run``/metrics.jsonl, in order."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"{path}: not found (expected a run directory of nmt.train)")
    points = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise SystemExit(f"{path}:{n}: not JSON ({e.msg})") from None
        if "bleu" in rec and "elapsed_s" in rec:
            points.append((rec["elapsed_s"] / 60.0, rec["bleu"]))
    return points


def parse_run(arg: str) -> tuple[Path, str]:
    """``DIR=LABEL`` (or ``DIR``, labelled by its name)."""
    path, _, label = arg.partition("=")
    return Path(path), label or Path(path).name


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="run directories, each as DIR or DIR=LABEL")
    ap.add_argument("--plot", type=Path, required=True, help="the PNG to write")
    args = ap.parse_args(argv)
    series = []
    for path, label in map(parse_run, args.runs):
        points = validations(path)
        if not points:
            raise SystemExit(f"{path}/metrics.jsonl: no validation records")
        series.append((label, [m for m, _ in points], [b for _, b in points]))
        print(f"{label}: " + ", ".join(f"{m:.1f} min {b:.2f}" for m, b in points))
    curves(series, args.plot, "training minutes (validations included)", "greedy valid BLEU")
    print(f"wrote {args.plot}", file=sys.stderr)


if __name__ == "__main__":
    main()
