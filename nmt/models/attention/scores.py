"""The classic score functions. Each is one small class registered by name.

Notation: decoder state h [B, T, H], encoder outputs a [B, S, K] (``keys``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from nmt.errors import ConfigError
from nmt.models.attention.base import Attention, AttentionState
from nmt.models.attention.registry import register


def dot_size_problem(attention: str, query_size: int, key_size: int) -> str:
    """The message for a dot score between sizes that differ (nmt.config checks it before any work)."""
    return (
        f"attention={attention} needs decoder.hidden_size ({query_size}) == 2 * encoder.hidden_size "
        f"({key_size}); use attention=general, which learns the mapping"
    )


@register("dot")
class DotAttention(Attention):
    """Luong et al. 2015, eq. 8 (dot): score(h, a) = hᵀa. Needs H == K; has no parameters."""

    label = "dot"

    def __init__(self, query_size: int, key_size: int, dim: int):
        super().__init__(query_size, key_size, dim)
        if query_size != key_size:
            raise ConfigError(dot_size_problem(self.label, query_size, key_size))

    def score(self, query: torch.Tensor, state: AttentionState) -> torch.Tensor:
        return torch.bmm(query, state.proj.transpose(1, 2))  # [B, T, S]


@register("scaled_dot")
class ScaledDotAttention(DotAttention):
    """Dot score scaled by 1/sqrt(H) (Vaswani et al. 2017, eq. 1), keeps softmax unsaturated."""

    label = "scaled_dot"

    def score(self, query: torch.Tensor, state: AttentionState) -> torch.Tensor:
        return super().score(query, state) / math.sqrt(self.query_size)


@register("general")
class GeneralAttention(Attention):
    """Luong et al. 2015, eq. 8 (general, bilinear): score(h, a) = hᵀ W_a a, W_a: [H, K].

    W_a a is computed once per batch ([B, S, H]); each step is then a dot product.
    """

    products = ("W",)

    def __init__(self, query_size: int, key_size: int, dim: int):
        super().__init__(query_size, key_size, dim)
        self.W = nn.Linear(key_size, query_size, bias=False)

    def project_keys(self, keys: torch.Tensor, products) -> torch.Tensor:
        return self.linear("W", products)(keys)  # [B, S, H]

    def score(self, query: torch.Tensor, state: AttentionState) -> torch.Tensor:
        return torch.bmm(query, state.proj.transpose(1, 2))


class _AdditiveScore(Attention):
    """score(h, a) = vᵀ tanh(W_q h + W_k a): the shared maths of concat and bahdanau.

    W_k a [B, S, D] is computed once per batch. All steps at once broadcast to
    [B, T, S, D], which is what the one-call decoder path pays for its speed.
    """

    key_bias = False
    products = ("W_q", "W_k")

    def __init__(self, query_size: int, key_size: int, dim: int):
        super().__init__(query_size, key_size, dim)
        self.W_q = nn.Linear(query_size, dim, bias=not self.key_bias)
        self.W_k = nn.Linear(key_size, dim, bias=self.key_bias)
        self.v = nn.Linear(dim, 1, bias=False)

    def project_keys(self, keys: torch.Tensor, products) -> torch.Tensor:
        return self.linear("W_k", products)(keys)  # [B, S, D]

    def score(self, query: torch.Tensor, state: AttentionState) -> torch.Tensor:
        q = self.linear("W_q", state.products)(query)  # [B, T, D]
        return self.v(self.tanh(q.unsqueeze(2) + state.proj.unsqueeze(1))).squeeze(-1)  # [B, T, S]


@register("concat")
class ConcatAttention(_AdditiveScore):
    """Luong et al. 2015, eq. 8 (concat): score(h_t, a_s) = v_aᵀ tanh(W_a [h_t; a_s]).

    W_a [h; a] is split as W_q h + W_k a (one matrix, two blocks); the bias sits with the
    query side. Used in Luong order, h is the *current* decoder state.
    """


@register("bahdanau")
class BahdanauAttention(_AdditiveScore):
    """Bahdanau et al. 2015, App. A.1.2: e_ij = v_aᵀ tanh(W_a s_{i-1} + U_a h_j).

    In the seeds' notation ``softmax(V(tanh(W1(a) + W2(h0))))``: U_a = W1 on the keys a
    (with bias, projected once per sentence), W_a = W2 on the previous state h0.
    """

    key_bias = True
