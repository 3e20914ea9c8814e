"""Decoding speed: sentences/s and target tokens/s for greedy, beam 5 and beam 10 at batch sizes 1 and 64.

    python scripts/benchmark_decode.py CHECKPOINT data/spa-eng/test.tsv [--limit-b1 300] [--device cpu]

Sentences are sorted by length and cut into batches of N sentences (what nmt.translate does,
with a sentence count instead of a token budget); each configuration is run once after one
warm-up batch, and the first ``--limit-b1`` sentences only are used at batch size 1 (it is
slow on a CPU). Prints a markdown table and writes JSON next to it with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch

from nmt.data.batching import collate
from nmt.data.corpus import CorpusSpec, load_pairs
from nmt.runtime import load_model
from nmt.search import SearchOptions, beam_search


def run(model, ids: list[list[int]], batch: int, beam: int, device: torch.device) -> dict:
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    batches = [
        collate([ids[i] for i in order[k : k + batch]], [[4]] * len(order[k : k + batch]))
        for k in range(0, len(order), batch)
    ]
    opts = SearchOptions(beam_size=beam, alpha=1.0 if beam > 1 else 0.0)
    b = batches[len(batches) // 2].to(device)
    beam_search(model, b.src, b.src_len, opts)  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0, tokens = time.perf_counter(), 0
    for b in batches:
        b = b.to(device)
        tokens += sum(len(h[0].tokens) + 1 for h in beam_search(model, b.src, b.src_len, opts))
    if device.type == "cuda":
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    return {
        "batch": batch,
        "beam": beam,
        "sentences": len(ids),
        "seconds": round(secs, 2),
        "sent_per_s": round(len(ids) / secs, 1),
        "tgt_tok_per_s": round(tokens / secs, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("tsv")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--limit-b1", type=int, default=300)
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--beams", default="1,5,10")
    ap.add_argument("--json")
    args = ap.parse_args()
    device = torch.device(args.device)
    model, tok = load_model(args.checkpoint, device)
    ids = [s[:256] for s in tok.encode_src([s for s, _ in load_pairs(CorpusSpec(args.tsv))])]
    rows = []
    with torch.inference_mode():
        for batch in map(int, args.batches.split(",")):
            for beam in map(int, args.beams.split(",")):
                subset = ids[: args.limit_b1] if batch == 1 else ids
                rows.append(run(model, subset, batch, beam, device))
                print(rows[-1], flush=True)
    meta = {
        "device": str(device),
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "checkpoint": args.checkpoint,
        "tsv": args.tsv,
    }
    print(f"\n{meta}\n\n| batch | beam | sentences | sent/s | target tok/s |\n|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['batch']} | {r['beam']} | {r['sentences']} | {r['sent_per_s']:,} | {r['tgt_tok_per_s']:,} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
