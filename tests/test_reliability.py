"""Fault injection: kills at random steps, corrupt checkpoints, NaN losses, full disks, mistyped resumes.

Every test here injects a fault and checks that no work is lost. Counts of what was injected
go to ``FAULTS`` and, when NMT_RELIABILITY_REPORT names a file, are written there at the end
(docs/reliability.md quotes them).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import re
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

import nmt.trainer
from helpers import TINY, compose_cfg, popen_module, run_module
from nmt import checkpoint
from nmt.errors import ConfigError, NmtError
from nmt.runner import run

FAULTS: Counter = Counter()
STEPS = 45
COMMON = [*TINY, "trainer.valid_every=15", "trainer.log_every=1", "trainer.keep_last=2"]


@pytest.fixture(scope="session", autouse=True)
def report():
    yield
    if os.environ.get("NMT_RELIABILITY_REPORT"):
        with open(os.environ["NMT_RELIABILITY_REPORT"], "w") as f:
            json.dump(dict(FAULTS), f, indent=1)


def step_losses(run_dir) -> dict[int, str]:
    """Per-step training loss from train.log; a re-run step (after SIGKILL) keeps its last value."""
    found = re.findall(r"step (\d+)  epoch \d+  train loss (\S+)", (run_dir / "train.log").read_text())
    return {int(k): v for k, v in found}


def weights(run_dir):
    return checkpoint.load(run_dir / "checkpoints" / "last.pt")["model"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, sample_dir):
    """One uninterrupted run to compare interrupted ones with."""
    root = tmp_path_factory.mktemp("ref")
    run_module(
        "nmt.train",
        [f"data.dir={sample_dir}", *COMMON, f"trainer.max_steps={STEPS}", f"hydra.run.dir={root}/run"],
        root / "cache",
    )
    return root / "run", root / "cache"


def wait_for_step(proc, step: int) -> None:
    for line in proc.stdout:
        if f"step {step}  epoch" in line:
            return
    raise AssertionError(f"training ended before step {step}")


KILLS = [(signal.SIGTERM, False), (signal.SIGKILL, False), (signal.SIGINT, True), (signal.SIGTERM, True)]


@pytest.mark.parametrize("sig,group", KILLS, ids=["SIGTERM", "SIGKILL", "SIGINT-group", "SIGTERM-group"])
def test_killed_at_a_random_step_resumes_exactly(reference, tmp_path, sample_dir, sig, group):
    """group: the signal goes to the whole process group (the DataLoader worker too), as Ctrl-C,
    `timeout` and cluster schedulers send it."""
    ref_dir, cache = reference
    # a SIGKILL loses the steps since the last checkpoint (every 15 steps): kill after the first one
    kill_at = random.Random().randint(17 if sig == signal.SIGKILL else 5, STEPS - 3)
    run_dir = tmp_path / "run"
    args = [f"data.dir={sample_dir}", *COMMON, f"trainer.max_steps={STEPS}", f"hydra.run.dir={run_dir}"]
    proc = popen_module("nmt.train", args, cache, new_session=group)
    wait_for_step(proc, kill_at)
    if group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    out = proc.communicate(timeout=120)[0]
    FAULTS[f"killed with {signal.Signals(sig).name}{' (process group)' if group else ''}"] += 1
    if sig == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
    else:  # the handler saves after the step in flight, then exits 128 + signal
        assert proc.returncode == 128 + sig, out[-2000:]
        assert "continue with trainer.resume=true" in out
    saved = checkpoint.load(run_dir / "checkpoints" / "last.pt")["progress"]["step"]
    resumed = run_module("nmt.train", [*args, "trainer.resume=true"], cache)
    FAULTS["runs resumed"] += 1
    assert f"resuming from {run_dir}/checkpoints/last.pt: step {saved}," in resumed.stderr
    # the same losses step for step, and the same final weights, as the run that was never interrupted
    assert step_losses(run_dir) == step_losses(ref_dir), f"killed at {kill_at}, resumed from {saved}"
    ref_w, got_w = weights(ref_dir), weights(run_dir)
    for k in ref_w:
        torch.testing.assert_close(got_w[k], ref_w[k], rtol=1e-5, atol=1e-6, msg=k)
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["step"] == STEPS


def test_a_resumed_run_keeps_the_runs_measured_kernel_choices(reference, tmp_path, sample_dir):
    """The step loops' tanh (2σ(2x) − 1 or torch.tanh) and packed float32 products are chosen by a measurement
    that a busy CPU can tip the other way (a CI run's resume measured 1.03x where the run had 2.0x, and its
    weights drifted); the checkpoint stores the choices and a resume takes them instead of measuring."""
    ref_dir, cache = reference
    stored = checkpoint.load(ref_dir / "checkpoints" / "last.pt")["kernels"]
    assert set(stored) == {"sigmoid_tanh", "float32_packing"} and all(isinstance(v, bool) for v in stored.values())
    # Resume a copy whose checkpoint says the opposite tanh from what this CPU measures for a fresh run.
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    state = checkpoint.load(ref_dir / "checkpoints" / "last.pt")
    flipped = not stored["sigmoid_tanh"]
    checkpoint.save(run_dir / "checkpoints" / "last.pt", {**state, "kernels": {**stored, "sigmoid_tanh": flipped}})
    args = [f"data.dir={sample_dir}", *COMMON, f"trainer.max_steps={STEPS + 2}"]
    resumed = run_module("nmt.train", [*args, f"hydra.run.dir={run_dir}", "trainer.resume=true"], cache)
    said = re.findall(r"\] - tanh: (.*)$", resumed.stderr, re.M)
    assert said == [f"{'2σ(2x) − 1' if flipped else 'torch.tanh'} (this run's choice, kept on resume)"], said
    assert checkpoint.load(run_dir / "checkpoints" / "last.pt")["kernels"]["sigmoid_tanh"] is flipped


def test_a_run_that_restarts_its_process_trains_as_one_that_never_did(reference, tmp_path, sample_dir):
    """trainer.restart_minutes (a fresh heap for a long CPU run): at the first validation after that many minutes,
    the process saves, closes its data worker and replaces itself (same PID) with its own resume, which goes on
    exactly as the uninterrupted run."""
    ref_dir, cache = reference
    run_dir = tmp_path / "run"
    args = [f"data.dir={sample_dir}", *COMMON, f"trainer.max_steps={STEPS}", f"hydra.run.dir={run_dir}"]
    proc = popen_module("nmt.train", [*args, "trainer.restart_minutes=0.0001"], cache)
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, out[-3000:]
    # validations at steps 15 and 30 restart it; the one at 45 ends the run
    restarts = re.findall(r"step (\d+): restarting this process \(trainer.restart_minutes\)", out)
    assert restarts == ["15", "30"], out[-3000:]
    resumed = re.findall(rf"resuming from {run_dir}/checkpoints/last.pt: step (\d+),", out)
    assert resumed == ["15", "30"], out[-3000:]
    # no DataLoader worker of the replaced processes is left behind (a worker's command line is its parent's)
    time.sleep(1)
    left = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(run_dir).encode() in cmdline.read_bytes():
                left.append(cmdline.parent.name)
        except OSError:  # the process ended
            pass
    assert not left, f"processes still running with this run's folder in their command line: {left}"
    assert step_losses(run_dir) == step_losses(ref_dir)
    ref_w, got_w = weights(ref_dir), weights(run_dir)
    for k in ref_w:
        torch.testing.assert_close(got_w[k], ref_w[k], rtol=1e-5, atol=1e-6, msg=k)
    assert "translate with: python -m nmt.translate" in out  # the last process finished the run as usual


def test_restart_minutes_is_unused_where_the_process_cannot_replace_itself(tmp_path, sample_dir, cache_env, caplog):
    """Called as a library (or in a -m sweep's job, or under torchrun), run() has no process of its own to replace."""
    caplog.set_level(logging.INFO)
    result = run(tiny_cfg(sample_dir, "trainer.max_steps=20", "trainer.restart_minutes=0.0001"), tmp_path)
    assert result["step"] == 20
    assert "trainer.restart_minutes=0.0001 left unused: this process cannot replace itself" in caplog.text


def tiny_cfg(sample_dir, *extra):
    return compose_cfg(
        [
            f"data.dir={sample_dir}",
            *COMMON,
            "data.num_workers=0",
            "data.valid_max_sentences=5",
            "trainer.log_every=5",
            *extra,
        ]
    )


def test_resume_refuses_a_changed_config_unless_allowed(tmp_path, sample_dir, cache_env):
    run(tiny_cfg(sample_dir, "trainer.max_steps=15"), tmp_path)
    changed = ["trainer.resume=true", "trainer.lr=0.01", "decoder.tie_embeddings=true"]
    with pytest.raises(ConfigError) as refused:
        run(tiny_cfg(sample_dir, "trainer.max_steps=20", *changed), tmp_path)
    FAULTS["changed-config resumes refused"] += 1
    said = str(refused.value)
    assert "decoder.tie_embeddings: False -> True; trainer.lr: 0.003 -> 0.01);" in said, said
    assert "trainer.allow_changes=[KEY,...]" in said, said
    # the values it says to add (as after a preset changed under a run) continue the run as it was started
    back = re.search(r"to continue it as it was started, add (.*); or name", said).group(1).split()
    assert back == ["decoder.tie_embeddings=false", "trainer.lr=0.003"], said
    assert run(tiny_cfg(sample_dir, "trainer.max_steps=20", *changed, *back), tmp_path)["step"] == 20
    result = run(
        tiny_cfg(
            sample_dir,
            "trainer.max_steps=25",
            "trainer.resume=true",
            "trainer.lr=0.01",
            "trainer.allow_changes=[trainer.lr]",
        ),
        tmp_path,
    )
    assert result["step"] == 25
    # how a run logs may change without being named: heatmaps on or off, progress lines
    from nmt.training import config_changes

    saved, now = {"trainer": {"plot_attention": 3, "log_every": 10}}, {"trainer": {"plot_attention": 0, "log_every": 1}}
    assert config_changes(saved, now, []) == []


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_resume_falls_back_when_last_checkpoint_is_damaged(tmp_path, sample_dir, cache_env, caplog, damage):
    caplog.set_level(logging.INFO)
    run(tiny_cfg(sample_dir, "trainer.max_steps=30"), tmp_path)
    last = tmp_path / "checkpoints" / "last.pt"
    raw = last.read_bytes()
    last.write_bytes(raw[: len(raw) // 3] if damage == "truncate" else os.urandom(len(raw)))
    FAULTS["checkpoints corrupted"] += 1
    result = run(tiny_cfg(sample_dir, "trainer.max_steps=35", "trainer.resume=true"), tmp_path)
    FAULTS["runs resumed"] += 1
    assert "falling back to an older checkpoint" in caplog.text
    assert re.search(r"resuming from \S+step_30\.pt: step 30,", caplog.text)
    assert result["step"] == 35


def test_non_finite_losses_are_skipped_then_stop_the_run(tmp_path, sample_dir, cache_env, monkeypatch, caplog):
    real = nmt.trainer.nll_loss
    calls = {"n": 0}
    poisoned = {3, 4, *range(9, 100)}  # two isolated faults, then a model gone bad for good

    def faulty(logits, target, label_smoothing=0.0):
        loss = real(logits, target, label_smoothing)
        if label_smoothing > 0:  # training steps only (validation uses no smoothing)
            calls["n"] += 1
            if calls["n"] in poisoned:
                FAULTS["NaN losses injected"] += 1
                return loss * float("nan")
        return loss

    monkeypatch.setattr(nmt.trainer, "nll_loss", faulty)
    cfg = tiny_cfg(sample_dir, "trainer.max_steps=40", "trainer.max_bad_steps=3", "trainer.valid_every=6")
    with pytest.raises(NmtError, match=r"stopped at step 11: 3 non-finite steps in a row"):
        run(cfg, tmp_path)
    assert "step 3: non-finite loss or gradient, update skipped (1 in a row, 1 in all)" in caplog.text
    saved = checkpoint.load(tmp_path / "checkpoints" / "last.pt")
    assert saved["progress"]["skipped_steps"] == 5 and saved["progress"]["step"] == 11
    at_6 = checkpoint.load(tmp_path / "checkpoints" / "step_6.pt")["model"]
    # steps 7 and 8 trained, 9-11 were skipped: last.pt differs from step 6 but holds only finite weights
    assert all(torch.isfinite(v).all() for v in saved["model"].values() if v.is_floating_point())
    assert any(not torch.equal(saved["model"][k], at_6[k]) for k in at_6)


def test_unwritable_checkpoints_keep_the_previous_one(tmp_path, sample_dir, cache_env, monkeypatch, caplog):
    run(tiny_cfg(sample_dir, "trainer.max_steps=15"), tmp_path)
    last = tmp_path / "checkpoints" / "last.pt"
    before = last.read_bytes()
    real_save = torch.save

    def disk_full(obj, f, *a, **k):
        real_save(obj, f, *a, **k)  # the bytes are written, then the disk fills up
        FAULTS["checkpoint writes failed (disk full)"] += 1
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint.torch, "save", disk_full)
    with pytest.raises(NmtError, match="final checkpoint could not be written"):
        run(tiny_cfg(sample_dir, "trainer.max_steps=30", "trainer.resume=true"), tmp_path)
    assert "cannot write checkpoint" in caplog.text and "No space left on device" in caplog.text
    assert last.read_bytes() == before  # untouched, still loadable
    assert checkpoint.load(last)["progress"]["step"] == 15
    assert sorted(p.name for p in last.parent.iterdir() if p.name.startswith(".")) == []  # no temp files left


def test_checkpoint_dir_that_is_a_file(tmp_path, sample_dir, cache_env, caplog):
    (tmp_path / "checkpoints").write_text("in the way")
    FAULTS["checkpoint writes failed (not a directory)"] += 1
    with pytest.raises(NmtError, match="final checkpoint could not be written"):
        run(tiny_cfg(sample_dir, "trainer.max_steps=5"), tmp_path)
    assert "cannot write checkpoint" in caplog.text


def test_a_signal_during_a_validation_waits_for_it_and_says_so(tmp_path, sample_dir, cache_env, monkeypatch, caplog):
    """SIGTERM while the validation at step 15 runs: the run finishes that validation (a resume would not
    redo it), saves and stops at step 15; its line names the validation it waits for, not 'this step'."""
    caplog.set_level(logging.INFO)
    real = nmt.trainer.Validator.__call__

    def signalled(self, model):
        os.kill(os.getpid(), signal.SIGTERM)
        FAULTS["signals during a validation"] += 1
        return real(self, model)

    monkeypatch.setattr(nmt.trainer.Validator, "__call__", signalled)
    with pytest.raises(SystemExit) as e:
        run(tiny_cfg(sample_dir, "trainer.max_steps=30"), tmp_path)
    assert e.value.code == 128 + signal.SIGTERM
    assert "received SIGTERM: saving a checkpoint after the validation at step 15, which is running" in caplog.text
    saved = checkpoint.load(tmp_path / "checkpoints" / "last.pt")["progress"]
    assert saved["step"] == 15 and saved["last_validation"]["step"] == 15


def test_weight_average_is_the_exponential_moving_average_with_its_warmup():
    from nmt.trainer import WeightAverage

    model = torch.nn.Linear(2, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    avg = WeightAverage(model, decay=0.9)
    expect = torch.zeros(1, 2)
    for t in range(30):
        with torch.no_grad():
            model.weight.fill_(float(t + 1))
        avg.update(model, t)
        d = min(0.9, (1 + t) / (10 + t))
        expect = d * expect + (1 - d) * float(t + 1)
    torch.testing.assert_close(avg.model.weight, expect)
    assert (
        not avg.model.weight.requires_grad and float(model.weight.detach()[0, 0]) == 30.0
    )  # the training weights untouched


def test_a_run_with_a_weight_average_validates_saves_and_resumes_it_exactly(tmp_path, sample_dir, cache_env):
    """trainer.ema_decay: checkpoints' model is the average (best.pt is the validated one), train_model the
    training weights; a run stopped at 15 and resumed to 30 ends with both as the uninterrupted run does."""
    ema = ["trainer.ema_decay=0.9", "trainer.max_steps=30"]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    run(tiny_cfg(sample_dir, *ema), whole)
    run(tiny_cfg(sample_dir, "trainer.ema_decay=0.9", "trainer.max_steps=15"), parts)
    run(tiny_cfg(sample_dir, *ema, "trainer.resume=true"), parts)
    FAULTS["runs resumed"] += 1
    a, b = checkpoint.load(whole / "checkpoints" / "last.pt"), checkpoint.load(parts / "checkpoints" / "last.pt")
    for key in ("model", "train_model"):
        for k in a[key]:
            torch.testing.assert_close(b[key][k], a[key][k], rtol=1e-5, atol=1e-6, msg=f"{key} {k}")
    assert any(not torch.equal(a["model"][k], a["train_model"][k]) for k in a["model"])  # an average, not a copy
    best = checkpoint.load(whole / "checkpoints" / "best.pt")
    at_best = checkpoint.load(whole / "checkpoints" / f"step_{best['progress']['step']}.pt")
    assert "train_model" not in best and all(torch.equal(best["model"][k], at_best["model"][k]) for k in best["model"])
