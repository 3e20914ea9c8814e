"""Location-based attention (Luong et al. 2015, §3.1 eq. 8, "location"): a_t = softmax(W_a h_t).

The weights depend on the target state alone, not on the source words: W_a maps h_t to one
score per source position, so the model learns *where* to look, not *what* to look for.
W_a: [max_positions, H]; a source longer than max_positions gets no weight past that point
(nmt.translate truncates inputs to 256 pieces, training to data.max_len).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nmt.models.attention.base import Attention, AttentionState
from nmt.models.attention.registry import register


@register("location")
class LocationAttention(Attention):
    products = ("W",)

    def __init__(self, query_size: int, key_size: int, dim: int, max_positions: int = 256):
        super().__init__(query_size, key_size, dim)
        self.W = nn.Linear(query_size, max_positions)

    def score(self, query: torch.Tensor, state: AttentionState) -> torch.Tensor:
        S = state.mask.size(1)
        scores = self.linear("W", state.products)(query)  # [B, T, max_positions]
        if S <= scores.size(-1):
            return scores[..., :S]
        return F.pad(scores, (0, S - scores.size(-1)), value=float("-inf"))
