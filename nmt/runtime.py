"""What the commands share at run time: choosing the device, and a checkpoint → model / translator.

A library module, so no entry point imports another: ``nmt.translate``, ``nmt.evaluate``,
``nmt.serve`` and ``nmt.report`` load models through here without loading the trainer,
and ``nmt.train`` picks its device here too.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from nmt import checkpoint
from nmt.config import device_problem
from nmt.data.tokenizer import Tokenizer
from nmt.errors import ConfigError
from nmt.models import quant
from nmt.models.build import model_from_config
from nmt.models.rnn import pin_kernel_choices
from nmt.models.seq2seq import Ensemble, Seq2Seq
from nmt.search import SearchOptions
from nmt.shortlist import Shortlist
from nmt.translator import Translator

log = logging.getLogger(__name__)

DEFAULT_SEARCH = SearchOptions()  # beam 5, length penalty 1.0: what a checkpoint without a stored choice decodes with


def resolve_device(name: str) -> torch.device:
    """``auto`` (CUDA when present), ``cpu``, ``cuda``, ``cuda:N`` → a device, or a one-line error."""
    problem = device_problem(name)
    if problem:
        raise ConfigError(problem)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={name}: CUDA is not available on this machine; use device=cpu or auto")
    if dev.index is not None and dev.index >= (count := torch.cuda.device_count()):
        raise ConfigError(f"device={name}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    return dev


def load_model(path: str, device: torch.device) -> tuple[Seq2Seq, Tokenizer]:
    """Rebuild a model and its tokenizer from a checkpoint alone (no corpus, no cache needed)."""
    return model_from_checkpoint(checkpoint.load(path, map_location=device), device)


def model_from_checkpoint(ckpt: dict, device: torch.device) -> tuple[Seq2Seq, Tokenizer]:
    """The model and tokenizer of a loaded checkpoint (``checkpoint.load``)."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(ckpt["config"])
    tok = Tokenizer.from_state_dict(ckpt["tokenizer"])
    model = model_from_config(cfg, tok.src_vocab_size, tok.tgt_vocab_size, device)
    model.load_state_dict(ckpt["model"])
    return model.to(device).eval(), tok


def search_options(cfg: Any, stored: dict | None = None) -> tuple[SearchOptions, str]:
    """The search settings of a DecodeConfig (translate, evaluate and serve share it), and a line saying
    where the beam size and length penalty came from.

    ``beam_size`` / ``length_penalty`` / ``stop`` left unset (null) take the checkpoint's ``stored``
    choice (its ``decoding``, chosen on valid at the end of training: ``trainer.tune_decoding``), else
    5 / 1.0 / exact as before such choices existed. With ``n_best`` above the checkpoint's beam and no
    ``beam_size`` given, the beam widens to ``n_best``.
    """
    stored = stored or {}
    if cfg.get("sample", False):  # one draw per line: no beam, no length penalty (nmt.search)
        options = SearchOptions(
            beam_size=1,
            n_best=cfg.n_best,  # draws per line
            max_len_ratio=cfg.max_len_ratio,
            min_len_ratio=cfg.min_len_ratio,
            no_repeat_ngram=cfg.no_repeat_ngram,
            sample=True,
            sample_topk=cfg.sample_topk,
            sample_topp=cfg.sample_topp,
            temperature=cfg.temperature,
            sample_seed=cfg.sample_seed,
        )
        top = []
        if cfg.sample_topk:
            top.append(f"top-k {cfg.sample_topk}")
        if cfg.sample_topp < 1:
            top.append(f"top-p {cfg.sample_topp:g}")
        return options, (
            f"sampling at temperature {cfg.temperature:g} from {' and '.join(top) or 'all pieces'}, "
            f"{f'{cfg.n_best} draws per line, ' if cfg.n_best > 1 else ''}sample_seed={cfg.sample_seed} "
            "(the same line and seed draw the same output)"
        )
    beam = cfg.beam_size if cfg.beam_size is not None else stored.get("beam_size", DEFAULT_SEARCH.beam_size)
    if cfg.beam_size is None:
        beam = max(beam, cfg.n_best)
    elif cfg.n_best > cfg.beam_size:
        raise ConfigError(f"n_best={cfg.n_best} needs beam_size >= {cfg.n_best} (got {cfg.beam_size})")
    alpha = cfg.length_penalty if cfg.length_penalty is not None else stored.get("length_penalty", DEFAULT_SEARCH.alpha)
    stop = cfg.stop if cfg.stop is not None else stored.get("stop", DEFAULT_SEARCH.stop)
    options = SearchOptions(
        beam_size=beam,
        n_best=cfg.n_best,
        alpha=alpha,
        beta=cfg.coverage_penalty,
        max_len_ratio=cfg.max_len_ratio,
        min_len_ratio=cfg.min_len_ratio,
        no_repeat_ngram=cfg.no_repeat_ngram,
        stop=stop,
    )
    shown = "" if stop == "exact" else f", stop={stop}"
    return options, f"decoding with beam {beam}, length penalty {alpha:g}{shown} ({_origin(cfg, stored)})"


