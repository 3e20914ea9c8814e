"""What a new user meets in the first hour, through the real CLIs: the run directory named first,
progress lines with an ETA, a validation interval measured in minutes, time-based checkpoints that
survive SIGKILL, resume without a run directory, data folders that are never invented, flat sweep
folders that nmt.report finds, one-line errors, a quiet wandb, and checkpoints stored compactly."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser

from helpers import REPO, TINY, env, popen_module, refused_before_torch, run_module, tiny_sweep
from nmt.rundir import disk_usage
from nmt.trainer import nice_interval

# A tiny run that validates rarely, so the behaviour under test is not a validation's side effect.
QUIET = [*TINY, "trainer.valid_every=100000"]


def train_in(cwd: Path, args: list[str], cache: Path, check: bool = True, timeout: int = 300):
    """``python -m nmt.train`` with ``cwd`` as the working directory (where outputs/ goes)."""
    return run_module("nmt.train", args, cache, timeout=timeout, check=check, cwd=cwd)


def test_a_short_run_names_its_folder_shows_eta_keeps_wandb_quiet_and_stores_checkpoints_once(tmp_path, sample_dir):
    """One tiny run, several first-hour promises: the run directory in line 1, timestamped progress
    lines with % done and ETA, an end that says why and how to translate, no wandb console chatter
    (wandb.mode=offline still logs), and checkpoints that take little more than the largest file."""
    # A space, and = and , as in a sweep job's folder: the printed commands quote for the shell and for Hydra.
    run = tmp_path / "my run,lr=3"
    args = [f"data.dir={sample_dir}", *QUIET, "trainer.max_steps=40", "trainer.log_every=20"]
    args.append(f"hydra.run.dir='{run}'")
    e = {k: v for k, v in env(tmp_path / "cache").items() if k != "WANDB_MODE"}
    proc = subprocess.run(
        [sys.executable, "-m", "nmt.train", *args, "wandb.mode=offline"],
        cwd=REPO,
        env=e,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stderr.splitlines()
    assert f"run directory: {run}" in lines[0]
    progress = [x for x in lines if re.search(r"step (20|40)  epoch", x)]
    assert len(progress) == 2, proc.stderr[-2000:]
    assert all(re.search(r"elapsed \d+:\d\d  \d+% of trainer\.max_steps=40, ETA \d+:\d\d", x) for x in progress)
    assert re.search(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", progress[0])  # timestamped
    tail = "\n".join(lines[-4:])
    # why it stopped comes first, before the finishing (decoding defaults, shortlist) it then spends time on
    stop = next(i for i, x in enumerate(lines) if "stopping: reached trainer.max_steps=40" in x)
    assert all(i > stop for i, x in enumerate(lines) if "[nmt.finishing]" in x)
    hint = f"python -m nmt.translate \"checkpoint='{run}/checkpoints/best.pt'\"   (answers the lines you type, Ctrl-D"
    assert hint in tail, tail
    (arg,) = shlex.split(tail.split("python -m nmt.translate ")[1].split("   (")[0])
    assert OverridesParser.create().parse_override(arg).value() == f"{run}/checkpoints/best.pt"
    # each validation line shows the first valid sentence and its translation (quoted: it may be empty)
    first = (sample_dir / "valid.tsv").read_text(encoding="utf-8").split("\t", 1)[0]
    validations = [x for x in lines if "validation at step" in x]
    assert validations and all(f'| first valid sentence: "{first}" → "' in x for x in validations), validations
    assert list((run / "wandb").glob("offline-run-*")), "nothing logged to wandb"
    chatter = [x for x in (proc.stdout + proc.stderr).splitlines() if "wandb" in x.lower() and "[nmt" not in x]
    assert chatter == [], chatter
    files = list((run / "checkpoints").iterdir())
    assert {f.name for f in files} == {"last.pt", "best.pt"}
    assert disk_usage(run / "checkpoints") <= 1.5 * max(f.stat().st_size for f in files)
    best = torch.load(run / "checkpoints" / "best.pt", weights_only=False)
    assert "optimizer" not in best and "model" in best  # weights only: enough to translate


def test_validation_interval_from_minutes_is_kept_on_resume(tmp_path, sample_dir):
    run, cache = tmp_path / "run", tmp_path / "cache"
    # 0.0005 minutes: the interval comes out at the floor of 10 steps on any machine.
    common = [f"data.dir={sample_dir}", *TINY, "trainer.valid_every=0", "trainer.valid_minutes=0.0005"]
    proc = run_module("nmt.train", [*common, "trainer.max_steps=30", f"hydra.run.dir={run}"], cache)
    assert "validating every 10 steps" in proc.stderr
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [20, 30]  # fixed at step 20 (after timing steps 5-20), then every 10
    resume = [*common, "trainer.max_steps=50", "trainer.resume=true", f"hydra.run.dir={run}"]
    proc = run_module("nmt.train", resume, cache)
    assert "validating every" not in proc.stderr  # the interval came back with the checkpoint
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [20, 30, 40, 50]


def test_nice_interval():
    assert [nice_interval(x) for x in (3, 10, 87.9, 1234, 56789)] == [10, 10, 87, 1200, 56000]


def test_time_based_checkpoint_survives_sigkill(tmp_path, sample_dir):
    run, cache = tmp_path / "run", tmp_path / "cache"
    args = [f"data.dir={sample_dir}", *QUIET, "trainer.checkpoint_minutes=0.01", f"hydra.run.dir={run}"]
    proc = popen_module("nmt.train", args, cache)
    last = run / "checkpoints" / "last.pt"
    deadline = time.monotonic() + 120
    while not last.is_file() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    time.sleep(1.0)  # let it train on past the first save
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert last.is_file(), "no last.pt before any validation"
    step = torch.load(last, weights_only=False)["progress"]["step"]
    assert step > 0 and not (run / "metrics.jsonl").exists()  # saved by the clock, not by a validation
    more = run_module("nmt.train", [*args, f"trainer.max_steps={step + 5}", "trainer.resume=true"], cache)
    assert f"resuming from {last}: step {step}," in more.stderr


def test_resume_without_a_run_directory_finds_this_commands_newest_run(tmp_path, sample_dir):
    cache = tmp_path / "cache"
    base = [f"data.dir={sample_dir}", *QUIET]
    train_in(tmp_path, [*base, "trainer.max_steps=20"], cache)
    (first,) = list((tmp_path / "outputs").glob("*/*"))
    proc = train_in(tmp_path, [*base, "trainer.max_steps=25", "trainer.resume=true"], cache)
    assert re.search(r"resuming from \S*checkpoints/last\.pt: step 20,", proc.stderr), proc.stderr[-2000:]
    assert "starting this run at step 0" not in proc.stderr
    assert list((tmp_path / "outputs").glob("*/*")) == [first]  # no second run folder left behind
    # Another command (a different attention) has nothing to resume: an error listing the resumable runs.
    other = train_in(tmp_path, [*base, "attention=dot", "trainer.resume=true"], cache, check=False)
    assert other.returncode == 2 and "resumable runs" in other.stderr and str(first.name) in other.stderr
    assert "Traceback" not in other.stderr
    assert list((tmp_path / "outputs").glob("*/*")) == [first]


def test_interrupt_prints_the_exact_resume_command(tmp_path, sample_dir):
    run = tmp_path / "run"
    proc = popen_module("nmt.train", [f"data.dir={sample_dir}", *QUIET, f"hydra.run.dir={run}"], tmp_path / "cache")
    deadline = time.monotonic() + 120
    log = run / "train.log"
    while time.monotonic() < deadline and not (log.is_file() and "Ctrl-C saves a checkpoint" in log.read_text()):
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert f"hydra.run.dir={run} trainer.resume=true" in out and "continue with trainer.resume=true" in out


def test_a_missing_data_dir_is_an_error_and_nothing_is_created(tmp_path):
    missing = tmp_path / "no" / "such" / "corpus"
    proc = run_module(
        "nmt.train", [f"data.dir={missing}", *TINY, f"hydra.run.dir={tmp_path}/run"], tmp_path / "cache", check=False
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"data.dir={missing}: no such folder" in proc.stderr and "train.tsv" in proc.stderr
    assert not (tmp_path / "no").exists()
    # The mistake leaves no empty run folder behind, and the console names none.
    assert not (tmp_path / "run").exists() and "run directory" not in proc.stderr
    # Without hydra.run.dir, Hydra's outputs/DATE/TIME goes too (folders that held other runs stay).
    (tmp_path / "outputs" / "2000-01-01").mkdir(parents=True)
    again = train_in(tmp_path, [f"data.dir={missing}", *TINY], tmp_path / "cache", check=False)
    assert again.returncode == 2 and f"data.dir={missing}: no such folder" in again.stderr
    assert [p.name for p in (tmp_path / "outputs").iterdir()] == ["2000-01-01"]


def test_strict_corpus_error_is_one_line_before_training(tmp_path, sample_dir):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split in ("valid", "test"):
        (corpus / f"{split}.tsv").write_bytes((sample_dir / f"{split}.tsv").read_bytes())
    good = (sample_dir / "train.tsv").read_bytes().splitlines(keepends=True)
    (corpus / "train.tsv").write_bytes(b"".join(good[:50]) + b"no tab on this line\n" + b"".join(good[50:]))
    # One error line, exit 2, and torch never imported: found before the model, sentencepiece or the stream
    line = refused_before_torch("nmt.train", [f"data.dir={corpus}", "data.strict=true", *TINY], tmp_path)
    expected = "expected 2 tab-separated columns (source<TAB>target), found 1 (data.strict=true)"
    assert line.endswith(f"{corpus}/train.tsv:51: {expected}"), line
    assert not (tmp_path / "outputs").exists()  # and no run folder left behind


def test_a_corpus_with_an_attribution_column_is_named_before_torch_and_read_with_data_columns(tmp_path, sample_dir):
    """The manythings.org/Anki exports have a third column: refused from their first lines, before torch, with
    the key that reads them; data.columns=[1,0] trains Spanish to English from the same files, and nmt.evaluate
    asks which side of its input is the source instead of scoring the reversed model on English."""
    corpus, cache = tmp_path / "corpus", tmp_path / "cache"
    corpus.mkdir()
    for split in ("train", "valid"):
        lines = (sample_dir / f"{split}.tsv").read_text(encoding="utf-8").splitlines()
        (corpus / f"{split}.tsv").write_text("".join(f"{x}\tCC-BY 2.0 (France) #{i}\n" for i, x in enumerate(lines)))
    line = refused_before_torch("nmt.train", [f"data.dir={corpus}", *TINY], tmp_path)
    assert line.endswith(
        f"{corpus}/train.tsv: every line has 3 tab-separated columns and data.columns is unset "
        "(exactly two: source<TAB>target); name the source and target columns, e.g. "
        "data.columns=[0,1] (0-based; the manythings.org/Anki exports carry a third, attribution "
        "column)"
    ), line
    run = tmp_path / "run"
    args = [f"data.dir={corpus}", *TINY, "data.columns=[1,0]", "trainer.max_steps=10", "trainer.valid_every=10"]
    proc = run_module("nmt.train", [*args, f"hydra.run.dir={run}"], cache)
    assert "malformed" not in proc.stderr and "validation at step 10" in proc.stderr
    assert "corpus: the source is column 1 and the target column 0 of each line (data.columns, from 0)" in proc.stderr
    best = f"checkpoint={run}/checkpoints/best.pt"
    for given, says in [
        (f"input={corpus}/valid.tsv", "every line has 3 tab-separated columns and columns is unset"),
        (f"input={sample_dir}/valid.tsv", f"say which columns of {sample_dir}/valid.tsv hold the source and the"),
    ]:
        refused = run_module("nmt.evaluate", [best, given], cache, check=False)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr and says in refused.stderr, refused.stderr
    assert "columns=[1,0] as in training, or columns=[0,1] if its source comes first" in refused.stderr
    scored = run_module("nmt.evaluate", [best, f"input={corpus}/valid.tsv", "columns=[1,0]", "beam_size=1"], cache)
    assert "BLEU" in scored.stdout and "200 lines" in scored.stdout + scored.stderr


def test_sweep_job_folders_are_flat_and_the_report_finds_them(tmp_path, sample_dir):
    sweep = tmp_path / "sweep"
    procs = []  # data.dir: '/' in job names
    swept = ["attention=dot,general", "attention.window=3"]  # a key neither job reads: a warning, and each log's
    jobs = tiny_sweep(sweep, swept, sample_dir, tmp_path / "cache", output=procs)
    assert len(jobs) == 2 and all(j.parent == sweep for j in jobs), jobs
    unread = "attention.window=3 is not read: it is for attention=local_m or local_p (this run: "
    named = [f"[nmt.train][WARNING] - in the sweep's job attention={a}: {unread}{a})" for a in ("dot", "general")]
    assert procs[0].stderr.splitlines()[:2] == named, procs[0].stderr[:800]  # before the first job starts
    assert all(unread in (j / "train.log").read_text() for j in jobs)
    # The sweep's last lines: every job with its best validation, and the report command (SweepSummary).
    tail = procs[0].stderr.splitlines()[-4:]
    assert tail[0] == f"sweep {sweep}: 2 job(s) with a validation, best valid BLEU first (greedy, as validated):"
    assert sorted(re.fullmatch(r" +[\d.]+ +step +20 +(\S+)", x).group(1) for x in tail[1:3]) == [j.name for j in jobs]
    assert tail[3] == f"tables, curves and attention statistics: python -m nmt.report {sweep}"
    # The sweep again without trainer.resume=true: its first job's folder holds checkpoints, which it would have
    # overwritten; it stops in one line instead and they are kept.
    before = (jobs[0] / "checkpoints" / "best.pt").read_bytes()
    args = ["-m", *swept, f"data.dir={sample_dir}", *TINY, "trainer.max_steps=20", f"hydra.sweep.dir={sweep}"]
    refused = run_module("nmt.train", args, tmp_path / "cache", check=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert (
        f"the sweep job's folder {jobs[0]} already holds a run's checkpoints (best.pt, last.pt), which a fresh run "
        "would overwrite: add trainer.resume=true to continue that run, or give another hydra.sweep.dir"
        in refused.stderr
    ), refused.stderr[-2000:]
    assert (jobs[0] / "checkpoints" / "best.pt").read_bytes() == before
    # The sweep again with trainer.resume=true (as an interrupted job prints it): each job continues in its own
    # folder, found by the same name, and a job that never started (its folder gone) starts.
    shutil.rmtree(jobs[1])
    again = []
    resumed = tiny_sweep(sweep, [*swept, "trainer.resume=true"], sample_dir, tmp_path / "cache", output=again)
    assert resumed == jobs, resumed
    assert f"resuming from {jobs[0]}/checkpoints/last.pt: step 20," in again[0].stderr, again[0].stderr[-3000:]
    assert f"trainer.resume=true, but {jobs[1]} has no checkpoint yet: starting this run at step 0" in again[0].stderr
    assert (jobs[1] / "checkpoints" / "best.pt").is_file()
    (sweep / "broken" / ".hydra").mkdir(parents=True)
    (sweep / "broken" / ".hydra" / "config.yaml").write_text("{}")
    proc = run_module("nmt.report", [str(sweep)], tmp_path / "cache")
    report = (sweep / "report.md").read_text()
    assert "| dot |" in report and "| general |" in report
    assert "skipped" in proc.stderr and "broken" in proc.stderr and "`broken`" in report


def test_translate_refuses_a_missing_output_folder_and_reports_binary_lines(trained, tmp_path):
    run, cache, _ = trained
    best = f"{run}/checkpoints/best.pt"
    proc = run_module("nmt.translate", [f"checkpoint={best}", f"output={tmp_path}/no/out.txt"], cache, check=False)
    assert proc.returncode == 2 and "does not exist" in proc.stderr and "Traceback" not in proc.stderr
    src = tmp_path / "in.txt"
    src.write_bytes(b"Hello.\nbad \x00 byte\nok\n\xff\xfe not utf-8\n")
    proc = run_module("nmt.translate", [f"checkpoint={best}", f"input={src}", f"output={tmp_path}/out.txt"], cache)
    assert "2 line(s) hold NUL bytes or bytes that are not UTF-8" in proc.stderr and "lines 2, 4" in proc.stderr
    assert len((tmp_path / "out.txt").read_text().splitlines()) == 4


def test_translate_and_evaluate_name_the_lines_they_truncate_once(trained, tmp_path):
    """A line over max_input_len pieces is translated from its first pieces, and one warning at the end names
    the input's lines (it said "1 input line(s) ... were truncated" per batch, in each decoding process)."""
    run, cache, _ = trained
    best = f"{run}/checkpoints/best.pt"
    long = " ".join(["word"] * 40)
    src = tmp_path / "in.txt"
    src.write_text(f"Hello.\n{long}\nok\n{long}\n", encoding="utf-8")
    args = [f"checkpoint={best}", f"input={src}", f"output={tmp_path}/out.txt", "max_input_len=10", "batch_size=1"]
    proc = run_module("nmt.translate", args, cache)
    warned = [x for x in proc.stderr.splitlines() if "max_input_len" in x]
    assert len(warned) == 1 and warned[0].endswith(
        f"{src}: 2 lines longer than max_input_len=10 pieces were truncated to the first 10: lines 2, 4 "
        "(max_input_len=N raises the limit)"
    ), proc.stderr[-2000:]
    assert len((tmp_path / "out.txt").read_text().splitlines()) == 4
    test = tmp_path / "test.tsv"
    test.write_text(f"Hello.\tHola.\n{long}\tpalabra\n", encoding="utf-8")
    proc = run_module("nmt.evaluate", [f"checkpoint={best}", f"input={test}", "max_input_len=10"], cache)
    warned = [x for x in proc.stderr.splitlines() if "max_input_len" in x]
    assert len(warned) == 1 and "1 line longer than max_input_len=10 pieces" in warned[0], proc.stderr[-2000:]
    assert warned[0].endswith(": line 2 (max_input_len=N raises the limit)")


