"""The one room that knows how an RNN is computed: a stacked (bi)directional GRU/LSTM whose
implementation is chosen once, at build time (``model.rnn_impl``).

Encoder and decoder describe *what* recurrence they need (a bidirectional encoder over padded
sentences; a decoder advanced one step at a time from precomputed input gates); this module
decides *how*. The parameters always live in one ``nn.GRU``/``nn.LSTM`` (``RNN`` is an
``nn.RNNBase``), so cuDNN can use them and checkpoints keep their ``weight_ih_l0``-style keys.

Implementations (``IMPLS``):

* ``eager``: plain PyTorch. nn.GRU/nn.LSTM over packed sequences for the encoder; the decoder's
  step loop is the hand-written cell (``rnn_cell``) with ``F.linear`` and ordinary autograd.
* ``loop``: the CPU fast path. The encoder runs explicit step loops too, and every product of a
  loop is a ``StepLinear`` (below): one weight gradient per pass, optionally in bf16.
* ``cudnn``: nn.GRU/nn.LSTM over packed sequences (one cuDNN call per layer on GPU). The decoder's
  step loop, which attention makes step-by-step, keeps ``StepLinear``: cuDNN has no per-step
  entry point, and one weight-gradient GEMM per pass instead of T thin ones (what cuDNN's own
  backward does) saves T-1 kernel launches per weight on a GPU too: today's CUDA behaviour.
* ``auto``: ``loop`` on CPU, ``cudnn`` on CUDA (``resolve_impl``, a pure function of the device).

``StepLinear``: autograd treats a weight used at T time steps as T separate uses: backward runs T
thin weight-gradient GEMMs ([O, B] · [B, I]) and adds each into the accumulated gradient (plus,
for a weight that is a slice of a bigger parameter, a zero-filled full-size copy per step).
cuDNN's RNNs instead keep every step's input and compute the weight gradient once, as one
GEMM over all B·T rows. ``StepLinear`` does the same for the hand-written step loops: each
step's backward only propagates to its input and records its output gradient; a node that
autograd runs after all of them (every step depends on it) computes the weight gradient.
It can also run the products in a lower precision (bf16 on CPUs with matrix units): the
weight is cast once per pass instead of once per step, and inputs/outputs are cast at the
product only, so the recurrent state and the element-wise gate maths stay in float32.
``CastLinear`` is the decoder's own layers (readout / combine, vocabulary projection) in a search:
their weights cast once per search, where autocast would cast them at every step.

``tanh_kernel`` is the model's tanh (the cells, the additive attention's scores, the readout / combine):
with ``loop``, for a model built for the CPU, tanh(x) = 2σ(2x) − 1 (``sigmoid_tanh``) when that measured
faster than torch.tanh in this process (PyTorch's CPU tanh kernel is 4–5x slower than its sigmoid on the
AMD EPYC of docs/benchmarks.md); torch.tanh otherwise, and always for a model built for a GPU
(``build_model`` chooses it once, for its device).

``dropout_layer`` makes the encoder's and decoder's dropout layers: with ``loop`` a ``MaskDropout``, whose
mask comes from 16-bit fields of 64-bit random words. PyTorch's CPU ``bernoulli_`` draws one
random number per element and, on CPUs other than Intel's, one element at a time: 5.4 ms for model
R's [1800, 512] activations against 1.0 ms (AMD EPYC, 2 cores), ~7% of a model R training step
for its four dropout layers. The others get ``nn.Dropout``.

Layer-normalised cells (``layer_norm=True``; Ba, Kiros & Hinton 2016, "Layer Normalization", §3.1
and their LN-LSTM): the input and the recurrent pre-activations are normalised separately over
all G·H gates, LN(W_ih x; g_ih) + b_ih and LN(W_hh h; g_hh) + b_hh, and an LSTM's output reads
LN(c_t; g_c, b_c). The shifts of the two gate norms are the cell's own biases (the paper's β₁, β₂
and b only ever appear as a sum), so the parameters are nn.GRU/nn.LSTM's plus the gains (and the
LSTM's cell-norm pair), named ``ln_ih_l0``, ``ln_hh_l0``, ``ln_c_l0``, ``ln_c_bias_l0`` (+ ``_reverse``).
No fused kernel (cuDNN, oneDNN) has such a cell, so with layer norm every implementation runs the
step loops: ``eager`` with ``EagerLinear``, ``loop`` with ``StepLinear`` (the normalisation sits
after the product, so each pass still computes one weight gradient per weight), and ``auto``
resolves to ``loop`` on every device; ``cudnn`` is refused.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from nmt.errors import ConfigError

IMPLS = ("auto", "cudnn", "eager", "loop")
CELLS = ("gru", "lstm")

# The one-line refusal of cuDNN with layer-normalised cells (also raised by nmt.config.validate).
CUDNN_LAYER_NORM = (
    "model.rnn_impl=cudnn cannot compute layer-normalised cells (encoder/decoder.layer_norm=true): cuDNN has "
    "no such cell; use model.rnn_impl=auto or loop (the step loops, on GPU too)"
)

# A recurrent state: h [L·D, B, H] for GRU, (h, c) for LSTM.
RNNState = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


def resolve_impl(impl: str, device: Any = "cpu", layer_norm: bool = False) -> str:
    """``model.rnn_impl``, the model's device and whether any RNN is layer-normalised → ``eager``,
    ``loop`` or ``cudnn``.

    ``auto`` is today's fastest choice per device: the step loops on CPU (PyTorch's packed CPU
    RNN backward is about half as fast for model R, docs/benchmarks.md), cuDNN on CUDA; with layer
    norm the step loops everywhere (cuDNN has no layer-normalised cell).
    """
    if impl not in IMPLS:
        raise ConfigError(f"model.rnn_impl={impl!r} is unknown; choose one of {', '.join(IMPLS)}")
    if impl == "cudnn" and layer_norm:
        raise ConfigError(CUDNN_LAYER_NORM)
    if impl != "auto":
        return impl
    return "cudnn" if torch.device(device).type == "cuda" and not layer_norm else "loop"


class _Tape:
    """Every step's input (forward order) and output gradient (filled in by backward)."""

    def __init__(self) -> None:
        self.xs: list[torch.Tensor] = []  # [n, I] each
        self.gs: dict[int, torch.Tensor] = {}  # step index → [n, O]


