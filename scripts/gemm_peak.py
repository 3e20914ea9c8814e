"""This machine's measured GEMM peak in float32 and bf16: the ceiling that achieved FLOP/s are a share of.

    python scripts/gemm_peak.py [--dtypes float32,bf16] [--repeats 3] [--json peak.json]

``torch.mm`` on 512, 1024 and 2048 squares and on model R's vocabulary projection shape
(640×512)·(512×8000) (a ~2,000-token batch's rows times the output layer), with torch's default
intra-op threads, as training runs; and, where this PyTorch has them, the same products by oneDNN
over a weight blocked once into its own layout (``torch.ops.mkldnn``, nmt.models.rnn.packed_linear,
the CPU fast path's search kernel). The two can differ by 2× or more: PyTorch's CPU build hands a
float32 ``torch.mm`` to MKL's sgemm, which ran at under half of oneDNN's float32 rate on an AVX-512 AMD
EPYC (docs/benchmarks.md), so a float32 "peak" from ``torch.mm`` alone would be MKL's, not the
machine's. Per shape and kernel: one untimed call (kernel creation, first-touch of the output), then
the best of ``--repeats`` timed calls; GFLOP/s = 2·m·n·k / seconds. The peak of a dtype is the best
over its shapes and kernels.

Where bf16 has no hardware behind it (no AMX, no AVX512-BF16) torch emulates the products, often
hundreds of times slower than float32; it is still measured, and reported as emulated. So that an
emulated 2048³ product cannot take a minute, a shape whose predicted time (its FLOPs at the best
rate measured so far for the dtype, smaller shapes first) exceeds ``--max-seconds`` is skipped and
said to be; its rate is below the smaller shapes' there anyway.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from nmt.calibrate import cpu_has_native_bf16, cpu_name
from nmt.models.rnn import _packing_available, pack_weight, packed_linear

# (m, k, n): A [m, k] · B [k, n]; smallest first, so a slow dtype's rate is known before the big ones
SHAPES = ((512, 512, 512), (1024, 1024, 1024), (640, 512, 8000), (2048, 2048, 2048))
DTYPES = {"float32": torch.float32, "bf16": torch.bfloat16}
KERNELS = ("torch.mm", "oneDNN packed")  # see the module docstring


@dataclass
class ShapeRate:
    m: int
    k: int
    n: int
    gflops: float | None  # best timed call; None when skipped
    seconds: float | None  # that call's time
    note: str = ""
    kernel: str = KERNELS[0]


@dataclass
class Peak:
    """The best GFLOP/s per dtype over the shapes, and how each shape did."""

    gflops: dict[str, float]  # dtype name → peak GFLOP/s
    shapes: dict[str, list[ShapeRate]] = field(default_factory=dict)
    threads: int = 0
    cpu: str = ""
    bf16_native: bool = False  # AMX or AVX512-BF16 present; False: bf16 products are emulated
    cpu_capability: str = ""  # what torch's kernels dispatch to (AVX2, AVX512, ...)

    def kernel_peaks(self, name: str) -> dict[str, float]:
        """Dtype ``name``'s best GFLOP/s by each kernel measured, fastest first."""
        best: dict[str, float] = {}
        for r in self.shapes.get(name, []):
            if r.gflops:
                best[r.kernel] = max(best.get(r.kernel, 0.0), r.gflops)
        return dict(sorted(best.items(), key=lambda kv: -kv[1]))

    def describe(self) -> str:
        """One line: ``GEMM peak (AMD EPYC, 2 threads, AVX512): float32 480.2 GFLOP/s by oneDNN packed
        (torch.mm 227.9), bf16 1,010.0 GFLOP/s by torch.mm (oneDNN packed 998.1)``; bf16 without AMX or
        AVX512-BF16 is said to be emulated."""
        parts = []
        for name, g in self.gflops.items():
            part = f"{name} {g:,.1f} GFLOP/s"
            by = self.kernel_peaks(name)
            if len(by) > 1:
                (first, _), *others = by.items()
                part += f" by {first} (" + ", ".join(f"{k} {v:,.1f}" for k, v in others) + ")"
            if name == "bf16" and not self.bf16_native:
                part += " (emulated: no AMX/AVX512-BF16)"
            parts.append(part)
        return f"GEMM peak ({self.cpu}, {self.threads} threads, {self.cpu_capability}): " + ", ".join(parts)


