"""The training loop: optimisation, validation, early stopping, checkpoints, resume, signals.

One loop, no callbacks: read top to bottom to see everything a step does. The step
itself never waits on the device (losses are accumulated as tensors and read only
when logging), so CUDA runs ahead of Python.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sacrebleu
import torch
from tqdm import tqdm

from nmt import checkpoint
from nmt.data.batching import Batch, eval_batches
from nmt.data.tokenizer import Tokenizer
from nmt.errors import CheckpointError, ConfigError, NmtError
from nmt.logger import RunLogger
from nmt.models.seq2seq import Seq2Seq, nll_loss
from nmt.plots import heatmap
from nmt.search import SearchOptions
from nmt.translator import Translator

log = logging.getLogger(__name__)


@dataclass
class Progress:
    """Everything besides weights/optimiser that a resumed run must get back."""

    step: int = 0
    epoch: int = 0
    batch_index: int = -1  # last batch of ``epoch`` consumed
    best_bleu: float = -1.0
    bad_validations: int = 0  # validations in a row without a BLEU gain (early stopping)
    elapsed_s: float = 0.0  # wall-clock seconds of training so far (counts against max_minutes)
    bad_steps: int = 0  # non-finite steps in a row
    skipped_steps: int = 0  # non-finite steps in all (their updates were skipped)
    last_validation: dict = field(default_factory=dict)  # the newest metrics.jsonl record


def build_optimizer(model: torch.nn.Module, t: Any) -> torch.optim.Optimizer:
    opts = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    if t.optimizer not in opts:
        raise ConfigError(f"trainer.optimizer={t.optimizer!r} is unknown; choose one of {sorted(opts)}")
    return opts[t.optimizer](model.parameters(), lr=t.lr, betas=tuple(t.betas), weight_decay=t.weight_decay)


def build_scheduler(opt: torch.optim.Optimizer, t: Any):
    """Per-step LambdaLR for constant/warmup_decay; ReduceLROnPlateau on valid BLEU for plateau."""
    if t.scheduler == "plateau":
        return torch.optim.lr_scheduler.ReduceLROnPlateau(
            opt, mode="max", factor=t.plateau_factor, patience=t.plateau_patience, min_lr=t.min_lr
        )
    if t.scheduler == "constant":
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    if t.scheduler == "warmup_decay":
        w = max(1, t.warmup_steps)
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / w, math.sqrt(w / (s + 1))))
    raise ConfigError(f"trainer.scheduler={t.scheduler!r} is unknown; choose constant, warmup_decay or plateau")


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# Keys that may change between an interrupted run and its resumption without being named in
# trainer.allow_changes: limits, where it runs, and where it logs. Entries ending in "." are prefixes.
RESUME_MAY_CHANGE = (
    "trainer.resume",
    "trainer.allow_changes",
    "trainer.max_steps",
    "trainer.max_minutes",
    "trainer.max_epochs",
    "trainer.patience",
    "trainer.log_every",
    "trainer.threads",
    "device",
    "data.dir",
    "data.num_workers",
    "tokenizer.cache_dir",
    "wandb.",
)


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_changes(saved: dict, current: dict, allowed: list[str]) -> list[str]:
    """Keys whose values differ between two configs, minus those allowed to change."""
    a, b = flatten(saved), flatten(current)
    ok = tuple(RESUME_MAY_CHANGE) + tuple(allowed)
    return [
        f"{k}: {a.get(k, '<absent>')!r} -> {b.get(k, '<absent>')!r}"
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k) and not any(k == x or (x.endswith(".") and k.startswith(x)) for x in ok)
    ]


def find_checkpoint(ckpt_dir: Path, device: torch.device) -> tuple[Path, dict] | None:
    """The newest loadable checkpoint of a run: last.pt, else the step_N.pt files, newest first."""
    candidates = [ckpt_dir / "last.pt"] + sorted(
        ckpt_dir.glob("step_*.pt"), key=lambda p: int(p.stem.split("_")[1]), reverse=True
    )
    for path in candidates:
        if not path.is_file():
            continue
        try:
            return path, checkpoint.load(path, map_location=device)
        except CheckpointError as e:
            log.warning("%s; falling back to an older checkpoint", e)
    return None


class StopSignal:
    """Turns SIGINT/SIGTERM into a flag the loop checks after each step, so it can save first."""

    def __init__(self):
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopSignal:
        for s in (signal.SIGINT, signal.SIGTERM):
            self._old[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:  # second signal: give up at once
            raise KeyboardInterrupt
        self.signum = signum
        log.warning("received %s: saving a checkpoint after this step, then exiting", signal.Signals(signum).name)

    def __exit__(self, *exc) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


class Window:
    """Loss and throughput over an interval of steps; read() is the only place that syncs the device."""

    def __init__(self, device: torch.device):
        self.loss = torch.zeros((), device=device)
        self.loss_tokens = self.tgt_tokens = self.src_tokens = 0
        self.start, self.paused = time.monotonic(), 0.0  # paused: validation time to leave out

    def add(self, loss: torch.Tensor | None, b: Batch) -> None:
        if loss is not None:  # a skipped (non-finite) step adds its tokens to the throughput only
            self.loss += loss
            self.loss_tokens += b.n_tgt_tokens
        self.tgt_tokens += b.n_tgt_tokens
        self.src_tokens += int(b.src_len.sum())

    def read(self) -> tuple[float | None, float, float]:
        """(train loss per target token, target tokens/s, source+target tokens/s)."""
        secs = max(1e-9, time.monotonic() - self.start - self.paused)
        loss = float(self.loss) / self.loss_tokens if self.loss_tokens else None  # None: every step skipped
        return loss, self.tgt_tokens / secs, (self.tgt_tokens + self.src_tokens) / secs


class Trainer:
    def __init__(
        self,
        model: Seq2Seq,
        tokenizer: Tokenizer,
        cfg: Any,
        plain_config: dict,
        run_dir: Path,
        device: torch.device,
        valid_pairs: list[tuple[str, str]],
        logger: RunLogger,
    ):
        self.model, self.tok, self.cfg, self.t = model, tokenizer, cfg, cfg.trainer
        self.plain_config, self.run_dir, self.device = plain_config, run_dir, device
        self.ckpt_dir = run_dir / "checkpoints"
        self.logger = logger
        self.opt = build_optimizer(model, self.t)
        self.sched = build_scheduler(self.opt, self.t)
        self.progress = Progress()
        self.last_save_failed = False
        self.amp_dtype = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}.get(self.t.amp, "?")
        if self.amp_dtype == "?":
            raise ConfigError(f"trainer.amp={self.t.amp!r} is unknown; choose none, bf16 or fp16")
        if device.type != "cuda":
            self.amp_dtype = None  # autocast is a CUDA speed path; CPU trains in float32
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp_dtype == torch.float16)
        valid_src = [s for s, _ in valid_pairs]
        self.valid_src_ids = tokenizer.encode_src(valid_src)
        self.valid_tgt_ids = tokenizer.encode_tgt([t for _, t in valid_pairs])
        n_bleu = cfg.data.valid_max_sentences or len(valid_pairs)
        self.bleu_src, self.bleu_ref = valid_src[:n_bleu], [t for _, t in valid_pairs[:n_bleu]]
        search = SearchOptions(beam_size=self.t.val_beam_size)  # what nmt.translate does at that beam size
        self.translator = Translator(model, tokenizer, device, search, max_tokens=4 * cfg.data.max_tokens)

    # ---- checkpoints ----
    def state(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
            "scaler": self.scaler.state_dict(),
            "progress": self.progress.__dict__,
            "rng": rng_state(),
            "tokenizer": self.tok.state_dict(),
            "config": self.plain_config,
        }

    def save(self, name: str) -> Path | None:
        """Write a checkpoint; on a disk error say so, keep the previous file, and go on training."""
        path = self.ckpt_dir / name
        try:
            checkpoint.save(path, self.state())
        except OSError as e:
            log.error("cannot write checkpoint %s (%s); the previous one is kept", path, e.strerror or e)
            self.last_save_failed = True
            return None
        self.last_save_failed = False
        return path

    def load_state(self, path: Path, ckpt: dict) -> None:
        """Continue from a checkpoint of this run (see ``find_checkpoint``)."""
        self.model.load_state_dict(ckpt["model"])
        self.opt.load_state_dict(ckpt["optimizer"])
        self.sched.load_state_dict(ckpt["scheduler"])
        self.scaler.load_state_dict(ckpt["scaler"])
        self.progress = Progress(**ckpt["progress"])
        set_rng_state(ckpt["rng"])
        log.info(
            "resuming from %s: step %d, epoch %d, best BLEU %.2f",
            path,
            self.progress.step,
            self.progress.epoch,
            self.progress.best_bleu,
        )

    def _keep_step_checkpoint(self) -> None:
        if self.t.keep_last <= 0:
            return
        self.save(f"step_{self.progress.step}.pt")
        old = sorted(self.ckpt_dir.glob("step_*.pt"), key=lambda p: int(p.stem.split("_")[1]))
        for p in old[: -self.t.keep_last]:
            p.unlink(missing_ok=True)

    # ---- validation ----
    @torch.no_grad()
    def validate(self) -> dict:
        self.model.eval()
        loss_sum, n_tok = 0.0, 0
        for _, b in eval_batches(self.valid_src_ids, self.valid_tgt_ids, self.cfg.data.max_tokens):
            b = b.to(self.device)
            with self._autocast():
                logits, _ = self.model(b.src, b.src_len, b.tgt_in)
            loss_sum += float(nll_loss(logits, b.tgt_out))
            n_tok += b.n_tgt_tokens
        hyps = [tr.text for tr in self.translator.translate(self.bleu_src)]
        self.model.train()
        loss = loss_sum / max(1, n_tok)
        bleu = sacrebleu.corpus_bleu(hyps, [self.bleu_ref])
        chrf = sacrebleu.corpus_chrf(hyps, [self.bleu_ref])
        return {
            "loss": loss,
            "ppl": math.exp(min(loss, 50.0)),
            "bleu": bleu.score,
            "chrf": chrf.score,
            "example": hyps[0] if hyps else "",
        }

    def _autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type="cuda", dtype=self.amp_dtype)

    # ---- the loop ----
    def train_step(self, b: Batch) -> torch.Tensor | None:
        """One update; returns the summed loss, or None when it was non-finite and the update skipped."""
        with self._autocast():
            logits, _ = self.model(b.src, b.src_len, b.tgt_in, self.t.teacher_forcing)
            loss_sum = nll_loss(logits, b.tgt_out, self.t.label_smoothing)
        self.scaler.scale(loss_sum / b.n_tgt_tokens).backward()
        self.scaler.unscale_(self.opt)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.t.clip_grad or float("inf"))
        if self.scaler.is_enabled():  # fp16: the scaler skips inf/NaN steps itself and lowers its scale
            self.scaler.step(self.opt)
            self.scaler.update()
            ok = True
        else:
            # The one host sync per step: a NaN must never reach the weights or Adam's moments.
            ok = bool(torch.isfinite(norm))
            if ok:
                self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if not ok:
            return None
        if not isinstance(self.sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
            self.sched.step()
        return loss_sum.detach()

    def _done(self, p: Progress) -> str | None:
        t = self.t
        if t.max_steps and p.step >= t.max_steps:
            return f"reached trainer.max_steps={t.max_steps}"
        if t.max_minutes and p.elapsed_s >= 60 * t.max_minutes:  # elapsed_s is updated after every step
            return f"reached trainer.max_minutes={t.max_minutes}"
        if t.patience and p.bad_validations >= t.patience:
            return f"no BLEU gain in {t.patience} validations (trainer.patience)"
        if t.max_bad_steps and p.bad_steps >= t.max_bad_steps:
            return f"{p.bad_steps} non-finite steps in a row (trainer.max_bad_steps)"
        return None

    def fit(self, batches: Iterator[Batch]) -> dict:
        """Train until a limit, early stopping or a signal; validate and save at the end."""
        p, t = self.progress, self.t
        self.model.train()
        started, elapsed_at_start = time.monotonic(), p.elapsed_s
        since_log, since_valid = Window(self.device), Window(self.device)
        reason = self._done(p)
        bar = tqdm(
            total=t.max_steps or None,
            initial=p.step,
            unit="step",
            dynamic_ncols=True,
            mininterval=2.0,
            disable=None,
            file=sys.stderr,
        )
        with StopSignal() as stop:
            while reason is None:
                b = next(batches)
                if t.max_epochs and b.epoch >= t.max_epochs:
                    reason = f"reached trainer.max_epochs={t.max_epochs}"
                    break
                loss = self.train_step(b.to(self.device))
                if loss is None:
                    p.bad_steps, p.skipped_steps = p.bad_steps + 1, p.skipped_steps + 1
                    log.warning(
                        "step %d: non-finite loss or gradient, update skipped (%d in a row, %d in all)",
                        p.step + 1,
                        p.bad_steps,
                        p.skipped_steps,
                    )
                else:
                    p.bad_steps = 0
                for w in (since_log, since_valid):
                    w.add(loss, b)
                p.step, p.epoch, p.batch_index = p.step + 1, b.epoch, b.index
                p.elapsed_s = elapsed_at_start + time.monotonic() - started
                bar.update(1)
                if p.step % t.log_every == 0:
                    train_loss, tok_s, _ = since_log.read()  # the one sync for logging: every log_every steps
                    lr = self.opt.param_groups[0]["lr"]
                    shown = "n/a" if train_loss is None else f"{train_loss:.4f}"
                    bar.set_postfix(loss=shown, tok_s=f"{tok_s:,.0f}", lr=f"{lr:.2e}", refresh=False)
                    msg = "step %d  epoch %d  train loss %s  %.0f tgt tok/s  lr %.2e"
                    log.info(msg, p.step, p.epoch, shown, tok_s, lr)
                    since_log = Window(self.device)
                if stop.signum is not None:
                    break
                reason = self._done(p)
                if reason is None and p.step % t.valid_every == 0:
                    v0 = time.monotonic()
                    self._validate_and_save(since_valid)
                    since_valid = Window(self.device)
                    since_log.paused += time.monotonic() - v0
                    reason = self._done(p)
            bar.close()
            if stop.signum is not None:
                path = self.save("last.pt")
                if path is not None:
                    log.warning("interrupted at step %d: saved %s; continue with trainer.resume=true", p.step, path)
                self.logger.finish()
                raise SystemExit(128 + stop.signum)
        log.info("stopping: %s", reason)
        if t.max_bad_steps and p.bad_steps >= t.max_bad_steps:
            self.save("last.pt")  # the skipped updates left the weights as they were before the fault
            raise NmtError(
                f"stopped at step {p.step}: {reason}; {self.ckpt_dir / 'last.pt'} holds the weights from "
                "before the fault (try a lower trainer.lr, or check the data)"
            )
        if p.step > 0 and p.last_validation.get("step") != p.step:
            self._validate_and_save(since_valid)
        if self.last_save_failed:
            raise NmtError(
                f"training ended at step {p.step}, but its final checkpoint could not be written to "
                f"{self.ckpt_dir} (see the errors above)"
            )
        return p.last_validation

    def _validate_and_save(self, window: Window) -> None:
        p = self.progress
        train_loss, tok_s, src_tgt_tok_s = window.read()
        v = self.validate()
        record = {
            "step": p.step,
            "epoch": p.epoch,
            "loss": v["loss"],
            "ppl": v["ppl"],
            "bleu": v["bleu"],
            "chrf": v["chrf"],
            "train_loss": train_loss,
            "lr": self.opt.param_groups[0]["lr"],
            "tgt_tokens_per_s": tok_s,
            "src_tgt_tokens_per_s": src_tgt_tok_s,
            "elapsed_s": p.elapsed_s,
            "skipped_steps": p.skipped_steps,
        }
        improved = v["bleu"] > p.best_bleu
        if improved:
            p.best_bleu, p.bad_validations = v["bleu"], 0
        else:
            p.bad_validations += 1
        if isinstance(self.sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
            self.sched.step(v["bleu"])
        p.last_validation = record
        self.logger.log(record, step=p.step)
        log.info(
            "validation at step %d: loss %.4f  ppl %.2f  BLEU %.2f  chrF %.2f%s | %s",
            p.step,
            v["loss"],
            v["ppl"],
            v["bleu"],
            v["chrf"],
            "  (best)" if improved else "",
            v["example"],
        )
        self.logger.log_images(self.plot_attention(), step=p.step)
        self.save("last.pt")
        if improved:
            self.save("best.pt")
        self._keep_step_checkpoint()

    def plot_attention(self) -> dict[str, Path]:
        """Heatmaps of a few fixed validation sentences, saved under run_dir/attention/ (and sent to wandb)."""
        n = min(self.t.plot_attention, len(self.bleu_src))
        if n <= 0:
            return {}
        out = self.run_dir / "attention"
        out.mkdir(exist_ok=True)
        images = {}
        for k, tr in enumerate(self.translator.translate(self.bleu_src[:n], return_attention=True)):
            if tr.hypothesis.attention is not None:
                path = out / f"step{self.progress.step:07d}_sent{k}.png"
                images[f"attention/sent{k}"] = heatmap(
                    tr.hypothesis.attention,
                    tr.src_pieces,
                    tr.tgt_pieces,
                    path,
                    title=f"step {self.progress.step}: {tr.text[:60]}",
                )
        return images
