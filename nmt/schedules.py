"""Learning-rate schedules that follow the run's budget rather than a step count.

``trainer.scheduler=budget`` is the one here: ``BudgetDecay`` holds the peak rate, then decays it
linearly over the last part of the budget (``trainer.max_minutes`` and/or ``trainer.max_steps``).
``trainer.scheduler=step`` multiplies the rate by a factor at fixed steps (``step_decay``). The other
schedules are torch's own (``nmt.training.build_scheduler``).
"""

from __future__ import annotations

import torch


def budget_done(max_steps: int, max_minutes: float, step: int, elapsed_s: float) -> float:
    """The share of the run's budget used so far, in [0, 1]: of ``max_steps`` or of ``max_minutes``,
    whichever is nearer its end (0 when neither is set)."""
    shares = [0.0]
    if max_steps:
        shares.append(step / max_steps)
    if max_minutes:
        shares.append(elapsed_s / (60.0 * max_minutes))
    return min(1.0, max(shares))


def step_decay(step: int, warmup: int, start: int, every: int, factor: float, floor: float) -> float:
    """The multiplier of the peak rate after ``step`` updates under ``trainer.scheduler=step``: a linear
    warmup over ``warmup`` updates, 1 until update ``start``, then ``factor`` once more at ``start`` and
    at every ``every`` updates after it, never below ``floor`` (min_lr / lr). OpenNMT-py's RNN schedule
    (``start_decay_steps``, ``decay_steps``, ``learning_rate_decay``); Luong et al. (2015) halved plain
    SGD's rate every epoch after the fifth (here in updates: an epoch's worth of them)."""
    scale = min(1.0, (step + 1) / warmup) if warmup else 1.0
    if step >= start:
        scale *= factor ** ((step - start) // every + 1)
    return max(scale, floor)


class BudgetDecay:
    """Linear warmup over ``warmup_steps``, the peak rate ``lr``, then a linear decay to ``final_lr``
    over the last ``decay_fraction`` of the budget.

    This is the warmup-stable-decay shape (Hu et al. 2024, "MiniCPM"; Hägele et al. 2024, "Scaling
    Laws and Compute-Optimal Training Beyond Fixed Training Durations"): under a fixed budget, a
    decay at the end matches a cosine over the whole run, and the rate stays at its peak until then.
    Li et al. (2020, "Budgeted Training: Rethinking Deep Neural Network Training Under Resource
    Constraints") show that what matters under a budget is that the decay ends with the budget. The
    budget here may be wall clock (``trainer.max_minutes``), so the decay follows elapsed time, not
    steps: a slower CPU starts it at a lower step, at the same minute.

    No state of its own: the rate is a function of (step, share of the budget done), both kept in
    the checkpoint's progress, so a resumed run continues the same curve (and changing
    ``trainer.max_minutes`` on resume stretches it).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        lr: float,
        decay_fraction: float,
        final_lr: float = 0.0,
        warmup_steps: int = 0,
    ):
        if not 0.0 < decay_fraction <= 1.0:
            raise ValueError(f"decay_fraction={decay_fraction}: expected a share in (0, 1]")
        self.opt, self.lr, self.decay_fraction = optimizer, lr, decay_fraction
        self.final_lr, self.warmup_steps = min(final_lr, lr), warmup_steps

    def rate(self, step: int, done: float) -> float:
        """The learning rate of update ``step`` (0-based) at ``done`` (share of the budget used)."""
        warm = min(1.0, (step + 1) / self.warmup_steps) if self.warmup_steps else 1.0
        start = 1.0 - self.decay_fraction
        if done <= start:
            return self.lr * warm
        into = min(1.0, (done - start) / self.decay_fraction)
        return (self.lr + (self.final_lr - self.lr) * into) * warm

    def update(self, step: int, done: float) -> float:
        """Set the rate for the coming update; returns it."""
        lr = self.rate(step, done)
        for group in self.opt.param_groups:
            group["lr"] = lr
        return lr

    def describe(self, limit: str) -> str:
        """One line for the log: the curve in words, ``limit`` naming the budget it follows."""
        warm = f"warmup over {self.warmup_steps} steps, then " if self.warmup_steps else ""
        start = 100 * (1.0 - self.decay_fraction)
        return (
            f"learning rate: {warm}{self.lr:.2g} until {start:.0f}% of {limit}, then linear decay to "
            f"{self.final_lr:.2g} at its end (trainer.scheduler=budget, trainer.decay_fraction={self.decay_fraction:g})"
        )

    def state_dict(self) -> dict:
        return {"schedule": "budget"}  # nothing to keep: see the class docstring

    def load_state_dict(self, state: dict) -> None:
        pass
