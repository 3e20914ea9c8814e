"""Label-smoothed cross-entropy over the vocabulary, fused and chunked.

The loss touches the largest tensor of a training step, the logits [N, V]. Written with
``F.cross_entropy`` it upcasts them to float32, keeps a float32 log-softmax for backward,
then builds the gradient from three more [N, V] float32 temporaries (the NLL's one-hot,
the smoothing term, their sum) and casts it back: each a 64 MB pass over memory at model
R's batch, allocated afresh every step. Here the rows are processed in chunks that stay in
cache, and the gradient, which for a scalar loss is known once the forward is done, is
written straight into one buffer of the logits' dtype. Backward only scales that buffer.
"""

from __future__ import annotations

import torch


def smoothed_ce_rows(x: torch.Tensor, y: torch.Tensor, eps: float, lse: torch.Tensor | None = None) -> torch.Tensor:
    """x [n, V] float32, y [n] → per-row loss [n]; ``lse`` [n, 1], x's log-sum-exp, when the caller has it.

    loss = -(1-eps) log p_y - eps/V Σ_v log p_v = lse - (1-eps) x_y - eps/V Σ_v x_v,
    the same smoothing as ``F.cross_entropy(label_smoothing=eps)`` (uniform over all V).
    """
    if lse is None:
        lse = torch.logsumexp(x, -1, keepdim=True)  # [n, 1]
    loss = lse.squeeze(1) - (1 - eps) * x.gather(1, y.unsqueeze(1)).squeeze(1)
    if eps:
        loss = loss - (eps / x.size(1)) * x.sum(-1)
    return loss


class FusedSmoothedCE(torch.autograd.Function):
    """Summed label-smoothed CE over rows whose target is not ``ignore``; grad computed in forward.

    The saved gradient is scaled in place in backward, so the graph is single-use (no
    ``retain_graph`` double backward), which is all training needs.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, eps: float, ignore: int, chunk: int):
        grad = torch.empty_like(logits)  # [N, V]
        total = logits.new_zeros((), dtype=torch.float32)
        for rows, x, y, keep in _chunks(logits, target, ignore, chunk):
            # ∂loss/∂x = softmax(x) - (1-eps) onehot(y) - eps/V, zero on ignored rows; computed in
            # float32, in place in the gradient buffer when that is float32 too. PyTorch's fused softmax
            # kernel is about twice as fast as exp(x - max) by hand, and the log-sum-exp follows from its
            # largest entry: max_v p_v = exp(max x - lse) ≥ 1/V, so lse = max x - log max p never underflows.
            g = grad[rows]
            p = torch.ops.aten._softmax.out(x, -1, False, out=g) if g.dtype == x.dtype else torch.softmax(x, -1)
            lse = x.amax(-1, keepdim=True) - p.amax(-1, keepdim=True).log()  # [n, 1]
            total += (smoothed_ce_rows(x, y, eps, lse) * keep).sum()
            if eps:
                p.sub_(eps / x.size(1))
            p.scatter_add_(1, y.unsqueeze(1), p.new_full((p.size(0), 1), eps - 1.0))
            p.mul_(keep.unsqueeze(1))
            if p is not g:
                g.copy_(p)
        ctx.save_for_backward(grad)
        return total

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        (grad,) = ctx.saved_tensors
        return grad.mul_(g.to(grad.dtype)), None, None, None, None


def label_smoothed_nll(
    logits: torch.Tensor, target: torch.Tensor, eps: float, ignore: int, chunk: int | None = None
) -> torch.Tensor:
    """logits [N, V] (any float dtype), target [N] → summed loss over non-ignored rows (float32 scalar).

    ``chunk`` rows at a time; by default ~2 MB of float32 on CPU (stays in cache) and all rows at
    once on GPUs, where memory is plentiful and every chunk costs kernel launches.
    """
    if chunk is None:
        chunk = logits.size(0) if logits.is_cuda else (1 << 19) // logits.size(1)
    chunk = max(1, chunk)
    if torch.is_grad_enabled() and logits.requires_grad:
        return FusedSmoothedCE.apply(logits, target, eps, ignore, chunk)
    total = logits.new_zeros((), dtype=torch.float32)
    for _, x, y, keep in _chunks(logits, target, ignore, chunk):
        total += (smoothed_ce_rows(x, y, eps) * keep).sum()
    return total


def _chunks(logits: torch.Tensor, target: torch.Tensor, ignore: int, chunk: int):
    """Yield (row slice, float32 rows [n, V], targets [n] with ignored ones set to 0, keep mask [n])."""
    for s in range(0, logits.size(0), chunk):
        rows = slice(s, s + chunk)
        y = target[rows]
        keep = y != ignore
        yield rows, logits[rows].float(), y.masked_fill(~keep, 0), keep
