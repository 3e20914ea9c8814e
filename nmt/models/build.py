"""The one place that reads model config: config sections → a plain ``Seq2Seq``."""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf
from torch import nn

from nmt.errors import ConfigError
from nmt.models.attention import build_attention
from nmt.models.decoder import DECODERS, BahdanauDecoder, LuongDecoder
from nmt.models.encoder import Encoder
from nmt.models.rnn import resolve_impl
from nmt.models.seq2seq import Seq2Seq


def build_model(
    encoder: Any,
    attention: Any,
    decoder: Any,
    src_vocab: int,
    tgt_vocab: int,
    init_range: float = 0.1,
    rnn_impl: str = "auto",
    device: Any = "cpu",
) -> Seq2Seq:
    """Assemble the model from the ``encoder``/``attention``/``decoder`` config sections.

    ``rnn_impl`` (``model.rnn_impl``) picks how both RNNs are computed (nmt.models.rnn); ``auto``
    is resolved here for ``device``, the device the model will run on.

    Parameters start uniform in ±``init_range`` (OpenNMT-py's RNN default), which trains
    markedly faster per update for GRU/LSTM NMT than Xavier initialisation.
    """
    if decoder.order not in DECODERS:
        raise ConfigError(f"decoder.order={decoder.order!r} is unknown; choose one of {sorted(DECODERS)}")
    impl = resolve_impl(rnn_impl, device)
    key_size = 2 * encoder.hidden_size
    enc = Encoder(
        src_vocab,
        encoder.emb_size,
        encoder.hidden_size,
        encoder.layers,
        encoder.cell,
        encoder.dropout,
        decoder.hidden_size,
        decoder.layers,
        decoder.cell,
        impl,
    )
    options = {k: attention[k] for k in ("window", "score", "heads", "max_positions") if k in attention}
    attn = build_attention(attention.name, decoder.hidden_size, key_size, attention.dim, **options)
    common = dict(
        vocab_size=tgt_vocab,
        emb_size=decoder.emb_size,
        hidden_size=decoder.hidden_size,
        layers=decoder.layers,
        cell=decoder.cell,
        dropout=decoder.dropout,
        attention=attn,
        key_size=key_size,
        tie_embeddings=decoder.tie_embeddings,
        rnn_impl=impl,
    )
    if decoder.order == "luong":
        dec = LuongDecoder(**common, input_feeding=decoder.input_feeding)
    else:
        dec = BahdanauDecoder(**common)
    model = Seq2Seq(enc, dec)
    for p in model.parameters():
        nn.init.uniform_(p, -init_range, init_range)
    for emb in (enc.embed, dec.embed):
        emb.weight.data[emb.padding_idx].zero_()
    return model


def model_from_config(cfg: Any, src_vocab: int, tgt_vocab: int, device: Any) -> Seq2Seq:
    """``build_model`` from a whole train config, for ``device``. A checkpoint's config from before
    ``model.rnn_impl`` existed has no ``model`` section: it gets ``auto``."""
    rnn_impl = OmegaConf.select(cfg, "model.rnn_impl", default="auto")
    return build_model(cfg.encoder, cfg.attention, cfg.decoder, src_vocab, tgt_vocab, rnn_impl=rnn_impl, device=device)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