def time_product(a: torch.Tensor, b: torch.Tensor, repeats: int, budget_s: float, kernel: str = KERNELS[0]) -> float:
    """Best seconds of a [m, k] · b [k, n] by ``kernel`` after one untimed call: ``repeats`` timed calls,
    fewer (at least one) once they have taken ``budget_s`` together. ``oneDNN packed``: b blocked once,
    untimed, as a search blocks a weight once for all its steps."""
    if kernel == KERNELS[0]:
        out = torch.mm(a, b)

        def product() -> None:
            torch.mm(a, b, out=out)

    else:
        packed = pack_weight(b.t())

        def product() -> None:
            packed_linear(a, packed, None)

        product()
    times: list[float] = []
    with torch.no_grad():
        while not times or (len(times) < repeats and sum(times) < budget_s):
            start = time.perf_counter()
            product()
            times.append(time.perf_counter() - start)
    return min(times)


def kernels(dtype: torch.dtype) -> tuple[str, ...]:
    """The kernels measured for ``dtype`` here: ``torch.mm``, and oneDNN's packed product where this PyTorch
    can block ``dtype`` weights (nmt.models.rnn._packing_available)."""
    return KERNELS if _packing_available(dtype) else KERNELS[:1]


def shape_rate(
    m: int, k: int, n: int, dtype: torch.dtype, repeats: int, best_so_far: float, max_s: float, kernel: str = KERNELS[0]
) -> ShapeRate:
    """GFLOP/s of one shape by ``kernel``, or a skipped entry when ``best_so_far`` GFLOP/s predicts more than
    ``max_s`` seconds per call; timed calls stop early once they have taken ``max_s`` together."""
    flop = 2 * m * n * k
    if best_so_far > 0 and flop / (best_so_far * 1e9) > max_s:
        note = f"skipped: ~{flop / (best_so_far * 1e9):.0f} s per call predicted"
        return ShapeRate(m, k, n, None, None, note, kernel)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=g).to(dtype)
    b = torch.randn(k, n, generator=g).to(dtype)
    seconds = time_product(a, b, repeats, max_s, kernel)
    return ShapeRate(m, k, n, flop / seconds / 1e9, seconds, kernel=kernel)


def measure(
    dtypes: tuple[str, ...] = ("float32", "bf16"),
    shapes: tuple[tuple[int, int, int], ...] = SHAPES,
    repeats: int = 3,
    max_seconds: float = 5.0,
) -> Peak:
    """The GEMM peak of this machine for each dtype name in ``dtypes`` (keys of DTYPES)."""
    peak = Peak(
        {},
        threads=torch.get_num_threads(),
        cpu=cpu_name(),
        bf16_native=cpu_has_native_bf16(),
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
    )
    for name in dtypes:
        rates: list[ShapeRate] = []
        best = 0.0
        for m, k, n in sorted(shapes, key=lambda s: s[0] * s[1] * s[2]):
            for kernel in kernels(DTYPES[name]):
                r = shape_rate(m, k, n, DTYPES[name], repeats, best, max_seconds, kernel)
                rates.append(r)
                best = max(best, r.gflops or 0.0)
        peak.gflops[name], peak.shapes[name] = best, rates
    return peak


def best_of(*peaks: Peak) -> Peak:
    """One peak from several measurements of the same machine: per dtype and per shape the higher rate.

    A ceiling is what the machine can do, so a measurement taken while it ran slower (a virtual
    machine whose host is busy for a minute: seen here as half the rate at the start of a benchmark
    and full speed 25 minutes later) must not lower it; ``peaks[0]`` supplies the description."""
    first = peaks[0]
    out = Peak({}, {}, first.threads, first.cpu, first.bf16_native, first.cpu_capability)
    for name in first.gflops:
        out.gflops[name] = max(p.gflops.get(name, 0.0) for p in peaks)
        rates = []
        for i in range(len(first.shapes.get(name, []))):
            same = [p.shapes[name][i] for p in peaks if len(p.shapes.get(name, [])) > i]
            rates.append(max(same, key=lambda x: x.gflops or 0.0))
        out.shapes[name] = rates
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="float32,bf16", help="comma-separated: float32, bf16")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per shape (the best counts)")
    ap.add_argument("--max-seconds", type=float, default=5.0, help="skip a shape predicted to take longer per call")
    ap.add_argument("--json", help="write the measurement here")
    args = ap.parse_args()
    names = tuple(args.dtypes.split(","))
    unknown = [n for n in names if n not in DTYPES]
    if unknown:
        raise SystemExit(f"--dtypes: unknown {', '.join(unknown)}; expected some of {', '.join(DTYPES)}")
    peak = measure(names, repeats=args.repeats, max_seconds=args.max_seconds)
    print("| dtype | m×k×n | kernel | GFLOP/s | seconds per call |\n|---|---|---|---:|---:|")
    for name, rates in peak.shapes.items():
        for r in rates:
            rate = f"{r.gflops:,.1f}" if r.gflops else r.note
            secs = f"{r.seconds:.4f}" if r.seconds else ""
            print(f"| {name} | {r.m}×{r.k}×{r.n} | {r.kernel} | {rate} | {secs} |")
    print(peak.describe())
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(peak), indent=1))


if __name__ == "__main__":
    main()
