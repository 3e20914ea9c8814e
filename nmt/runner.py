"""One training run, as ``python -m nmt.train`` starts it: a resolved config → data, tokenizer, model,
trainer → a trained checkpoint, and what the run says when it ends (``finish``).

Library code: the entry point ``nmt.train`` parses and checks the config first (a mistake answers in about
a second, before torch is imported) and then calls ``run``. Its log lines are the command's
(``nmt.train``).
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Sequence
from pathlib import Path

import torch
from omegaconf import DictConfig

from nmt import allocator
from nmt.calibrate import cached_kernel_choices
from nmt.config import override, resume_args, shell_quote, to_plain, train_command, value_override
from nmt.data import build_specs, build_tokenizer, check_corpus, prepare_corpus
from nmt.data.batching import Batch, BatchStream, worker_context, worker_errors, worker_init
from nmt.data.corpus import CorpusSpec, load_pairs
from nmt.data.tokenizer import Sampling, Tokenizer
from nmt.distributed import Dist, init_distributed, shutdown
from nmt.errors import ConfigError, NmtError
from nmt.finishing import Finished, Finisher
from nmt.heartbeat import heartbeat
from nmt.logger import RunLogger
from nmt.models.build import count_parameters, model_from_config
from nmt.models.rnn import KEPT_ON_RESUME, pin_kernel_choices
from nmt.rundir import RunDir
from nmt.runtime import resolve_device
from nmt.schedules import BudgetDecay
from nmt.sweep import resume_sweep_command
from nmt.trainer import GAINS, FitResult, Trainer
from nmt.training import ABSENT, build_finisher, build_trainer, config_changes, load_init

log = logging.getLogger("nmt.train")  # the command's voice: its lines read [nmt.train]


def seed_everything(seed: int) -> None:
    import random

    random.seed(seed)
    torch.manual_seed(seed)


def quiet_other_ranks(d: Dist) -> None:
    """Only rank 0 writes the run's log file; the others keep warnings on stderr, tagged."""
    if d.is_main:
        return
    root = logging.getLogger()
    for h in list(root.handlers):
        if isinstance(h, logging.FileHandler):
            root.removeHandler(h)
        else:
            h.setFormatter(logging.Formatter(f"[rank {d.rank}][%(name)s][%(levelname)s] - %(message)s"))
    root.setLevel(logging.WARNING)


def build_loader(
    cfg: DictConfig,
    train: CorpusSpec,
    tokenizer: Tokenizer,
    device: torch.device,
    shards: Sequence[int] = (0,),
    num_shards: int = 1,
    starts: Sequence[tuple[int, int]] | None = None,
) -> Generator[Batch, None, None]:
    """The training batches: this rank's shards of the stream, built in a DataLoader worker, with the
    data-side regularisers (subword sampling, word dropout) that only training gets. ``close()`` ends the
    worker."""
    d, t = cfg.data, cfg.tokenizer
    if t.sample_alpha or d.src_word_dropout or d.tgt_word_dropout:
        log.info(
            "training stream: subword sampling alpha=%g nbest=%d, word dropout source %g target input %g",
            t.sample_alpha,
            t.sample_nbest,
            d.src_word_dropout,
            d.tgt_word_dropout,
        )
    stream = BatchStream(
        train,
        tokenizer.state_dict(),
        d.max_len,
        d.max_tokens,
        d.bucket_size,
        d.shuffle_buffer,
        cfg.seed,
        shards=shards,
        num_shards=num_shards,
        starts=starts,
        sampling=Sampling(t.sample_alpha, t.sample_nbest),
        word_dropout=(d.src_word_dropout, d.tgt_word_dropout),
        max_sentences=d.max_sentences,
    )
    if d.num_workers:
        # The worker is forked and inherits this process's imports; the stream's library must be among them.
        # Imported first in the child, it runs wandb's import hooks there, which raise ForkedError (a resume,
        # whose tokenizer comes from the checkpoint, had not imported it yet).
        import datasets  # noqa: F401
    loader = torch.utils.data.DataLoader(
        stream,
        batch_size=None,
        num_workers=d.num_workers,
        pin_memory=device.type == "cuda",
        prefetch_factor=8 if d.num_workers else None,
        # Its own generator: making the iterator would otherwise draw a seed from the global RNG
        # after a resume restored it, and the resumed run's dropout masks would drift.
        generator=torch.Generator().manual_seed(cfg.seed),
        worker_init_fn=worker_init,
        # Explicit: inside a joblib (loky) sweep job the default context is loky's, which cannot
        # start a DataLoader worker.
        multiprocessing_context=worker_context() if d.num_workers else None,
    )
    return worker_errors(iter(loader))


