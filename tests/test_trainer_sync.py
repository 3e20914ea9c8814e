"""Under torchrun every rank must take the same decisions in ``Trainer.fit``: the progress line
(a collective), the automatic validation interval, the time-based checkpoint (it gathers) and
the time limit. They are all decided from the elapsed time the ranks agree on (``Dist.max``),
never from one process's own clock; otherwise a rank whose clock lags would skip a collective
the others enter, and the job would hang.

A single process stands in for the job: its ``Dist.max`` answers as if another rank's clock
gained ``AHEAD`` seconds on this one at every step, which is what a real all-reduce of the elapsed
time returns when a peer is slower. Every time-based decision must then follow the peer's clock.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from nmt.config import TrainConfig
from nmt.data.batching import collate
from nmt.distributed import Dist
from nmt.models.build import build_model
from nmt.schedules import BudgetDecay
from nmt.trainer import EarlyStopping, Schedule, Trainer
from nmt.training import build_optimizer, build_precision

V = 30
AHEAD = 100.0  # seconds the (simulated) slowest peer's clock gains on this process per step


@dataclasses.dataclass(frozen=True)
class AgreedClock(Dist):
    """One process whose all-reduced maximum of the elapsed time adds ``offset(k)`` seconds at its k-th
    step (k from 1): by default a peer's clock gaining ``AHEAD`` s on this one at every step."""

    offset: Callable[[int], float] = lambda k: AHEAD * k
    steps: itertools.count = dataclasses.field(default_factory=lambda: itertools.count(1), compare=False)

    def max(self, values: list[float]) -> list[float]:
        sig, elapsed, epoch = values
        return [sig, elapsed + self.offset(next(self.steps)), epoch]


class Saves:
    def __init__(self):
        self.steps: list[int] = []

    def save(self, state: dict, best: bool = False, step: int | None = None) -> Path:
        self.steps.append(state["progress"]["step"])
        return Path("last.pt")


def validator(model) -> dict:
    return {"loss": 1.0, "ppl": 2.7, "acc": 50.0, "bleu": 1.0, "chrf": 1.0}


def make_trainer(schedule: Schedule, scheduler: Callable | None = None) -> tuple[Trainer, Saves]:
    """``scheduler(opt)`` builds the learning-rate schedule (default: a constant rate)."""
    torch.manual_seed(0)
    cfg = OmegaConf.structured(TrainConfig)
    cfg.encoder.update(emb_size=8, hidden_size=6, layers=1, dropout=0.0)
    cfg.decoder.update(emb_size=8, hidden_size=12, layers=1, dropout=0.0)
    cfg.attention.name = "dot"
    cfg.model.rnn_impl = "eager"
    model = build_model(cfg.encoder, cfg.attention, cfg.decoder, V, V, rnn_impl="eager", device="cpu")
    opt = build_optimizer(model, cfg.trainer)
    sched = scheduler(opt) if scheduler else torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    precision = build_precision("none", torch.device("cpu"), model)
    saves = Saves()
    trainer = Trainer(
        model, opt, sched, precision, validator, EarlyStopping(0), saves, None, schedule, {}, AgreedClock()
    )
    trainer.data_starts()  # a fresh run: the data position of each shard
    return trainer, saves


def batches():
    g = torch.Generator().manual_seed(0)
    for i in itertools.count():
        src = [torch.randint(4, V, (n,), generator=g).tolist() for n in (5, 3)]
        tgt = [torch.randint(4, V, (n,), generator=g).tolist() for n in (4, 6)]
        yield dataclasses.replace(collate(src, tgt), index=i)


def test_time_limit_follows_the_agreed_clock():
    """The peer is past a 1-minute budget after the first step: every rank stops there."""
    trainer, _ = make_trainer(Schedule(max_minutes=1.0, max_steps=50, checkpoint_minutes=0, valid_every=1000))
    result = trainer.fit(batches())
    assert result.reason == "reached trainer.max_minutes=1"
    assert trainer.progress.step == 1


