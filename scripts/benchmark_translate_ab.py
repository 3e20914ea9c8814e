"""The whole decoding command, as a user runs it, this checkout against a baseline checkout in the same run.

    git worktree add /tmp/old COMMIT
    python scripts/benchmark_translate_ab.py CHECKPOINT --baseline /tmp/old [--input SRC] [--rounds 5] [-- KEY=V ...]

Each round runs ``python -m nmt.translate checkpoint=CHECKPOINT input=SRC output=... beam_size=5 stop=exact``
once from each checkout (this interpreter, each from its own folder, the order swapped every round, so slow
drift of a virtual machine hits both alike), timed from launch to exit: start-up, loading, the forked
decoding processes and their exit included, what ``scripts/benchmark.py --compare`` times for nmt.
Extra ``KEY=VALUE`` overrides after ``--`` go to both (``quantize=int8``, ``workers=1``, ...).

SRC defaults to the source side of ../shared/data/spa-eng/valid.tsv (2,000 lines), written to a temporary
file. Prints each round, then the median seconds of each checkout, their ratio (baseline / this: above 1 is
faster here), output words/s, and whether the two checkouts wrote the same translations: a change meant to
be exact must write identical files, and one that is not says so here before any speed is read.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VALID = REPO.parent / "shared" / "data" / "spa-eng" / "valid.tsv"


def run(folder: Path, checkpoint: Path, src: Path, out: Path, extra: list[str]) -> float:
    """Seconds from launch to exit of one nmt.translate from ``folder``; stops the script if it fails."""
    cmd = [sys.executable, "-m", "nmt.translate", f"checkpoint={checkpoint}", f"input={src}", f"output={out}"]
    cmd += ["beam_size=5", "stop=exact", *extra]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=folder, capture_output=True, text=True)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{folder}: nmt.translate exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return took


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of the docstring. Intermixed: plain ``parse_args`` binds the overrides' positional to
    nothing once it has read CHECKPOINT, and then refused the usage above ("unrecognized arguments")."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--baseline", type=Path, required=True, help="another checkout of the repository")
    ap.add_argument("--input", type=Path, help="source lines (default: valid.tsv's first column)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("extra", nargs="*", help="KEY=VALUE overrides for both checkouts (after --)")
    return ap.parse_intermixed_args(argv)


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src = args.input
        if src is None:
            src = tmp / "valid.src"
            lines = VALID.read_text(encoding="utf-8").splitlines()
            src.write_text("".join(line.split("\t")[0] + "\n" for line in lines), encoding="utf-8")
        sides = {"baseline": args.baseline.resolve(), "this": REPO}
        times: dict[str, list[float]] = {name: [] for name in sides}
        for k in range(args.rounds):
            order = list(sides) if k % 2 == 0 else list(sides)[::-1]
            for name in order:
                times[name].append(run(sides[name], args.checkpoint.resolve(), src, tmp / f"{name}.txt", args.extra))
            print(f"round {k + 1}: " + ", ".join(f"{n} {times[n][-1]:.2f} s" for n in sides), flush=True)
        digests = {n: hashlib.sha256((tmp / f"{n}.txt").read_bytes()).hexdigest() for n in sides}
        words = sum(len(line.split()) for line in (tmp / "this.txt").read_text(encoding="utf-8").splitlines())
    med = {n: statistics.median(t) for n, t in times.items()}
    print(f"\nmedian of {args.rounds}: baseline {med['baseline']:.2f} s, this {med['this']:.2f} s")
    print(
        f"baseline / this: {med['baseline'] / med['this']:.3f} (per round: "
        + ", ".join(f"{b / t:.3f}" for b, t in zip(times["baseline"], times["this"]))
        + ")"
    )
    print(f"output words/s (this checkout): {words / med['this']:,.0f} ({words:,} words)")
    same = digests["baseline"] == digests["this"]
    print("translations: identical" if same else "translations: DIFFER between the checkouts")


if __name__ == "__main__":
    main()
