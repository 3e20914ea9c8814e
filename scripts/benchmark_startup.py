"""How long each command takes to answer a mistake (a bad value, a missing checkpoint) or ``--help``: the
whole process, as a user waits for it, this checkout against a baseline checkout in the same run.

    python scripts/benchmark_startup.py --baseline /tmp/old --rounds 3

``--baseline`` is another checkout of the repository (``git worktree add /tmp/old COMMIT``); both run
with this interpreter, each from its own folder, alternating case by case. Prints one row per case: the
median seconds of each checkout and their ratio. Every case must exit 0 (``--help``) or 2 (a mistake),
else the script stops: a case that crashed would time the wrong thing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", type=Path, required=True, help="another checkout of the repository")
    ap.add_argument("--rounds", type=int, default=3, help="alternating runs of each case per checkout")
    args = ap.parse_args()
    if not (args.baseline / "nmt" / "train.py").is_file():
        raise SystemExit(f"--baseline {args.baseline}: not a checkout of this repository (no nmt/train.py)")
    os.environ.setdefault("OMP_NUM_THREADS", str(min(2, os.cpu_count() or 1)))
    print(f"| case | baseline s | this checkout s | speed-up |  ({args.rounds} alternating rounds, median)")
    print("|---|---:|---:|---:|")
    for label, module, cmd, expect in CASES:
        times: dict[str, list[float]] = {"base": [], "this": []}
        for _ in range(args.rounds):
            times["base"].append(seconds(args.baseline, module, cmd, expect))
            times["this"].append(seconds(REPO, module, cmd, expect))
        base, this = statistics.median(times["base"]), statistics.median(times["this"])
        print(f"| {label} | {base:.2f} | {this:.2f} | {base / this:.1f}x |")


if __name__ == "__main__":
    main()