class _WeightGrad(torch.autograd.Function):
    """Forward: an empty token that every step takes as input. Backward: runs once all steps'
    backwards have (autograd waits for every consumer), so it sees the whole tape."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, tape: _Tape) -> torch.Tensor:
        ctx.tape, ctx.dtype = tape, weight.dtype
        ctx.set_materialize_grads(False)
        return weight.new_empty(0)

    @staticmethod
    def backward(ctx, _unused):
        tape = ctx.tape
        if not tape.gs:
            return None, None
        steps = sorted(tape.gs)
        x = torch.cat([tape.xs[i] for i in steps])  # [N, I], N = rows of all steps
        g = torch.cat([tape.gs[i] for i in steps])  # [N, O]
        tape.xs, tape.gs = [], {}
        return (g.t() @ x).to(ctx.dtype), None  # [O, I]


class _Step(torch.autograd.Function):
    """y = x Wᵀ for one step; backward gives only ∂/∂x and leaves ∂/∂W to the tape."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, token: torch.Tensor, w: torch.Tensor, tape: _Tape) -> torch.Tensor:
        xc = x.to(w.dtype, memory_format=torch.contiguous_format).reshape(-1, x.size(-1))  # [N, I], one copy at most
        ctx.w, ctx.tape, ctx.index = w, tape, len(tape.xs)
        tape.xs.append(xc)
        return F.linear(xc, w).view(*x.shape[:-1], -1).to(x.dtype)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        # Both products on [N, *] matrices (the cast and, when g is not contiguous, e.g. the gradient of the
        # attention keys that a score reads transposed, the layout in one copy): on a strided 3-D tensor
        # ``g @ W`` is a batched product over a broadcast W, 3-5x slower on CPU (docs/benchmarks.md, "A
        # strided gradient").
        gc = g.to(ctx.w.dtype, memory_format=torch.contiguous_format).reshape(-1, g.size(-1))
        ctx.tape.gs[ctx.index] = gc
        return (gc @ ctx.w).view(*g.shape[:-1], -1).to(g.dtype), None, None, None


class StepLinear:
    """x [.., I] → x Wᵀ + b [.., O], for a weight used at every step of one forward pass.

    Build one per pass (the tape belongs to that pass's graph). Without autograd (search,
    validation) it is a plain ``F.linear`` in ``dtype``.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, dtype: torch.dtype | None = None):
        self.bias = bias
        self.w = weight.detach().to(dtype or weight.dtype)  # cast once per pass
        self.taped = torch.is_grad_enabled() and weight.requires_grad
        self.packed = None
        if self.taped:
            self.tape = _Tape()
            self.token = _WeightGrad.apply(weight, self.tape)
        else:  # a search or validation: the weight blocked once for oneDNN where that helps (packed_weight)
            self.packed = packed_weight(self.w)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.taped:
            y = _Step.apply(x, self.token, self.w, self.tape)
        elif self.packed is not None:
            y = packed_linear(x.to(self.w.dtype), self.packed, None).to(x.dtype)
        else:
            y = F.linear(x.to(self.w.dtype), self.w).to(x.dtype)
        return y if self.bias is None else y + self.bias


def packed_weight(w: torch.Tensor) -> torch.Tensor | None:
    """A weight [O, I] in oneDNN's own blocked layout, for products without autograd that reuse it many
    times (every step of a search), or None where that is not available or not faster. ``F.linear`` hands
    oneDNN a plain bf16 weight, which it re-blocks at every call; ``packed_linear`` over a packed one skips
    that, with the same result, bit for bit. A float32 ``F.linear`` is MKL's sgemm in PyTorch's CPU build;
    oneDNN's packed float32 product rounds differently (results within ~1e-5) and is packed only where it
    measured faster on this CPU (``float32_packing_speedup``). The tensor holds the blocked data behind a
    plain [O, I] shape: use it with ``packed_linear`` only. These are PyTorch's own ops for this
    (``torch.ops.mkldnn``, what its compiler's CPU weight prepacking calls), so a PyTorch without them
    keeps ``F.linear``."""
    if w.device.type != "cpu" or w.dtype not in (torch.bfloat16, torch.float32):
        return None
    if not (packs_float32() if w.dtype == torch.float32 else _packing_available(w.dtype)):
        return None
    return pack_weight(w)


def pack_weight(w: torch.Tensor) -> torch.Tensor:
    """w [O, I] blocked into oneDNN's layout for ``packed_linear``, unconditionally (``packed_weight`` decides
    whether to): the one call of PyTorch's private ``torch.ops.mkldnn`` reorder op."""
    return torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), 256)  # 256: a row-count hint for the layout


