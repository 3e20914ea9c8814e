"""Shared fixtures. Tests never touch the network: Hub and wandb run offline/disabled."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # `pytest -n N`: N workers share the cores, so each one, and every CLI it starts, uses one thread
    # (two workers with two OpenMP threads each on two cores spin against each other).
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
else:
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO.parent / "shared" / "data" / "spa-eng" / "sample"


@pytest.fixture(scope="session")
def sample_dir() -> Path:
    if not (SAMPLE / "train.tsv").is_file():
        pytest.fail(f"{SAMPLE} is missing: the tests need ../shared/data/spa-eng/sample beside the repository")
    return SAMPLE


@pytest.fixture()
def cache_env(tmp_path, monkeypatch):
    monkeypatch.setenv("NMT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(autouse=True)
def _unpinned_kernels():
    """A training or decoding run in this process pins its kernel choices (nmt.models.rnn.pin_kernel_choices),
    possibly read from a cache measured by another process; the next test measures for itself again."""
    yield
    from nmt.models.rnn import pin_kernel_choices

    pin_kernel_choices({})


@pytest.fixture()
def seeded():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def trained(tmp_path_factory, sample_dir):
    """A tiny model trained for real through the CLI: (run dir, tokenizer cache, the finished process).

    Trained once per test session: under ``pytest -n N`` the first worker to ask trains it (the others wait on
    a lock) and every worker reads the same run, so tests must copy it before changing it."""
    from helpers import TINY, run_module

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the folder the workers' own temporary folders share
    root, done = base / "e2e", base / "e2e.json"
    run = root / "run"
    with open(base / "e2e.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_file():
            tiny = [x for x in TINY if not x.startswith("trainer.plot_attention=")]  # the default: 3 heatmaps
            args = [f"data.dir={sample_dir}", *tiny, "trainer.max_steps=120", "trainer.valid_every=40"]
            args += [f"hydra.run.dir={run}", "trainer.tensorboard=true"]  # test_end_to_end.py reads the events
            proc = run_module("nmt.train", args, root / "cache")
            done.write_text(json.dumps({k: getattr(proc, k) for k in ("args", "returncode", "stdout", "stderr")}))
    return run, root / "cache", subprocess.CompletedProcess(**json.loads(done.read_text()))


def pytest_report_header(config) -> str:
    """Says where tests/test_cuda_path.py runs, so a log shows whether a GPU was really used."""
    if os.environ.get("NMT_TEST_DEVICE", "") == "cuda":
        return f"CUDA path tests: real GPU (NMT_TEST_DEVICE=cuda, torch {torch.__version__}, cuda {torch.version.cuda})"
    return "CUDA path tests: fake CUDA tensors on the CPU (NMT_TEST_DEVICE=cuda runs them on a GPU)"
