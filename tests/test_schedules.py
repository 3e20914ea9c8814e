"""trainer.scheduler=budget: the learning rate's shape over the run's budget (the loop's use of it,
on the agreed clock and across a resume, is in tests/test_trainer_sync.py); trainer.scheduler=step."""

from __future__ import annotations

import pytest
import torch

from nmt.schedules import BudgetDecay, budget_done, step_decay


def opt() -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.5)


def test_peak_until_the_decay_then_linear_to_the_final_rate():
    s = BudgetDecay(opt(), 2e-3, decay_fraction=0.4, final_lr=2e-4)
    assert [s.rate(100, d) for d in (0.0, 0.3, 0.6)] == [2e-3, 2e-3, 2e-3]
    assert s.rate(100, 0.8) == pytest.approx(2e-3 - 0.5 * 1.8e-3)  # half way through the decay
    assert s.rate(100, 1.0) == pytest.approx(2e-4)
    assert s.rate(100, 1.5) == pytest.approx(2e-4)  # past the budget (a resumed run with a shorter one)
    assert s.update(100, 0.8) == s.opt.param_groups[0]["lr"] == pytest.approx(1.1e-3)


def test_warmup_scales_the_whole_curve():
    s = BudgetDecay(opt(), 1e-3, decay_fraction=1.0, final_lr=0.0, warmup_steps=4)
    assert [s.rate(k, 0.0) for k in range(5)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])
    assert s.rate(1, 0.5) == pytest.approx(0.5 * 0.5e-3)


def test_budget_done_is_the_limit_nearer_its_end():
    assert budget_done(100, 0.0, 25, 9999.0) == 0.25
    assert budget_done(0, 10.0, 9999, 150.0) == 0.25
    assert budget_done(100, 10.0, 25, 300.0) == 0.5  # the clock is nearer its end
    assert budget_done(100, 10.0, 90, 300.0) == 0.9  # the steps are
    assert budget_done(100, 10.0, 150, 900.0) == 1.0
    assert budget_done(0, 0.0, 5, 5.0) == 0.0


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5])
def test_decay_fraction_is_a_share(bad):
    with pytest.raises(ValueError, match="decay_fraction"):
        BudgetDecay(opt(), 1e-3, decay_fraction=bad)


def test_step_decay_multiplies_at_the_start_and_every_interval_after_it():
    rates = [step_decay(s, warmup=0, start=4, every=2, factor=0.5, floor=0.0) for s in range(9)]
    assert rates == [1, 1, 1, 1, 0.5, 0.5, 0.25, 0.25, 0.125]
    assert step_decay(100, warmup=0, start=4, every=2, factor=0.5, floor=0.01) == 0.01  # min_lr / lr
    warm = [step_decay(s, warmup=4, start=6, every=1, factor=0.5, floor=0.0) for s in range(8)]
    assert warm == pytest.approx([0.25, 0.5, 0.75, 1, 1, 1, 0.5, 0.25])


def test_the_step_scheduler_follows_the_config_through_the_updates():
    from helpers import compose_cfg
    from nmt.training import build_scheduler

    cfg = compose_cfg(["trainer.scheduler=step", "trainer.lr=1.0", "trainer.decay_start=3", "trainer.decay_every=2"])
    o = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=cfg.trainer.lr)
    sched, lrs = build_scheduler(o, cfg.trainer), []
    for _ in range(7):
        lrs.append(o.param_groups[0]["lr"])
        o.step()
        sched.step()
    assert lrs == [1.0, 1.0, 1.0, 0.5, 0.5, 0.25, 0.25]


@pytest.mark.parametrize(
    "overrides, expect",
    [
        (["trainer.scheduler=step"], "trainer.scheduler=step multiplies the rate by trainer.decay_factor every"),
        (["trainer.scheduler=step", "trainer.decay_every=10", "trainer.decay_factor=1"], "trainer.decay_factor=1.0:"),
        (["trainer.decay_every=10"], "trainer.decay_every=10 is for trainer.scheduler=step (this run: plateau)"),
        (["trainer.decay_start=100"], "trainer.decay_start=100 is for trainer.scheduler=step (this run: plateau)"),
    ],
)
def test_step_decay_keys_are_checked_before_any_work(overrides, expect):
    from nmt.cli import COMMANDS, Stop, preflight

    with pytest.raises(Stop) as e:
        preflight(COMMANDS["train"], overrides)
    assert len(e.value.lines) == 1 and e.value.lines[0].startswith(expect), e.value.lines


def test_train_cli_logs_the_curve_and_decays_to_the_final_rate(tmp_path, sample_dir):
    """``python -m nmt.train trainer.scheduler=budget``: one line describing the curve, the peak rate
    in the progress lines until the decay, then falling to near trainer.min_lr at the budget's end, and
    the resume hint saying that a larger budget raises the rate again."""
    import re

    from helpers import TINY, run_module

    steps = [
        f"data.dir={sample_dir}",
        *TINY,
        "trainer.scheduler=budget",
        "trainer.max_steps=20",
        "trainer.decay_fraction=0.5",
        "trainer.min_lr=1e-5",
        "trainer.log_every=1",
        f"hydra.run.dir={tmp_path}/run",
    ]
    err = run_module("nmt.train", steps, tmp_path / "cache").stderr
    assert "learning rate: 0.003 until 50% of trainer.max_steps=20, then linear decay to 1e-05" in err
    rates = {int(k): float(v) for k, v in re.findall(r"step (\d+)  epoch \d+ .*?  lr (\S+)", err)}
    assert rates[1] == rates[10] == 3e-3  # update 10 (0-based 9) runs at 45% of the budget
    assert rates[11] == pytest.approx(3e-3, rel=1e-2) and rates[12] < rates[11]  # the decay starts at 50%
    assert all(rates[k + 1] < rates[k] for k in range(11, 20))
    assert rates[20] == pytest.approx(1e-5 + 0.1 * (3e-3 - 1e-5), rel=1e-2)  # update 20 runs at 95%
    assert "spreads its decay over the larger budget" in err