PACKING_MARGIN = 1.15  # oneDNN's packed float32 product must be at least this much faster than F.linear


@functools.cache
def _packing_available(dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether this PyTorch blocks and multiplies ``dtype`` weights with oneDNN's ops (tried once, on a tiny
    one)."""
    try:
        w = torch.eye(16, dtype=dtype)
        x = torch.ones(2, 16, dtype=dtype)
        y = packed_linear(x, pack_weight(w), None)
        return bool(torch.backends.mkldnn.is_available()) and torch.equal(y, x)
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


@functools.cache
def float32_packing_speedup() -> float:
    """F.linear's time over oneDNN's packed float32 product on this CPU (0.0 where packing is not
    available): the best of 5 alternating calls each of a [64, 512] x [512, 4096] product (about 50 ms in
    all), measured once per process, on the first float32 weight a search or validation pass would pack.
    On the AVX2-only AMD EPYC of docs/benchmarks.md oneDNN's was 1.3-2x faster at decoding's shapes."""
    if not _packing_available(torch.float32):
        return 0.0
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(64, 512, generator=g), torch.randn(4096, 512, generator=g)
    packed = pack_weight(w)
    fns = {"plain": lambda: F.linear(x, w), "packed": lambda: packed_linear(x, packed, None)}
    best = dict.fromkeys(fns, math.inf)
    with torch.no_grad():
        for fn in fns.values():
            fn()  # oneDNN builds its kernel on the first call
        for _ in range(5):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - t0)
    return best["plain"] / best["packed"]


def packs_float32() -> bool:
    """Whether ``packed_weight`` packs float32 weights on this CPU (measured once per process, unless
    ``pin_kernel_choices`` gave the choice)."""
    if not _packing_available(torch.float32):
        return False
    pinned = _PINNED.get("float32_packing")
    return pinned if pinned is not None else float32_packing_speedup() >= PACKING_MARGIN


_PINNED: dict[str, bool] = {}  # measured kernel choices given instead (pin_kernel_choices)
_PIN_NOTE: dict[str, object] = {}  # where the pinned choices came from, for the log (pin_kernel_choices)
KERNEL_CHOICES = ("sigmoid_tanh", "float32_packing")
KEPT_ON_RESUME = "this run's choice, kept on resume"


def kernel_choices() -> dict[str, bool]:
    """This process's measured kernel choices (measuring them now if not yet done), as a training checkpoint
    stores them: tanh as 2σ(2x) − 1 in the step loops (``uses_sigmoid_tanh``), float32 products over packed
    weights in gradient-free passes (``packs_float32``). Each is a measurement that a busy machine can tip
    the other way, so a resumed run (and every rank of a distributed one) takes the run's own choices
    (``pin_kernel_choices``) and computes as the run it continues did."""
    return {"sigmoid_tanh": uses_sigmoid_tanh(), "float32_packing": packs_float32()}


def measured_speedups() -> dict[str, float]:
    """What ``kernel_choices`` decides from, measured in this process: ``sigmoid_tanh_speedup`` and
    ``float32_packing_speedup`` (0.0 where oneDNN cannot pack float32 weights)."""
    return {"sigmoid_tanh": sigmoid_tanh_speedup(), "float32_packing": float32_packing_speedup()}


def choices_from_speedups(speedups: dict[str, float]) -> dict[str, bool]:
    """``measured_speedups`` (now, or read from a cache) as the choices ``kernel_choices`` makes from them."""
    return {
        "sigmoid_tanh": speedups["sigmoid_tanh"] >= SIGMOID_TANH_MARGIN,
        "float32_packing": _packing_available(torch.float32) and speedups["float32_packing"] >= PACKING_MARGIN,
    }


def pin_kernel_choices(
    choices: dict[str, bool], note: str = KEPT_ON_RESUME, speedups: dict[str, float] | None = None
) -> None:
    """Take these ``kernel_choices`` in this process instead of measuring, replacing earlier pins (a sweep
    runs its jobs in one process); other keys are ignored, a missing one is measured. Call before the model
    is built: its tanh is chosen when it is. ``note`` and ``speedups`` are for the log lines
    (``describe_tanh``, ``describe_packing``): where the choices came from (a resume, a cached measurement)
    and the measurement behind them, when known."""
    _PINNED.clear()
    _PINNED.update({k: bool(v) for k, v in choices.items() if k in KERNEL_CHOICES})
    _PIN_NOTE.clear()
    _PIN_NOTE.update(note=note, speedups=speedups or {})


def describe_packing() -> str:
    """One line for the log: how a search's float32 products run on the CPU fast path, and why."""
    if not _packing_available(torch.float32):
        return "F.linear (oneDNN cannot pack float32 weights in this PyTorch)"
    note = None
    if _PINNED.get("float32_packing") is not None:
        speedup, note = _PIN_NOTE["speedups"].get("float32_packing"), _PIN_NOTE["note"]
        if speedup is None:
            return f"{'oneDNN packed weights' if packs_float32() else 'F.linear'} ({note})"
    else:
        speedup = float32_packing_speedup()
    if packs_float32():
        line = f"oneDNN packed weights (measured {speedup:.2f}x as fast as F.linear on this CPU"
    else:
        line = f"F.linear (oneDNN packed weights measured {speedup:.2f}x its speed, below the {PACKING_MARGIN}x needed"
    return line + (f"; {note})" if note else ")")


