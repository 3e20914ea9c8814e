"""``trainer.allocator``: on CPU, keep the memory a training step frees for the next step.

PyTorch's CPU tensors come from the C library's ``malloc``. glibc serves every block above its
mmap threshold (128 KiB, raised after each such free up to at most 32 MiB) with a fresh ``mmap``
and hands it back with ``munmap`` when it is freed. A training step allocates and frees the same
large buffers every time (the [N, V] logits and their gradient, the RNN's per-pass activations),
so each step the kernel maps them again, page by page, and zero-fills every page on first touch.
With ``auto`` (on a CPU device, where the C library is glibc) two ``mallopt`` calls change that:

- ``M_MMAP_MAX = 0``: every block comes from the heap, whose freed blocks ``malloc`` reuses;
- ``M_TRIM_THRESHOLD`` at its largest: the freed top of the heap is not returned to the system
  after every step either.

The costs: the process keeps its peak memory until it exits, and a long run's heap fragments. Its free
memory ends up in tens of thousands of pieces, which glibc's malloc walks one distinct size at a time. In
``experiment=cpu_best``, ``_int_malloc`` grew from ~2% of the samples at 3 minutes to 5-6% at 11-23 minutes, and
throughput fell with it (docs/benchmarks.md, "Where a long run's time goes"; ``heap_stats`` puts the pieces in
metrics.jsonl). ``system`` fragments as well, and trains slower. oneTBB's malloc through ``LD_PRELOAD`` made 11%
fewer steps: it maps and clears large blocks afresh ("oneTBB's scalable malloc"). What does help is a fresh
process: ``trainer.restart_minutes``, a long run's resume of itself every so often (docs/benchmarks.md, "A fresh
process gives a long run its speed back"). The older short-run measurement:
``experiment=cpu_small`` trained at +8-15% target tokens/s with a 33% larger maximum RSS (1.77 GB
against 1.35), model R within the noise at the same RSS, on an AMD EPYC (docs/benchmarks.md, "A
training process that keeps its freed memory"). ``system`` leaves ``malloc`` as it is. It applies to
the whole process (and the data worker forked from it) and cannot be undone, so the trainer builder
sets it once; on CUDA the big buffers live in PyTorch's own caching allocator and ``auto`` changes
nothing.
"""

from __future__ import annotations

import ctypes
import platform

import torch

from nmt.errors import ConfigError

MODES = ("auto", "system")
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's <malloc.h>
_INT_MAX = 2**31 - 1
GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"  # where ``auto`` acts


def configure(mode: str, device: torch.device) -> str:
    """Apply ``trainer.allocator`` (see the module docstring) and say what was done, for the log."""
    if mode not in MODES:
        raise ConfigError(f"trainer.allocator={mode!r} is unknown; choose one of {', '.join(MODES)}")
    if mode == "system":
        return "the C library's defaults (trainer.allocator=system)"
    if device.type != "cpu":
        return f"PyTorch's {device.type} caching allocator (trainer.allocator=auto changes nothing off the CPU)"
    if not GLIBC:
        return "the C library's defaults (trainer.allocator=auto acts on glibc only)"
    libc = ctypes.CDLL(None)
    if not (libc.mallopt(_M_MMAP_MAX, 0) and libc.mallopt(_M_TRIM_THRESHOLD, _INT_MAX)):
        return "the C library's defaults (glibc refused mallopt)"
    return "freed memory kept for the next step (trainer.allocator=auto: glibc mallopt, no mmap per buffer)"


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (<malloc.h>, glibc 2.33 and later), field for field."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def heap_stats(device: torch.device) -> dict[str, int]:
    """The C library's heap now, for metrics.jsonl: ``heap_mib`` (what malloc holds from the system outside its
    per-block mmaps), ``heap_free_mib`` (how much of that is free, held for reuse) and ``heap_free_chunks`` (in
    how many pieces), from glibc's ``mallinfo2`` over all arenas; ``{}`` off the CPU or off glibc 2.33+.
    Free memory in many pieces is a fragmented heap: under ``trainer.allocator=auto`` a long CPU run's pieces
    grow with its varying batch shapes, and glibc's malloc walks more of them per block (docs/benchmarks.md,
    "Where a long run's time goes"). It walks every free list, so its cost grows with the pieces: call it per
    validation, not per step."""
    if device.type != "cpu" or not GLIBC:
        return {}
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "mallinfo2"):
        return {}
    libc.mallinfo2.restype = _MallInfo2
    m = libc.mallinfo2()
    return {"heap_mib": m.arena >> 20, "heap_free_mib": m.fordblks >> 20, "heap_free_chunks": m.ordblks}


def peak_mib(device: torch.device) -> float:
    """The most memory this process has held so far, in MiB: PyTorch's allocator peak on CUDA, else the
    process's maximum resident set (what ``trainer.allocator=auto`` trades for speed; metrics.jsonl)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        import resource  # Unix only
    except ImportError:
        return 0.0
    scale = 1 if platform.system() == "Darwin" else 1024  # ru_maxrss: bytes on macOS, KiB elsewhere
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20
