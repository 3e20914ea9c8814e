"""Where a training step's time goes at one thread and at two: per-operation self CPU time, alternating.

    python scripts/profile_threads.py [--model r] [--batches 12] [--top 40]

Builds the model and the real data pipeline as scripts/benchmark.py does (``NmtRun``), trains 2 batches at each
thread count to warm up, then trains each of --batches batches once with 1 thread and once with 2
(``torch.set_num_threads``), the order swapped on every other batch so the machine's drift hits both alike, each
step under ``torch.profiler`` (CPU). Prints the wall time of both, then per operation (the profiler's
``key_averages``): self CPU time at 1 and at 2 threads, their ratio (2.0 = perfect scaling), the "excess" (time at
2 threads minus half the time at 1: what the operation costs beyond perfect scaling) and calls per step, sorted by
excess. The profiler adds its own time per operation, so the ratios are of a profiled step; the wall ratio printed
first says how far that is from an unprofiled one.
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import torch
from benchmark import MODELS, NmtRun
from torch.profiler import ProfilerActivity, profile

GEMMS = ("aten::mm", "aten::addmm", "aten::bmm")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="r", choices=sorted(MODELS))
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--data", default="data/spa-eng")
    args = ap.parse_args()
    run = NmtRun(args.model, list(MODELS[args.model]), SimpleNamespace(device="cpu", data=args.data, warmup=4))
    trainer = run.trainer
    batches = [next(run.loader) for _ in range(args.batches)]
    for b in batches[:2]:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            trainer.train_step([b])
    self_us: dict[int, dict[str, float]] = {1: {}, 2: {}}
    calls: dict[str, int] = {}
    wall = {1: 0.0, 2: 0.0}
    for k, b in enumerate(batches):
        for threads in (1, 2) if k % 2 == 0 else (2, 1):
            torch.set_num_threads(threads)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                t0 = time.perf_counter()
                trainer.train_step([b])
                wall[threads] += time.perf_counter() - t0
            for e in prof.key_averages():
                self_us[threads][e.key] = self_us[threads].get(e.key, 0.0) + e.self_cpu_time_total
                if threads == 2:
                    calls[e.key] = calls.get(e.key, 0) + e.count
    n = len(batches)
    tokens = sum(b.n_tgt_tokens for b in batches)
    print(
        f"wall: 1 thread {wall[1]:.2f} s, 2 threads {wall[2]:.2f} s, ratio {wall[1] / wall[2]:.2f}; "
        f"target tok/s {tokens / wall[1]:,.0f} / {tokens / wall[2]:,.0f} (profiled)"
    )
    groups, rows = summarise(self_us[1], self_us[2])
    for name, (one, two) in groups.items():
        print(
            f"{name}: {one / 1e3 / n:.1f} ms a step at 1 thread, {two / 1e3 / n:.1f} at 2 "
            f"({one / max(two, 1):.2f}x; {100 * two / 1e6 / wall[2]:.0f}% of the 2-thread wall time)"
        )
    print("\n| operation | 1 thread, ms/step | 2 threads, ms/step | ratio | excess, ms/step | calls/step |")
    print("|---|---:|---:|---:|---:|---:|")
    for key, one, two, excess in rows[: args.top]:
        print(
            f"| `{key[:60]}` | {one / 1e3 / n:.1f} | {two / 1e3 / n:.1f} | {one / max(two, 1):.2f} "
            f"| {excess / 1e3 / n:.1f} | {calls.get(key, 0) / n:.0f} |"
        )
    print(f"\nexcess of all operations: {sum(r[3] for r in rows) / 1e3 / n:.1f} ms a step")


def summarise(one: dict[str, float], two: dict[str, float]):
    """Self times per operation at 1 and 2 threads (any unit) → ({group: (time at 1, time at 2)} for the matrix
    products and everything else, rows (operation, time at 1, at 2, excess) sorted by excess, largest first).
    Excess = time at 2 threads − half the time at 1: what an operation costs beyond perfect two-thread scaling (an
    operation seen at one count only has 0 at the other)."""
    groups = {}
    for name, is_gemm in (("matrix products", True), ("everything else", False)):
        groups[name] = tuple(sum(v for k, v in d.items() if (k in GEMMS) == is_gemm) for d in (one, two))
    keys = set(one) | set(two)
    rows = [(k, one.get(k, 0.0), two.get(k, 0.0), two.get(k, 0.0) - one.get(k, 0.0) / 2) for k in keys]
    return groups, sorted(rows, key=lambda r: r[3], reverse=True)


if __name__ == "__main__":
    main()