ROW_GRID = 32  # packed products of more than 2 * ROW_GRID rows run on a multiple of this many (row_grid)


def row_grid(rows: int) -> int:
    """The rows a packed product of ``rows`` rows runs on: ``rows`` up to 2 * ROW_GRID, else ``rows`` rounded
    up to a multiple of ROW_GRID. oneDNN builds a kernel for every row count it has not seen (2-4 ms each on
    an AMX Xeon, more than the product itself); a search's row count changes at almost every step, as
    sentences leave it, so a whole valid.tsv spent about a tenth of its time building kernels. On the grid
    the same few row counts recur (docs/benchmarks.md, "Run 31"), for at most ROW_GRID - 1 rows of padding."""
    return rows if rows <= 2 * ROW_GRID else -(-rows // ROW_GRID) * ROW_GRID


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [.., I] → x Wᵀ + b [.., O], W from ``packed_weight``; x, b and the result in W's dtype. A matrix x
    [N, I] runs on ``row_grid(N)`` rows (zero rows below it, cut off the result): every row's result is the
    same either way, bit for bit (tests/test_fast_search.py)."""
    rows = x.size(0) if x.dim() == 2 else 0
    grid = row_grid(rows)
    if grid != rows:
        return torch.ops.mkldnn._linear_pointwise(F.pad(x, (0, 0, 0, grid - rows)), packed, bias, "none", [], "")[:rows]
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class CastLinear:
    """x [.., I] → x Wᵀ + b [.., O] for passes without autograd (search, validation): W and b cast to
    ``dtype`` once, when the pass starts, instead of at every call as autocast does (for an 8,000-way
    vocabulary projection that cast is ~7% of a bf16 search step). The product comes out in ``dtype``,
    or in ``out_dtype`` when given. ``pack`` (the ``loop`` implementation's search and validation): the
    weight is also blocked once for oneDNN where ``packed_weight`` allows (bf16 where PyTorch can; float32
    where oneDNN's product measured faster than F.linear on this CPU).
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
        out_dtype: torch.dtype | None = None,
        pack: bool = False,
    ):
        self.w = weight.detach().to(dtype)
        self.b = None if bias is None else bias.detach().to(dtype)
        self.out_dtype = out_dtype
        self.packed = packed_weight(self.w) if pack else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.w.dtype)
        y = F.linear(x, self.w, self.b) if self.packed is None else packed_linear(x, self.packed, self.b)
        return y if self.out_dtype is None else y.to(self.out_dtype)


class EagerLinear:
    """x [.., I] → x Wᵀ + b [.., O] with ordinary autograd (∂W accumulated per step): the plain
    version of ``StepLinear``, with the same interface and the same once-per-pass cast."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, dtype: torch.dtype | None = None):
        self.bias = bias
        self.w = weight.to(dtype or weight.dtype)  # differentiable cast, once per pass

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x.to(self.w.dtype), self.w).to(x.dtype)
        return y if self.bias is None else y + self.bias


def _sigmoid_tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.mul(x, 2.0).sigmoid_().mul_(2.0).sub_(1.0)


class _SigmoidTanh(torch.autograd.Function):
    """tanh(x) = 2σ(2x) − 1 forward; backward (1 − y²)·g from the output, as torch.tanh's."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        y = _sigmoid_tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(g, y)


def sigmoid_tanh(x: torch.Tensor) -> torch.Tensor:
    """tanh through the logistic function, tanh(x) = 2σ(2x) − 1, on float32 CPU tensors (torch.tanh on
    others: in bf16 the −1 would cancel most of a small value's bits): the same function to within float32
    rounding (≤ 2·10⁻⁷ apart), with torch.tanh's gradient. PyTorch's
    CPU ``sigmoid`` kernel is several times faster than its ``tanh``: on 1M floats (AMD EPYC, 2 cores)
    0.20 ms for the four passes here against 1.07 ms, and the additive attention's tanh alone was ~7% of
    a model R training step (docs/benchmarks.md). One vectorised pass each: x·2, σ, ·2, −1."""
    if x.device.type != "cpu" or x.dtype != torch.float32:
        return torch.tanh(x)
    return _SigmoidTanh.apply(x) if torch.is_grad_enabled() and x.requires_grad else _sigmoid_tanh(x)


SIGMOID_TANH_MARGIN = 1.2  # sigmoid_tanh must be at least this much faster than torch.tanh to be used


@functools.cache
def sigmoid_tanh_speedup() -> float:
    """torch.tanh's time over ``sigmoid_tanh``'s on this CPU: the best of 6 alternating calls each on
    2¹⁸ floats (about 10 ms in all), measured once per process (with its own generator: the global
    random state, and so a seeded run, stays as it was)."""
    x = torch.randn(1 << 18, generator=torch.Generator().manual_seed(0))
    best = {torch.tanh: math.inf, sigmoid_tanh: math.inf}
    with torch.no_grad():
        for _ in range(6):
            for fn in best:
                t0 = time.perf_counter()
                fn(x)
                best[fn] = min(best[fn], time.perf_counter() - t0)
    return best[torch.tanh] / best[sigmoid_tanh]


def tanh_kernel(impl: str, device: Any = "cpu") -> Callable[[torch.Tensor], torch.Tensor]:
    """The tanh of a model whose RNNs run as ``impl`` on ``device`` (the cells, the additive attention's
    scores, the readout / combine): ``sigmoid_tanh`` for the CPU step loops (``loop`` on the CPU) when
    measured at least ``SIGMOID_TANH_MARGIN`` faster on this CPU, ``torch.tanh`` otherwise (the plain
    version). Off the CPU (layer-norm cells run the loop on a GPU too) nothing is measured: the host CPU's
    speed says nothing about a GPU's tanh."""
    if impl != "loop" or torch.device(device).type != "cpu":
        return torch.tanh
    return sigmoid_tanh if uses_sigmoid_tanh() else torch.tanh


def uses_sigmoid_tanh() -> bool:
    """Whether the CPU step loops compute tanh as 2σ(2x) − 1: measured at least ``SIGMOID_TANH_MARGIN``
    faster on this CPU, unless ``pin_kernel_choices`` gave the choice."""
    pinned = _PINNED.get("sigmoid_tanh")
    return pinned if pinned is not None else sigmoid_tanh_speedup() >= SIGMOID_TANH_MARGIN


def describe_tanh(tanh: Callable[[torch.Tensor], torch.Tensor], device: Any = "cpu") -> str:
    """One line for the log: which tanh a model on ``device`` computes (``tanh_kernel``), and why. A model
    built for a GPU holds ``torch.tanh`` and nothing was measured for it; the line says why."""
    if torch.device(device).type != "cpu":
        return f"torch.tanh (on {torch.device(device).type}; 2σ(2x) − 1 is a CPU kernel choice)"
    pinned = _PINNED.get("sigmoid_tanh")
    if pinned is not None:
        if pinned and tanh is not sigmoid_tanh:  # eager/cudnn: the plain version, whatever the CPU measured
            return "torch.tanh"
        return tanh_line(pinned, _PIN_NOTE["speedups"].get("sigmoid_tanh"), _PIN_NOTE["note"])
    measured = sigmoid_tanh_speedup() if sigmoid_tanh_speedup.cache_info().currsize else None
    return tanh_line(tanh is sigmoid_tanh, measured)


def tanh_line(formula: bool, measured: float | None, note: str | None = None) -> str:
    """``describe_tanh``'s words: ``formula`` whether the model computes 2σ(2x) − 1, ``measured`` its speed
    against torch.tanh on this CPU, or None where nothing was measured (CUDA, ``eager``/``cudnn``, a resume);
    ``note``: where a pinned choice came from (``pin_kernel_choices``)."""
    end = f"; {note})" if note else ")"
    if measured is None:
        name = "2σ(2x) − 1" if formula else "torch.tanh"
        return f"{name} ({note})" if note else name
    if formula:
        return f"2σ(2x) − 1 (measured {measured:.1f}x as fast as torch.tanh on this CPU{end}"
    if measured >= SIGMOID_TANH_MARGIN:  # kept for another reason (eager, cudnn)
        return "torch.tanh"
    return (
        f"torch.tanh (2σ(2x) − 1 measured {measured:.2f}x its speed on this CPU, "
        f"below the {SIGMOID_TANH_MARGIN}x it needs{end}"
    )


def dropout_layer(p: float, impl: str) -> nn.Module:
    """A dropout layer (Srivastava et al. 2014) for a model whose RNNs run as ``impl``: ``MaskDropout`` for
    the CPU step loops (``loop``), ``nn.Dropout`` otherwise (the plain version)."""
    return MaskDropout(p) if impl == "loop" else nn.Dropout(p)


class MaskDropout(nn.Module):
    """Inverted dropout, x ⊙ m / (1 - p) with m ~ Bernoulli(1 - p), the mask cut from random bits.

    On CPU each element reads 16 of the bits of a 64-bit random word from the default generator
    (so ``torch.manual_seed`` and a checkpoint's RNG state reproduce it), a quarter of the draws of
    ``bernoulli_``: p is then a multiple of 2⁻¹⁶ (0.1 drops 6,554 of 65,536 values). Autograd keeps the
    scaled mask for backward, as ``F.dropout`` does. On other devices, ``F.dropout``.
    """

    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p

    def extra_repr(self) -> str:
        return f"p={self.p}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, True)
        n = x.numel()
        words = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None)  # 64 random bits each
        keep = words.view(torch.int16)[:n].view(x.shape) >= -32768 + round(self.p * 65536)  # P = 1 - p
        return x * keep.to(x.dtype).mul_(1.0 / (1.0 - self.p))