def resume_command(overrides: Sequence[str], run_dir: Path, then: str = "") -> str:
    """The exact command that continues a run: its overrides, its run directory, trainer.resume=true,
    and ``then`` (e.g. ``trainer.max_steps=...``, which replaces that key's override)."""
    extra = [then] if then else []
    return train_command(overrides, [*resume_args(run_dir), *extra])


class Restart(Exception):
    """``run`` stopped for a fresh process (``trainer.restart_minutes``): everything is saved and closed, and the
    caller, the process's owner (``nmt.train``), replaces this process with the resume of ``run_dir``."""

    def __init__(self, run_dir: Path, step: int):
        super().__init__(f"restart {run_dir} at step {step}")
        self.run_dir, self.step = run_dir, step


def run(cfg: DictConfig, run_dir: Path, overrides: Sequence[str] = (), restartable: bool = False) -> dict:
    """Train with a resolved config; returns the last validation record. ``overrides`` (the command
    line's) only make the resume hint exact. ``restartable``: the caller owns this process and can replace it
    with the run's resume, so ``trainer.restart_minutes`` may stop the run by raising ``Restart``."""
    plain = to_plain(cfg)  # resolves interpolations and fails on missing values before any work
    d, device = init_distributed(resolve_device(cfg.device))
    try:
        return _run(cfg, plain, Path(d.broadcast(str(run_dir))), d, device, overrides, restartable and not d.active)
    finally:
        shutdown(d)


def restart_seconds(t, device: torch.device, restartable: bool) -> float:
    """``trainer.restart_minutes`` in seconds where this process can act on it, else 0 with a line saying why."""
    if not t.restart_minutes:
        return 0.0
    why = None
    if device.type != "cpu" or not allocator.GLIBC:
        why = "it acts on CPU runs with glibc's malloc, whose heap a long run fragments"
    elif not restartable:
        why = "this process cannot replace itself (a -m sweep's job, a torchrun rank, or nmt.runner.run as a library)"
    if why:
        log.info("trainer.restart_minutes=%g left unused: %s", t.restart_minutes, why)
        return 0.0
    log.info(
        "a fresh process after every %g minutes of training, at the validation that follows (trainer.restart_minutes;"
        " a long CPU run's fragmented heap slows its steps, docs/benchmarks.md)",
        t.restart_minutes,
    )
    return 60.0 * t.restart_minutes


