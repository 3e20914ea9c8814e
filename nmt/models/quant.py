"""int8 CPU decoding (``quantize=int8``): the decoder's linear and recurrent products in int8.

Dynamic quantisation (Jacob et al. 2018, "Quantization and Training of Neural Networks for
Efficient Integer-Arithmetic-Only Inference"): each weight [O, I] is quantised once, symmetric
int8 per output row (scale_o = max|W_o| / 127); each activation x [N, I] is quantised when it
arrives, asymmetric per tensor; the int8 × int8 product accumulates in int32 and is rescaled to
float32 (+ bias) inside the kernel. State, gate maths, attention and softmax stay float32.

Applied at load time by ``quantize(model, mode)`` (nmt.runtime): the decoder's ``nn.Linear``
products (vocabulary projection, readout / Luong combine) become ``QuantLinear``, and its RNN's
step products (``RNN.product``) ``Int8Linear``. The plain model is untouched: training and
``quantize=none`` never come here. CPU only (``check`` refuses CUDA before anything loads).

Why this kernel path (torch 2.13.0, read from the installed build):

* ``torch.ao.quantization.quantize_dynamic`` (eager) warns that torch.ao.quantization is
  deprecated and will be removed, and the quantised-tensor types under it (``torch.qint8``,
  ``quantize_per_tensor``, the ``quantized::linear_dynamic`` packed params) warn that they will be
  removed too (pytorch issue 184982). Not used.
* ``torch._int_mm`` and ``aten._weight_int8pack_mm`` are plain-tensor ops, but on this CPU build
  they run reference loops: 8-40x slower than the float32 GEMM for a [400, 192] x [192, 4000]
  vocabulary projection (200-330 ms against 24 ms, AMD EPYC, AVX2).
* torchao (the named successor) runs its int8 layouts on CPU through ``torch._int_mm`` in eager
  mode and needs ``torch.compile`` to be fast, and its wheels are built against particular torch
  releases: a second moving dependency for one kernel.
* ``torch.ops.onednn.qlinear_prepack`` / ``qlinear_pointwise``: oneDNN's int8 matmul on plain
  int8/uint8 tensors (no quantised tensor types), the ops that Inductor's x86 int8 lowering and
  torchao's x86 PT2E path emit, so they live as long as those do. 1.5-2x the float32 GEMM at
  batched decoding's shapes on the same EPYC (slower at a few rows, where quantising x costs more
  than it saves). Used here, behind ``available()``.

On CPUs without VNNI (AVX2 only) oneDNN multiplies u8 × s8 with ``vpmaddubsw``, whose int16
pair sums saturate for 8-bit activations (outputs wrong by hundreds in a test); activations are
therefore quantised to 7 bits (0..127), fbgemm's ``reduce_range`` for the same reason. This
costs a bit of activation precision on every CPU but keeps one code path.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from nmt.errors import ConfigError

MODES = ("none", "int8")
_ACT_LEVELS = 127  # 7-bit activations: no int16 saturation without VNNI (module docstring)


def available() -> bool:
    """Whether this torch build has oneDNN's int8 linear ops (x86 CPU builds do)."""
    return hasattr(torch.ops.onednn, "qlinear_pointwise") and torch.backends.mkldnn.is_available()


def check(mode: str, device: torch.device) -> None:
    """Refuse, before a model is loaded, a ``quantize`` value this device/build cannot run."""
    if mode not in MODES:
        raise ConfigError(f"quantize={mode!r} is unknown; choose one of {', '.join(MODES)}")
    if mode == "none":
        return
    if torch.device(device).type != "cpu":
        raise ConfigError(f"quantize={mode} runs on CPU only (device={device}); use device=cpu or quantize=none")
    if not available():
        raise ConfigError(f"quantize={mode}: this torch build has no oneDNN int8 kernels; use quantize=none")


class Int8Linear:
    """x [.., I] float32 → x Wᵀ + b [.., O] float32 through an int8 × int8 → int32 product.

    W is quantised once here (symmetric int8 per output row) and packed for oneDNN; x is
    quantised per call (asymmetric per tensor, 7 bits).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        w = weight.detach().float()
        self.out_features = w.size(0)
        self.scale = (w.abs().amax(1) / 127).clamp(min=1e-12)  # [O]
        wq = (w / self.scale[:, None]).round().clamp(-127, 127).to(torch.int8)
        self.packed = torch.ops.onednn.qlinear_prepack(wq, None)
        self.zero = torch.zeros(self.out_features, dtype=torch.long)
        self.bias = None if bias is None else bias.detach().float().contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x = x.reshape(-1, x.size(-1)).float()
        lo, hi = torch.aminmax(x)
        lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)  # the range holds 0 exactly (padding, ReLU-free zeros)
        scale = max(hi - lo, 1e-8) / _ACT_LEVELS
        zp = round(-lo / scale)
        xq = (x * (1.0 / scale)).add_(zp).round_().clamp_(0, _ACT_LEVELS).to(torch.uint8)
        y = torch.ops.onednn.qlinear_pointwise(
            xq, scale, zp, self.packed, self.scale, self.zero, self.bias, 1.0, 0, torch.float32, "none", [], ""
        )
        return y.reshape(*lead, self.out_features)


class QuantLinear(nn.Module):
    """An ``nn.Linear`` in int8 for decoding (``Int8Linear`` as a module, so it sits where the
    Linear sat)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.product = Int8Linear(linear.weight, linear.bias)
        # float rows kept for shortlists (rows); quantising per row makes a subset's int8 rows the same
        self.weight = linear.weight.detach()
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.product(x)

    def rows(self, vocab: torch.Tensor) -> Int8Linear:
        """The rows ``vocab`` as an int8 product (a search's shortlist, nmt.shortlist): each row is
        quantised on its own, so these equal the full product's rows."""
        bias = None if self.bias is None else self.bias.index_select(0, vocab)
        return Int8Linear(self.weight.index_select(0, vocab), bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


class Int8Products:
    """``RNN.product`` for int8: weight (or a column slice of it), bias → an ``Int8Linear``.

    ``RNN.step_weights`` runs once per search and slices the same parameters every time, so the
    quantised products are kept by (storage address, offset, shape, stride) and made once.
    """

    def __init__(self) -> None:
        self.cache: dict[tuple, Int8Linear] = {}

    def __call__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, dtype: Any = None) -> Int8Linear:
        key = (
            weight.untyped_storage().data_ptr(),
            weight.storage_offset(),
            tuple(weight.shape),
            weight.stride(),
            None if bias is None else bias.data_ptr(),
        )
        if key not in self.cache:
            self.cache[key] = Int8Linear(weight, bias)
        return self.cache[key]


def _decoders(model: nn.Module) -> list[nn.Module]:
    from nmt.models.decoder import Decoder

    return [m for m in model.modules() if isinstance(m, Decoder)]


def quantize(model: nn.Module, mode: str = "int8") -> nn.Module:
    """Put every decoder of ``model`` (a Seq2Seq, or each member of an Ensemble) on int8 products,
    in place, for decoding on CPU; ``mode="none"`` returns the model as it is."""
    if mode == "none":
        return model
    check(mode, next(model.parameters()).device)
    for dec in _decoders(model):
        for name, child in list(dec.named_children()):
            if type(child) is nn.Linear:  # out, readout (Bahdanau order) / combine (Luong order)
                setattr(dec, name, QuantLinear(child))
        dec.rnn.product = Int8Products()
    return model.eval()
