"""Bidirectional RNN encoder over packed sequences, with a bridge to the decoder's first state."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from nmt.data.tokenizer import PAD
from nmt.errors import ConfigError
from nmt.models.loop import StepLinear, rnn_cell

RNNS = {"gru": nn.GRU, "lstm": nn.LSTM}

# The decoder's recurrent state: h [L, B, H] for GRU, (h, c) for LSTM.
RNNState = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


@dataclass
class EncoderOutput:
    keys: torch.Tensor  # [B, S, 2E] top-layer outputs of both directions
    mask: torch.Tensor  # [B, S] True at real tokens
    state: RNNState  # decoder initial state, [L_dec, B, H_dec] (each of h, c for LSTM)


def check_cell(cell: str, key: str) -> type[nn.RNNBase]:
    if cell not in RNNS:
        raise ConfigError(f"{key}={cell!r} is unknown; choose one of {sorted(RNNS)}")
    return RNNS[cell]


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
    ):
        super().__init__()
        rnn = check_cell(cell, "encoder.cell")
        self.lstm = cell == "lstm"
        self.embed = nn.Embedding(vocab_size, emb_size, padding_idx=PAD)
        self.dropout = nn.Dropout(dropout)
        self.rnn = rnn(
            emb_size,
            hidden_size,
            num_layers=layers,
            batch_first=True,
            bidirectional=True,
            dropout=dropout if layers > 1 else 0.0,
        )
        # An LSTM decoder needs a cell state: a GRU encoder's h serves as the source for both.
        self.dec_lstm = dec_cell == "lstm"
        self.bridge = Bridge(hidden_size, dec_size, dec_layers, self.dec_lstm)
        self.output_size = 2 * hidden_size
        self.matmul_dtype: torch.dtype | None = None  # the step loop's products (see Decoder.matmul_dtype)

    def forward(self, src: torch.Tensor, src_len: torch.Tensor) -> EncoderOutput:
        """src [B, S], src_len [B] → keys [B, S, 2E], mask, decoder initial state."""
        emb = self.dropout(self.embed(src))  # [B, S, E_emb]
        mask = src != PAD
        # On GPUs one cuDNN call per layer is fastest. On CPUs PyTorch's packed RNN backward zero-fills
        # and adds a full [N, G*H] input-gate gradient per time step; the explicit loop avoids that and
        # runs its products like the decoder's (one weight gradient per pass, bf16 where set): about
        # twice as fast for model R's encoder (docs/benchmarks.md).
        keys, final = self._step_loop(emb, src_len, mask) if emb.device.type == "cpu" else self._packed(emb, src_len)
        h = final[0] if self.lstm else final  # [2L, B, E]
        if self.dec_lstm:
            state = self.bridge((h, final[1] if self.lstm else h))
        else:
            state = self.bridge(h)
        return EncoderOutput(keys=self.dropout(keys), mask=mask, state=state)

    def _packed(self, emb: torch.Tensor, src_len: torch.Tensor) -> tuple[torch.Tensor, RNNState]:
        """nn.GRU/nn.LSTM over packed sequences: → outputs [B, S, 2E] (0 at padding), final states."""
        packed = pack_padded_sequence(emb, src_len.cpu(), batch_first=True, enforce_sorted=False)
        out, final = self.rnn(packed)
        keys, _ = pad_packed_sequence(out, batch_first=True, total_length=emb.size(1))  # [B, S, 2E]
        return keys, final

    def _step_loop(self, emb: torch.Tensor, src_len: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, RNNState]:
        """The same RNN (same weights) as explicit step loops; the same outputs and final states as
        ``_packed``. The backward direction runs over each sentence reversed within its length, so
        padding only ever follows a sentence and no step needs a mask."""
        rnn, (b, s, _) = self.rnn, emb.shape
        last = (src_len.to(emb.device) - 1).unsqueeze(1)  # [B, 1] position of each sentence's last token
        pos = torch.arange(s, device=emb.device).unsqueeze(0)  # [1, S]
        rev = torch.where(pos <= last, last - pos, pos).unsqueeze(-1)  # [B, S, 1] reversal within length

        def flip(t: torch.Tensor) -> torch.Tensor:  # [B, S, X], its own inverse
            return t.gather(1, rev.expand_as(t))

        rows, x, finals_h, finals_c = torch.arange(b, device=emb.device), emb, [], []
        for layer in range(rnn.num_layers):
            outs = []
            for reverse in (False, True):
                name = f"l{layer}_reverse" if reverse else f"l{layer}"
                w = {k: getattr(rnn, f"{k}_{name}") for k in ("weight_ih", "bias_ih", "weight_hh", "bias_hh")}
                gx = StepLinear(w["weight_ih"], w["bias_ih"], self.matmul_dtype)(flip(x) if reverse else x)  # hoisted
                hh = StepLinear(w["weight_hh"], w["bias_hh"], self.matmul_dtype)
                h = emb.new_zeros(b, rnn.hidden_size)
                c = torch.zeros_like(h) if self.lstm else None
                hs, cs = [], []
                for gx_t in gx.unbind(1):
                    h, c = rnn_cell(gx_t, hh(h), h, c)
                    hs.append(h)
                    cs.append(c)
                out = torch.stack(hs, 1)  # [B, S, E] in this direction's order
                finals_h.append(out[rows, last.squeeze(1)])
                if self.lstm:
                    finals_c.append(torch.stack(cs, 1)[rows, last.squeeze(1)])
                outs.append(flip(out) if reverse else out)
            x = torch.cat(outs, -1) * mask.unsqueeze(-1)  # [B, S, 2E], 0 at padding like pad_packed_sequence
            if layer + 1 < rnn.num_layers:
                x = F.dropout(x, rnn.dropout, self.training)
        h = torch.stack(finals_h)  # [2L, B, E]: layer by layer, forward then backward, as nn.GRU orders them
        return x, ((h, torch.stack(finals_c)) if self.lstm else h)
