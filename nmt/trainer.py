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
from nmt.data.batching import Batch, eval_batches, shard_starts
from nmt.data.tokenizer import Tokenizer
from nmt.distributed import Dist
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
    epoch: int = 0  # newest epoch any shard has reached
    # Per data shard, the [epoch, index] of its last consumed batch (see BatchStream).
    positions: list[list[int]] = field(default_factory=list)
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
    # fused: one kernel over all parameters instead of ~10 element-wise passes per tensor (+1-5% for
    # model R on CPU, docs/benchmarks.md); the same update rule.
    return opts[t.optimizer](model.parameters(), lr=t.lr, betas=tuple(t.betas), weight_decay=t.weight_decay, fused=True)


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


def cpu_has_native_bf16() -> bool:
    """AMX or AVX512-BF16: bf16 matrix products run several times faster than float32 there."""
    cpu = torch.cpu
    return any(getattr(cpu, f, lambda: False)() for f in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"))


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

    def add(self, loss: torch.Tensor | None, micro: list[Batch]) -> None:
        n_tgt = sum(b.n_tgt_tokens for b in micro)
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
        tokenizer: Tokenizer,
        cfg: Any,
        plain_config: dict,
        run_dir: Path,
        device: torch.device,
        valid_pairs: list[tuple[str, str]],
        logger: RunLogger | None,
        dist: Dist | None = None,
    ):
        """``logger`` is None on every rank but 0; under torchrun ``model`` is wrapped in
        DistributedDataParallel for the training step only (validation, decoding and
        checkpoints use the plain module, on rank 0)."""
        self.model, self.tok, self.cfg, self.t = model, tokenizer, cfg, cfg.trainer
        self.plain_config, self.run_dir, self.device = plain_config, run_dir, device
        self.ckpt_dir = run_dir / "checkpoints"
        self.logger, self.dist = logger, dist or Dist()
        self.net: torch.nn.Module = model
        if self.dist.active:
            ids = [device.index] if device.type == "cuda" else None
            self.net = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
        if self.t.accum_steps < 1:
            raise ConfigError(f"trainer.accum_steps={self.t.accum_steps}: expected an integer >= 1")
        self.opt = build_optimizer(model, self.t)
        self.sched = build_scheduler(self.opt, self.t)
        self.progress = Progress()
        self.last_save_failed = False
        self.amp_dtype = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}.get(self.t.amp, "?")
        if self.amp_dtype == "?":
            raise ConfigError(f"trainer.amp={self.t.amp!r} is unknown; choose none, bf16 or fp16")
        precision = "float32" if self.amp_dtype is None else f"{self.t.amp} autocast"
        if device.type == "cpu":
            # Autocasting the whole CPU step loses: it casts per op and per time step. The big
            # products (vocabulary projection, the RNN step loops' GEMMs) run in bf16 instead, weights
            # cast once per pass, and only where the CPU has bf16 matrix units (AMX / AVX512-BF16);
            # see docs/benchmarks.md.
            native = self.amp_dtype == torch.bfloat16 and cpu_has_native_bf16()
            model.encoder.matmul_dtype = model.decoder.matmul_dtype = torch.bfloat16 if native else None
            precision = "float32, bf16 matrix products" if native else "float32"
            self.amp_dtype = None
        log.info("training precision: %s", precision)
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
        """The checkpoint. Every rank must call it: it gathers each rank's data positions and RNG."""
        mine = {"positions": {s: self.progress.positions[s] for s in self.shards}, "rng": rng_state()}
        parts = self.dist.gather(mine)
        positions = [list(pos) for pos in self.progress.positions]
        for part in parts:
            for s, pos in part["positions"].items():
                positions[s] = list(pos)
        return {
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
            "scaler": self.scaler.state_dict(),
            "progress": {**self.progress.__dict__, "positions": positions},
            "rng": [part["rng"] for part in parts],  # one per rank
            "tokenizer": self.tok.state_dict(),
            "config": self.plain_config,
        }

    def save(self, *names: str) -> Path | None:
        """Write checkpoints (every rank calls this, rank 0 writes); returns the first path written.

        On a disk error say so, keep the previous file, and go on training.
        """
        state = self.state()
        if not self.dist.is_main:
            return None
        written = None
        for name in names:
            path = self.ckpt_dir / name
            try:
                checkpoint.save(path, state)
            except OSError as e:
                log.error("cannot write checkpoint %s (%s); the previous one is kept", path, e.strerror or e)
                self.last_save_failed = True
                continue
            self.last_save_failed = False
            written = written or path
        return written

    def load_state(self, path: Path, ckpt: dict) -> None:
        """Continue from a checkpoint of this run (see ``find_checkpoint``)."""
        self.model.load_state_dict(ckpt["model"])
        self.opt.load_state_dict(ckpt["optimizer"])
        self.sched.load_state_dict(ckpt["scheduler"])
        self.scaler.load_state_dict(ckpt["scaler"])
        self.progress = Progress(**ckpt["progress"])
        rngs = ckpt["rng"]
        if self.dist.rank < len(rngs):
            set_rng_state(rngs[self.dist.rank])
        else:  # more ranks than the run had: a fresh stream per rank, still reproducible
            torch.manual_seed(self.cfg.seed + 7919 * self.dist.rank + self.progress.step)
        log.info(
            "resuming from %s: step %d, epoch %d, best BLEU %.2f",
            path,
            self.progress.step,
            self.progress.epoch,
            self.progress.best_bleu,
        )

    def _prune_step_checkpoints(self) -> None:
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
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    # ---- the loop ----
    @property
    def shards(self) -> range:
        """The data shards this rank reads: one per micro-batch of an update (see BatchStream)."""
        a = self.t.accum_steps
        return range(self.dist.rank * a, (self.dist.rank + 1) * a)

    @property
    def num_shards(self) -> int:
        return self.dist.world_size * self.t.accum_steps

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

    def train_step(self, micro: list[Batch]) -> torch.Tensor | None:
        """One update from this rank's micro-batches; returns their summed loss, or None when the
        update was skipped because the loss or gradient was non-finite.

        Every rank scales its loss by world_size / (target tokens of the whole update, all ranks):
        DDP averages gradients over ranks, so the result is the per-token mean over the global
        batch, the same as one process accumulating the same batches.
        """
        (n_tokens,) = self.dist.sum([sum(b.n_tgt_tokens for b in micro)])
        scale = self.dist.world_size / n_tokens
        total = torch.zeros((), device=self.device)
        for k, b in enumerate(micro):
            last = k == len(micro) - 1
            sync = contextlib.nullcontext() if last or not self.dist.active else self.net.no_sync()
            with sync:
                with self._autocast():
                    logits, _ = self.net(b.src, b.src_len, b.tgt_in, self.t.teacher_forcing)
                    loss_sum = nll_loss(logits, b.tgt_out, self.t.label_smoothing)
                self.scaler.scale(loss_sum * scale).backward()
            total += loss_sum.detach().float()
        self.scaler.unscale_(self.opt)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.t.clip_grad or float("inf"))
        if self.scaler.is_enabled():  # fp16: the scaler skips inf/NaN steps itself and lowers its scale
            self.scaler.step(self.opt)
            self.scaler.update()
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
        if not isinstance(self.sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
            self.sched.step()
        return total

    def _done(self, p: Progress) -> str | None:
        t = self.t
        if t.max_steps and p.step >= t.max_steps:
            return f"reached trainer.max_steps={t.max_steps}"
        if t.max_minutes and p.elapsed_s >= 60 * t.max_minutes:
            return f"reached trainer.max_minutes={t.max_minutes}"
        if t.max_epochs and p.epoch >= t.max_epochs:
            return f"reached trainer.max_epochs={t.max_epochs}"
        if t.patience and p.bad_validations >= t.patience:
            return f"no BLEU gain in {t.patience} validations (trainer.patience)"
        if t.max_bad_steps and p.bad_steps >= t.max_bad_steps:
            return f"{p.bad_steps} non-finite steps in a row (trainer.max_bad_steps)"
        return None

    def fit(self, batches: Iterator[Batch]) -> dict:
        """Train until a limit, early stopping or a signal; validate and save at the end.

        Every stop decision is taken from values all ranks agree on (one small all-reduce per
        step under torchrun: the signal, the elapsed time, the epoch), so ranks stop together.
        """
        p, t = self.progress, self.t
        self.model.train()
        started, elapsed_at_start = time.monotonic(), p.elapsed_s
        since_log, since_valid = Window(self.device), Window(self.device)
        bar = tqdm(
            total=t.max_steps or None,
            initial=p.step,
            unit="step",
            dynamic_ncols=True,
            mininterval=2.0,
            disable=None if self.dist.is_main else True,
            file=sys.stderr,
        )
        with StopSignal() as stop:
            while True:
                reason = self._done(p)
                if reason is not None:
                    break
                micro = [next(batches) for _ in range(t.accum_steps)]
                local = [stop.signum or 0, elapsed_at_start + time.monotonic() - started, max(b.epoch for b in micro)]
                signum, p.elapsed_s, epoch = self.dist.max(local)
                if signum:
                    stop.signum = int(signum)
                    break
                if t.max_epochs and epoch >= t.max_epochs:  # these batches open an epoch past the limit
                    p.epoch = int(epoch)
                    continue
                loss = self.train_step([b.to(self.device) for b in micro])
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
                    w.add(loss, micro)
                for b in micro:
                    p.positions[b.shard] = [b.epoch, b.index]
                p.step, p.epoch = p.step + 1, max(p.epoch, int(epoch))
                p.elapsed_s = elapsed_at_start + time.monotonic() - started
                bar.update(1)
                if p.step % t.log_every == 0:
                    train_loss, tok_s, _ = since_log.read(self.dist)  # the one sync for logging
                    lr = self.opt.param_groups[0]["lr"]
                    shown = "n/a" if train_loss is None else f"{train_loss:.4f}"
                    bar.set_postfix(loss=shown, tok_s=f"{tok_s:,.0f}", lr=f"{lr:.2e}", refresh=False)
                    msg = "step %d  epoch %d  train loss %s  %.0f tgt tok/s  lr %.2e"
                    log.info(msg, p.step, p.epoch, shown, tok_s, lr)
                    since_log = Window(self.device)
                if p.step % t.valid_every == 0 and self._done(p) is None:
                    v0 = time.monotonic()
                    self._validate_and_save(since_valid)
                    since_valid = Window(self.device)
                    since_log.paused += time.monotonic() - v0
            bar.close()
            if stop.signum is not None:
                path = self.save("last.pt")
                if path is not None:
                    log.warning("interrupted at step %d: saved %s; continue with trainer.resume=true", p.step, path)
                if self.logger is not None:
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
        """Rank 0 validates while the others wait; all apply its result, so early stopping and the
        plateau schedule agree on every rank."""
        p = self.progress
        train_loss, tok_s, src_tgt_tok_s = window.read(self.dist)
        v = self.validate() if self.dist.is_main else None
        v = self.dist.broadcast(v)
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
        if self.logger is not None:
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
        keep = self.t.keep_last > 0
        self.save("last.pt", *(["best.pt"] if improved else []), *([f"step_{p.step}.pt"] if keep else []))
        if self.dist.is_main and keep:
            self._prune_step_checkpoints()

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
