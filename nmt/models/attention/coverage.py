"""Coverage attention (Tu et al. 2016, "Modeling Coverage for NMT", eq. 5 with linguistic coverage):

    e_ij = vᵀ tanh(W s_{i-1} + U a_j + V C_{i-1,j}),   C_{i,j} = C_{i-1,j} + α_ij

The coverage C counts how much attention each source position has received (the fertility
Φ_j of eq. 7 is fixed to 1), so the model can learn to move on from words already translated.
Step t needs the weights of step t-1: this attention always runs in the decoder's step loop.
"""

from __future__ import annotations

import torch
from torch import nn

from nmt.models.attention.base import AttentionState
from nmt.models.attention.registry import register
from nmt.models.attention.scores import BahdanauAttention


@register("coverage")
class CoverageAttention(BahdanauAttention):
    parallel = False
    tracks_coverage = True

    def __init__(self, query_size: int, key_size: int, dim: int):
        super().__init__(query_size, key_size, dim)
        self.V = nn.Linear(1, dim, bias=False)

    def score(self, query: torch.Tensor, state: AttentionState) -> torch.Tensor:
        if query.size(1) != 1:
            raise RuntimeError("coverage attention scores one step at a time (its decoder runs a step loop)")
        keys = state.proj + self.V(state.coverage.unsqueeze(-1))  # [B, S, D]: U a_j + V C_{i-1,j}
        q = self.linear("W_q", state.products)(query)  # [B, 1, D]
        return self.v(self.tanh(q.unsqueeze(2) + keys.unsqueeze(1))).squeeze(-1)  # [B, 1, S]
