"""How long each command takes to answer a mistake (a bad value, a missing checkpoint) or ``--help``: the
whole process, as a user waits for it, this checkout against a baseline checkout in the same run.

    python scripts/benchmark_startup.py --baseline /tmp/old --rounds 3
    python scripts/benchmark_startup.py --baseline /tmp/old --rounds 3 --work      # and two commands that work

``--work`` adds two short commands that do real work, start to exit: a tiny training run (20 steps on
``../shared/data/spa-eng/sample``, into a fresh folder each time) and ``nmt.translate`` of 100 valid.tsv
sources with the checkpoint the first such run wrote (beam 5).

``--baseline`` is another checkout of the repository (``git worktree add /tmp/old COMMIT``); both run
with this interpreter, each from its own folder, alternating case by case. Prints one row per case: the
median seconds of each checkout and their ratio. Every case must exit 0 (``--help``) or 2 (a mistake),
else the script stops: a case that crashed would time the wrong thing.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VALID = REPO.parent / "shared" / "data" / "spa-eng" / "valid.tsv"

CASES = [  # (label, module, arguments, expected exit status)
    ("train: a bad value", "nmt.train", ["trainer.lr=abc"], 2),
    ("train --help", "nmt.train", ["--help"], 0),
    ("train: a value out of range", "nmt.train", ["trainer.patience=-1"], 2),
    ("train: a missing data.dir", "nmt.train", ["data.dir=/nonexistent"], 2),
    ("evaluate: a bad value", "nmt.evaluate", ["beam_size=abc"], 2),
    ("serve: a bad value", "nmt.serve", ["beam_size=abc"], 2),
    ("average: a bad value", "nmt.average", ["last=abc"], 2),
    ("translate: missing checkpoint", "nmt.translate", ["checkpoint=/nonexistent/best.pt"], 2),
    ("evaluate: missing checkpoint", "nmt.evaluate", ["checkpoint=/nonexistent/best.pt", f"input={VALID}"], 2),
    ("serve: missing checkpoint", "nmt.serve", ["checkpoint=/nonexistent/best.pt"], 2),
]


def seconds(folder: Path, module: str, args: list[str], expect: int) -> float:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=folder, capture_output=True, text=True)
    took = time.perf_counter() - start
    if proc.returncode != expect:
        raise SystemExit(f"{folder}: {module} {' '.join(args)} exited {proc.returncode}, expected {expect}")
    return took


# The tiny model of tests/helpers.py, its sizes only, kept here on purpose: both checkouts run these same
# overrides, and the baseline's tests (or the keys they set) may differ from this checkout's.
TINY = [
    "tokenizer.vocab_size=300",
    "tokenizer.sample_size=3000",
    "encoder.emb_size=32",
    "encoder.hidden_size=32",
    "decoder.emb_size=32",
    "decoder.hidden_size=64",
    "data.max_tokens=600",
    "data.valid_max_sentences=40",
    "trainer.tune_decoding=false",
    "trainer.plot_attention=0",
    "wandb.mode=disabled",
    "device=cpu",
]


def work_cases(scratch: Path) -> list[tuple[str, str, list[str], int]]:
    """The ``--work`` cases. Each training run gets its own folder (``{n}`` is filled per call); the translate
    case reads the checkpoint of the first training run, which ``main`` runs before timing anything."""
    sample = REPO.parent / "shared" / "data" / "spa-eng" / "sample"
    sources = scratch / "valid100.src"
    sources.write_text("".join(line.split("\t")[0] + "\n" for line in VALID.read_text().splitlines()[:100]))
    train = [f"data.dir={sample}", *TINY, "trainer.max_steps=20", "hydra.run.dir=" + str(scratch / "run{n}")]
    translate = [f"checkpoint={scratch}/run0/checkpoints/best.pt", f"input={sources}", "beam_size=5"]
    return [
        ("train: 20 tiny steps, start to exit", "nmt.train", train, 0),
        ("translate: 100 lines, tiny model, start to exit", "nmt.translate", [*translate, "output={out}"], 0),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", type=Path, required=True, help="another checkout of the repository")
    ap.add_argument("--rounds", type=int, default=3, help="alternating runs of each case per checkout")
    ap.add_argument("--work", action="store_true", help="also time a tiny training run and a translation")
    args = ap.parse_args()
    if not (args.baseline / "nmt" / "train.py").is_file():
        raise SystemExit(f"--baseline {args.baseline}: not a checkout of this repository (no nmt/train.py)")
    os.environ.setdefault("OMP_NUM_THREADS", str(min(2, os.cpu_count() or 1)))
    cases = list(CASES)
    scratch = Path(tempfile.mkdtemp(prefix="nmt-startup-"))
    os.environ.setdefault("NMT_CACHE", str(scratch / "cache"))  # the tokenizer and calibration, measured once
    if args.work:
        cases += work_cases(scratch)
        seconds(REPO, "nmt.train", [a.format(n=0) for a in cases[-2][2]], 0)  # run0: the checkpoint, warm caches
    print(f"| case | baseline s | this checkout s | speed-up |  ({args.rounds} alternating rounds, median)")
    print("|---|---:|---:|---:|")
    calls = itertools.count(1)
    for label, module, cmd, expect in cases:
        times: dict[str, list[float]] = {"base": [], "this": []}
        for _ in range(args.rounds):
            for key, folder in (("base", args.baseline), ("this", REPO)):
                n = next(calls)
                filled = [a.format(n=n, out=scratch / f"out{n}.txt") for a in cmd]
                times[key].append(seconds(folder, module, filled, expect))
        base, this = statistics.median(times["base"]), statistics.median(times["this"])
        print(f"| {label} | {base:.2f} | {this:.2f} | {base / this:.1f}x |")


if __name__ == "__main__":
    main()
