"""The one place that reads model config: config sections → a plain ``Seq2Seq``."""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf
from torch import nn

from nmt.errors import ConfigError
from nmt.models.attention import build_attention
from nmt.models.decoder import DECODERS, BahdanauDecoder, LuongDecoder
from nmt.models.encoder import Encoder
from nmt.models.rnn import RNN, resolve_impl, tanh_kernel
from nmt.models.seq2seq import Seq2Seq


def option(section: Any, key: str, default: Any) -> Any:
    """``section.key``, or ``default`` when the section predates the key (a checkpoint's config from
    before it existed): a missing new key means the old behaviour."""
    return getattr(section, key, default)


def build_model(
    encoder: Any,
    attention: Any,
    decoder: Any,
    src_vocab: int,
    tgt_vocab: int,
    init_range: float = 0.1,
    rnn_impl: str = "auto",
    device: Any = "cpu",
    tie_all_embeddings: bool = False,
    lstm_forget_bias: float | None = None,
) -> Seq2Seq:
    """Assemble the model from the ``encoder``/``attention``/``decoder`` config sections.

    ``rnn_impl`` (``model.rnn_impl``) picks how both RNNs are computed (nmt.models.rnn); ``auto``
    is resolved here for ``device``, the device the model will run on (and for layer norm).
    ``tie_all_embeddings`` (``model.tie_all_embeddings``): one matrix for the source embedding, the
    target embedding and the output layer (Press & Wolf 2017; fairseq's share_all_embeddings).

    Parameters start uniform in ±``init_range`` (OpenNMT-py's RNN default), which trains
    markedly faster per update for GRU/LSTM NMT than Xavier initialisation; layer-norm gains at
    ``encoder/decoder.layer_norm_gain`` (default 1, the paper's). ``lstm_forget_bias``
    (``model.lstm_forget_bias``): every LSTM forget gate's bias starts there instead (Gers et al. 2000).
    """
    if decoder.order not in DECODERS:
        raise ConfigError(f"decoder.order={decoder.order!r} is unknown; choose one of {sorted(DECODERS)}")
    if tie_all_embeddings and (problem := tie_all_problem(encoder.emb_size, decoder.emb_size, src_vocab, tgt_vocab)):
        raise ConfigError(problem)
    enc_ln, dec_ln = option(encoder, "layer_norm", False), option(decoder, "layer_norm", False)
    impl = resolve_impl(rnn_impl, device, enc_ln or dec_ln)
    tanh = tanh_kernel(impl, device)  # one tanh for the whole model, chosen for the device
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
        emb_dropout=option(encoder, "emb_dropout", None),
        layer_norm=enc_ln,
        tanh=tanh,
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
        tie_embeddings=decoder.tie_embeddings or tie_all_embeddings,
        rnn_impl=impl,
        emb_dropout=option(decoder, "emb_dropout", None),
        layer_norm=dec_ln,
        tanh=tanh,
    )
    if decoder.order == "luong":
        dec = LuongDecoder(**common, input_feeding=decoder.input_feeding)
    else:
        dec = BahdanauDecoder(**common)
    if tie_all_embeddings:
        enc.embed.weight = dec.embed.weight
    model = Seq2Seq(enc, dec)
    for p in model.parameters():
        nn.init.uniform_(p, -init_range, init_range)
    for part, section in ((enc, encoder), (dec, decoder)):
        for m in part.modules():
            if isinstance(m, RNN):
                m.reset_layer_norm(option(section, "layer_norm_gain", 1.0))
                if lstm_forget_bias is not None and m.lstm:
                    m.reset_forget_bias(lstm_forget_bias)
    for emb in (enc.embed, dec.embed):
        emb.weight.data[emb.padding_idx].zero_()
    return model


def tie_all_problem(src_emb: int, tgt_emb: int, src_vocab: int | None = None, tgt_vocab: int | None = None):
    """Why ``model.tie_all_embeddings`` cannot tie these sizes (one line), or None. The vocabulary
    sizes are known only once the tokenizer is built (nmt.config.validate checks tokenizer.joint first)."""
    if src_emb != tgt_emb:
        return (
            f"model.tie_all_embeddings=true needs encoder.emb_size ({src_emb}) == decoder.emb_size ({tgt_emb}): "
            "one matrix serves as both embeddings and the output layer"
        )
    if src_vocab != tgt_vocab:
        return (
            f"model.tie_all_embeddings=true needs one vocabulary (tokenizer.joint=true), but the source has "
            f"{src_vocab} pieces and the target {tgt_vocab}"
        )
    return None


def model_from_config(cfg: Any, src_vocab: int, tgt_vocab: int, device: Any) -> Seq2Seq:
    """``build_model`` from a whole train config, for ``device``. A checkpoint's config from before
    ``model.rnn_impl`` existed has no ``model`` section: it gets ``auto`` (and no tying of all embeddings)."""
    rnn_impl = OmegaConf.select(cfg, "model.rnn_impl", default="auto")
    tie_all = OmegaConf.select(cfg, "model.tie_all_embeddings", default=False)
    forget_bias = OmegaConf.select(cfg, "model.lstm_forget_bias", default=None)
    return build_model(
        cfg.encoder,
        cfg.attention,
        cfg.decoder,
        src_vocab,
        tgt_vocab,
        rnn_impl=rnn_impl,
        device=device,
        tie_all_embeddings=tie_all,
        lstm_forget_bias=forget_bias,
    )


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
