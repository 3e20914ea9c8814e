"""What the commands share at run time: choosing the device, and a checkpoint → model / translator.

A library module, so no entry point imports another: ``nmt.translate``, ``nmt.evaluate``,
``nmt.serve`` and ``nmt.report`` load models through here without loading the trainer,
and ``nmt.train`` picks its device here too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from nmt import checkpoint
from nmt.data.tokenizer import Tokenizer
from nmt.errors import ConfigError, NmtError
from nmt.models import quant
from nmt.models.build import model_from_config
from nmt.models.seq2seq import Ensemble, Seq2Seq
from nmt.search import SearchOptions
from nmt.translator import Translator


def resolve_device(name: str) -> torch.device:
    """``auto`` (CUDA when present), ``cpu``, ``cuda``, ``cuda:N`` → a device, or a one-line error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError as e:
        raise ConfigError(f"device={name!r} is not a device; choose auto, cpu, cuda or cuda:N") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={name}: CUDA is not available on this machine; use device=cpu or auto")
    return dev


def load_model(path: str, device: torch.device) -> tuple[Seq2Seq, Tokenizer]:
    """Rebuild a model and its tokenizer from a checkpoint alone (no corpus, no cache needed)."""
    from omegaconf import OmegaConf

    ckpt = checkpoint.load(path, map_location=device)
    cfg = OmegaConf.create(ckpt["config"])
    tok = Tokenizer.from_state_dict(ckpt["tokenizer"])
    model = model_from_config(cfg, tok.src_vocab_size, tok.tgt_vocab_size, device)
    model.load_state_dict(ckpt["model"])
    return model.to(device).eval(), tok


def search_options(cfg: Any) -> SearchOptions:
    """The search settings of a DecodeConfig (translate, evaluate and serve share it)."""
    if cfg.n_best > cfg.beam_size:
        raise ConfigError(f"n_best={cfg.n_best} needs beam_size >= {cfg.n_best} (got {cfg.beam_size})")
    return SearchOptions(
        beam_size=cfg.beam_size,
        n_best=cfg.n_best,
        alpha=cfg.length_penalty,
        beta=cfg.coverage_penalty,
        max_len_ratio=cfg.max_len_ratio,
        min_len_ratio=cfg.min_len_ratio,
        no_repeat_ngram=cfg.no_repeat_ngram,
    )


def load_translator(cfg: Any) -> Translator:
    """The checkpoint (an ensemble when ``cfg.ensemble`` names more) on ``cfg.device`` with the search
    settings of ``cfg`` (a DecodeConfig)."""
    search = search_options(cfg)  # checked before anything is loaded
    device = resolve_device(cfg.device)
    mode = cfg.get("quantize", "none")
    quant.check(mode, device)  # before anything is loaded
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model, tok = load_model(cfg.checkpoint, device)
    if cfg.ensemble:
        members = [model]
        for path in cfg.ensemble:
            m, t = load_model(path, device)
            if t.state_dict() != tok.state_dict():
                raise ConfigError(f"ensemble: {path} has another vocabulary than {cfg.checkpoint}")
            members.append(m)
        model = Ensemble(members)
    model = quant.quantize(model, mode)  # int8 products for CPU decoding; the model itself when none
    return Translator(model, tok, device, search, max_input_len=cfg.max_input_len)


def check_outputs(*paths: str | None) -> None:
    """Refuse, before any model is loaded, an output file whose folder does not exist."""
    for path in paths:
        if path and not Path(path).resolve().parent.is_dir():
            raise NmtError(f"{path}: its folder {Path(path).parent} does not exist (create it, or write elsewhere)")