def _origin(cfg: Any, stored: dict) -> str:
    """Where the beam size and length penalty came from, for the log."""
    keys = ("beam_size", "length_penalty", "stop") if "stop" in stored else ("beam_size", "length_penalty")
    given = [k for k in keys if getattr(cfg, k) is not None]
    if len(given) == len(keys):
        return "as given"
    if stored:
        where = f"the checkpoint's choice on valid, BLEU {stored['bleu']:.2f} on {stored['sentences']} sentences"
    else:
        where = "defaults: the checkpoint stores no choice"
    return f"{' and '.join(given)} as given, the rest {where}" if given else where


def load_translator(cfg: Any) -> Translator:
    """The checkpoint (an ensemble when ``cfg.ensemble`` names more) on ``cfg.device``, decoding with the
    search settings of ``cfg`` (a DecodeConfig) and, where it leaves them unset, the checkpoint's stored
    choice (see ``search_options``; the log says which was used)."""
    search_options(cfg)  # checked before anything is loaded
    device = resolve_device(cfg.device)
    mode = cfg.get("quantize", "none")
    quant.check(mode, device)  # before anything is loaded
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if device.type == "cpu":  # measured once per machine (cached beside amp's choice): it decodes alike every time
        from nmt.calibrate import cached_kernel_choices

        pin_kernel_choices(*cached_kernel_choices(cfg.get("amp_cache")))
    ckpt = checkpoint.load(cfg.checkpoint, map_location=device)
    search, used = search_options(cfg, ckpt.get("decoding"))
    model, tok = model_from_checkpoint(ckpt, device)
    short = load_shortlist(ckpt, cfg.get("shortlist", False))
    columns = (ckpt.get("config") or {}).get("data", {}).get("columns")
    del ckpt
    if cfg.ensemble:
        members = [model]
        for path in cfg.ensemble:
            m, t = load_model(path, device)
            if t.state_dict() != tok.state_dict():
                raise ConfigError(f"ensemble: {path} has another vocabulary than {cfg.checkpoint}")
            members.append(m)
        model = Ensemble(members)
    log.info("%s", used)
    model = quant.quantize(model, mode)  # int8 products for CPU decoding; the model itself when none
    amp, cache = cfg.get("amp", "auto"), cfg.get("amp_cache")
    log.info("decoding products: %s", decode_products(model, amp, mode, device, cache))
    trained = tuple(columns) if columns else None
    return Translator(
        model, tok, device, search, max_input_len=cfg.max_input_len, shortlist=short, trained_columns=trained
    )


def load_shortlist(ckpt: dict, use: bool) -> Shortlist | None:
    """The checkpoint's vocabulary shortlist (nmt.shortlist) when it stores one and ``use`` (the decoding
    commands' ``shortlist``), with a log line either way it matters."""
    if not use:
        return None
    if "shortlist" not in ckpt:
        log.warning(
            "shortlist=true, but the checkpoint stores no vocabulary shortlist (runs from before trainer.shortlist: "
            "python scripts/shortlist.py CHECKPOINT adds one): searching the whole vocabulary"
        )
        return None
    short = Shortlist.from_state_dict(ckpt["shortlist"])
    log.info("vocabulary shortlist: each batch searches %s (shortlist=true)", short.describe())
    return short


def decode_products(
    model: Seq2Seq | Ensemble, amp: str, quantize: str, device: torch.device, cache_dir: str | None = None
) -> str:
    """Set the product dtype decoding runs with (the decoding commands' ``amp``) and say which, for the log.
    int8 decoding (``quantize=int8``) has its own products, so ``amp`` does not apply there."""
    if quantize != "none":
        return f"int8 (quantize={quantize}; amp does not apply)"
    from nmt.calibrate import decode_dtype

    first = model.members[0] if isinstance(model, Ensemble) else model
    dtype, why = decode_dtype(first, amp, device, cache_dir)
    model.set_matmul_dtype(dtype)
    if dtype is None and device.type == "cpu" and getattr(model, "fast_search", False):
        from nmt.models.rnn import describe_packing

        why += f"; products by {describe_packing()}"
    return f"{'bf16' if dtype == torch.bfloat16 else 'float32'} ({why})"
