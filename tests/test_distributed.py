"""Data-parallel training with torchrun on 2 CPU processes (gloo).

A probe script (written by the test) runs the real ``nmt.train`` entry point under torchrun
and records, per rank, the final weights, its pid, and whether it wrote checkpoints or
metrics, so the checks need no hooks in the product.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import REPO, TINY, env

PROBE = """
import atexit, json, os, runpy
import torch
import nmt.checkpoint, nmt.logger, nmt.trainer

out, rank = os.environ["PROBE_OUT"], os.environ.get("RANK", "0")
record = {"saved": [], "logger": False}
open(f"{out}/pid{rank}", "w").write(str(os.getpid()))
atexit.register(lambda: json.dump(record, open(f"{out}/rank{rank}.json", "w")))

save, init, fit = nmt.checkpoint.save, nmt.logger.RunLogger.__init__, nmt.trainer.Trainer.fit
def probe_save(path, state):
    record["saved"].append(str(path))
    return save(path, state)
def probe_init(self, *a, **k):
    record["logger"] = True
    init(self, *a, **k)
def probe_fit(self, batches, **kwargs):
    result = fit(self, batches, **kwargs)
    torch.save(self.model.state_dict(), f"{out}/weights{rank}.pt")
    return result
nmt.checkpoint.save, nmt.logger.RunLogger.__init__, nmt.trainer.Trainer.fit = probe_save, probe_init, probe_fit
runpy.run_module("nmt.train", run_name="__main__")  # as `python -m nmt.train` (Hydra finds configs/)
"""

STEPS = 30


def overrides(sample_dir: Path, run_dir: Path, *extra: str) -> list[str]:
    # No dropout: ranks draw different masks than one process would, and the comparison is exact.
    return [
        *TINY,
        f"data.dir={sample_dir}",
        "data.fetch=false",
        "encoder.dropout=0",
        "decoder.dropout=0",
        f"trainer.max_steps={STEPS}",
        "trainer.valid_every=10",
        "trainer.keep_last=0",
        "trainer.threads=1",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]


def launch(probe_out: Path, cache: Path, nproc: int, args: list[str]) -> subprocess.Popen:
    probe_out.mkdir(parents=True, exist_ok=True)
    script = probe_out / "probe.py"
    script.write_text(PROBE)
    e = env(cache)
    e.update(PROBE_OUT=str(probe_out), OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    if nproc:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    else:
        cmd = [sys.executable]
    return subprocess.Popen(
        [*cmd, str(script), *args], cwd=REPO, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def finish(proc: subprocess.Popen, timeout: int = 300) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-3000:]
    return out


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, sample_dir):
    """One process accumulating 2 batches per update, and 2 ranks with one batch each."""
    root = tmp_path_factory.mktemp("ddp")
    cache = root / "cache"
    single = launch(root / "single", cache, 0, overrides(sample_dir, root / "single_run", "trainer.accum_steps=2"))
    finish(single)  # first: it trains the sentencepiece model the ranks then reuse from the cache
    ddp = launch(root / "ddp", cache, 2, overrides(sample_dir, root / "ddp_run"))
    log = finish(ddp)
    return root, log


def test_ranks_hold_identical_weights(runs):
    root, _ = runs
    w0, w1 = (torch.load(root / "ddp" / f"weights{r}.pt") for r in (0, 1))
    assert w0.keys() == w1.keys()
    assert all(torch.equal(w0[k], w1[k]) for k in w0)


def test_two_ranks_match_one_process_with_the_same_global_batch(runs):
    root, _ = runs
    single, ddp = metrics(root / "single_run"), metrics(root / "ddp_run")
    assert [m["step"] for m in single] == [m["step"] for m in ddp] == [10, 20, 30]
    for a, b in zip(single, ddp):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-5)
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
    assert ddp[-1]["train_loss"] < ddp[0]["train_loss"]  # and it learns
    ws, wd = torch.load(root / "single" / "weights0.pt"), torch.load(root / "ddp" / "weights0.pt")
    for k in ws:
        torch.testing.assert_close(wd[k], ws[k], atol=1e-5, rtol=1e-4, msg=k)


def test_only_rank_0_writes_checkpoints_and_logs(runs):
    root, log = runs
    r0, r1 = (json.loads((root / "ddp" / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["logger"] and sorted({Path(p).name for p in r0["saved"]}) == ["best.pt", "last.pt"]
    assert r1 == {"saved": [], "logger": False}
    assert "world size 2 (gloo backend)" in log
    text = (root / "ddp_run" / "train.log").read_text()
    assert "world size 2" in text and "[rank 1]" not in text
    assert len(metrics(root / "ddp_run")) == 3  # one line per validation, not one per rank


def test_a_signal_to_one_rank_stops_both_and_another_world_size_resumes(runs, sample_dir):
    """SIGTERM reaches only rank 1; both ranks stop at the same step and rank 0 saves. One process with
    accum_steps=2 (same global batch, same data shards) then finishes the run exactly as the
    uninterrupted single-process run did."""
    root, _ = runs
    run_dir, cache = root / "sig_run", root / "cache"
    ddp = launch(root / "sig", cache, 2, overrides(sample_dir, run_dir, "trainer.log_every=1"))
    deadline = time.monotonic() + 120
    seen = ""
    while "step 8 " not in seen and time.monotonic() < deadline:
        line = ddp.stdout.readline()
        assert line, seen[-3000:]
        seen += line
    os.kill(int((root / "sig" / "pid1").read_text()), signal.SIGTERM)
    out, _ = ddp.communicate(timeout=120)
    seen += out
    assert ddp.returncode != 0  # torchrun reports the workers' exit 143
    saved = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=False)
    step = saved["progress"]["step"]
    assert 8 <= step < STEPS and len(saved["progress"]["positions"]) == 2 and len(saved["rng"]) == 2
    assert f"interrupted at step {step}" in seen

    resumed = launch(
        root / "resumed",
        cache,
        0,
        overrides(
            sample_dir,
            run_dir,
            "trainer.accum_steps=2",
            "trainer.resume=true",
            "trainer.allow_changes=[trainer.accum_steps]",
        ),
    )
    log = finish(resumed)
    assert f"step {step}" in log and "data shards" not in log  # resumed exactly, no reshard warning
    ws = torch.load(root / "single" / "weights0.pt")
    wr = torch.load(root / "resumed" / "weights0.pt")
    for k in ws:
        torch.testing.assert_close(wr[k], ws[k], atol=1e-5, rtol=1e-4, msg=k)


def test_resume_with_a_different_shard_count_warns_and_continues(runs, sample_dir):
    root, _ = runs
    run_dir = root / "ddp_run"  # finished at STEPS with 2 shards; one process with 1 shard goes on
    more = overrides(sample_dir, run_dir, "trainer.resume=true", f"trainer.max_steps={STEPS + 10}")
    log = finish(launch(root / "reshard", root / "cache", 0, more))
    assert "written with 2 data shards, this run has 1" in log
    assert metrics(run_dir)[-1]["step"] == STEPS + 10