def test_an_interrupted_sweep_job_names_the_command_that_continues_the_whole_sweep(tmp_path):
    """The command re-runs the sweep with trainer.resume=true, which job names leave out, so each job finds its
    own folder (the end-to-end sweep test cannot show this: its long tiny-model names are cut before it)."""
    from hydra import compose, initialize_config_dir

    from nmt.config import register_configs
    from nmt.sweep import resume_sweep_command

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        for extra in ([], ["trainer.resume=true", "trainer.allow_changes=[trainer.lr]"]):
            cfg = compose("config", overrides=["attention=dot", "trainer.lr=0.01", *extra], return_hydra_config=True)
            assert cfg.hydra.job.override_dirname == "attention=dot,trainer.lr=0.01"

    sweep = tmp_path / "multirun" / "a,b"  # a folder Hydra must read quoted
    sweep.mkdir(parents=True)
    assert resume_sweep_command(sweep) is None  # a single run's folder has no multirun.yaml above it
    task = ["experiment=smoke", "attention=dot,general", "trainer.resume=true"]  # a sweep resumed once already
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"overrides": {"task": task}}}))
    assert resume_sweep_command(sweep) == (
        "python -m nmt.train -m experiment=smoke attention=dot,general "
        f"\"hydra.sweep.dir='{sweep}'\" trainer.resume=true"
    )