def test_checkpoint_clock_and_progress_line_follow_the_agreed_clock():
    """last.pt every minute and a progress line every 30 s of the *peer's* clock: at every step."""
    trainer, saves = make_trainer(
        Schedule(max_steps=4, checkpoint_minutes=1.0, log_every=1000, log_seconds=30.0, valid_every=1000)
    )
    logged = []
    trainer._log_progress = lambda p, window, bar: logged.append(p.step) or setattr(trainer, "_logged_at", p.elapsed_s)
    trainer.fit(batches())
    assert saves.steps[:3] == [1, 2, 3]  # then the end of the run (step 4: validation)
    assert logged == [1, 2, 3, 4]


def test_progress_lines_count_steps_from_the_last_line():
    """A time-based line at step 2 moves the next step-based one to step 5, not step 3 (which would
    print two lines a step apart)."""
    trainer, _ = make_trainer(
        Schedule(max_steps=9, checkpoint_minutes=0, log_every=3, log_seconds=30.0, valid_every=1000)
    )
    trainer.dist = AgreedClock(offset=lambda k: 40.0 if k >= 2 else 0.0)  # the clock jumps 40 s at step 2
    logged, log_progress = [], trainer._log_progress
    trainer._log_progress = lambda p, window, bar: logged.append(p.step) or log_progress(p, window, bar)
    trainer.fit(batches())
    assert logged == [2, 5, 8]


def record_rates(trainer: Trainer) -> list[float]:
    """The learning rate of every update the trainer makes from now on."""
    rates: list[float] = []
    trainer.opt.register_step_pre_hook(lambda opt, args, kwargs: rates.append(opt.param_groups[0]["lr"]))
    return rates


def test_budget_schedule_follows_the_agreed_clock():
    """trainer.scheduler=budget decays by the elapsed time all ranks agree on: with a peer gaining 100 s
    per step on a 10-minute budget, update k (from 1) runs at k/6 of it, whatever this process's clock says."""
    budget = lambda opt: BudgetDecay(opt, 1e-3, decay_fraction=0.5, final_lr=0.0)  # noqa: E731
    trainer, _ = make_trainer(Schedule(max_minutes=10.0, checkpoint_minutes=0, valid_every=1000), budget)
    rates = record_rates(trainer)
    trainer.fit(batches())
    # done = 1/6 .. 6/6: the peak until half of the budget, then linear to 0 at its end. This process's own
    # clock adds its real seconds t to the peer's: 2e-3 * t / 600 on a decaying rate, so abs=1e-5 allows t up
    # to 3 s (a busy CI machine took 0.11 s) while the schedule's steps are 1.7e-4 apart.
    assert rates == pytest.approx([1e-3, 1e-3, 1e-3, 2e-3 / 3, 1e-3 / 3, 0.0], abs=1e-5)


def test_budget_schedule_continues_exactly_after_a_resume(tmp_path):
    """Interrupted after 3 of 8 updates and resumed from the saved state, the run makes the same
    updates at the same rates as the run that was never interrupted (the rate is a function of the
    checkpoint's progress, not of a counter that a restart would reset)."""
    budget = lambda opt: BudgetDecay(opt, 1e-3, decay_fraction=0.75, final_lr=1e-4, warmup_steps=2)  # noqa: E731
    plan = Schedule(max_steps=8, checkpoint_minutes=0, valid_every=1000)
    whole, _ = make_trainer(plan, budget)
    expected = record_rates(whole)
    whole.fit(batches())

    first, _ = make_trainer(plan, budget)
    got = record_rates(first)

    def interrupted():
        for i, b in enumerate(batches()):
            if i == 3:
                os.kill(os.getpid(), signal.SIGTERM)  # what Ctrl-C or a scheduler's TERM does
            yield b

    assert first.fit(interrupted()).signum == signal.SIGTERM
    state = first.state()
    second, _ = make_trainer(plan, budget)
    second.load_state(tmp_path / "last.pt", state)
    rest = record_rates(second)
    second.fit(itertools.islice(batches(), 3, None))
    assert len(expected) == 8 and got + rest == pytest.approx(expected, rel=1e-12)
    assert expected[0] == pytest.approx(5e-4) and expected[-1] < expected[2]  # the warmup and the decay
    for k, w in whole.model.state_dict().items():
        torch.testing.assert_close(second.model.state_dict()[k], w, msg=k)
