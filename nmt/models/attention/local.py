"""Local attention (Luong et al. 2015, §3.2): attend to a window [p_t - D, p_t + D] only.

Within the window the weights are the softmax of any registered score (``attention.score``),
then multiplied by a Gaussian centred on p_t with σ = D/2 (eq. 10):

    a_t(s) = softmax_window(score(h_t, a_s)) · exp(-(s - p_t)² / (2σ²))

* ``local_m`` (monotonic): p_t = t, the target position (clipped to the source length).
* ``local_p`` (predictive, eq. 9): p_t = S · sigmoid(v_pᵀ tanh(W_p h_t)), S = source length.

Positions outside the window and padding get exactly zero weight; as in the paper, the
Gaussian factor is not renormalised, so a row sums to at most 1.
"""

from __future__ import annotations

import torch
from torch import nn

from nmt.errors import ConfigError
from nmt.models.attention.base import Attention, AttentionState
from nmt.models.attention.registry import ATTENTIONS, accepted_options, register, scores_alone


class LocalAttention(Attention):
    """``options``: those of the inner score (``attention.max_positions`` for ``score=location``)."""

    def __init__(self, query_size: int, key_size: int, dim: int, window: int = 5, score: str = "general", **options):
        super().__init__(query_size, key_size, dim)
        if window < 1:
            raise ConfigError(f"attention.window must be >= 1, got {window}")
        inner = ATTENTIONS.get(score)
        if inner is None or not scores_alone(inner):
            choices = sorted(k for k, c in ATTENTIONS.items() if scores_alone(c))
            raise ConfigError(f"attention.score={score!r} cannot score local attention; choose one of {choices}")
        self.inner = inner(query_size, key_size, dim, **accepted_options(inner, options))
        self.window, self.sigma = window, window / 2.0

    def project_keys(self, keys: torch.Tensor, products) -> torch.Tensor:
        return self.inner.project_keys(keys, products)  # the inner score's layers, as themselves

    def score(self, query: torch.Tensor, state: AttentionState) -> torch.Tensor:
        return self.inner.score(query, state)

    def centre(self, query: torch.Tensor, state: AttentionState) -> torch.Tensor:
        """p_t for every query: [B, T] (float)."""
        raise NotImplementedError

    def normalize(self, scores: torch.Tensor, query: torch.Tensor, state: AttentionState) -> torch.Tensor:
        p = self.centre(query, state).unsqueeze(-1)  # [B, T, 1]
        pos = torch.arange(scores.size(-1), device=scores.device, dtype=p.dtype)  # [S]
        dist = pos - p  # [B, T, S]
        inside = (dist.abs() <= self.window) & state.mask.unsqueeze(1)
        weights = torch.softmax(scores.float().masked_fill(~inside, float("-inf")), dim=-1)
        gauss = torch.exp(-(dist.float() ** 2) / (2 * self.sigma**2))
        return (weights * gauss).to(state.keys.dtype)


@register("local_m")
class LocalMonotonicAttention(LocalAttention):
    def centre(self, query: torch.Tensor, state: AttentionState) -> torch.Tensor:
        T = query.size(1)
        t = state.t + torch.arange(T, device=query.device, dtype=torch.float)  # [T]
        last = (state.src_len - 1).to(torch.float).unsqueeze(1)  # [B, 1]
        return torch.minimum(t.unsqueeze(0), last)


@register("local_p")
class LocalPredictiveAttention(LocalAttention):
    def __init__(self, query_size: int, key_size: int, dim: int, window: int = 5, score: str = "general", **options):
        super().__init__(query_size, key_size, dim, window, score, **options)
        self.W_p = nn.Linear(query_size, dim, bias=False)
        self.v_p = nn.Linear(dim, 1, bias=False)

    def centre(self, query: torch.Tensor, state: AttentionState) -> torch.Tensor:
        S = state.src_len.to(query.dtype).unsqueeze(1)  # [B, 1]
        return S * torch.sigmoid(self.v_p(torch.tanh(self.W_p(query)))).squeeze(-1)  # [B, T]