def test_the_resume_hint_replaces_the_limit_it_asks_to_raise():
    from nmt.runner import resume_command

    cmd = resume_command(
        ["trainer.max_steps=190", "attention=dot", "hydra.run.dir=old"], Path("runs/a"), "trainer.max_steps=..."
    )
    assert cmd == "python -m nmt.train attention=dot hydra.run.dir=runs/a trainer.resume=true trainer.max_steps=..."


def test_resume_with_only_damaged_checkpoints_stops_and_changes_nothing(tmp_path, sample_dir):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.pt").write_bytes(b"not a checkpoint")
    args = [f"data.dir={sample_dir}", *QUIET, "trainer.resume=true", f"hydra.run.dir={run}"]
    proc = run_module("nmt.train", args, tmp_path / "cache", check=False)
    assert proc.returncode == 2 and "no checkpoint in" in proc.stderr and "is readable" in proc.stderr
    assert "starting this run at step 0" not in proc.stderr and "Traceback" not in proc.stderr
    assert (run / "checkpoints" / "last.pt").read_bytes() == b"not a checkpoint"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last.pt"]


def test_wandb_online_without_an_api_key_is_one_line(tmp_path, sample_dir):
    """wandb.mode=online with no key configured ended in wandb's UsageError traceback; now one line with the
    ways out, before the sentencepiece model and the network are built (a wandb that cannot start used to fail
    only after them). HOME is a fresh folder (no ~/.netrc) and no WANDB_* variable is set."""
    e = {k: v for k, v in env(tmp_path / "cache").items() if not k.startswith("WANDB_")}
    e.update(HOME=str(tmp_path), PYTHONPATH=str(REPO))
    args = [
        f"data.dir={sample_dir}",
        *QUIET,
        "trainer.max_steps=2",
        "wandb.mode=online",
        f"hydra.run.dir={tmp_path}/run",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "nmt.train", *args], cwd=REPO, env=e, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "wandb.mode=online: No API key configured" in proc.stderr, proc.stderr[-3000:]
    assert "wandb.mode=offline logs into the run directory" in proc.stderr
    assert "sentencepiece" not in proc.stderr and "parameters, device cpu" not in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "run").exists()  # nothing was trained: no folder left behind


