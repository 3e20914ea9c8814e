"""Encoder + decoder, and the label-smoothed loss over all steps at once."""

from __future__ import annotations

import math

import torch
from torch import nn

from nmt.data.tokenizer import PAD
from nmt.models.decoder import Decoder, DecoderState
from nmt.models.encoder import Encoder, EncoderOutput
from nmt.models.loss import label_smoothed_nll
from nmt.models.rnn import RNN


class Seq2Seq(nn.Module):
    def __init__(self, encoder: Encoder, decoder: Decoder):
        super().__init__()
        self.encoder, self.decoder = encoder, decoder

    def set_matmul_dtype(self, dtype: torch.dtype | None) -> None:
        """Dtype of the big matrix products on CPU (None = the surrounding one): both RNNs' step-loop
        GEMMs and the decoder's vocabulary projection, which follows its RNN, in training and in search.
        Set by nmt.training.build_precision (trainer.amp), nmt.runtime.load_translator (the decoding
        commands' amp) and the benchmarks: whole-step autocast on CPU was slower."""
        for m in self.modules():
            if isinstance(m, RNN):
                m.matmul_dtype = dtype

    @property
    def fast_search(self) -> bool:
        """Whether a search over this model takes the CPU fast path's kernels (nmt.search.blocked_topk):
        on a CPU, when its RNNs run the ``loop`` implementation, the fast path chosen at build time
        (model.rnn_impl; ``eager`` keeps every part of a search plain). A GPU's own top-k is fast already."""
        return self.decoder.rnn.impl == "loop" and self.decoder.out.weight.device.type == "cpu"

    def encode(self, src: torch.Tensor, src_len: torch.Tensor) -> EncoderOutput:
        return self.encoder(src, src_len)

    def forward(
        self, src: torch.Tensor, src_len: torch.Tensor, tgt_in: torch.Tensor, teacher_forcing: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """→ (logits [B, T, V], attention weights [B, T, S])."""
        return self.decoder(tgt_in, self.encode(src, src_len), teacher_forcing)

    def start(self, src: torch.Tensor, src_len: torch.Tensor, vocab: torch.Tensor | None = None) -> DecoderState:
        """Encode once and return the decoder state that search steps from; ``vocab`` (sorted target ids, a
        shortlist: nmt.shortlist) makes every step's logits cover those ids only."""
        return self.decoder.init_state(self.encode(src, src_len), vocab)

    def step(self, y_prev: torch.Tensor, state: DecoderState) -> tuple[torch.Tensor, DecoderState, torch.Tensor]:
        """One search step: y_prev [N] → (logits [N, V] (V = len(vocab) under a shortlist), state, attention [N, S])."""
        return self.decoder.step(y_prev, state)


class EnsembleState(list):
    """One decoder state per member; reordered together along the beam."""

    def index_select(self, idx: torch.Tensor) -> EnsembleState:
        return EnsembleState(s.index_select(idx) for s in self)

    def reorder_beams(self, idx: torch.Tensor) -> EnsembleState:
        return EnsembleState(s.reorder_beams(idx) for s in self)


class Ensemble(nn.Module):
    """Several models sharing a vocabulary, searched as one: p(y) = mean of the members' p(y).

    Exposes the ``start``/``step`` pair that search uses, so every search option works with it.
    """

    def __init__(self, members: list[Seq2Seq]):
        super().__init__()
        self.members = nn.ModuleList(members)

    def set_matmul_dtype(self, dtype: torch.dtype | None) -> None:
        """Every member's product dtype (Seq2Seq.set_matmul_dtype)."""
        for m in self.members:
            m.set_matmul_dtype(dtype)

    @property
    def fast_search(self) -> bool:
        return all(m.fast_search for m in self.members)

    def start(self, src: torch.Tensor, src_len: torch.Tensor, vocab: torch.Tensor | None = None) -> EnsembleState:
        return EnsembleState(m.start(src, src_len, vocab) for m in self.members)

    def step(self, y_prev: torch.Tensor, state: EnsembleState):
        outs = [m.step(y_prev, s) for m, s in zip(self.members, state)]
        logp = torch.stack([torch.log_softmax(lg.float(), -1) for lg, _, _ in outs])  # [M, N, V]
        mixed = torch.logsumexp(logp, dim=0) - math.log(len(outs))  # log of the mean probability
        att = torch.stack([w for _, _, w in outs]).mean(0)
        return mixed, EnsembleState(s for _, s, _ in outs), att


def nll_loss(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Summed (label-smoothed) cross-entropy over non-pad target tokens; logits [B, T, V], target [B, T].

    Summed, not averaged, so the caller divides by the token count it already knows on the
    host (no device sync) and gradient accumulation weighs every token equally.
    """
    return label_smoothed_nll(logits.flatten(0, 1), target.flatten(), label_smoothing, PAD)
