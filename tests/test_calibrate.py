"""``trainer.amp``: auto measures float32 against bf16 products on this CPU (nmt.calibrate) and caches the
result per CPU model, torch version, threads and model shape; bf16/none force a choice.

The timings are injected through ``Calibration(timer=..., probe=...)`` (seconds per step / per
product for a dtype), so each outcome is chosen by the test; one test times real steps of a tiny
model, and the session's end-to-end training run (conftest ``trained``) shows the CLI's log line.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re

import pytest
import torch
from omegaconf import OmegaConf

from nmt.calibrate import (
    BF16_MARGIN,
    Calibration,
    Measured,
    StepTimer,
    calibrate,
    cpu_has_native_bf16,
    measure_model,
)
from nmt.config import TrainConfig
from nmt.models.build import build_model
from nmt.models.rnn import RNN
from nmt.training import build_precision, config_changes

CPU = torch.device("cpu")


def tiny_model():
    torch.manual_seed(0)
    cfg = OmegaConf.structured(TrainConfig)
    cfg.encoder.update(emb_size=8, hidden_size=6, layers=1, dropout=0.1)
    cfg.decoder.update(emb_size=8, hidden_size=12, layers=1, dropout=0.1)
    cfg.attention.name = "bahdanau"
    return build_model(cfg.encoder, cfg.attention, cfg.decoder, 30, 30, device="cpu")


def product_dtypes(model) -> set:
    return {m.matmul_dtype for m in model.modules() if isinstance(m, RNN)}


class Clock:
    """A fake step timer: ``bf16_speed`` times as fast with bf16 products; counts its calls."""

    def __init__(self, bf16_speed: float):
        self.bf16_speed, self.calls = bf16_speed, 0

    def __call__(self, dtype) -> float:
        self.calls += 1
        return 1.0 if dtype is None else 1.0 / self.bf16_speed


def never(dtype) -> float:
    raise AssertionError("measured although it should not have")


@pytest.mark.parametrize("speed, bf16", [(2.0, True), (0.5, False), (BF16_MARGIN - 0.02, False)])
def test_auto_keeps_bf16_products_only_when_measured_faster_by_the_margin(speed, bf16):
    model = tiny_model()
    precision = build_precision("auto", CPU, model, Calibration(timer=Clock(speed)))
    assert product_dtypes(model) == {torch.bfloat16 if bf16 else None}
    assert precision.autocast_dtype is None
    assert precision.description.startswith("float32, bf16 matrix products (" if bf16 else "float32 (")
    assert f"measured: bf16 products {speed:.2f}x the speed of float32 (training steps) on " in precision.description


def test_the_cache_is_used_the_second_time_and_keyed_by_the_model(tmp_path):
    model, clock = tiny_model(), Clock(2.0)
    cal = Calibration(max_tokens=300, cache_dir=str(tmp_path / "precision"), timer=clock)
    first = calibrate(model, cal)
    calls = clock.calls
    assert first.bf16 and first.cached_at is None and calls >= 4  # a warm-up pair and at least one timed pair
    assert first.cache is not None and first.cache.parent == tmp_path / "precision"
    second = calibrate(model, dataclasses.replace(cal, timer=never))
    assert (second.bf16, second.ratio, second.cache) == (True, first.ratio, first.cache) and second.cached_at
    assert "cached " in second.reason() and str(second.cache) in second.reason()
    # another batch budget is another shape: measured afresh, in another file
    other = calibrate(model, dataclasses.replace(cal, max_tokens=600))
    assert clock.calls > calls and other.cache != first.cache


@pytest.mark.parametrize("content", ["{not json", '{"key": 1}', "", '{"key": null, "float32_s": 1, "bf16_s": 0}'])
def test_a_corrupt_cache_file_is_ignored_with_a_warning_and_replaced(tmp_path, caplog, content):
    model, cal = tiny_model(), Calibration(cache_dir=str(tmp_path), timer=Clock(2.0))
    path = calibrate(model, cal).cache
    path.write_text(content)
    clock = Clock(0.5)
    with caplog.at_level(logging.WARNING, logger="nmt.calibrate"):
        again = calibrate(model, dataclasses.replace(cal, timer=clock))
    assert clock.calls and not again.bf16 and again.cached_at is None
    assert any(str(path) in r.getMessage() and "measuring again" in r.getMessage() for r in caplog.records)
    assert json.loads(path.read_text())["bf16_s"] == 2.0  # rewritten with the new measurement


def test_a_probe_showing_slow_bf16_products_decides_without_timing_steps():
    model = tiny_model()
    m = calibrate(model, Calibration(timer=never, probe=Clock(0.3)))
    assert not m.bf16 and m.basis == "probe" and "steps not timed" in m.reason()
    m = calibrate(model, Calibration(timer=Clock(1.5), probe=Clock(0.9)))  # products close: steps decide
    assert m.bf16 and m.basis == "steps"


@pytest.mark.parametrize("amp, dtype", [("none", None), ("fp16", None), ("bf16", torch.bfloat16)])
def test_forcing_skips_the_measurement(amp, dtype, caplog, tmp_path):
    model = tiny_model()
    with caplog.at_level(logging.WARNING):
        precision = build_precision(amp, CPU, model, Calibration(cache_dir=str(tmp_path), timer=never, probe=never))
    assert product_dtypes(model) == {dtype} and f"trainer.amp={amp}" in precision.description
    assert not list(tmp_path.iterdir())
    emulated = [r for r in caplog.records if "emulated" in r.getMessage()]
    assert len(emulated) == (amp == "bf16" and not cpu_has_native_bf16())


def test_measuring_real_steps_leaves_weights_mode_dtype_and_rng_as_they_were():
    model = tiny_model().eval()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    cal = Calibration(max_tokens=200)
    rng = torch.get_rng_state()
    result = measure_model(model, dataclasses.replace(cal, timer=StepTimer(model, cal)))
    assert result["basis"] == "steps" and result["float32_s"] > 0 and result["bf16_s"] > 0
    assert torch.equal(torch.get_rng_state(), rng)  # a run that measures draws the same dropout masks
    assert not model.training and product_dtypes(model) == {None}
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())


def test_a_resume_may_change_the_precision():
    """Checkpoints from before trainer.amp=auto (amp: bf16, no amp_cache) resume under the new default."""
    old = {"trainer": {"amp": "bf16", "lr": 0.001}}
    assert config_changes(old, {"trainer": {"amp": "auto", "amp_cache": "/c/precision", "lr": 0.001}}, []) == []


def test_the_training_cli_logs_its_measured_choice_and_caches_it(trained):
    run, cache, _ = trained
    log = (run / "train.log").read_text()
    assert re.search(r"training precision: float32(, bf16 matrix products)? \(measured: bf16 products [\d.]+x", log)
    # and which tanh the model computes (the CPU step loops: 2σ(2x) − 1 where it measured faster, else
    # torch.tanh, saying by how much the formula fell short; nmt.models.rnn.tanh_line), measured once per
    # machine: saved to the cache on first use, read from it after
    kept = r"; (saved to|cached [-\d: ]+UTC in) \S+/precision/\w+\.json(, delete it to measure again)?\)"
    assert re.search(
        r"\] - tanh: (2σ\(2x\) − 1 \(measured [\d.]+x as fast as torch\.tanh on this CPU"
        r"|torch\.tanh \(2σ\(2x\) − 1 measured [\d.]+x its speed on this CPU, below the [\d.]+x it needs)" + kept + "$",
        log,
        re.M,
    )
    # and what the progress lines' train loss is beside the validation loss (label-smoothed: the default 0.1)
    smoothed = "] - loss: train loss is the label-smoothed cross-entropy per target piece (trainer.label_smoothing=0.1)"
    assert smoothed in log
    # one training measurement (decoding commands run by other tests on this fixture add their own entries)
    entries = [json.loads(f.read_text()) for f in (cache / "precision").glob("*.json")]
    assert len([e for e in entries if "model" in e["key"]]) == 1
    assert len([e for e in entries if "kernels" in e["key"]]) == 1


def test_kernel_choices_are_measured_once_per_machine_and_read_from_the_cache_after(tmp_path, caplog):
    """Fresh runs on one machine compute alike: the step loops' kernel choices come from the cache once it
    holds them (here an entry edited to the opposite tanh decision decides it), and an unusable entry is
    measured again with a warning."""
    from nmt.calibrate import cached_kernel_choices
    from nmt.models import rnn

    choices, note, speedups = cached_kernel_choices(str(tmp_path))
    assert choices == rnn.choices_from_speedups(speedups) and note.startswith(f"saved to {tmp_path}")
    (path,) = tmp_path.glob("*.json")
    entry = json.loads(path.read_text())
    flipped = 0.5 if choices["sigmoid_tanh"] else 3.0
    path.write_text(json.dumps({**entry, "speedups": {**entry["speedups"], "sigmoid_tanh": flipped}}))
    again, note, speedups = cached_kernel_choices(str(tmp_path))
    assert again["sigmoid_tanh"] is not choices["sigmoid_tanh"] and speedups["sigmoid_tanh"] == flipped
    assert note == f"cached {entry['measured_at']} in {path}, delete it to measure again"
    rnn.pin_kernel_choices(again, note, speedups)
    model = tiny_model()  # the CPU step loops (rnn_impl auto), which take the pinned tanh
    assert (model.decoder.tanh is rnn.sigmoid_tanh) is again["sigmoid_tanh"]
    assert rnn.describe_tanh(model.decoder.tanh).endswith(f"; {note})")
    if rnn._packing_available(torch.float32):  # decoding's line for its float32 products says the same
        assert rnn.describe_packing().endswith(f"; {note})")
    path.write_text("{not json")
    with caplog.at_level(logging.WARNING):
        _, note, _ = cached_kernel_choices(str(tmp_path))
    assert "unreadable cache entry" in caplog.text and note.startswith("saved to")
    assert cached_kernel_choices(None)[1] is None  # amp_cache=null: measured, kept nowhere


def test_the_loss_line_says_whether_the_train_loss_is_smoothed():
    from nmt.training import describe_loss

    assert "not smoothed" in describe_loss(0.2) and "label_smoothing=0.2" in describe_loss(0.2)
    assert describe_loss(0.0) == "cross-entropy per target piece, in training and validation alike"


@pytest.mark.parametrize("seconds, took", [(0.034, "took 34 ms"), (0.1, "took 0.1 s"), (2.26, "took 2.3 s")])
def test_the_log_says_how_long_measuring_took_without_rounding_it_to_nothing(seconds, took):
    """A probe of a few milliseconds read "took 0.0 s" in the log (session 88, a Xeon without bf16 units)."""
    m = Measured(False, 0.29, "some CPU", 2, "probe", None, seconds=seconds)
    assert f"; {took}; trainer.amp=bf16 or none forces a choice" in m.reason()
