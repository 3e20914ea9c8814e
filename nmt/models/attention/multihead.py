"""Multi-head additive attention: k Bahdanau scores side by side, their contexts concatenated.

Head h: e_h = v_hᵀ tanh(W_q^h s + W_k^h a_j) on its own D/k-wide slice; its own softmax over
the source; context c = W_o [c_1; ...; c_k] (W_o maps the k·K concatenation back to K, so
the decoder sees the usual context width). Heads can specialise (one on the aligned word,
one on its neighbours); the weights returned for inspection are the mean over heads.
"""

from __future__ import annotations

import torch
from torch import nn

from nmt.errors import ConfigError
from nmt.models.attention.base import Attention, AttentionState
from nmt.models.attention.registry import register


@register("multihead")
class MultiHeadAdditiveAttention(Attention):
    products = ("W_q", "W_k", "W_o")

    def __init__(self, query_size: int, key_size: int, dim: int, heads: int = 4):
        super().__init__(query_size, key_size, dim)
        if heads < 1 or dim % heads:
            raise ConfigError(f"attention.heads={heads} must divide the scoring width attention.dim={dim}")
        self.heads = heads
        self.W_q = nn.Linear(query_size, dim)
        self.W_k = nn.Linear(key_size, dim, bias=False)
        self.v = nn.Parameter(torch.empty(heads, dim // heads))
        nn.init.uniform_(self.v, -0.1, 0.1)
        self.W_o = nn.Linear(heads * key_size, key_size, bias=False)

    def project_keys(self, keys: torch.Tensor, products) -> torch.Tensor:
        return self.linear("W_k", products)(keys)  # [B, S, D]

    def head_scores(self, query: torch.Tensor, state: AttentionState) -> torch.Tensor:
        """query [B, T, H] → scores [B, k, T, S]."""
        B, T, _ = query.shape
        S, k = state.proj.size(1), self.heads
        q = self.linear("W_q", state.products)(query).view(B, T, 1, k, -1)
        keys = state.proj.view(B, 1, S, k, -1)
        e = (self.tanh(q + keys) * self.v).sum(-1)  # [B, T, S, k]
        return e.permute(0, 3, 1, 2)

    def forward(self, query: torch.Tensor, state: AttentionState) -> tuple[torch.Tensor, torch.Tensor]:
        single = query.dim() == 2
        q = query.unsqueeze(1) if single else query
        B, T, _ = q.shape
        scores = self.head_scores(q, state).masked_fill(~state.mask[:, None, None, :], float("-inf"))
        w = torch.softmax(scores.float(), dim=-1).to(state.keys.dtype)  # [B, k, T, S]
        ctx = torch.einsum("bhts,bsk->bthk", w, state.keys).reshape(B, T, -1)  # [B, T, k*K]
        ctx, w = self.linear("W_o", state.products)(ctx), w.mean(1)
        return (ctx.squeeze(1), w.squeeze(1)) if single else (ctx, w)
