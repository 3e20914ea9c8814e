"""Bidirectional RNN encoder (computed by nmt.models.rnn), with a bridge to the decoder's first state."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from nmt.data.tokenizer import PAD
from nmt.errors import ConfigError
from nmt.models.rnn import CELLS, RNN, RNNState, dropout_layer


@dataclass
class EncoderOutput:
    keys: torch.Tensor  # [B, S, 2E] top-layer outputs of both directions
    mask: torch.Tensor  # [B, S] True at real tokens
    state: RNNState  # decoder initial state, [L_dec, B, H_dec] (each of h, c for LSTM)


def check_cell(cell: str, key: str) -> str:
    if cell not in CELLS:
        raise ConfigError(f"{key}={cell!r} is unknown; choose one of {sorted(CELLS)}")
    return cell


class Bridge(nn.Module):
    """Maps the encoder's final states (both directions concatenated) to the decoder's initial state.

    A learned ``tanh(W [h_fwd; h_bwd])`` per decoder layer (Bahdanau et al. 2015 initialise
    from the backward state the same way), so encoder and decoder widths are independent.
    """

    def __init__(self, enc_size: int, dec_size: int, dec_layers: int, lstm: bool):
        super().__init__()
        self.dec_layers, self.lstm = dec_layers, lstm
        self.h = nn.Linear(2 * enc_size, dec_layers * dec_size)
        self.c = nn.Linear(2 * enc_size, dec_layers * dec_size) if lstm else None

    def _map(self, lin: nn.Linear, final: torch.Tensor) -> torch.Tensor:
        # final: [2, B, E] (last layer, both directions) → [L_dec, B, H_dec]
        both = torch.cat([final[0], final[1]], dim=-1)  # [B, 2E]
        out = torch.tanh(lin(both))  # [B, L_dec * H_dec]
        return out.view(out.size(0), self.dec_layers, -1).transpose(0, 1).contiguous()

    def forward(self, final: RNNState) -> RNNState:
        if self.lstm:
            h, c = final
            return self._map(self.h, h[-2:]), self._map(self.c, c[-2:])
        return self._map(self.h, final[-2:])


class Encoder(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        emb_size: int,
        hidden_size: int,
        layers: int,
        cell: str,
        dropout: float,
        dec_size: int,
        dec_layers: int,
        dec_cell: str,
        rnn_impl: str = "loop",
        emb_dropout: float | None = None,
        layer_norm: bool = False,
        tanh: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        """``dropout``: between RNN layers and on the outputs (keys); ``emb_dropout``: on the embeddings
        (None = ``dropout``); ``layer_norm``: layer-normalised cells; ``tanh``: the RNN's
        (``nmt.models.rnn.tanh_kernel``; None = the CPU's choice)."""
        super().__init__()
        self.lstm = check_cell(cell, "encoder.cell") == "lstm"
        self.embed = nn.Embedding(vocab_size, emb_size, padding_idx=PAD)
        self.emb_dropout = dropout_layer(dropout if emb_dropout is None else emb_dropout, rnn_impl)
        self.dropout = dropout_layer(dropout, rnn_impl)
        self.rnn = RNN(cell, emb_size, hidden_size, layers, dropout, True, rnn_impl, layer_norm, tanh)
        # An LSTM decoder needs a cell state: a GRU encoder's h serves as the source for both.
        self.dec_lstm = dec_cell == "lstm"
        self.bridge = Bridge(hidden_size, dec_size, dec_layers, self.dec_lstm)
        self.output_size = 2 * hidden_size

    def forward(self, src: torch.Tensor, src_len: torch.Tensor) -> EncoderOutput:
        """src [B, S], src_len [B] → keys [B, S, 2E], mask, decoder initial state."""
        emb = self.emb_dropout(self.embed(src))  # [B, S, E_emb]
        mask = src != PAD
        keys, final = self.rnn.encode(emb, src_len)  # [B, S, 2E] (0 at padding), [2L, B, E] (each of h, c)
        h = final[0] if self.lstm else final  # [2L, B, E]
        if self.dec_lstm:
            state = self.bridge((h, final[1] if self.lstm else h))
        else:
            state = self.bridge(h)
        return EncoderOutput(keys=self.dropout(keys), mask=mask, state=state)
