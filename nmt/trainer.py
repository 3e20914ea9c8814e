"""The training loop and the small collaborators it delegates to.

The loop (``Trainer.fit``) reads as a list of delegations: a ``Precision`` runs the step's
arithmetic, a ``Validator`` scores the model, ``EarlyStopping`` keeps the best BLEU, a
``CheckpointSaver`` writes the run directory, a ``RunLogger`` records metrics. All of them
are built from the config outside (``nmt.training.build_trainer``) and passed in, so
nothing here reads a config. The step never waits on the device (losses are accumulated as
tensors and read only when logging), so CUDA runs ahead of Python.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import random
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sacrebleu
import torch
from tqdm import tqdm

from nmt import allocator, checkpoint
from nmt.config import metric_digits, selection_gain
from nmt.data.batching import Batch, eval_batches, shard_starts
from nmt.data.tokenizer import PAD
from nmt.distributed import Dist
from nmt.heartbeat import clock, heartbeat
from nmt.logger import RunLogger
from nmt.models.seq2seq import Seq2Seq, nll_loss
from nmt.rundir import RunDir, step_name
from nmt.schedules import BudgetDecay, budget_done
from nmt.search import SearchOptions
from nmt.translator import Translator

log = logging.getLogger(__name__)


@dataclass
class Progress:
    """Everything besides weights/optimiser that a resumed run must get back."""

    step: int = 0
    epoch: int = 0  # newest epoch any shard has reached
    # Per data shard, the [epoch, index] of its last consumed batch (see BatchStream).
    positions: list[list[int]] = field(default_factory=list)
    best_bleu: float = -1.0  # the valid BLEU of best.pt; -1: no validation yet
    best_step: int = 0
    best_score: float | None = None  # best.pt's trainer.select_by value (None: none yet, or a run from before it)
    bad_validations: int = 0  # validations in a row without a gain (early stopping)
    elapsed_s: float = 0.0  # wall-clock seconds of training so far (counts against max_minutes)
    bad_steps: int = 0  # non-finite steps in a row
    skipped_steps: int = 0  # non-finite steps in all (their updates were skipped)
    last_validation: dict = field(default_factory=dict)  # the newest metrics.jsonl record
    valid_every: int = 0  # the validation interval in steps, once fixed (see Schedule.valid_every)


@dataclass
class Schedule:
    """When the loop stops, validates, saves and logs (plain values, from trainer.* keys)."""

    accum_steps: int = 1
    clip_grad: float = 1.0
    label_smoothing: float = 0.1
    teacher_forcing: float = 1.0
    max_steps: int = 0
    max_minutes: float = 0.0
    max_epochs: int = 0
    max_bad_steps: int = 5
    # Validation interval in steps; 0 = fixed after CALIBRATE steps to about valid_minutes of training,
    # then kept for the whole run (it is saved in the checkpoint, so a resumed run validates at the same steps).
    valid_every: int = 0
    valid_minutes: float = 3.0
    checkpoint_minutes: float = 5.0  # last.pt at least this often (0 = only at validations and the end)
    log_every: int = 100  # a progress line after this many steps since the last one ...
    log_seconds: float = 30.0  # ... and at least this often


CALIBRATE = (5, 20)  # steps between which the step time is measured for an automatic validation interval


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore ``rng_state()``. The generator states must be CPU byte tensors, and a checkpoint loaded
    with ``map_location=cuda`` (resume on a GPU) brings them to the GPU: they go back to the CPU here."""
    torch.set_rng_state(state["torch"].cpu())
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


@dataclass
class Precision:
    """How the step computes: autocast on CUDA, bf16 matrix products on CPUs where they are faster (applied to the
    model once by the builder), a GradScaler for fp16."""

    device: torch.device
    autocast_dtype: torch.dtype | None  # CUDA autocast; None = off
    description: str  # for the log
    scaler: torch.amp.GradScaler

    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)


