"""The attention interface every score function plugs into.

``prepare`` runs once per batch and projects the keys (the part of every score that
does not depend on the decoder state), so the per-step cost is one query projection
and one batched product. ``forward`` takes one query ``[B, H]`` (step-by-step search
and step-loop decoders) or all queries ``[B, T, H]`` (the one-call decoder path).
``advance`` moves the state past a step: it counts the target position (local-m
attention needs it) and accumulates coverage (coverage models need it); attentions
that need neither return the state untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from torch import nn

# One pass's products of an attention's linear layers, by layer name (``Attention.products``): made
# by the decoder once per pass (nmt.models.decoder.Decoder.linear), used at every step.
Products = dict[str, Callable[[torch.Tensor], torch.Tensor]]


@dataclass
class AttentionState:
    keys: torch.Tensor  # [B, S, K] encoder outputs; also the values the context is built from
    proj: torch.Tensor  # [B, S, *] keys after the score's key-side projection
    mask: torch.Tensor  # [B, S] True at real (non-pad) positions
    t: int = 0  # target position of the next query
    coverage: torch.Tensor | None = None  # [B, S] attention received so far (coverage models only)
    products: Products = field(default_factory=dict)  # this pass's products (Attention.linear); batch-independent

    def index_select(self, idx: torch.Tensor) -> AttentionState:
        """Reorder/expand along the batch (beam search)."""
        cov = None if self.coverage is None else self.coverage.index_select(0, idx)
        return AttentionState(
            self.keys.index_select(0, idx),
            self.proj.index_select(0, idx),
            self.mask.index_select(0, idx),
            self.t,
            cov,
            self.products,
        )

    def reorder_beams(self, idx: torch.Tensor) -> AttentionState:
        """Follow beam back-pointers that stay within each sentence's own beams. The keys, their
        projection and the mask are the same in every beam of a sentence, so they stay where they are
        (no copy of [B, S, K] per step); only what a hypothesis accumulated itself (coverage) moves."""
        if self.coverage is None:
            return self
        return replace(self, coverage=self.coverage.index_select(0, idx))

    @property
    def src_len(self) -> torch.Tensor:
        return self.mask.sum(-1)  # [B]


class Attention(nn.Module):
    """Base class: subclasses define ``score`` (and ``project_keys``); masking and softmax live here.

    Args of every subclass: ``query_size`` (decoder state width H), ``key_size`` (encoder
    output width K), ``dim`` (width of a scoring MLP, where the score has one).
    """

    parallel = True  # all target positions can be scored at once (False: step t needs step t-1's weights)
    tracks_coverage = False
    # The nn.Linear layers (by attribute name) whose products are matrix products worth making once per
    # pass: the decoder makes them in its product dtype (bf16 on CPUs with matrix units) with one weight
    # gradient per pass (``prepare``'s ``linear``). Layers not named here (a [.., D] → 1 score vector, a
    # tiny coverage map) run as themselves.
    products: tuple[str, ...] = ()

    def __init__(self, query_size: int, key_size: int, dim: int):
        super().__init__()
        self.query_size, self.key_size, self.dim = query_size, key_size, dim
        # The scores' tanh, where a score has one: the decoder sets its RNN implementation's
        # (nmt.models.rnn.tanh_kernel: the same function, computed faster on CPUs); plain by default.
        self.tanh: Callable[[torch.Tensor], torch.Tensor] = torch.tanh

    def linear(self, name: str, products: Products) -> Callable[[torch.Tensor], torch.Tensor]:
        """The layer ``name`` as this pass computes it: its per-pass product when the decoder made one
        (``products``, from ``prepare``), else the layer itself."""
        return products.get(name) or getattr(self, name)

    def project_keys(self, keys: torch.Tensor, products: Products) -> torch.Tensor:
        """[B, S, K] → [B, S, *]: the key-side part of the score, computed once per batch."""
        return keys

    def score(self, query: torch.Tensor, state: AttentionState) -> torch.Tensor:
        """query [B, T, H] → unnormalised scores [B, T, S]."""
        raise NotImplementedError

    def normalize(self, scores: torch.Tensor, query: torch.Tensor, state: AttentionState) -> torch.Tensor:
        """Scores [B, T, S] → weights; padding gets exactly 0 (-inf before the softmax, not a big negative)."""
        scores = scores.masked_fill(~state.mask.unsqueeze(1), float("-inf"))
        return torch.softmax(scores.float(), dim=-1).to(state.keys.dtype)

    def context(self, weights: torch.Tensor, state: AttentionState) -> torch.Tensor:
        """weights [B, T, S] → context [B, T, K]."""
        return torch.bmm(weights, state.keys)

    def prepare(
        self, keys: torch.Tensor, mask: torch.Tensor, linear: Callable[[nn.Linear], Callable] | None = None
    ) -> AttentionState:
        """The state of a pass over ``keys`` [B, S, K] (``mask`` [B, S]). ``linear`` makes a layer's per-pass
        product (nmt.models.decoder.Decoder.linear); without it every layer runs as itself."""
        products = {name: linear(getattr(self, name)) for name in self.products} if linear else {}
        cov = keys.new_zeros(mask.shape) if self.tracks_coverage else None
        return AttentionState(keys, self.project_keys(keys, products), mask, 0, cov, products)

    def forward(self, query: torch.Tensor, state: AttentionState) -> tuple[torch.Tensor, torch.Tensor]:
        """query [B, H] or [B, T, H] → (context [B, (T,) K], weights [B, (T,) S])."""
        single = query.dim() == 2
        q = query.unsqueeze(1) if single else query  # [B, T, H]
        weights = self.normalize(self.score(q, state), q, state)  # [B, T, S]
        context = self.context(weights, state)
        if single:
            return context.squeeze(1), weights.squeeze(1)
        return context, weights

    def advance(self, state: AttentionState, weights: torch.Tensor) -> AttentionState:
        """The state after the step(s) that produced ``weights`` ([B, S] or [B, T, S])."""
        steps = 1 if weights.dim() == 2 else weights.size(1)
        if state.coverage is None:
            return replace(state, t=state.t + steps)
        received = weights if weights.dim() == 2 else weights.sum(1)
        return replace(state, t=state.t + steps, coverage=state.coverage + received)
