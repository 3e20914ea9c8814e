"""Linear layers shared by every step of a recurrent loop, with one weight gradient per pass.

Autograd treats a weight used at T time steps as T separate uses: backward runs T thin
weight-gradient GEMMs ([O, B] · [B, I]) and adds each into the accumulated gradient (plus,
for a weight that is a slice of a bigger parameter, a zero-filled full-size copy per step).
cuDNN's RNNs instead keep every step's input and compute the weight gradient once, as one
GEMM over all B·T rows. ``StepLinear`` does the same for the hand-written step loops: each
step's backward only propagates to its input and records its output gradient; a node that
autograd runs after all of them (every step depends on it) computes the weight gradient.

It can also run the products in a lower precision (bf16 on CPUs with matrix units): the
weight is cast once per pass instead of once per step, and inputs/outputs are cast at the
product only, so the recurrent state and the element-wise gate maths stay in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
        xc = x.to(w.dtype)
        ctx.w, ctx.tape, ctx.index = w, tape, len(tape.xs)
        tape.xs.append(xc.reshape(-1, xc.size(-1)))
        return F.linear(xc, w).to(x.dtype)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        gc = g.to(ctx.w.dtype)
        ctx.tape.gs[ctx.index] = gc.reshape(-1, gc.size(-1))
        return (gc @ ctx.w).to(g.dtype), None, None, None


class StepLinear:
    """x [.., I] → x Wᵀ + b [.., O], for a weight used at every step of one forward pass.

    Build one per pass (the tape belongs to that pass's graph). Without autograd (search,
    validation) it is a plain ``F.linear`` in ``dtype``.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, dtype: torch.dtype | None = None):
        self.bias = bias
        self.w = weight.detach().to(dtype or weight.dtype)  # cast once per pass
        self.taped = torch.is_grad_enabled() and weight.requires_grad
        if self.taped:
            self.tape = _Tape()
            self.token = _WeightGrad.apply(weight, self.tape)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.taped:
            y = _Step.apply(x, self.token, self.w, self.tape)
        else:
            y = F.linear(x.to(self.w.dtype), self.w).to(x.dtype)
        return y if self.bias is None else y + self.bias


def rnn_cell(
    gx: torch.Tensor, gh: torch.Tensor, h: torch.Tensor, c: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One GRU (c is None) or LSTM step from input gates gx and hidden gates gh [B, G*H]
    (PyTorch's equations and gate order, so nn.GRU/nn.LSTM weights plug in unchanged)."""
    if c is not None:
        i, f, g, o = (gx + gh).chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c
    xr, xz, xn = gx.chunk(3, dim=1)
    hr, hz, hn = gh.chunk(3, dim=1)
    r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
    n = torch.tanh(xn + r * hn)
    return n + z * (h - n), None
