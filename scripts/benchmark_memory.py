"""Memory as the corpus grows: the training set repeated 1x, 10x and 100x into local files.

    python scripts/benchmark_memory.py [--scales 1,10,100] [--steps 200] [--json mem.json]

Two measurements per scale, each in a fresh process, with the resident memory of the whole
process tree (trainer + DataLoader worker) sampled every 0.2 s from /proc:

- ``train``: ``python -m nmt.train`` (experiment=cpu_small, sentencepiece trained from the
  stream on a bounded sample) for --steps updates, validation included; peak tree RSS.
- ``stream``: the batch pipeline (read -> shuffle buffer -> buckets -> tokenise -> batches)
  over the file, for one full epoch or --stream-pairs pairs, whichever ends first (it runs at
  ~8k pairs/s on 2 cores, so a 100x epoch would take 20 minutes); peak tree RSS and pairs/s.
  This is the part that would grow with the corpus if anything held it in memory.

The scaled files go to --workdir (default /tmp/nmt-memory; 100x spa-eng is ~650 MB).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

STREAM = """
import sys, time
from nmt.data import build_tokenizer
from nmt.data.batching import BatchStream
from nmt.data.corpus import CorpusSpec
from types import SimpleNamespace
spec = CorpusSpec(sys.argv[1])
tok = build_tokenizer(SimpleNamespace(model_type="unigram", vocab_size=8000, joint=True, sample_size=300000,
                                      character_coverage=1.0, cache_dir=sys.argv[2]), spec)
stream = BatchStream(spec, tok.state_dict(), 50, 2000, 20000, 20000, 1)
t0, pairs = time.perf_counter(), 0
for b in stream.epoch_batches(tok, 0):
    pairs += b.src.size(0)
    if pairs >= int(sys.argv[3]):
        break
print(f"PAIRS {pairs} SECONDS {time.perf_counter() - t0:.1f}")
"""


def tree_rss_mib(root: int) -> float:
    """Resident memory of ``root`` and all its descendants."""
    children: dict[int, list[int]] = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(pid))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def run_sampled(cmd: list[str], env: dict) -> tuple[float, str]:
    """Run a command; return (peak tree RSS in MiB, its output)."""
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = 0.0
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)
    reader.start()
    while proc.poll() is None:
        peak = max(peak, tree_rss_mib(proc.pid))
        time.sleep(0.2)
    reader.join()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{''.join(out)[-3000:]}")
    return peak, "".join(out)


def scaled_corpus(src: Path, scale: int, workdir: Path) -> Path:
    d = workdir / f"x{scale}"
    d.mkdir(parents=True, exist_ok=True)
    train = d / "train.tsv"
    if not train.is_file():
        data = src.joinpath("train.tsv").read_bytes()
        with train.open("wb") as f:
            for _ in range(scale):
                f.write(data)
    for split in ("valid.tsv", "test.tsv"):
        if not (d / split).is_file():
            (d / split).write_bytes(src.joinpath(split).read_bytes())
    return d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="data/spa-eng")
    ap.add_argument("--scales", default="1,10,100")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--stream-pairs", type=int, default=1_100_000)
    ap.add_argument("--workdir", default="/tmp/nmt-memory")
    ap.add_argument("--json")
    args = ap.parse_args()
    workdir = Path(args.workdir)
    env = dict(os.environ, WANDB_MODE="disabled", HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    env["NMT_CACHE"] = str(workdir / "cache")
    rows = []
    for scale in map(int, args.scales.split(",")):
        d = scaled_corpus(REPO / args.data, scale, workdir)
        size_mib = (d / "train.tsv").stat().st_size / 2**20
        run_dir = tempfile.mkdtemp(prefix="nmt-mem-")
        train_peak, _ = run_sampled(
            [
                sys.executable,
                "-m",
                "nmt.train",
                "experiment=cpu_small",
                f"data.dir={d}",
                f"trainer.max_steps={args.steps}",
                f"trainer.valid_every={args.steps}",
                "trainer.max_minutes=0",
                "data.valid_max_sentences=200",
                f"hydra.run.dir={run_dir}",
            ],
            env,
        )
        stream_peak, out = run_sampled(
            [
                sys.executable,
                "-c",
                STREAM,
                str(d / "train.tsv"),
                str(workdir / "cache" / "sentencepiece"),
                str(args.stream_pairs),
            ],
            env,
        )
        pairs, secs = (float(x) for x in out.split("PAIRS ")[1].split(" SECONDS "))
        row = {
            "scale": scale,
            "train_mib": size_mib,
            "train_peak_tree_rss_mib": train_peak,
            "stream_pairs": int(pairs),
            "stream_seconds": secs,
            "stream_peak_tree_rss_mib": stream_peak,
        }
        rows.append(row)
        print(row, flush=True)
    print(f"\n{platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}\n")
    print("| corpus | train.tsv MiB | nmt.train peak RSS MiB | stream: pairs | pairs/s | peak RSS MiB |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['scale']}x | {r['train_mib']:,.0f} | {r['train_peak_tree_rss_mib']:,.0f} | {r['stream_pairs']:,} | "
            f"{r['stream_pairs'] / r['stream_seconds']:,.0f} | {r['stream_peak_tree_rss_mib']:,.0f} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