def _run(
    cfg: DictConfig,
    plain: dict,
    run_dir: Path,
    d: Dist,
    device: torch.device,
    overrides: Sequence[str],
    restartable: bool = False,
) -> dict:
    quiet_other_ranks(d)
    if cfg.data.num_workers > 1:
        raise ConfigError(
            f"data.num_workers={cfg.data.num_workers}: expected 0 or 1 (the batch stream runs in one worker "
            "process per rank, 0 = in the main process; scripts/benchmark.py measures its data wait)"
        )
    if d.active:
        log.info(
            "distributed: world size %d (%s backend), %d data shards, global batch %d x %d tokens",
            d.world_size,
            "nccl" if device.type == "cuda" else "gloo",
            d.world_size * cfg.trainer.accum_steps,
            d.world_size * cfg.trainer.accum_steps,
            cfg.data.max_tokens,
        )
    rundir = RunDir(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if cfg.trainer.threads:
        torch.set_num_threads(cfg.trainer.threads)
    seed_everything(cfg.seed + d.rank)  # own dropout masks per rank
    if d.is_main:  # fetch once (the other ranks find the files, on a shared filesystem)
        prepare_corpus(cfg.data)
    d.barrier()
    if not d.is_main:
        prepare_corpus(cfg.data)
    specs = build_specs(cfg.data)
    if d.is_main:
        check_corpus(specs)  # a misread layout or (strict) a bad line stops the run here, not in a DataLoader worker
        log.info("run directory: %s", run_dir)  # after the corpus checks: a command failing them names no folder
        if cfg.data.columns and cfg.data.source == "tsv":
            said = "corpus: the source is column %d and the target column %d of each line (data.columns, from 0)"
            log.info(said, *cfg.data.columns)
    resume_from = rundir.resumable(device) if cfg.trainer.resume else None
    if cfg.trainer.resume and resume_from is None:
        if rundir.is_resumable():  # checkpoint files exist, but none could be read (warnings above)
            raise NmtError(
                f"trainer.resume=true, but no checkpoint in {rundir.checkpoints} is readable (see the warnings "
                "above); nothing was changed: move the damaged files away to start this run again at step 0"
            )
        log.warning("trainer.resume=true, but %s has no checkpoint yet: starting this run at step 0", run_dir)
    if resume_from is not None:
        changed = config_changes(resume_from[1]["config"], plain, list(cfg.trainer.allow_changes))
        if changed:
            # a key changed by the command line, or by a preset or default edited since the run began: setting
            # the saved value back continues the run as it was (a key this code no longer has cannot be set)
            back = [value_override(k, old) for k, old, new in changed if old is not ABSENT and new is not ABSENT]
            raise ConfigError(
                f"resuming {resume_from[0]} with a different config "
                f"({'; '.join(f'{k}: {old!r} -> {new!r}' for k, old, new in changed)}); "
                + (f"to continue it as it was started, add {' '.join(map(shell_quote, back))}; or " if back else "")
                + "name intended changes in trainer.allow_changes=[KEY,...] or use a new hydra.run.dir"
            )
    init = load_init(cfg.trainer.init_from, plain) if cfg.trainer.init_from and resume_from is None else None
    # wandb starts before the minutes of sentencepiece and model building: a wandb that cannot (no API key for
    # wandb.mode=online, its servers unreachable) fails this command in seconds, with nothing trained
    logger = RunLogger(run_dir, plain, cfg.wandb, cfg.trainer.resume, cfg.trainer.tensorboard) if d.is_main else None
    try:  # the logger's one owner: finished here, whatever happens
        result, trainer, finisher = _train(cfg, plain, specs, resume_from, init, rundir, d, device, logger, restartable)
    finally:
        if logger is not None:
            logger.finish()
    return finish(result, trainer, rundir, overrides, finisher)


def _train(
    cfg: DictConfig,
    plain: dict,
    specs: dict,
    resume_from: tuple | None,
    init: dict | None,
    rundir: RunDir,
    d: Dist,
    device: torch.device,
    logger: RunLogger | None,
    restartable: bool = False,
) -> tuple[FitResult, Trainer, Finisher]:
    """Tokenizer, model, trainer and batch stream for a run whose directory, resume point and logger are settled,
    then the training; returns what ``finish`` needs."""
    if resume_from is not None:
        tokenizer = Tokenizer.from_state_dict(resume_from[1]["tokenizer"])  # the run's own pieces
    elif init is not None:
        tokenizer = Tokenizer.from_state_dict(init["tokenizer"])  # trainer.init_from: the pieces its weights index
    else:  # trained once, on rank 0; every rank gets the same pieces
        state = None
        if d.is_main:
            with heartbeat("preparing sentencepiece (read the corpus sample, train or load from the cache)"):
                state = build_tokenizer(cfg.tokenizer, specs["train"]).state_dict()
        tokenizer = Tokenizer.from_state_dict(d.broadcast(state))
    # Measured kernel choices (the step loops' tanh, packed float32 products): those of the run being resumed,
    # else rank 0's cached per CPU model, so that every rank, a resumed run and every fresh run on this
    # machine compute alike (a busy CPU can tip a measurement the other way). Before the model is built: it
    # takes its tanh then.
    kernels = resume_from[1].get("kernels") if resume_from is not None else None
    pin: tuple | None = (kernels, KEPT_ON_RESUME, None) if kernels is not None else None
    if pin is None and device.type == "cpu" and d.is_main:
        pin = cached_kernel_choices(cfg.trainer.get("amp_cache"))
    pin_kernel_choices(*(d.broadcast(pin) or ({},)))
    model = model_from_config(cfg, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, device).to(device)
    log.info(
        "model: %s encoder, %s attention, %s-order decoder, %s parameters, device %s",
        cfg.encoder.cell,
        cfg.attention.name,
        cfg.decoder.order,
        f"{count_parameters(model):,}",
        device,
    )
    if init is not None:
        model.load_state_dict(init["model"])
        log.info(
            "initialised from %s (step %s of its run): its weights and sentencepiece pieces; the optimiser, the "
            "learning-rate schedule and the step count start afresh",
            cfg.trainer.init_from,
            init.get("progress", {}).get("step", "?"),
        )
    valid = load_pairs(specs["valid"])
    trainer = build_trainer(cfg, plain, model, tokenizer, valid, rundir, device, d, logger)
    if resume_from is not None:
        trainer.load_state(*resume_from, seed=cfg.seed)
    loader = build_loader(
        cfg, specs["train"], tokenizer, device, trainer.shards, trainer.num_shards, trainer.data_starts()
    )
    log.info("%s", stop_rule(cfg.trainer))
    result = trainer.fit(loader, restart_after_s=restart_seconds(cfg.trainer, device, restartable))
    if result.restart:
        loader.close()  # the DataLoader worker ends here, in order, not when its pipes vanish at the exec
    return result, trainer, build_finisher(cfg.trainer, rundir, specs["train"], tokenizer)


def stop_rule(t) -> str:
    """One line on when the run ends, so nobody wonders whether it ever will."""
    limits = [f"trainer.{k}={getattr(t, k):g}" for k in ("max_steps", "max_minutes", "max_epochs") if getattr(t, k)]
    rule = f"training until {' or '.join(limits)}" if limits else "training with no step/time limit"
    if t.patience:
        gain = GAINS[t.select_by]
        rule += f"{' or' if limits else ','} until {t.patience} validations bring no {gain} (trainer.patience)"
    return rule + "; Ctrl-C saves a checkpoint and prints how to resume"


def finish(
    result: FitResult, trainer, rundir: RunDir, overrides: Sequence[str], finisher: Finisher | None = None
) -> dict:
    """Say how the run ended: why, where the best model is and how to use it (or how to resume). A run
    that ended normally is first finished (``averaged.pt``, decoding defaults: ``nmt.finishing``)."""
    p = trainer.progress
    if result.restart:
        log.info(
            "step %d: restarting this process (trainer.restart_minutes); the fresh one continues from %s",
            p.step,
            rundir.last,
        )
        raise Restart(rundir.root, p.step)
    if result.signum is not None:
        if result.saved is not None:
            sweep = resume_sweep_command(rundir.root.parent)  # a job of a -m sweep: the sweep's folder above it
            whole = "or continue the whole sweep (each job from its own folder; jobs not started yet start)"
            log.warning(
                "interrupted at step %d: saved %s; continue with trainer.resume=true in the same run directory:"
                "\n  %s%s",
                p.step,
                result.saved,
                resume_command(overrides, rundir.root),
                f"\n  {whole}:\n  {sweep}" if sweep else "",
            )
        raise SystemExit(128 + result.signum)
    if result.fault:
        raise NmtError(
            f"stopped at step {p.step}: {result.reason}; {rundir.last} holds the weights from "
            "before the fault (try a lower trainer.lr, or check the data)"
        )
    if trainer.saver.failed:
        raise NmtError(
            f"training ended at step {p.step}, but its final checkpoint could not be written to "
            f"{rundir.checkpoints} (see the errors above)"
        )
    log.info("stopping: %s", result.reason)  # why, before the minutes of finishing that follow
    done = Finished()
    if finisher is not None and trainer.dist.is_main:
        done = finisher(trainer.model, trainer.validator, p)
    trainer.dist.barrier()  # the other ranks wait while rank 0 finishes
    if trainer.dist.is_main and p.best_bleu >= 0:
        best = rundir.best
        log.info("%s: %s%s", trainer.stopping.describe_best(p), best, done.decodes(best))
        if done.averaged is not None:
            log.info(
                "averaged %s: valid BLEU %.2f (best.pt %.2f): %s%s",
                ", ".join(Path(f).name for f in done.averaged_from),
                done.averaged_bleu,
                p.best_bleu,
                done.averaged,
                done.decodes(done.averaged),
            )
        log.info(
            "translate with: python -m nmt.translate %s   (answers the lines you type, Ctrl-D ends; add "
            "input=FILE output=FILE for a file)",
            shell_quote(override("checkpoint", done.recommended(best, p.best_bleu))),
        )
        limit = result.reason.split()[1].split("=")[0] if result.reason.startswith("reached trainer.") else None
        if limit is None and result.reason.endswith("(trainer.patience)"):  # early stopping: the patience ran out
            limit = "trainer.patience"
        if limit:
            log.info(
                "to train further, raise %s and resume: %s%s",
                limit,
                resume_command(overrides, rundir.root, f"{limit}=..."),
                "\n  (trainer.scheduler=budget then spreads its decay over the larger budget: the learning rate "
                "rises again before it falls)"
                if isinstance(trainer.sched, BudgetDecay) and limit in ("trainer.max_steps", "trainer.max_minutes")
                else "",
            )
    return result.last_validation