def test_a_second_interrupt_stops_at_once_in_one_line(tmp_path, sample_dir):
    """Ctrl-C twice in a row: the second stops at once (nmt.trainer.StopSignal raises KeyboardInterrupt). That
    printed a traceback; now one line says nothing of this step was saved and how to resume from what was.
    The interrupt is raised by a stand-in for the run (two real signals inside one tiny step are not timeable)."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.pt").write_bytes(b"an earlier checkpoint")
    # trainer.resume=true: the launcher refuses a fresh run over a folder's checkpoints (the stand-in loads none)
    argv = ["nmt.train", f"data.dir={sample_dir}", *QUIET, f"hydra.run.dir={run}", "trainer.resume=true"]
    code = (
        "import runpy, sys, nmt.runner\n"
        "def interrupted(*args, **kwargs):\n    raise KeyboardInterrupt\n"
        f"nmt.runner.run = interrupted\nsys.argv = {argv!r}\n"
        "runpy.run_module('nmt.train', run_name='__main__')\n"
    )
    e = {**env(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=e, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 130 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert (
        "interrupted again: stopped at once, without saving this step; the newest checkpoint is kept, " in proc.stderr
    )
    assert (
        f"resume with: python -m nmt.train data.dir={sample_dir}" in proc.stderr
        and "trainer.resume=true" in proc.stderr
    )


def test_one_stop_delivered_twice_is_one_stop():
    """`timeout -s TERM` signals the process and then its group, so one stop can arrive as two SIGTERMs a few ms
    apart (seen in session 78: the run quit without saving, "interrupted again"). A repeat of SIGTERM within
    StopSignal.SAME_STOP_S is ignored; a later one, or a second Ctrl-C at any time, still stops at once."""
    from nmt.trainer import StopSignal

    now = [100.0]
    stop = StopSignal(clock=lambda: now[0])
    stop._handle(signal.SIGTERM, None)
    now[0] += 0.01
    stop._handle(signal.SIGTERM, None)  # the group's copy: no KeyboardInterrupt
    assert stop.signum == signal.SIGTERM
    now[0] += StopSignal.SAME_STOP_S
    with pytest.raises(KeyboardInterrupt):
        stop._handle(signal.SIGTERM, None)
    ctrl_c = StopSignal(clock=lambda: now[0])
    ctrl_c._handle(signal.SIGINT, None)
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C twice, however quick: the user means it
        ctrl_c._handle(signal.SIGINT, None)