class Validator:
    """Validation loss, and BLEU/chrF of translations made exactly as ``nmt.translate`` makes them."""

    def __init__(
        self,
        translator: Translator,
        pairs: list[tuple[str, str]],
        bleu_sentences: int,
        max_tokens: int,
        precision: Precision,
        plot_sentences: int,
        plot_dir: Path,
    ):
        self.translator, self.max_tokens, self.precision = translator, max_tokens, precision
        tok = translator.tok
        src = [s for s, _ in pairs]
        self.src_ids, self.tgt_ids = tok.encode_src(src), tok.encode_tgt([t for _, t in pairs])
        n = bleu_sentences or len(pairs)
        self.bleu_src, self.bleu_ref = src[:n], [t for _, t in pairs[:n]]
        self.plot_sentences, self.plot_dir = min(plot_sentences, n), plot_dir

    @torch.no_grad()
    def __call__(self, model: Seq2Seq) -> dict:
        model.eval()
        loss_sum, n_tok, n_right = 0.0, 0, 0
        for _, b in eval_batches(self.src_ids, self.tgt_ids, self.max_tokens):
            b = b.to(self.precision.device)
            with self.precision.autocast():
                logits, _ = model(b.src, b.src_len, b.tgt_in)
            loss_sum += float(nll_loss(logits, b.tgt_out))
            # summed on the device, read once below: no second host sync per batch besides the loss's
            n_right = n_right + ((logits.argmax(-1) == b.tgt_out) & (b.tgt_out != PAD)).sum()
            n_tok += b.n_tgt_tokens
        hyps = self.hypotheses(model)
        model.train()
        loss = loss_sum / max(1, n_tok)
        return {
            "loss": loss,
            "ppl": math.exp(min(loss, 50.0)),
            # teacher-forced accuracy: the share of target pieces the model ranks first given the reference
            # prefix (OpenNMT-py's and Joey NMT's validation "acc")
            "acc": 100.0 * int(n_right) / max(1, n_tok),
            "bleu": sacrebleu.corpus_bleu(hyps, [self.bleu_ref]).score,
            "chrf": sacrebleu.corpus_chrf(hyps, [self.bleu_ref]).score,
            # the first sentence and its translation, quoted so an empty one (an untrained model) shows
            "example": f'first valid sentence: "{self.bleu_src[0]}" → "{hyps[0]}"' if hyps else "",
        }

    def _translator(self, model: Seq2Seq | None, search: SearchOptions | None = None) -> Translator:
        """The validation translator, or one like it for another ``model`` (a weight average) or ``search``."""
        tr = self.translator
        if (model is None or model is tr.model) and search is None:
            return tr
        return Translator(model or tr.model, tr.tok, tr.device, search or tr.search, tr.max_tokens, tr.max_input_len)

    def hypotheses(self, model: Seq2Seq, search: SearchOptions | None = None) -> list[str]:
        """``model``'s translations of the BLEU sentences, with the validation search or ``search``."""
        return [t.text for t in self._translator(model, search).translate(self.bleu_src)]

    def bleu(self, model: Seq2Seq, search: SearchOptions | None = None) -> float:
        """Corpus BLEU of ``model`` on the BLEU sentences (the validation search, or ``search``)."""
        return sacrebleu.corpus_bleu(self.hypotheses(model, search), [self.bleu_ref]).score

    @property
    def sentences(self) -> int:
        """How many validation sentences BLEU is computed on (``data.valid_max_sentences``)."""
        return len(self.bleu_src)

    def plot(self, step: int, model: Seq2Seq | None = None) -> dict[str, Path]:
        """Heatmaps of the first few validation sentences (saved in the run directory, sent to wandb), by
        ``model`` (default: the translator's)."""
        if self.plot_sentences <= 0:
            return {}
        tr = self._translator(model)
        from nmt.plots import heatmap  # matplotlib (~0.6 s to import): only when heatmaps are drawn

        self.plot_dir.mkdir(parents=True, exist_ok=True)
        images = {}
        for k, t in enumerate(tr.translate(self.bleu_src[: self.plot_sentences], return_attention=True)):
            if t.hypothesis.attention is not None:
                images[f"attention/sent{k}"] = heatmap(
                    t.hypothesis.attention,
                    t.src_pieces,
                    t.tgt_pieces,
                    self.plot_dir / f"step{step:07d}_sent{k}.png",
                    title=f"step {step}: {t.text[:60]}",
                )
        return images


