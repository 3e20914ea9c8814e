"""Sweeps through Hydra launchers: joblib (parallel local jobs), submitit (local run; SLURM config)."""

from __future__ import annotations

import json

from helpers import TINY, run_module


def sweep_args(sample_dir, sweep_dir, *launcher):
    return [
        "-m",
        *launcher,
        "attention=dot,general",
        *TINY,
        f"data.dir={sample_dir}",
        "data.fetch=false",
        "trainer.max_steps=4",
        "trainer.valid_every=4",
        "data.valid_max_sentences=5",
        f"hydra.sweep.dir={sweep_dir}",
        "hydra.sweep.subdir=job${hydra.job.num}",
    ]


def job_metrics(sweep_dir) -> dict[str, dict]:
    out = {}
    for f in sweep_dir.glob("*/metrics.jsonl"):
        out[f.parent.name] = json.loads(f.read_text().splitlines()[-1])
    return out


def test_joblib_launcher_runs_the_sweep_jobs_in_parallel(tmp_path, sample_dir):
    proc = run_module(
        "nmt.train", sweep_args(sample_dir, tmp_path, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"), tmp_path
    )
    assert "Joblib.Parallel(n_jobs=2" in proc.stderr + proc.stdout
    jobs = job_metrics(tmp_path)
    assert sorted(jobs) == ["job0", "job1"]
    assert all(m["step"] == 4 for m in jobs.values())


def test_submitit_launcher_runs_the_sweep_jobs(tmp_path, sample_dir):
    """submitit_local goes through the same submitit path as submitit_slurm, with local processes."""
    proc = run_module(
        "nmt.train",
        sweep_args(sample_dir, tmp_path, "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10"),
        tmp_path,
    )
    assert "Submitit 'local' sweep output dir" in proc.stderr + proc.stdout
    jobs = job_metrics(tmp_path)
    assert sorted(jobs) == ["job0", "job1"]
    assert (tmp_path / ".submitit").is_dir()


def test_submitit_slurm_launcher_config_composes(tmp_path):
    proc = run_module(
        "nmt.train",
        [
            "hydra/launcher=submitit_slurm",
            "hydra.launcher.partition=gpu",
            "hydra.launcher.gpus_per_node=1",
            "--cfg",
            "hydra",
            "--package",
            "hydra.launcher",
        ],
        tmp_path,
    )
    assert "SlurmLauncher" in proc.stdout and "partition: gpu" in proc.stdout and "gpus_per_node: 1" in proc.stdout
