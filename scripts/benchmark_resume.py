"""How long a resumed run waits for its first batch: the training stream of a checkpoint's run rebuilt from
batch ``--skip`` of epoch 0 (what ``trainer.resume=true`` does in its DataLoader worker), this checkout
against a baseline checkout, alternating, each in a fresh process.

    git worktree add /tmp/old COMMIT
    python scripts/benchmark_resume.py runs/a/checkpoints/last.pt --skip 450 --baseline /tmp/old --rounds 2

Prints one row per skip (0 = a fresh run's first batch): the seconds to the first batch in each round, and
their medians' ratio; the order alternates (ABBA): with a fixed order, skip 0 (the same work in both
checkouts) came out 1.19x. Both checkouts must yield the same batch (its index and a checksum are compared), else
the script stops. Run it from the folder the checkpoint's run was started in (its ``data.dir`` may be
relative), on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PROBE = """
import json, sys, time
import torch
from omegaconf import OmegaConf
from nmt.data import build_specs
from nmt.data.batching import BatchStream
import nmt.data.batching

def nmt_file():
    return str(__import__("pathlib").Path(nmt.data.batching.__file__).resolve())

torch.set_num_threads(1)  # as in the DataLoader worker
ckpt = torch.load(sys.argv[1], weights_only=False, map_location="cpu")
cfg = OmegaConf.create(ckpt["config"])
d = cfg.data
stream = BatchStream(build_specs(d)["train"], ckpt["tokenizer"], d.max_len, d.max_tokens, d.bucket_size,
                     d.shuffle_buffer, cfg.seed, starts=[(0, int(sys.argv[2]))])
start = time.perf_counter()
batch = next(iter(stream))
took = time.perf_counter() - start
print(json.dumps({"s": took, "index": batch.index, "sum": int(batch.src.sum()) + int(batch.tgt_in.sum())}))
"""


def first_batch(checkout: Path, checkpoint: Path, skip: int) -> dict:
    """The probe in a fresh process that imports ``nmt`` from ``checkout``: run as a file from a folder of its
    own (``python -c`` would put the working directory, maybe another checkout, first on the path)."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    with tempfile.TemporaryDirectory() as folder:
        probe = Path(folder) / "probe.py"
        probe.write_text(PROBE + f"assert nmt_file().startswith({str(checkout.resolve())!r}), nmt_file()\n")
        proc = subprocess.run(
            [sys.executable, str(probe), str(checkpoint), str(skip)], env=env, capture_output=True, text=True
        )
    if proc.returncode != 0:
        raise SystemExit(f"{checkout}: the probe failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", type=Path, help="a run's last.pt or step_N.pt (its config and tokenizer)")
    ap.add_argument("--baseline", type=Path, required=True, help="another checkout of the repository")
    ap.add_argument("--skip", type=int, nargs="+", default=[0, 450], help="batches of epoch 0 to skip")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    print(f"| skip | baseline s | this checkout s | speed-up |  ({args.rounds} alternating rounds, median)")
    print("|---:|---|---|---:|")
    for skip in args.skip:
        times: dict[str, list[float]] = {"base": [], "this": []}
        seen = set()
        for r in range(args.rounds):
            pair = [("base", args.baseline), ("this", REPO)]
            for key, checkout in pair if r % 2 == 0 else pair[::-1]:  # ABBA: neither always goes first
                got = first_batch(checkout, args.checkpoint, skip)
                times[key].append(got["s"])
                seen.add((got["index"], got["sum"]))
        if len(seen) != 1:
            raise SystemExit(f"skip {skip}: the checkouts yield different first batches {sorted(seen)}")
        base, this = statistics.median(times["base"]), statistics.median(times["this"])
        shown = {k: " / ".join(f"{t:.2f}" for t in v) for k, v in times.items()}
        print(f"| {skip} | {shown['base']} | {shown['this']} | {base / this:.2f}x |")


if __name__ == "__main__":
    main()