class WeightAverage:
    """An exponential moving average of the weights (Polyak & Juditsky 1992), as OpenNMT-py's ``average_decay``
    and fairseq's ``--ema`` keep it: after update t, avg <- d * avg + (1 - d) * w with d = min(decay, (1 + t) /
    (10 + t)), so the first updates are not drowned in the initial weights. ``model`` is a copy holding the
    average: validation, best.pt and every checkpoint's ``model`` are its weights (what translating uses); the
    training weights go to ``train_model``, for resuming."""

    def __init__(self, model: Seq2Seq, decay: float):
        self.decay = decay
        self.model = copy.deepcopy(model)
        self.model.requires_grad_(False)
        self._averaged = list(self.model.parameters())  # listed once, not at every update

    @torch.no_grad()
    def update(self, model: Seq2Seq, t: int) -> None:
        d = min(self.decay, (1 + t) / (10 + t))
        torch._foreach_lerp_(self._averaged, list(model.parameters()), 1.0 - d)


# trainer.select_by's metrics as the log names them, and what counts as progress in each.
METRICS = {"bleu": "BLEU", "chrf": "chrF", "acc": "token accuracy", "loss": "validation loss"}
GAINS = {"bleu": "BLEU gain", "chrf": "chrF gain", "acc": "token accuracy gain", "loss": "validation loss improvement"}


@dataclass
class EarlyStopping:
    """Keeps the best validation by ``metric`` (trainer.select_by: ``bleu``, ``chrf`` or ``acc``, higher is
    better; ``loss``, lower is better); stops after ``patience`` validations without a gain (0 = never)."""

    patience: int = 5
    metric: str = "bleu"

    def gain(self, v: dict) -> float:
        """The validation's score with higher = better (the plateau scheduler's input)."""
        return selection_gain(self.metric, v)

    def update(self, p: Progress, v: dict) -> bool:
        """Record a validation (its metrics.jsonl record); True when it is the best so far."""
        best = p.best_score
        if best is None and p.best_bleu >= 0 and self.metric == "bleu":  # a checkpoint from before select_by
            best = p.best_bleu
        better = best is None or self.gain(v) > selection_gain(self.metric, {self.metric: best})
        if better:
            p.best_score, p.best_bleu, p.best_step, p.bad_validations = v[self.metric], v["bleu"], p.step, 0
            return True
        p.bad_validations += 1
        return False

    def reason(self, p: Progress) -> str | None:
        if self.patience and p.bad_validations >= self.patience:
            return f"no {GAINS[self.metric]} in {self.patience} validations (trainer.patience)"
        return None

    def describe_best(self, p: Progress) -> str:
        """'best valid BLEU 41.20 at step 900', or with another metric 'best valid chrF 60.10 (BLEU 41.20) ...'."""
        if self.metric == "bleu" or p.best_score is None:
            return f"best valid BLEU {p.best_bleu:.2f} at step {p.best_step}"
        name = "validation loss" if self.metric == "loss" else f"valid {METRICS[self.metric]}"  # not "valid validation"
        return (
            f"best {name} {p.best_score:.{metric_digits(self.metric)}f} (BLEU {p.best_bleu:.2f}) at step {p.best_step}"
        )


class CheckpointSaver:
    """Writes checkpoints into the run directory on rank 0: ``last.pt`` (everything, to resume),
    ``best.pt`` (weights only, to translate), ``step_N.pt`` (the newest ``keep_last``, to average).

    A file that cannot be written (disk full, permissions) is reported, the previous one is kept,
    and training goes on; ``failed`` says whether the newest write failed.
    """

    def __init__(self, rundir: RunDir, dist: Dist, keep_last: int = 0):
        self.rundir, self.dist, self.keep_last = rundir, dist, keep_last
        self.failed = False

    def save(self, state: dict, best: bool = False, step: int | None = None) -> Path | None:
        """``state`` from ``Trainer.state()`` (every rank calls both); returns last.pt's path when written."""
        if not self.dist.is_main:
            return None
        files = [("last.pt", state)]
        if best:
            files.append(("best.pt", checkpoint.weights_only(state)))
        if step is not None and self.keep_last > 0:
            files.append((step_name(step), state))
        written = None
        for name, payload in files:
            try:
                path = self.rundir.write_checkpoint(name, payload)
            except OSError as e:
                log.error("cannot write checkpoint %s (%s); the previous one is kept", name, e.strerror or e)
                self.failed = True
                continue
            self.failed = False
            written = written or path
        if step is not None and self.keep_last > 0:
            self.rundir.prune(self.keep_last)
        return written


