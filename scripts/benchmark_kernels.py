"""The CPU fast path's search kernels against the plain ones beside them, as ratios in one process.

    python scripts/benchmark_kernels.py [--rows 500] [--vocab 8000] [--hidden 512] [--k 10] [--pairs 40]

- top-k: ``nmt.search.row_topk`` (torch.topk) against ``blocked_topk`` over a beam step's log-probabilities
  [rows, vocab] (500 rows = 100 sentences × beam 5), k = 2 × beam as the search takes it;
- products: ``F.linear`` against ``packed_linear`` over a oneDNN-packed bf16 weight, the vocabulary
  projection's shape [rows, hidden] × [vocab, hidden] (only where PyTorch can pack bf16 weights here:
  AVX512-BF16/AMX CPUs; elsewhere the fast path keeps F.linear and the row says so);
- float32 products, the same shape and a small one (60 rows: a batch's last few sentences): F.linear
  (MKL's sgemm in PyTorch's CPU build) against oneDNN's packed float32 product. The fast path does not
  pack float32 weights (yet): these rows measure whether it should, per CPU. Not bit-identical (another
  GEMM kernel: float32 rounding), so the row also gives the largest difference.

Each pair runs both kernels on the same input, in alternating order, ``--reps`` calls each; the ratio is
the median over pairs of plain seconds / fast seconds, at 1 thread (a decoding worker's setting) and at
the machine's thread count. Prints the CPU model and a markdown table; ``--json`` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from nmt.calibrate import cpu_name
from nmt.models.rnn import _packing_available, packed_linear, packed_weight
from nmt.search import blocked_topk, row_topk


def timed(fn, reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def pairs(plain, fast, n: int, reps: int) -> dict:
    plain(), fast()  # warm-up (oneDNN builds its kernels on the first call of a shape)
    ts_p, ts_f = [], []
    for i in range(n):
        order = [(plain, ts_p), (fast, ts_f)]
        for fn, ts in order if i % 2 == 0 else order[::-1]:
            ts.append(timed(fn, reps))
    ratios = [p / f for p, f in zip(ts_p, ts_f)]
    return {
        "plain_ms": round(statistics.median(ts_p) * 1e3, 3),
        "fast_ms": round(statistics.median(ts_f) * 1e3, 3),
        "ratio": round(statistics.median(ratios), 2),
        "ratio_range": [round(min(ratios), 2), round(max(ratios), 2)],
    }


def float32_row(n: int, w: torch.Tensor, args: argparse.Namespace) -> dict:
    """F.linear against oneDNN's packed float32 product, [n, I] x [O, I]."""
    x = torch.randn(n, w.size(1))
    packed = torch.ops.mkldnn._reorder_linear_weight(w, n)

    def onednn() -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")

    row = {"kernel": f"float32 product [{n}, {w.size(1)}] x [{w.size(0)}, {w.size(1)}]"}
    row.update(pairs(lambda: F.linear(x, w), onednn, args.pairs, args.reps))
    row["max_abs_diff"] = float((onednn() - F.linear(x, w)).abs().max())
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=500)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.manual_seed(0)
    logp = torch.log_softmax(torch.randn(args.rows, args.vocab) * 3, dim=1)
    x = torch.randn(args.rows, args.hidden).bfloat16()
    w = (torch.randn(args.vocab, args.hidden) / args.hidden**0.5).bfloat16()
    packed = packed_weight(w)
    rows = []
    for threads in sorted({1, torch.get_num_threads()}):
        torch.set_num_threads(threads)
        row = {"kernel": f"top-k [{args.rows}, {args.vocab}] k={args.k}", "threads": threads}
        row.update(pairs(lambda: row_topk(logp, args.k), lambda: blocked_topk(logp, args.k), args.pairs, args.reps))
        rows.append(row)
        shape = f"[{args.rows}, {args.hidden}] x [{args.vocab}, {args.hidden}]"
        row = {"kernel": f"bf16 product {shape}", "threads": threads}
        if packed is None:
            row["note"] = "not packed here: PyTorch's oneDNN cannot pack bf16 weights on this CPU"
        else:
            row.update(pairs(lambda: F.linear(x, w), lambda: packed_linear(x, packed, None), args.pairs, args.reps))
        rows.append(row)
        for n in (args.rows, 60):
            rows.append({"threads": threads, **float32_row(n, w.float(), args)})
    print(f"CPU: {cpu_name()}; torch {torch.__version__}; bf16 packing available: {_packing_available()}")
    print("| kernel | threads | plain ms | fast ms | plain / fast (median, range) |")
    print("|---|---:|---:|---:|---|")
    for r in rows:
        if "note" in r:
            print(f"| {r['kernel']} | {r['threads']} | – | – | {r['note']} |")
        else:
            lo, hi = r["ratio_range"]
            diff = f"; max diff {r['max_abs_diff']:.1e}" if "max_abs_diff" in r else ""
            ratio = f"{r['ratio']}× ({lo}–{hi}){diff}"
            print(f"| {r['kernel']} | {r['threads']} | {r['plain_ms']} | {r['fast_ms']} | {ratio} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_name(), "torch": torch.__version__, "args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
