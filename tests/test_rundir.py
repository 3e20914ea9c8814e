"""The run directory: step_N.pt discovery and pruning, which checkpoint a resume takes, finding runs to
resume, Hydra's overrides, the one atomic writer, and disk usage with hard links."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from nmt.errors import ConfigError
from nmt.rundir import RunDir, atomic_write, discover_runs, disk_usage, step_name


def state(step: int) -> dict:
    return {"model": {"w": torch.full((2,), float(step))}, "tokenizer": {}, "config": {}, "progress": {"step": step}}


def make_run(root, steps=(), last=None) -> RunDir:
    """A run directory with real (tiny) checkpoints: step_N.pt for each of ``steps``, last.pt at ``last``."""
    run = RunDir(root)
    for s in steps:
        run.write_checkpoint(step_name(s), state(s))
    if last is not None:
        run.write_checkpoint("last.pt", state(last))
    return run


def damage(path) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 3])


def test_paths_are_under_the_root_and_nothing_is_created(tmp_path):
    run = RunDir(tmp_path / "run")
    assert run.checkpoints == tmp_path / "run" / "checkpoints"
    assert (run.metrics.name, run.log.name, run.attention.name) == ("metrics.jsonl", "train.log", "attention")
    assert (run.last, run.best) == (run.checkpoints / "last.pt", run.checkpoints / "best.pt")
    assert run.step_checkpoints() == [] and not run.is_resumable() and run.resumable() is None
    assert not (tmp_path / "run").exists()


def test_step_checkpoints_are_parsed_as_numbers_and_foreign_names_ignored(tmp_path):
    run = make_run(tmp_path, steps=(10, 2, 100))
    for name in ("step_x.pt", "step_3.pt.bak", "best.pt", "last.pt", ".step_4.pt.0123.tmp", "mystep_5.pt"):
        (run.checkpoints / name).write_bytes(b"")
    (run.checkpoints / "step_7.pt").mkdir()  # a folder is not a checkpoint
    assert run.step_checkpoints() == [(s, run.checkpoints / f"step_{s}.pt") for s in (2, 10, 100)]


def test_prune_keeps_the_newest_steps_only(tmp_path):
    run = make_run(tmp_path, steps=(2, 10, 20, 100), last=100)
    assert run.prune(2) == [run.checkpoints / "step_2.pt", run.checkpoints / "step_10.pt"]
    assert [s for s, _ in run.step_checkpoints()] == [20, 100]
    assert (run.checkpoints / "last.pt").is_file()
    assert run.prune(5) == [] and len(run.step_checkpoints()) == 2


def test_resumable_prefers_last_then_the_newest_step(tmp_path):
    run = make_run(tmp_path, steps=(2, 10), last=12)
    path, ckpt = run.resumable()
    assert path.name == "last.pt" and ckpt["progress"]["step"] == 12
    (run.checkpoints / "last.pt").unlink()
    path, ckpt = run.resumable()
    assert path.name == "step_10.pt" and ckpt["progress"]["step"] == 10


def test_resumable_skips_damaged_files_with_a_warning(tmp_path, caplog):
    run = make_run(tmp_path, steps=(2, 10), last=12)
    damage(run.checkpoints / "last.pt")
    damage(run.checkpoints / "step_10.pt")
    (run.checkpoints / "best.pt").write_bytes(b"never a resume candidate")
    with caplog.at_level(logging.WARNING, logger="nmt.rundir"):
        path, ckpt = run.resumable()
    assert path.name == "step_2.pt" and ckpt["progress"]["step"] == 2
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2 and all(w.endswith("; falling back to an older checkpoint") for w in warnings)
    assert "last.pt" in warnings[0] and "step_10.pt" in warnings[1]
    damage(run.checkpoints / "step_2.pt")
    assert run.is_resumable()  # cheap: a file exists, nothing is loaded
    assert run.resumable() is None


def test_a_run_with_only_best_pt_is_not_resumable(tmp_path):
    run = RunDir(tmp_path)
    run.write_checkpoint("best.pt", state(3))
    assert not run.is_resumable() and run.resumable() is None


def test_discover_runs_at_any_depth_newest_first(tmp_path):
    old = make_run(tmp_path / "outputs" / "2026-01-01" / "10-00-00", last=5)
    newest = make_run(tmp_path / "outputs" / "2026-01-02" / "09-00-00", steps=(3,))
    sweep_job = make_run(tmp_path / "outputs" / "multirun" / "2026-01-01" / "11-00-00" / "0_attention=dot", last=1)
    make_run(tmp_path / "outputs" / "2026-01-03" / "08-00-00")  # started, no checkpoint yet
    RunDir(tmp_path / "outputs" / "best_only").write_checkpoint("best.pt", state(1))
    for run, t in ((old, 1000), (sweep_job, 2000), (newest, 3000)):
        for f in run.checkpoints.iterdir():
            os.utime(f, (t, t))
    assert discover_runs(tmp_path / "outputs") == [newest, sweep_job, old]
    assert discover_runs(tmp_path / "nowhere") == []


def test_discover_runs_orders_by_the_newest_checkpoint_of_each_run(tmp_path):
    a = make_run(tmp_path / "a", steps=(1, 2))
    b = make_run(tmp_path / "b", last=9)
    os.utime(b.checkpoints / "last.pt", (2000, 2000))
    os.utime(a.checkpoints / "step_1.pt", (1000, 1000))
    os.utime(a.checkpoints / "step_2.pt", (3000, 3000))  # a's newest file is newer than b's
    assert discover_runs(tmp_path) == [a, b]


def test_overrides_are_read_from_hydra_or_empty(tmp_path):
    run = RunDir(tmp_path)
    assert run.overrides() == []
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- attention=dot\n- trainer.max_steps=5\n- data.dir=/a/b\n")
    assert run.overrides() == ["attention=dot", "trainer.max_steps=5", "data.dir=/a/b"]
    (tmp_path / ".hydra" / "overrides.yaml").write_text("attention: dot\n")
    with pytest.raises(ConfigError, match="overrides.yaml: expected Hydra's list of overrides"):
        run.overrides()


def test_atomic_write_replaces_whole_and_leaves_no_temp_file(tmp_path):
    target = tmp_path / "sub" / "f.bin"
    assert atomic_write(target, lambda f: f.write(b"old")) == target  # creates the folder
    seen_during_write = []

    def write(f):
        f.write(b"new, half")
        seen_during_write.append(target.read_bytes())  # a reader meanwhile sees the old file whole
        f.write(b" and whole")

    atomic_write(target, write)
    assert seen_during_write == [b"old"] and target.read_bytes() == b"new, half and whole"
    assert [p.name for p in target.parent.iterdir()] == ["f.bin"]


def test_atomic_write_failure_keeps_the_old_file_and_no_temp_file(tmp_path):
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")

    def fail(f):
        f.write(b"half of it")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        atomic_write(target, fail)
    assert target.read_bytes() == b"old"

    def interrupted(f):
        f.write(b"half of it")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # Ctrl-C mid-write too
        atomic_write(tmp_path / "new.bin", interrupted)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]


def test_atomic_write_gives_the_usual_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        path = atomic_write(tmp_path / "f", lambda f: f.write(b"x"))
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644  # not mkstemp's private 0600


def test_disk_usage_counts_hard_links_once(tmp_path):
    run = RunDir(tmp_path / "run")
    last = run.write_checkpoint("last.pt", {**state(1), "model": {"w": torch.randn(50_000)}})
    one = disk_usage(last)
    assert one >= last.stat().st_size and disk_usage(run.root) == one
    os.link(last, run.checkpoints / "best.pt")  # the same state stored once
    assert disk_usage(run.root) == one
    (run.checkpoints / "copy.pt").write_bytes(last.read_bytes())  # a second full copy
    assert disk_usage(run.root) == 2 * one
    (run.root / "link.pt").symlink_to(last)
    assert disk_usage(run.root) == 2 * one


def test_a_folder_with_only_hydras_files_is_removed_with_its_empty_parents(tmp_path):
    """A command that stopped before any work leaves no folder behind; a folder with anything of a run stays."""
    day = tmp_path / "outputs" / "2026-11-27"
    fresh, other = RunDir(day / "10-00-00"), RunDir(day / "09-00-00")
    for rd in (fresh, other):
        (rd.root / ".hydra").mkdir(parents=True)
        rd.log.write_text("")
    other.checkpoints.mkdir()
    assert fresh.holds_only_hydra_files() and not other.holds_only_hydra_files()
    assert not other.remove_if_unused(empty_parents=2) and other.root.is_dir()
    assert fresh.remove_if_unused(empty_parents=2) and not fresh.root.exists()
    assert day.is_dir()  # it still holds the other run, and so outputs/ stays too
    other.checkpoints.rmdir()
    assert other.remove_if_unused(empty_parents=2)
    assert not (tmp_path / "outputs").exists() and tmp_path.is_dir()  # DATE and outputs went, nothing above