@dataclass
class FitResult:
    """How ``fit`` ended: ``reason`` (a limit, early stopping, a fault) or ``signum`` (interrupted)."""

    reason: str
    last_validation: dict
    signum: int | None = None
    fault: bool = False  # stopped by trainer.max_bad_steps
    saved: Path | None = None  # the checkpoint written last, if any
    restart: bool = False  # stopped for a fresh process to resume from last.pt (``fit``'s restart_after_s)


class StopSignal:
    """Turns SIGINT/SIGTERM into a flag the loop checks after each step, so it can save first. ``doing`` names
    the work the flag waits for (the step, or a validation in progress), for the line that says so."""

    # GNU timeout (and `kill -TERM -- -PGID`) signal the process and then its whole group, so one stop can arrive as
    # two SIGTERMs a few milliseconds apart: a repeat within this many seconds is the same stop, not a second one.
    # Ctrl-C reaches the process once (the terminal signals each process of the group once), so SIGINT always counts.
    SAME_STOP_S = 1.0

    def __init__(self, doing: Callable[[], str] = lambda: "this step", clock: Callable[[], float] = time.monotonic):
        self.signum: int | None = None
        self.doing = doing
        self.clock = clock
        self._at = 0.0
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopSignal:
        for s in (signal.SIGINT, signal.SIGTERM):
            self._old[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        now = self.clock()
        if self.signum is not None:
            if signum == self.signum == signal.SIGTERM and now - self._at < self.SAME_STOP_S:
                return  # the group's copy of the same stop
            raise KeyboardInterrupt  # a second signal: give up at once
        self.signum, self._at = signum, now
        name = signal.Signals(signum).name
        log.warning("received %s: saving a checkpoint after %s, then exiting", name, self.doing())

    def __exit__(self, *exc) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


class Window:
    """Loss and throughput over an interval of steps; read() is the only place that syncs the device."""

    def __init__(self, device: torch.device):
        self.loss = torch.zeros((), device=device)
        self.loss_tokens = self.tgt_tokens = self.src_tokens = 0
        self.start, self.paused = time.monotonic(), 0.0  # paused: validation time to leave out
        self.steps = 0

    def add(self, loss: torch.Tensor | None, micro: list[Batch]) -> None:
        n_tgt = sum(b.n_tgt_tokens for b in micro)
        self.steps += 1
        if loss is not None:  # a skipped (non-finite) step adds its tokens to the throughput only
            self.loss += loss
            self.loss_tokens += n_tgt
        self.tgt_tokens += n_tgt
        self.src_tokens += sum(int(b.src_len.sum()) for b in micro)

    def read(self, d: Dist) -> tuple[float | None, float, float]:
        """(train loss per target token, target tokens/s, source+target tokens/s), summed over ranks."""
        secs = max(1e-9, time.monotonic() - self.start - self.paused)
        loss_sum, loss_tokens, tgt, src = d.sum([float(self.loss), self.loss_tokens, self.tgt_tokens, self.src_tokens])
        loss = loss_sum / loss_tokens if loss_tokens else None  # None: every step skipped
        return loss, tgt / secs, (tgt + src) / secs


class Trainer:
    def __init__(
        self,
        model: Seq2Seq,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        precision: Precision,
        validator: Validator | None,
        stopping: EarlyStopping,
        saver: CheckpointSaver,
        logger: RunLogger | None,
        schedule: Schedule,
        static_state: dict,
        dist: Dist | None = None,
        net: torch.nn.Module | None = None,
        average: WeightAverage | None = None,
    ):
        """``net`` is what the step runs (``model`` wrapped in DistributedDataParallel under torchrun);
        validation, decoding and checkpoints use the plain ``model``, or ``average``'s when given
        (``trainer.ema_decay``). ``validator`` and ``logger`` exist on rank 0 only. ``static_state``
        (tokenizer, config) goes into every checkpoint as it is."""
        self.model, self.net = model, net if net is not None else model
        self.average = average
        self.evaluated = average.model if average is not None else model  # what is validated and saved
        self.opt, self.sched, self.precision = optimizer, scheduler, precision
        self.validator, self.stopping, self.saver, self.logger = validator, stopping, saver, logger
        self.s, self.static_state, self.dist = schedule, static_state, dist or Dist()
        self.device = precision.device
        self.progress = Progress()
        self._calibration: tuple[int, float] | None = None
        self._doing = "this step"  # what a stop signal waits for (StopSignal's line)
        self._saved_at = self._logged_at = 0.0  # elapsed_s of the newest last.pt / progress line
        self._logged_step = 0  # the step of the newest progress line

    # ---- checkpoints ----
    def state(self) -> dict:
        """The checkpoint. Every rank must call it: it gathers each rank's data positions and RNG."""
        mine = {"positions": {s: self.progress.positions[s] for s in self.shards}, "rng": rng_state()}
        parts = self.dist.gather(mine)
        positions = [list(pos) for pos in self.progress.positions]
        for part in parts:
            for s, pos in part["positions"].items():
                positions[s] = list(pos)
        averaged = {"train_model": self.model.state_dict()} if self.average is not None else {}
        return {
            "model": self.evaluated.state_dict(),
            **averaged,
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
            "scaler": self.precision.scaler.state_dict(),
            "progress": {**self.progress.__dict__, "positions": positions},
            "rng": [part["rng"] for part in parts],  # one per rank
            **self.static_state,
        }

    def save(self, best: bool = False, step: int | None = None) -> Path | None:
        path = self.saver.save(self.state(), best=best, step=step)
        self._saved_at = self.progress.elapsed_s
        return path

    def load_state(self, path: Path, ckpt: dict, seed: int = 0) -> None:
        """Continue from a checkpoint of this run (see ``RunDir.resumable``)."""
        self.model.load_state_dict(ckpt.get("train_model", ckpt["model"]))
        if self.average is not None:
            self.average.model.load_state_dict(ckpt["model"])
        saved, mine = ckpt["optimizer"]["param_groups"], self.opt.state_dict()["param_groups"]
        if set(saved[0]) == set(mine[0]):
            self.opt.load_state_dict(ckpt["optimizer"])
        else:  # another optimizer (trainer.allow_changes=[trainer.optimizer]): its state would not fit
            log.warning("the checkpoint's optimizer state is another optimizer's: this one starts afresh")
        self.sched.load_state_dict(ckpt["scheduler"])
        if ckpt["scaler"]:  # empty when saved without fp16 (trainer.amp may change on resume)
            self.precision.scaler.load_state_dict(ckpt["scaler"])
        self.progress = p = Progress(**ckpt["progress"])
        self._saved_at = self._logged_at = p.elapsed_s
        self._logged_step = p.step
        rngs = ckpt["rng"]
        if self.dist.rank < len(rngs):
            set_rng_state(rngs[self.dist.rank])
        else:  # more ranks than the run had: a fresh stream per rank, still reproducible
            torch.manual_seed(seed + 7919 * self.dist.rank + p.step)
        best = self.stopping.describe_best(p) if p.best_bleu >= 0 else "no validation yet"
        log.info("resuming from %s: step %d, epoch %d, %s", path, p.step, p.epoch, best)

    # ---- data ----
    @property
    def shards(self) -> range:
        """The data shards this rank reads: one per micro-batch of an update (see BatchStream)."""
        a = self.s.accum_steps
        return range(self.dist.rank * a, (self.dist.rank + 1) * a)

    @property
    def num_shards(self) -> int:
        return self.dist.world_size * self.s.accum_steps

    def data_starts(self) -> list[tuple[int, int]]:
        """(epoch, batches to skip) for each of this rank's shards, from the progress (fresh or resumed)."""
        p = self.progress
        starts, exact = shard_starts(p.positions, self.num_shards)
        if not exact:
            log.warning(
                "the checkpoint was written with %d data shards, this run has %d (world size x accum_steps): "
                "weights, optimiser and schedule continue exactly; the data stream restarts in epoch %d "
                "at about the same share of it",
                len(p.positions),
                self.num_shards,
                starts[0][0],
            )
        p.positions = [[e, skip - 1] for e, skip in starts]
        return [starts[s] for s in self.shards]

    # ---- one update ----
    def train_step(self, micro: list[Batch]) -> torch.Tensor | None:
        """One update from this rank's micro-batches; returns their summed loss, or None when the
        update was skipped because the loss or gradient was non-finite.

        Every rank scales its loss by world_size / (target tokens of the whole update, all ranks):
        DDP averages gradients over ranks, so the result is the per-token mean over the global
        batch, the same as one process accumulating the same batches.
        """
        s, scaler = self.s, self.precision.scaler
        (n_tokens,) = self.dist.sum([sum(b.n_tgt_tokens for b in micro)])
        scale = self.dist.world_size / n_tokens
        total = torch.zeros((), device=self.device)
        for k, b in enumerate(micro):
            last = k == len(micro) - 1
            sync = contextlib.nullcontext() if last or not self.dist.active else self.net.no_sync()
            with sync:
                with self.precision.autocast():
                    logits, _ = self.net(b.src, b.src_len, b.tgt_in, s.teacher_forcing)
                    loss_sum = nll_loss(logits, b.tgt_out, s.label_smoothing)
                scaler.scale(loss_sum * scale).backward()
            total += loss_sum.detach().float()
        scaler.unscale_(self.opt)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), s.clip_grad or float("inf"))
        if scaler.is_enabled():  # fp16: the scaler skips inf/NaN steps itself and lowers its scale
            scaler.step(self.opt)
            scaler.update()
            ok = True
        else:
            # The one host sync per step: a NaN must never reach the weights or Adam's moments.
            # The norm is of the all-reduced gradients, so every rank decides the same.
            ok = bool(torch.isfinite(norm))
            if ok:
                self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if not ok:
            return None
        if self.average is not None:
            self.average.update(self.model, self.progress.step)
        if not isinstance(self.sched, (torch.optim.lr_scheduler.ReduceLROnPlateau, BudgetDecay)):
            self.sched.step()
        return total

    # ---- the loop ----
    def _limit_reason(self, p: Progress) -> str | None:
        s = self.s
        if s.max_steps and p.step >= s.max_steps:
            return f"reached trainer.max_steps={s.max_steps}"
        if s.max_minutes and p.elapsed_s >= 60 * s.max_minutes:
            return f"reached trainer.max_minutes={s.max_minutes:g}"
        if s.max_epochs and p.epoch >= s.max_epochs:
            return f"reached trainer.max_epochs={s.max_epochs}"
        if s.max_bad_steps and p.bad_steps >= s.max_bad_steps:
            return f"{p.bad_steps} non-finite steps in a row (trainer.max_bad_steps)"
        return self.stopping.reason(p)

    def fit(self, batches: Iterator[Batch], restart_after_s: float = 0.0) -> FitResult:
        """Train until a limit, early stopping, a fault or a signal; validate and save at the end.

        Every decision is taken from values all ranks agree on (one small all-reduce per step under
        torchrun: the signal, the elapsed time, the epoch), so ranks stop, log and save together.
        ``restart_after_s`` > 0 (one process only): also stop at the first validation after that many seconds of
        this call and return ``restart=True``, for a fresh process to resume (``trainer.restart_minutes``).
        """
        p, s = self.progress, self.s
        self.model.train()
        started, elapsed_at_start = time.monotonic(), p.elapsed_s
        since_log, since_valid = Window(self.device), Window(self.device)
        bar = tqdm(
            total=s.max_steps or None,
            initial=p.step,
            unit="step",
            dynamic_ncols=True,
            mininterval=2.0,
            disable=None if self.dist.is_main else True,  # None: shown only at a terminal
            file=sys.stderr,
        )
        signum, restart = None, False
        with StopSignal(lambda: self._doing) as stop:
            while (reason := self._limit_reason(p)) is None:
                micro = [next(batches) for _ in range(s.accum_steps)]
                local = [stop.signum or 0, elapsed_at_start + time.monotonic() - started, max(b.epoch for b in micro)]
                sig, p.elapsed_s, epoch = self.dist.max(local)
                if sig:
                    signum = int(sig)
                    break
                if s.max_epochs and epoch >= s.max_epochs:  # these batches open an epoch past the limit
                    p.epoch = int(epoch)
                    continue
                if isinstance(self.sched, BudgetDecay):  # the rate follows the share of the budget used
                    self.sched.update(p.step, budget_done(s.max_steps, s.max_minutes, p.step, p.elapsed_s))
                loss = self.train_step([b.to(self.device) for b in micro])
                self._count(p, loss)
                for w in (since_log, since_valid):
                    w.add(loss, micro)
                for b in micro:
                    p.positions[b.shard] = [b.epoch, b.index]
                # p.elapsed_s stays the value all ranks agreed on above: the log line, calibration,
                # time-based checkpoint and time limit below are collective or must match across ranks,
                # so none of them may be decided from this process's own clock.
                p.step, p.epoch = p.step + 1, max(p.epoch, int(epoch))
                bar.update(1)
                self._calibrate(p)
                # log_every steps or log_seconds since the last line, whichever comes first (counted from
                # the last line, so a time-based line is never followed by a step-based one a step later)
                if p.step - self._logged_step >= s.log_every or p.elapsed_s - self._logged_at >= s.log_seconds:
                    self._log_progress(p, since_log, bar)
                    since_log = Window(self.device)
                if p.valid_every and p.step % p.valid_every == 0 and self._limit_reason(p) is None:
                    v0 = time.monotonic()
                    # a signal now waits for it: a validation left out would be missing from the resumed run
                    self._doing = f"the validation at step {p.step}, which is running"
                    self._validate_and_save(since_valid)
                    self._doing = "this step"
                    since_valid = Window(self.device)
                    since_log.paused += time.monotonic() - v0
                    ran_s = time.monotonic() - started
                    if restart_after_s and not stop.signum and self._worth_restarting(p, ran_s, restart_after_s):
                        restart = True
                        break
                elif s.checkpoint_minutes and p.elapsed_s - self._saved_at >= 60 * s.checkpoint_minutes:
                    self.save()
        bar.close()
        if signum is not None:
            return FitResult(
                f"interrupted by {signal.Signals(signum).name}", p.last_validation, signum, saved=self.save()
            )
        if restart:
            # the validation has just written last.pt
            return FitResult("a fresh process (trainer.restart_minutes)", p.last_validation, restart=True)
        if s.max_bad_steps and p.bad_steps >= s.max_bad_steps:  # the skipped updates left the weights as they were
            return FitResult(reason, p.last_validation, fault=True, saved=self.save())
        if p.step > 0 and p.last_validation.get("step") != p.step:
            self._validate_and_save(since_valid)
        return FitResult(reason, p.last_validation)

    def _worth_restarting(self, p: Progress, ran_s: float, restart_after_s: float) -> bool:
        """After ``restart_after_s`` seconds of this process's training, once the validation has written last.pt,
        unless the time limit is nearer than half that (a fresh process would hardly pay for its start)."""
        left = 60 * self.s.max_minutes - p.elapsed_s if self.s.max_minutes else float("inf")
        return ran_s >= restart_after_s and left > restart_after_s / 2 and not self.saver.failed

    def _count(self, p: Progress, loss: torch.Tensor | None) -> None:
        if loss is not None:
            p.bad_steps = 0
            return
        p.bad_steps, p.skipped_steps = p.bad_steps + 1, p.skipped_steps + 1
        log.warning(
            "step %d: non-finite loss or gradient, update skipped (%d in a row, %d in all)",
            p.step + 1,
            p.bad_steps,
            p.skipped_steps,
        )

    def _calibrate(self, p: Progress) -> None:
        """Fix the validation interval: trainer.valid_every, or about valid_minutes of the measured step time."""
        if p.valid_every:
            return
        if self.s.valid_every:
            p.valid_every = self.s.valid_every
            return
        first, last = CALIBRATE
        if self._calibration is None and p.step >= first:
            self._calibration = (p.step, p.elapsed_s)
        elif self._calibration is not None and p.step - self._calibration[0] >= last - first:
            step0, t0 = self._calibration
            per_step = max(1e-6, (p.elapsed_s - t0) / (p.step - step0))
            p.valid_every = nice_interval(60 * self.s.valid_minutes / per_step)
            log.info(
                "validating every %d steps (about %g minutes at %.2f s/step; trainer.valid_every=N fixes it)",
                p.valid_every,
                self.s.valid_minutes,
                per_step,
            )

    def _log_progress(self, p: Progress, window: Window, bar: tqdm) -> None:
        """One progress line: step, epoch, loss, speed, elapsed time, share done and ETA of the nearest limit."""
        train_loss, tok_s, _ = window.read(self.dist)  # the one sync for logging
        self._logged_at, self._logged_step = p.elapsed_s, p.step
        lr = self.opt.param_groups[0]["lr"]
        shown = "n/a" if train_loss is None else f"{train_loss:.4f}"
        bar.set_postfix(loss=shown, tok_s=f"{tok_s:,.0f}", lr=f"{lr:.2e}", refresh=False)
        line = f"step {p.step}  epoch {p.epoch}  train loss {shown}  {tok_s:,.0f} tgt tok/s  lr {lr:.2e}"
        line += f"  elapsed {clock(p.elapsed_s)}{self._eta(p, window)}"
        log.info("%s", line)
        if self.logger is not None:  # the curves between validations (wandb, TensorBoard; not metrics.jsonl),
            # named apart from the validation record's train_loss etc., which average since the last validation
            record = {"progress/train_loss": train_loss, "progress/lr": lr, "progress/tgt_tokens_per_s": tok_s}
            self.logger.log({k: v for k, v in record.items() if v is not None}, step=p.step, to_file=False)

    def _eta(self, p: Progress, window: Window) -> str:
        """'  37% of trainer.max_steps=3000, ETA 6:40' for whichever limit comes first ('' without one)."""
        s, options = self.s, []
        if s.max_steps:
            steps = max(1, window.steps)
            per_step = (time.monotonic() - window.start - window.paused) / steps
            options.append(
                (p.step / s.max_steps, (s.max_steps - p.step) * per_step, f"trainer.max_steps={s.max_steps}")
            )
        if s.max_minutes:
            total = 60 * s.max_minutes
            options.append((p.elapsed_s / total, total - p.elapsed_s, f"trainer.max_minutes={s.max_minutes:g}"))
        if not options:
            return ""
        done, left, which = min(options, key=lambda o: o[1])
        return f"  {100 * min(done, 1.0):.0f}% of {which}, ETA {clock(max(0.0, left))}"

    def _validate_and_save(self, window: Window) -> None:
        """Rank 0 validates while the others wait; all apply its result, so early stopping and the
        plateau schedule agree on every rank."""
        p = self.progress
        train_loss, tok_s, src_tgt_tok_s = window.read(self.dist)
        v = None
        if self.validator is not None:
            with heartbeat(f"validating at step {p.step}"):
                v = self.validator(self.evaluated)
        v = self.dist.broadcast(v)
        record = {
            "step": p.step,
            "epoch": p.epoch,
            "loss": v["loss"],
            "ppl": v["ppl"],
            "acc": v["acc"],
            "bleu": v["bleu"],
            "chrf": v["chrf"],
            "train_loss": train_loss,
            "lr": self.opt.param_groups[0]["lr"],
            "tgt_tokens_per_s": tok_s,
            "src_tgt_tokens_per_s": src_tgt_tok_s,
            "elapsed_s": p.elapsed_s,
            "skipped_steps": p.skipped_steps,
            "peak_memory_mib": round(allocator.peak_mib(self.precision.device)),
            **allocator.heap_stats(self.precision.device),
        }
        improved = self.stopping.update(p, v)
        if isinstance(self.sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
            self.sched.step(self.stopping.gain(v))
        p.last_validation = record
        if self.logger is not None:
            self.logger.log(record, step=p.step)
            log.info(
                "validation at step %d: loss %.4f  ppl %.2f  acc %.1f%%  BLEU %.2f  chrF %.2f%s%s",
                p.step,
                v["loss"],
                v["ppl"],
                v["acc"],
                v["bleu"],
                v["chrf"],
                "  (best)" if improved else "",
                f" | {v['example']}" if v["example"] else "",
            )
            self.logger.log_images(self.validator.plot(p.step, self.evaluated), step=p.step)
        self.save(best=improved, step=p.step)


def nice_interval(steps: float) -> int:
    """Round down to two significant digits (1,234 -> 1,200), at least 10."""
    n = max(10, int(steps))
    scale = 10 ** max(0, len(str(n)) - 2)
    return n // scale * scale
