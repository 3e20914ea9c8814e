"""trainer.optimizer: Adam/AdamW, SGD (Luong et al. 2015), Adadelta (Bahdanau et al. 2015), Adagrad; their keys
are checked before any work, and a resume that was allowed to change the optimizer starts its state afresh."""

from __future__ import annotations

import logging

import pytest
import torch
from omegaconf import OmegaConf

from nmt.config import TrainConfig
from nmt.distributed import Dist
from nmt.models.build import build_model
from nmt.trainer import EarlyStopping, Schedule, Trainer
from nmt.training import build_optimizer, build_precision, describe_optimizer

CPU = torch.device("cpu")


def tiny_model(**trainer):
    torch.manual_seed(0)
    cfg = OmegaConf.structured(TrainConfig)
    cfg.encoder.update(emb_size=8, hidden_size=6, layers=1, dropout=0.0)
    cfg.decoder.update(emb_size=8, hidden_size=12, layers=1, dropout=0.0)
    cfg.attention.name = "general"
    cfg.trainer.update(trainer)
    return cfg, build_model(cfg.encoder, cfg.attention, cfg.decoder, 20, 20, device="cpu")


def a_trainer(**trainer) -> Trainer:
    cfg, model = tiny_model(**trainer)
    opt = build_optimizer(model, cfg.trainer)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    precision = build_precision("none", CPU, model)
    return Trainer(model, opt, sched, precision, None, EarlyStopping(), None, None, Schedule(), {}, Dist())


@pytest.mark.parametrize(
    "settings, cls, group",
    [
        ({}, torch.optim.Adam, {"lr": 1e-3, "betas": (0.9, 0.999), "fused": True}),
        ({"optimizer": "adamw", "weight_decay": 0.01}, torch.optim.AdamW, {"weight_decay": 0.01, "fused": True}),
        ({"optimizer": "sgd", "lr": 1.0, "momentum": 0.9}, torch.optim.SGD, {"momentum": 0.9, "fused": True}),
        ({"optimizer": "adadelta", "lr": 1.0}, torch.optim.Adadelta, {"lr": 1.0, "rho": 0.95, "eps": 1e-6}),
        ({"optimizer": "adagrad", "lr": 0.1}, torch.optim.Adagrad, {"lr": 0.1, "fused": True}),
    ],
)
def test_each_optimizer_is_built_with_its_own_keys(settings, cls, group):
    cfg, model = tiny_model(**settings)
    opt = build_optimizer(model, cfg.trainer)
    assert type(opt) is cls
    assert {k: opt.param_groups[0][k] for k in group} == group


@pytest.mark.parametrize("name, lr", [("sgd", 1.0), ("adadelta", 1.0), ("adagrad", 0.1)])
def test_the_other_optimizers_train_a_model(name, lr):
    """Steps on one fixed batch lower its loss (the wiring, not torch's maths, is under test)."""
    torch.manual_seed(1)
    src, tgt = torch.randint(4, 20, (6, 7)), torch.randint(4, 20, (6, 8))
    cfg, model = tiny_model(optimizer=name, lr=lr)
    opt = build_optimizer(model, cfg.trainer)
    losses = []
    for _ in range(20):
        logits, _ = model(src, torch.full((6,), 7), tgt[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 20), tgt[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.98 * losses[0], losses


@pytest.mark.parametrize(
    "overrides, expect",
    [
        (["trainer.momentum=0.9"], "trainer.momentum=0.9 is for trainer.optimizer=sgd (this run: adam)"),
        (["trainer.optimizer=sgd", "trainer.momentum=1"], "trainer.momentum=1.0: expected a number in [0, 1)"),
        (["trainer.optimizer=adadelta", "trainer.rho=1"], "trainer.rho=1.0: expected a number in (0, 1)"),
        (["trainer.optimizer=rmsprop"], "trainer.optimizer='rmsprop' is unknown; choose one of"),
    ],
)
def test_optimizer_keys_are_checked_before_any_work(overrides, expect):
    from nmt.cli import COMMANDS, Stop, preflight

    with pytest.raises(Stop) as e:
        preflight(COMMANDS["train"], overrides)
    assert len(e.value.lines) == 1 and e.value.lines[0].startswith(expect), e.value.lines
    if "rmsprop" in overrides[0]:
        assert all(n in e.value.lines[0] for n in ("adam", "adamw", "sgd", "adadelta", "adagrad"))


def test_a_resume_allowed_to_change_the_optimizer_starts_its_state_afresh(tmp_path, caplog):
    adam = a_trainer()
    adam.progress.positions = [[0, 0]]  # what fit() sets before the first step
    adam.opt.step()  # Adam's state: exp_avg, exp_avg_sq
    state = adam.state()
    same = a_trainer()
    same.load_state(tmp_path / "last.pt", state)
    assert same.opt.state_dict()["param_groups"] == state["optimizer"]["param_groups"]
    caplog.set_level(logging.WARNING, logger="nmt.trainer")
    sgd = a_trainer(optimizer="sgd", lr=1.0, momentum=0.9)
    sgd.load_state(tmp_path / "last.pt", state)
    assert "the checkpoint's optimizer state is another optimizer's: this one starts afresh" in caplog.text
    assert sgd.opt.param_groups[0]["momentum"] == 0.9 and not sgd.opt.state


def test_the_log_names_the_optimizer_and_its_settings():
    assert describe_optimizer(tiny_model()[0].trainer) == "adam (lr 0.001, betas 0.9/0.999)"
    t = tiny_model(optimizer="sgd", lr=1.0, momentum=0.9, weight_decay=1e-5)[0].trainer
    assert describe_optimizer(t) == "sgd (lr 1, momentum 0.9, weight decay 1e-05)"
    assert describe_optimizer(tiny_model(optimizer="adadelta", lr=1.0)[0].trainer) == "adadelta (lr 1, rho 0.95)"
