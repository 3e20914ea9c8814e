"""The attention interface every score function plugs into.

``prepare`` runs once per batch and projects the keys (the part of every score that
does not depend on the decoder state), so the per-step cost is one query projection
and one batched product. ``forward`` takes one query ``[B, H]`` (step-by-step search
and step-loop decoders) or all queries ``[B, T, H]`` (the one-call decoder path).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class AttentionState:
    keys: torch.Tensor  # [B, S, K] encoder outputs; also the values the context is built from
    proj: torch.Tensor  # [B, S, *] keys after the score's key-side projection
    mask: torch.Tensor  # [B, S] True at real (non-pad) positions

    def index_select(self, idx: torch.Tensor) -> AttentionState:
        """Reorder/expand along the batch (beam search)."""
        return AttentionState(
            self.keys.index_select(0, idx), self.proj.index_select(0, idx), self.mask.index_select(0, idx)
        )


class Attention(nn.Module):
    """Base class: subclasses define ``project_keys`` and ``score``; masking and softmax live here.

    Args of every subclass: ``query_size`` (decoder state width H), ``key_size`` (encoder
    output width K), ``dim`` (width of a scoring MLP, where the score has one).
    """

    def __init__(self, query_size: int, key_size: int, dim: int):
        super().__init__()
        self.query_size, self.key_size, self.dim = query_size, key_size, dim

    def project_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """[B, S, K] → [B, S, *]: the key-side part of the score, computed once per batch."""
        return keys

    def score(self, query: torch.Tensor, proj: torch.Tensor) -> torch.Tensor:
        """query [B, T, H], proj [B, S, *] → unnormalised scores [B, T, S]."""
        raise NotImplementedError

    def prepare(self, keys: torch.Tensor, mask: torch.Tensor) -> AttentionState:
        return AttentionState(keys, self.project_keys(keys), mask)

    def forward(self, query: torch.Tensor, state: AttentionState) -> tuple[torch.Tensor, torch.Tensor]:
        """query [B, H] or [B, T, H] → (context [B, (T,) K], weights [B, (T,) S])."""
        single = query.dim() == 2
        q = query.unsqueeze(1) if single else query  # [B, T, H]
        scores = self.score(q, state.proj)  # [B, T, S]
        # Fill with -inf, not a large negative number: padded positions then get exactly 0 weight.
        scores = scores.masked_fill(~state.mask.unsqueeze(1), float("-inf"))
        weights = torch.softmax(scores.float(), dim=-1).to(state.keys.dtype)  # [B, T, S]
        context = torch.bmm(weights, state.keys)  # [B, T, K]
        if single:
            return context.squeeze(1), weights.squeeze(1)
        return context, weights
