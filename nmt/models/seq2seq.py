"""Encoder + decoder, and the label-smoothed loss over all steps at once."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nmt.data.tokenizer import PAD
from nmt.models.decoder import Decoder, DecoderState
from nmt.models.encoder import Encoder, EncoderOutput


class Seq2Seq(nn.Module):
    def __init__(self, encoder: Encoder, decoder: Decoder):
        super().__init__()
        self.encoder, self.decoder = encoder, decoder

    def encode(self, src: torch.Tensor, src_len: torch.Tensor) -> EncoderOutput:
        return self.encoder(src, src_len)

    def forward(
        self, src: torch.Tensor, src_len: torch.Tensor, tgt_in: torch.Tensor, teacher_forcing: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """→ (logits [B, T, V], attention weights [B, T, S])."""
        return self.decoder(tgt_in, self.encode(src, src_len), teacher_forcing)

    def start(self, src: torch.Tensor, src_len: torch.Tensor) -> DecoderState:
        """Encode once and return the decoder state that search steps from."""
        return self.decoder.init_state(self.encode(src, src_len))


def nll_loss(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Summed (label-smoothed) cross-entropy over non-pad target tokens; logits [B, T, V], target [B, T].

    Summed, not averaged, so the caller divides by the token count it already knows on the
    host (no device sync) and gradient accumulation weighs every token equally.
    """
    return F.cross_entropy(
        logits.flatten(0, 1).float(),
        target.flatten(),
        ignore_index=PAD,
        label_smoothing=label_smoothing,
        reduction="sum",
    )