def rnn_cell(
    gx: torch.Tensor,
    gh: torch.Tensor,
    h: torch.Tensor,
    c: torch.Tensor | None,
    norm_c: Callable[[torch.Tensor], torch.Tensor] | None = None,
    tanh: Callable[[torch.Tensor], torch.Tensor] = torch.tanh,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One GRU (c is None) or LSTM step from input gates gx and hidden gates gh [B, G*H]
    (PyTorch's equations and gate order, so nn.GRU/nn.LSTM weights plug in unchanged).
    ``norm_c``: the LN-LSTM's cell norm, h_t = σ(o) ⊙ tanh(LN(c_t)) (Ba et al. 2016); c_t itself
    is carried unnormalised. ``tanh``: the model's (``tanh_kernel``)."""
    if c is not None:
        i, f, g, o = (gx + gh).chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * tanh(g)
        return torch.sigmoid(o) * tanh(c if norm_c is None else norm_c(c)), c
    xr, xz, xn = gx.chunk(3, dim=1)
    hr, hz, hn = gh.chunk(3, dim=1)
    r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
    n = tanh(xn + r * hn)
    return n + z * (h - n), None


class LayerNorm:
    """x [.., N] → LN(x) · gain + shift over the last dimension (Ba et al. 2016, eq. 4), with
    parameters that live elsewhere (the RNN's): a plain callable, made per pass like the products."""

    def __init__(self, gain: torch.Tensor, shift: torch.Tensor | None):
        self.gain, self.shift = gain, shift

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], self.gain, self.shift)


