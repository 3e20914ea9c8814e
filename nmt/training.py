"""Config → the trainer and its collaborators (optimiser, schedule, precision, validator, saver), and the
finisher that averages, tunes decoding and stores a vocabulary shortlist once training has ended.

The one place that reads the ``trainer`` config section; ``nmt.trainer`` gets plain objects.
Also: which config changes a resumed run may make, which earlier run a bare ``trainer.resume=true``
continues, and what a checkpoint named by ``trainer.init_from`` must share with the run it starts.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
from pathlib import Path
from typing import Any

import torch

from nmt import allocator, shortlist
from nmt.calibrate import Calibration, calibrate, calibrate_cuda, warn_if_emulated
from nmt.config import TrainConfig
from nmt.data.corpus import CorpusSpec, load_pairs
from nmt.data.tokenizer import Tokenizer
from nmt.distributed import Dist
from nmt.errors import ConfigError
from nmt.finishing import DecodingGrid, Finisher
from nmt.logger import RunLogger
from nmt.models.rnn import describe_tanh, kernel_choices
from nmt.models.seq2seq import Seq2Seq
from nmt.rundir import FINISHING_KEYS, RESUME_MAY_CHANGE, RunDir, may_change
from nmt.schedules import BudgetDecay, step_decay
from nmt.search import SearchOptions
from nmt.shortlist import Shortlist
from nmt.trainer import CheckpointSaver, EarlyStopping, Precision, Schedule, Trainer, Validator, WeightAverage
from nmt.translator import Translator

log = logging.getLogger(__name__)

# trainer.optimizer -> (class, the trainer keys it takes besides lr and weight_decay); config.CHOICES lists the names.
OPTIMIZERS: dict[str, tuple[type[torch.optim.Optimizer], tuple[str, ...]]] = {
    "adam": (torch.optim.Adam, ("betas",)),
    "adamw": (torch.optim.AdamW, ("betas",)),
    "sgd": (torch.optim.SGD, ("momentum",)),
    "adadelta": (torch.optim.Adadelta, ("rho",)),
    "adagrad": (torch.optim.Adagrad, ()),
}

# Decoding keeps no activations for a backward pass, so validation batches can hold several times the
# training budget in the same memory.
VALID_BATCH_FACTOR = 4


def build_optimizer(model: torch.nn.Module, t: Any) -> torch.optim.Optimizer:
    """Adam (Kingma & Ba 2015) or AdamW (Loshchilov & Hutter 2019) with ``trainer.betas``; SGD with
    ``trainer.momentum`` (Luong et al. 2015 trained with plain SGD at lr 1.0); Adadelta with ``trainer.rho``
    (Bahdanau et al. 2015: rho 0.95, eps 1e-6, lr 1.0); Adagrad. ``trainer.weight_decay`` for all."""
    if t.optimizer not in OPTIMIZERS:
        raise ConfigError(f"trainer.optimizer={t.optimizer!r} is unknown; choose one of {sorted(OPTIMIZERS)}")
    cls, extra = OPTIMIZERS[t.optimizer]
    kwargs = {k: (tuple(getattr(t, k)) if k == "betas" else getattr(t, k)) for k in extra}
    if t.optimizer == "adadelta":
        kwargs["eps"] = 1e-6  # the paper's; torch's default is the same
    else:
        # fused: one kernel over all parameters instead of ~10 element-wise passes per tensor (+1-5% for
        # model R with Adam on CPU, docs/benchmarks.md); the same update rule. Adadelta has no fused kernel.
        kwargs["fused"] = True
    return cls(model.parameters(), lr=t.lr, weight_decay=t.weight_decay, **kwargs)


def describe_optimizer(t: Any) -> str:
    """'adam (lr 0.001, betas 0.9/0.999)', 'sgd (lr 1, momentum 0.9, weight decay 1e-05)', ..."""
    _, extra = OPTIMIZERS[t.optimizer]
    parts = [f"lr {t.lr:g}"]
    for k in extra:
        v = getattr(t, k)
        parts.append(f"{k} {'/'.join(f'{b:g}' for b in v)}" if k == "betas" else f"{k} {v:g}")
    if t.weight_decay:
        parts.append(f"weight decay {t.weight_decay:g}")
    return f"{t.optimizer} ({', '.join(parts)})"


def build_scheduler(opt: torch.optim.Optimizer, t: Any):
    """Per-step LambdaLR for constant/warmup_decay/step; ReduceLROnPlateau on valid BLEU for plateau;
    BudgetDecay (stepped by the share of the budget used) for budget."""
    if t.scheduler == "budget":
        return BudgetDecay(opt, t.lr, t.decay_fraction, t.min_lr, t.warmup_steps)
    if t.scheduler == "plateau":
        return torch.optim.lr_scheduler.ReduceLROnPlateau(
            opt, mode="max", factor=t.plateau_factor, patience=t.plateau_patience, min_lr=t.min_lr
        )
    if t.scheduler == "constant":
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    if t.scheduler == "warmup_decay":
        w = max(1, t.warmup_steps)
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / w, math.sqrt(w / (s + 1))))
    if t.scheduler == "step":
        args = (t.warmup_steps, t.decay_start, t.decay_every, t.decay_factor, t.min_lr / t.lr)
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: step_decay(s, *args))
    raise ConfigError(
        f"trainer.scheduler={t.scheduler!r} is unknown; choose constant, warmup_decay, plateau, budget or step"
    )


def build_precision(
    amp: str,
    device: torch.device,
    model: Seq2Seq,
    calibration: Calibration | None = None,
    dist: Dist | None = None,
) -> Precision:
    """``trainer.amp`` → the step's precision; sets the model's matrix-product dtype (the one place that does).

    CUDA: autocast in bf16/fp16 (a GradScaler for fp16); ``auto`` measures whether bf16 autocast is
    faster than float32 for this model on this GPU (nmt.calibrate.calibrate_cuda, cached per GPU model;
    float32 where the GPU has no bf16).
    CPU: autocasting the whole step loses (it casts per op and per time step), so bf16 means that
    only the big products (vocabulary projection, the RNN loops' GEMMs) run in bf16, weights cast
    once per pass. ``auto`` measures whether that is faster than float32 for this model on this CPU
    (nmt.calibrate, cached per CPU model; rank 0 decides for all ranks); ``bf16`` forces it.
    """
    dtypes = {"auto": None, "none": None, "bf16": torch.bfloat16, "fp16": torch.float16}
    if amp not in dtypes:
        raise ConfigError(f"trainer.amp={amp!r} is unknown; choose one of {', '.join(dtypes)}")
    if device.type == "cpu":
        return _cpu_precision(amp, device, model, calibration or Calibration(), dist or Dist())
    model.set_matmul_dtype(None)
    dtype, why = dtypes[amp], f"trainer.amp={amp}"
    if amp == "auto" and not torch.cuda.is_bf16_supported():
        why = "trainer.amp=auto: this GPU has no bf16"
    elif amp == "auto":
        dist = dist or Dist()
        measured = calibrate_cuda(model, calibration or Calibration(), device) if dist.is_main else None
        measured = dist.broadcast(measured)
        dtype, why = (torch.bfloat16 if measured.bf16 else None), measured.reason()
    description = "float32" if dtype is None else f"{'bf16' if dtype == torch.bfloat16 else amp} autocast"
    description += f" ({why})"
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
    return Precision(device, dtype, description, scaler)


def _cpu_precision(amp: str, device: torch.device, model: Seq2Seq, cal: Calibration, dist: Dist) -> Precision:
    """Float32 throughout, optionally with bf16 matrix products: measured (auto) or forced."""
    if amp == "auto":
        measured = calibrate(model, cal) if dist.is_main else None
        measured = dist.broadcast(measured)
        bf16, why = measured.bf16, measured.reason()
    else:
        bf16, why = amp == "bf16", f"trainer.amp={amp}" + (" applies on CUDA only" if amp == "fp16" else "")
        if bf16:
            warn_if_emulated("trainer.amp")
    model.set_matmul_dtype(torch.bfloat16 if bf16 else None)
    description = f"{'float32, bf16 matrix products' if bf16 else 'float32'} ({why})"
    return Precision(device, None, description, torch.amp.GradScaler("cuda", enabled=False))


def build_schedule(t: Any) -> Schedule:
    """The ``trainer.*`` keys the loop reads, as plain values (Schedule's fields are named after them)."""
    if t.accum_steps < 1:
        raise ConfigError(f"trainer.accum_steps={t.accum_steps}: expected an integer >= 1")
    return Schedule(**{f.name: getattr(t, f.name) for f in dataclasses.fields(Schedule)})


def describe_loss(label_smoothing: float) -> str:
    """What the progress lines' ``train loss`` is, beside the validation ``loss``, for the log."""
    if not label_smoothing:
        return "cross-entropy per target piece, in training and validation alike"
    return (
        "train loss is the label-smoothed cross-entropy per target piece "
        f"(trainer.label_smoothing={label_smoothing:g}); the validation loss and ppl are not smoothed, "
        "so the train loss reads well above them"
    )


def build_trainer(
    cfg: Any,
    plain_config: dict,
    model: Seq2Seq,
    tokenizer: Tokenizer,
    valid_pairs: list[tuple[str, str]],
    rundir: RunDir,
    device: torch.device,
    dist: Dist,
    logger: RunLogger | None,
) -> Trainer:
    """The trainer with every collaborator built from ``cfg``; validation exists on rank 0 only."""
    t = cfg.trainer
    log.info("memory: %s", allocator.configure(t.allocator, device))
    schedule = build_schedule(t)
    opt = build_optimizer(model, t)
    log.info("optimizer: %s", describe_optimizer(t))
    if t.optimizer in ("sgd", "adadelta") and t.lr < 0.01:
        log.warning(
            "trainer.lr=%g with trainer.optimizer=%s: it is usually run at 0.1-1.0 (Luong et al. 2015 SGD and "
            "Bahdanau et al. 2015 Adadelta: 1.0); the default lr, 1e-3, suits Adam",
            t.lr,
            t.optimizer,
        )
    calibration = Calibration(cfg.data.max_tokens, t.get("amp_cache"), t.teacher_forcing, t.label_smoothing)
    precision = build_precision(t.amp, device, model, calibration, dist)
    log.info("training precision: %s", precision.description)
    log.info("tanh: %s", describe_tanh(model.decoder.tanh, device))
    log.info("loss: %s", describe_loss(t.label_smoothing))
    validator = None
    if dist.is_main:
        search = SearchOptions(beam_size=t.val_beam_size)  # what nmt.translate does at that beam size
        translator = Translator(model, tokenizer, device, search, max_tokens=VALID_BATCH_FACTOR * cfg.data.max_tokens)
        validator = Validator(
            translator,
            valid_pairs,
            cfg.data.valid_max_sentences,
            cfg.data.max_tokens,
            precision,
            t.plot_attention,
            rundir.attention,
        )
    net: torch.nn.Module = model
    if dist.active:  # the step runs the DDP wrapper; validation, decoding and checkpoints the plain model
        net = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    average = None
    if t.ema_decay > 0:
        average = WeightAverage(model, t.ema_decay)
        log.info(
            "weights: validated and saved as their exponential moving average (trainer.ema_decay=%g); the training "
            "weights are kept in last.pt and step_N.pt for resuming",
            t.ema_decay,
        )
    scheduler = build_scheduler(opt, t)
    if t.scheduler == "step":
        log.info(
            "learning rate: %g%s until update %d, then x%g there and every %d updates after it (not below %g)",
            t.lr,
            f" after a linear warmup over {t.warmup_steps} updates" if t.warmup_steps else "",
            t.decay_start,
            t.decay_factor,
            t.decay_every,
            t.min_lr,
        )
    if isinstance(scheduler, BudgetDecay):
        limits = [f"trainer.{k}={getattr(t, k):g}" for k in ("max_minutes", "max_steps") if getattr(t, k)]
        log.info("%s", scheduler.describe(" or ".join(limits) + (", whichever is nearer" if len(limits) > 1 else "")))
    return Trainer(
        model,
        opt,
        scheduler,
        precision,
        validator,
        EarlyStopping(t.patience, t.select_by),
        CheckpointSaver(rundir, dist, t.keep_last),
        logger,
        schedule,
        {
            "tokenizer": tokenizer.state_dict(),
            "config": plain_config,
            "kernels": kernel_choices() if device.type == "cpu" else None,
        },
        dist,
        net,
        average,
    )


def build_finisher(
    t: Any, rundir: RunDir, train: CorpusSpec | None = None, tokenizer: Tokenizer | None = None
) -> Finisher:
    """What the run does after training ends normally: ``trainer.average_last``, ``trainer.tune_decoding`` and
    ``trainer.shortlist`` (built from the ``train`` split with the run's ``tokenizer``, when both are given)."""
    grid = DecodingGrid(tuple(t.tune_beam_sizes), tuple(t.tune_length_penalties)) if t.tune_decoding else None
    make = None
    if t.shortlist and train is not None and tokenizer is not None:
        make = functools.partial(build_shortlist, t, train, tokenizer)
    # as finished.json will read back: lists for sequences (a config's ListConfig too)
    settings = json.loads(json.dumps({k: getattr(t, k) for k in FINISHING_KEYS}, default=list))
    return Finisher(rundir, t.average_last, grid, make, t.tune_min_bleu, settings)


def build_shortlist(t: Any, train: CorpusSpec, tokenizer: Tokenizer) -> Shortlist:
    """The vocabulary shortlist of ``trainer.shortlist_frequent`` / ``shortlist_per_source`` over the first
    ``shortlist.MAX_PAIRS`` pairs of the ``train`` split (what the end of a run stores; nmt.shortlist)."""
    pairs = load_pairs(train, shortlist.MAX_PAIRS)
    return shortlist.from_pairs(pairs, tokenizer, t.shortlist_frequent, t.shortlist_per_source)


# ---- resuming ----


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


# ---- starting from another run's checkpoint (trainer.init_from) ----

# The config sections a checkpoint's weights and pieces were made with, and the keys in them that do not shape
# either (regularisers, the RNN implementation, subword sampling, the cache): trainer.init_from needs the rest equal.
INIT_SECTIONS = ("encoder", "decoder", "attention", "model", "tokenizer")
INIT_MAY_DIFFER = (
    "encoder.dropout",
    "encoder.emb_dropout",
    "decoder.dropout",
    "decoder.emb_dropout",
    "model.rnn_impl",
    "tokenizer.sample_alpha",
    "tokenizer.sample_nbest",
    "tokenizer.sample_size",  # how many sentences sentencepiece was trained on: the pieces come with the weights
    "tokenizer.cache_dir",
)


def load_init(path: str, plain: dict) -> dict:
    """The checkpoint ``trainer.init_from`` names (weights, tokenizer and its run's config), checked against this
    run's model and tokenizer keys (``INIT_SECTIONS`` less ``INIT_MAY_DIFFER``) before anything is built; a
    difference is one ConfigError naming each key with both values."""
    from nmt import checkpoint

    init = checkpoint.load(Path(path).expanduser())
    a, b = _with_defaults(init["config"], plain), flatten(plain)
    differ = [
        f"{k}={a.get(k, '<absent>')} there, {b.get(k, '<absent>')} here"
        for k in sorted(set(a) | set(b))
        if k.split(".")[0] in INIT_SECTIONS and k not in INIT_MAY_DIFFER and a.get(k) != b.get(k)
    ]
    if differ:
        raise ConfigError(
            f"trainer.init_from={path}: its weights and pieces were made with other settings ({'; '.join(differ)}); "
            "give the settings of the checkpoint's run (the same experiment=... and overrides)"
        )
    return init


def _with_defaults(saved: dict, current: dict) -> dict[str, Any]:
    """A saved config flattened, with the schema default for each key it lacks (its checkpoint was written before
    the key existed, so that run did what the default does)."""
    a, b = flatten(saved), flatten(current)
    a.update({k: v for k, v in flatten(dataclasses.asdict(TrainConfig())).items() if k not in a and k in b})
    return a


ABSENT = "<absent>"


def config_changes(saved: dict, current: dict, allowed: list[str]) -> list[tuple[str, Any, Any]]:
    """``(key, saved value, current value)`` for each key whose value differs between two configs, minus those
    allowed to change (``ABSENT`` for a key one side lacks). A key the saved config lacks (its checkpoint was
    written before the key existed) counts as its schema default, which is what that run did, so adding a key
    with an old-behaviour default never blocks a resume."""
    a, b = _with_defaults(saved, current), flatten(current)
    ok = RESUME_MAY_CHANGE + tuple(allowed)
    return [
        (k, a.get(k, ABSENT), b.get(k, ABSENT))
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k) and not may_change(k, ok)
    ]