class Normed:
    """A product, then layer norm: x → LN(x Wᵀ) · g + b [.., G*H]: layer-normalised gate
    pre-activations whose shift is the cell's own bias (Ba et al. 2016, §3.1)."""

    def __init__(self, product: Callable[[torch.Tensor], torch.Tensor], norm: LayerNorm):
        self.product, self.norm = product, norm

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.product(x))


@dataclass
class StepWeights:
    """One pass's products of a step-by-step RNN (a teacher-forced pass, or a whole search).

    Opaque to callers: made by ``RNN.step_weights``, used by ``RNN.input_gates``/``RNN.step``.
    Batch-independent, so a search reuses it at every step and every beam reordering.
    """

    first: Any  # layer 0's first ``split`` input columns (+ the input bias), hoistable over steps
    rest: Any | None  # layer 0's remaining input columns (context / fed vector), or None
    ih: list  # input products of layers 1..L-1
    hh: list  # hidden products of every layer
    # Layer norm only: layer 0's input norm (applied to first + rest, so per step when rest exists) and
    # each layer's LSTM cell norm (None entries without).
    norm0: LayerNorm | None = None
    cell_norms: list | None = None


class RNN(nn.RNNBase):
    """A stacked (bi)directional GRU/LSTM (batch first), computed by the implementation ``impl``.

    Its parameters are exactly an ``nn.GRU``/``nn.LSTM``'s (same names, shapes and gate order), so
    ``nn.GRU.forward``/``nn.LSTM.forward`` run on it unchanged (cuDNN on GPU). ``layer_norm`` adds
    the layer-norm gains (module docstring) and runs every implementation as step loops. ``tanh``: the
    step loops' tanh, chosen for the device by ``tanh_kernel(impl, device)`` (the default: for the CPU).
    """

    def __init__(
        self,
        cell: str,
        input_size: int,
        hidden_size: int,
        layers: int,
        dropout: float,
        bidirectional: bool,
        impl: str,
        layer_norm: bool = False,
        tanh: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        if impl not in IMPLS[1:]:
            raise ValueError(f"RNN impl {impl!r}: resolve it first (resolve_impl)")
        if impl == "cudnn" and layer_norm:
            raise ConfigError(CUDNN_LAYER_NORM)
        super().__init__(
            cell.upper(),
            input_size,
            hidden_size,
            num_layers=layers,
            batch_first=True,
            dropout=dropout if layers > 1 else 0.0,
            bidirectional=bidirectional,
        )
        self.impl, self.lstm, self.layer_norm = impl, cell == "lstm", layer_norm
        self.drop = dropout_layer(self.dropout, impl)  # between layers, in the step loops
        self.tanh = tanh_kernel(impl) if tanh is None else tanh  # the cells' tanh in the step loops
        # Dtype of the loops' products (None = the surrounding one); only Seq2Seq.set_matmul_dtype
        # sets it. The weights are cast once per pass; state and gate maths stay float32.
        self.matmul_dtype: torch.dtype | None = None
        # Decoding only: another maker of the step products (weight, bias, dtype) → callable, set by
        # nmt.models.quant.quantize for int8 CPU decoding; None = this module's own (below).
        self.product: Any | None = None
        if layer_norm:
            gates = self.weight_hh_l0.size(0)  # G·H
            for layer in range(layers):
                for sfx in ("", "_reverse") if bidirectional else ("",):
                    self.register_parameter(f"ln_ih_l{layer}{sfx}", nn.Parameter(torch.ones(gates)))
                    self.register_parameter(f"ln_hh_l{layer}{sfx}", nn.Parameter(torch.ones(gates)))
                    if self.lstm:
                        self.register_parameter(f"ln_c_l{layer}{sfx}", nn.Parameter(torch.ones(hidden_size)))
                        self.register_parameter(f"ln_c_bias_l{layer}{sfx}", nn.Parameter(torch.zeros(hidden_size)))

    def reset_layer_norm(self, gain: float = 1.0) -> None:
        """Gains ``gain`` (Ba et al. 2016: 1), cell-norm shifts 0: the start, after a model-wide
        initialisation."""
        for name, p in self.named_parameters():
            if name.startswith("ln_"):
                nn.init.constant_(p, 0.0 if name.startswith("ln_c_bias") else gain)

    def reset_forget_bias(self, value: float) -> None:
        """An LSTM's forget gates start with bias ``value`` (PyTorch's gate order i, f, g, o: rows
        H..2H): b_ih's slice is ``value`` and b_hh's 0, so σ(f) starts near σ(value)."""
        h = self.hidden_size
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.startswith(("bias_ih", "bias_hh")):
                    p[h : 2 * h] = value if name.startswith("bias_ih") else 0.0

    @property
    def _torch(self) -> type[nn.RNNBase]:
        return nn.LSTM if self.lstm else nn.GRU

    def forward(self, x: torch.Tensor, hx: RNNState | None = None):
        """nn.GRU/nn.LSTM's forward (x [B, T, I] or packed) on these parameters; with layer norm,
        x [B, T, I] only (every sequence full length), through the step loops."""
        if self.layer_norm:
            return self._step_loop(x, torch.full((x.size(0),), x.size(1), device=x.device), hx)
        return self._torch.forward(self, x, hx)

    # nn.LSTM's forward calls these LSTM-specific overrides (a pair of states).
    def get_expected_cell_size(self, input, batch_sizes):  # noqa: A002
        return self._torch.get_expected_cell_size(self, input, batch_sizes)

    def check_forward_args(self, input, hidden, batch_sizes):  # noqa: A002
        return self._torch.check_forward_args(self, input, hidden, batch_sizes)

    def permute_hidden(self, hx, permutation):
        return self._torch.permute_hidden(self, hx, permutation)

    def linear(self, layer: nn.Linear):
        """Another module's linear layer as this RNN's implementation computes a product, in its product
        dtype (``matmul_dtype``; the result in the input's dtype): ``StepLinear`` for ``loop``, ``EagerLinear``
        otherwise. For a layer used once or at every step of a pass, like the RNN's own weights."""
        return self._linear(layer.weight, layer.bias)

    def _linear(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        if self.product is not None:
            return self.product(weight, bias, self.matmul_dtype)
        cls = EagerLinear if self.impl == "eager" else StepLinear
        return cls(weight, bias, self.matmul_dtype)

    def _w(self, name: str, layer: int, reverse: bool = False) -> torch.Tensor:
        return getattr(self, f"{name}_l{layer}{'_reverse' if reverse else ''}")

    def _norm(self, kind: str, layer: int, reverse: bool = False) -> LayerNorm | None:
        """Layer ``layer``'s norm of the ``ih``/``hh`` gate pre-activations (shifted by that bias), or
        of the LSTM cell (``c``); None without layer norm (or for ``c`` in a GRU)."""
        if not self.layer_norm or (kind == "c" and not self.lstm):
            return None
        shift = self._w("ln_c_bias" if kind == "c" else f"bias_{kind}", layer, reverse)
        return LayerNorm(self._w(f"ln_{kind}", layer, reverse), shift)

    def _gates(self, kind: str, layer: int, reverse: bool = False):
        """x → layer ``layer``'s ``ih``/``hh`` gate pre-activations [.., G*H]: W x + b, or with layer
        norm LN(W x; g) + b."""
        weight, bias = self._w(f"weight_{kind}", layer, reverse), self._w(f"bias_{kind}", layer, reverse)
        norm = self._norm(kind, layer, reverse)
        return self._linear(weight, bias) if norm is None else Normed(self._linear(weight), norm)

    # ---- the encoder: whole padded sentences ----
    def encode(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, RNNState]:
        """x [B, S, I], lengths [B] → outputs [B, S, D·H] (0 at padding), final states [L·D, B, H].

        ``loop`` runs explicit step loops: on CPUs PyTorch's packed RNN backward zero-fills and adds
        a full [N, G*H] input-gate gradient per time step, which the loop avoids (about twice as
        fast for model R's encoder, docs/benchmarks.md). The others call nn.GRU/nn.LSTM, except
        with layer norm, which only the step loops compute.
        """
        if self.impl == "loop" or self.layer_norm:
            return self._step_loop(x, lengths)
        return self._packed(x, lengths)

    def _packed(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, RNNState]:
        """nn.GRU/nn.LSTM over packed sequences: → outputs [B, S, D·H] (0 at padding), final states."""
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, final = self(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.size(1))  # [B, S, D·H]
        return out, final

    def _step_loop(
        self, x: torch.Tensor, lengths: torch.Tensor, hx: RNNState | None = None
    ) -> tuple[torch.Tensor, RNNState]:
        """The same RNN as explicit step loops; the same outputs and final states as ``_packed``.
        The backward direction runs over each sentence reversed within its length, so padding
        only ever follows a sentence and no step needs a mask. ``hx``: initial states [L·D, B, H]
        (a pair for LSTM), zeros when None."""
        b, s, _ = x.shape
        last = (lengths.to(x.device) - 1).unsqueeze(1)  # [B, 1] position of each sentence's last token
        pos = torch.arange(s, device=x.device).unsqueeze(0)  # [1, S]
        rev = torch.where(pos <= last, last - pos, pos).unsqueeze(-1)  # [B, S, 1] reversal within length
        real = (pos <= last).unsqueeze(-1)  # [B, S, 1]
        h0, c0 = hx if self.lstm and hx is not None else (hx, None)

        def flip(t: torch.Tensor) -> torch.Tensor:  # [B, S, X], its own inverse
            return t.gather(1, rev.expand_as(t))

        rows, finals_h, finals_c = torch.arange(b, device=x.device), [], []
        for layer in range(self.num_layers):
            outs = []
            for reverse in (False, True) if self.bidirectional else (False,):
                gx = self._gates("ih", layer, reverse)(flip(x) if reverse else x)  # hoisted over all steps
                hh, norm_c = self._gates("hh", layer, reverse), self._norm("c", layer, reverse)
                k = len(finals_h)  # this layer and direction's index in [L·D]
                h = x.new_zeros(b, self.hidden_size) if h0 is None else h0[k]
                c = (torch.zeros_like(h) if c0 is None else c0[k]) if self.lstm else None
                hs, cs = [], []
                for gx_t in gx.unbind(1):
                    h, c = rnn_cell(gx_t, hh(h), h, c, norm_c, self.tanh)
                    hs.append(h)
                    cs.append(c)
                out = torch.stack(hs, 1)  # [B, S, H] in this direction's order
                finals_h.append(out[rows, last.squeeze(1)])
                if self.lstm:
                    finals_c.append(torch.stack(cs, 1)[rows, last.squeeze(1)])
                outs.append(flip(out) if reverse else out)
            x = torch.cat(outs, -1) * real  # [B, S, D·H], 0 at padding like pad_packed_sequence
            if layer + 1 < self.num_layers:
                x = self.drop(x)
        h = torch.stack(finals_h)  # [L·D, B, H]: layer by layer, forward then backward, as nn.GRU orders them
        return x, ((h, torch.stack(finals_c)) if self.lstm else h)

    # ---- a decoder without step dependencies: whole target sequences in one call ----
    def sequence(self, x: torch.Tensor, hx: RNNState | None = None) -> tuple[torch.Tensor, RNNState]:
        """x [B, T, I], every row run for all T steps (a teacher-forced target: what follows a sentence's
        end is never read), hx initial states [L, B, H] → (outputs [B, T, H], final states).

        ``loop`` runs the step loops, so the products are in the product dtype (bf16 on CPUs with matrix
        units: PyTorch's CPU GRU/LSTM computes in float32 only) with one weight gradient per pass; the
        others call nn.GRU/nn.LSTM once (cuDNN on GPU).
        """
        if self.impl == "loop":
            return self._step_loop(x, torch.full((x.size(0),), x.size(1), device=x.device), hx)
        return self(x, hx)  # nn.GRU/nn.LSTM's forward (the step loops with layer norm)

    # ---- the decoder: one step at a time ----
    def step_weights(self, split: int | None = None) -> StepWeights:
        """This pass's products for ``step``. ``split`` cuts layer 0's input in two, [first; rest]
        (e.g. embedding | context), so the first part's gates can be computed for all steps at once
        (with layer norm, only the product: the norm needs the whole sum, so it runs per step)."""
        w0, b0, norm0 = self._w("weight_ih", 0), self._w("bias_ih", 0), self._norm("ih", 0)
        return StepWeights(
            first=self._linear(w0[:, :split], b0 if norm0 is None else None),
            rest=None if split is None or split == self.input_size else self._linear(w0[:, split:]),
            ih=[self._gates("ih", k) for k in range(1, self.num_layers)],
            hh=[self._gates("hh", k) for k in range(self.num_layers)],
            norm0=norm0,
            cell_norms=[self._norm("c", k) for k in range(self.num_layers)],
        )

    def first_gates(self, sw: StepWeights, first: torch.Tensor) -> torch.Tensor:
        """Layer 0's input gates from the first input part: [.., split] → [.., G*H] (any leading
        shape, e.g. [B, T, E] for all steps of a teacher-forced pass at once)."""
        gx = sw.first(first)
        return sw.norm0(gx) if sw.norm0 is not None and sw.rest is None else gx

    def step(
        self, sw: StepWeights, gx_first: torch.Tensor, hidden: RNNState, rest: torch.Tensor | None = None
    ) -> RNNState:
        """Advance every layer one step (unidirectional): gx_first [B, G*H] from ``first_gates``, rest
        [B, I - split] this step's remaining input (None when there is none), hidden [L, B, H]
        (a pair for LSTM) → the new hidden."""
        hs, cs = hidden if self.lstm else (hidden, None)
        new_h, new_c = [], []
        gx = gx_first if rest is None else gx_first + sw.rest(rest)
        if sw.norm0 is not None and sw.rest is not None:
            gx = sw.norm0(gx)
        for layer in range(self.num_layers):
            c, norm_c = None if cs is None else cs[layer], sw.cell_norms[layer] if sw.cell_norms else None
            h, c = rnn_cell(gx, sw.hh[layer](hs[layer]), hs[layer], c, norm_c, self.tanh)
            new_h.append(h)
            new_c.append(c)
            if layer + 1 < self.num_layers:
                gx = sw.ih[layer](self.drop(h))
        h_out = torch.stack(new_h)
        return (h_out, torch.stack(new_c)) if self.lstm else h_out
