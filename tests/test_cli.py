"""The launcher (nmt/cli.py): the whole config is checked before Hydra makes a run directory, every
mistake is one line, and each command's --help says what it does and what it reads."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO, env, error_lines, refused_before_torch
from nmt.config import CHOICES, TrainConfig, field_help, validate
from nmt.errors import ConfigError


def run_in(cwd: Path, module: str, args: list[str], timeout: int = 60) -> subprocess.CompletedProcess:
    """A command with ``cwd`` as the working directory (where Hydra would put outputs/)."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env={**env(cwd / "cache"), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    "override,allowed",
    [
        ("trainer.amp=fp8", ["none", "bf16", "fp16"]),
        ("trainer.optimizer=rmsprop", ["adam", "adamw", "sgd", "adadelta", "adagrad"]),
        ("trainer.scheduler=cosine", ["constant", "warmup_decay", "plateau", "budget", "step"]),
        ("encoder.cell=rnn", ["gru", "lstm"]),
        ("tokenizer.model_type=word", ["unigram", "bpe"]),
    ],
)
def test_bad_choice_is_one_line_before_any_work(tmp_path, override, allowed):
    run = tmp_path / "run"
    start = time.monotonic()
    proc = run_in(tmp_path, "nmt.train", [override, f"hydra.run.dir={run}"])
    took = time.monotonic() - start
    assert proc.returncode == 2, proc.stderr
    assert took < 20
    key, value = override.split("=")
    (line,) = error_lines(proc)
    assert f"{key}='{value}'" in line and all(a in line for a in allowed), line
    assert not run.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "no outputs/, no cache, nothing created"


def test_every_bad_key_is_reported_at_once(tmp_path):
    proc = run_in(tmp_path, "nmt.train", ["trainer.amp=fp8", "decoder.order=sideways", "device=gpu9"])
    assert proc.returncode == 2
    lines = error_lines(proc)
    assert len(lines) == 3, lines
    assert any("trainer.amp='fp8'" in x and "bf16" in x for x in lines)
    assert any("decoder.order='sideways'" in x and "luong" in x for x in lines)
    assert any("device='gpu9'" in x for x in lines)
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(
    "override,hint",
    [
        ("trainer.max_step=5", "did you mean trainer.max_steps?"),
        ("max_steps=5", "did you mean trainer.max_steps?"),
        ("attentoin=dot", "did you mean attention?"),
        ("attention=bahdnau", "did you mean attention=bahdanau?"),
    ],
)
def test_mistyped_key_suggests_the_right_one(tmp_path, override, hint):
    proc = run_in(tmp_path, "nmt.train", [override])
    assert proc.returncode == 2
    (line,) = error_lines(proc)
    assert hint in line, line
    assert "+" not in line.split("did you mean")[0], "no Hydra advice to append the key"
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(
    "module,args,key",
    [
        ("nmt.translate", [], "checkpoint"),
        ("nmt.evaluate", ["checkpoint=x.pt"], "input"),
        ("nmt.average", ["checkpoints=[a.pt,b.pt]"], "output"),
    ],
)
def test_missing_mandatory_key_is_one_line(tmp_path, module, args, key):
    proc = run_in(tmp_path, module, args)
    assert proc.returncode == 2
    (line,) = error_lines(proc)
    assert f"{key}=... is required" in line, line
    assert "Traceback" not in proc.stderr and "MissingMandatoryValue" not in proc.stderr


@pytest.mark.parametrize(
    "module,args,also",
    [
        ("nmt.evaluate", ["beam_size=0"], ["beam_size=0: expected an integer >= 1"]),
        (
            "nmt.serve",
            ["port=99999", "device=tpu"],
            ["port=99999: expected a TCP port", "device='tpu' is not a device"],
        ),
    ],
)
def test_a_missing_key_and_other_mistakes_are_answered_together(tmp_path, module, args, also):
    """Not one round trip per mistake: a required key left out does not hide a bad value given beside it."""
    proc = run_in(tmp_path, module, args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = error_lines(proc)
    required = "output" if module == "nmt.average" else "checkpoint"
    assert any(f"{required}=... is required" in x for x in lines), lines
    assert all(any(a in x for x in lines) for a in also), lines
    assert len(lines) == 1 + len(also) + (module == "nmt.evaluate"), lines  # evaluate also needs input=


def test_decode_settings_are_checked_before_the_checkpoint_is_read(tmp_path):
    proc = run_in(tmp_path, "nmt.translate", ["checkpoint=missing.pt", "beam_size=2", "n_best=3"])
    assert proc.returncode == 2
    (line,) = error_lines(proc)
    assert "n_best=3" in line and "beam_size=2" in line, line


def test_a_negative_worker_count_is_refused_before_the_checkpoint_is_read(tmp_path):
    proc = run_in(tmp_path, "nmt.evaluate", ["checkpoint=missing.pt", "input=missing.tsv", "workers=-1"])
    assert proc.returncode == 2
    (line,) = error_lines(proc)
    assert "workers=-1" in line and ">= 0" in line, line


def test_sweep_values_are_checked_before_any_job(tmp_path):
    argv = ["-m", "trainer.amp=bf16,fp8", "attention=dot,nope", "trainer.lr=fast,0.1", "trainer.betas=0.9,0.98"]
    proc = run_in(tmp_path, "nmt.train", [*argv, "trainer.max_steps=range(1,3)", "data.columns=[1,0],null"])
    assert proc.returncode == 2
    lines = error_lines(proc)
    assert any("trainer.amp='fp8'" in x for x in lines) and any("attention/nope" in x for x in lines), lines
    # values of the wrong type, as a single run says them (Hydra printed its multi-line error in each job)
    assert any(x.endswith("] - trainer.lr=fast: expected a number") for x in lines), lines
    betas = [x for x in lines if "trainer.betas=" in x]
    assert len(betas) == 2 and all("expected a list in brackets" in x for x in betas), lines
    assert len(lines) == 5 and not any("max_steps" in x or "columns" in x for x in lines), lines
    assert not (tmp_path / "multirun").exists()


def test_a_sweep_is_checked_job_by_job_and_a_problem_of_some_jobs_names_them():
    """A rule between keys is checked with each job's swept values in place: sweeping the key a fixed choice
    needs is fine (it was refused: the check saw decay_every at its default 0), and a fixed key that only
    some jobs can take names those jobs."""
    from nmt.cli import COMMANDS, Stop, preflight

    train = COMMANDS["train"]
    preflight(train, ["trainer.scheduler=step", "trainer.decay_every=100,200"])
    with pytest.raises(Stop) as e:
        preflight(train, ["trainer.optimizer=adam,sgd,adagrad", "trainer.momentum=0.9", "attention=dot,general"])
    assert e.value.lines == [
        "in the sweep's jobs trainer.optimizer=adam attention=dot; trainer.optimizer=adam attention=general: "
        "trainer.momentum=0.9 is for trainer.optimizer=sgd (this run: adam)",
        "in the sweep's jobs trainer.optimizer=adagrad attention=dot; trainer.optimizer=adagrad attention=general: "
        "trainer.momentum=0.9 is for trainer.optimizer=sgd (this run: adagrad)",
    ]
    with pytest.raises(Stop) as e:  # a problem of every job: said once, as a single run says it
        preflight(train, ["trainer.patience=-1", "attention=dot,general"])
    assert e.value.lines == ["trainer.patience=-1: expected an integer >= 0 (0 = never stop early)"]
    with pytest.raises(Stop) as e:  # without -m, several values are a mistake, said before Hydra's 5 lines
        preflight(train, ["attention=dot,general"], multirun=False)
    assert e.value.lines == [
        "attention=dot,general: several values sweep, which needs -m; a list is written [a,b], a text with commas 'a,b'"
    ]
    # a list key given a,b (its values were judged one by one: "data.columns=1: expected a list"), a number key
    with pytest.raises(Stop) as e:
        preflight(train, ["data.columns=0,1", "trainer.lr=fast,0.1"], multirun=False)
    assert e.value.lines == [
        "data.columns=0,1: several values sweep, which needs -m; a list is written [a,b]",
        "trainer.lr=fast,0.1: several values sweep, which needs -m; trainer.lr takes a number",
    ]


def test_a_value_far_down_a_long_sweep_is_checked_before_its_first_job():
    """Past the first SWEEP_JOBS_CHECKED jobs, each swept value they lack gets one job of its own: patience=-1
    would start as the sweep's 40th job, hours in, and is refused before the first."""
    from nmt.cli import COMMANDS, SWEEP_JOBS_CHECKED, Stop, preflight, sweep_jobs_to_check

    swept = [["a=1", "a=2", "a=1"], [f"b={i}" for i in range(SWEEP_JOBS_CHECKED + 3)]]
    jobs = sweep_jobs_to_check(swept)
    assert jobs[:SWEEP_JOBS_CHECKED] == [("a=1", f"b={i}") for i in range(SWEEP_JOBS_CHECKED)]
    assert jobs[SWEEP_JOBS_CHECKED:] == [("a=2", "b=0"), ("a=1", "b=32"), ("a=1", "b=33"), ("a=1", "b=34")]
    assert len(sweep_jobs_to_check([[f"a={i}" for i in range(100)]], first=4)) == 8  # at most `first` more
    with pytest.raises(Stop) as e:
        preflight(COMMANDS["train"], ["trainer.patience=0,-1", "trainer.max_steps=range(1,40)"])
    assert e.value.lines == [
        "in the sweep's job trainer.patience=-1 trainer.max_steps=1: "
        "trainer.patience=-1: expected an integer >= 0 (0 = never stop early)"
    ]


def test_a_sweep_asked_for_its_config_is_one_line(tmp_path):
    proc = run_in(tmp_path, "nmt.train", ["-m", "attention=dot,general", "--cfg", "job"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert error_lines(proc)[0].endswith(
        "-m and --cfg together: --cfg shows one run's config; drop -m and give one value per key"
    )


@pytest.mark.parametrize(
    "module,argv,says",
    [
        (
            "nmt.translate",
            ["-m", "checkpoint=a.pt,b.pt"],
            "-m: nmt.translate runs no sweeps: its jobs would read the same input and write the same output in turn",
        ),
        ("nmt.serve", ["-m", "checkpoint=a.pt,b.pt"], "-m: nmt.serve runs no sweeps: its first job would serve until"),
        ("nmt.average", ["-m", "last=2,3", "run_dir=r", "output=o.pt"], "-m: nmt.average runs no sweeps: its jobs"),
        (
            "nmt.evaluate",
            ["-m", "checkpoint=a.pt", "input=t.tsv", "beam_size=1,5", "hypotheses=h.txt"],
            "-m with hypotheses=h.txt: every job would write its translations to it in turn, and only the last job's",
        ),
    ],
)
def test_commands_that_cannot_sweep_refuse_m_before_any_work(module, argv, says, tmp_path):
    """A translate sweep over stdin died in its second job with a traceback (the first had closed stdin), and
    one over a file wrote each job's output over the last: -m is refused in one line, before torch."""
    assert says in refused_before_torch(module, argv, tmp_path)
    assert not (tmp_path / "multirun").exists()


def test_several_checkpoints_are_answered_with_how_to_ensemble(tmp_path):
    """checkpoint=a,b or [a,b] names several models: the answer says that a decoding command combines them with
    ensemble=[...] (nmt.evaluate still sweeps them with -m), and writes a text with commas the way a text key takes
    it."""
    hint = "several models decode together as checkpoint=A.pt ensemble=[B.pt,C.pt]"
    line = refused_before_torch("nmt.translate", ["checkpoint=a.pt,b.pt"], tmp_path)
    assert line.endswith(
        "checkpoint=a.pt,b.pt: one value per key (nmt.translate runs no sweeps); a text with commas is quoted, "
        f"'a,b'; {hint}"
    ), line
    line = refused_before_torch("nmt.evaluate", ["checkpoint=[a.pt,b.pt]", "input=t.tsv"], tmp_path)
    assert line.endswith(f"checkpoint=[a.pt,b.pt]: expected text; {hint}"), line
    line = refused_before_torch("nmt.evaluate", ["checkpoint=a.pt,b.pt", "input=t.tsv"], tmp_path)
    assert line.endswith("several values sweep, which needs -m; a text with commas is quoted, 'a,b'; " + hint), line


def test_a_fresh_run_over_a_folders_checkpoints_is_refused_and_they_are_kept(tmp_path):
    """``hydra.run.dir=runs/a`` without ``trainer.resume=true`` on a folder that holds a run wrote the new run's
    best.pt and last.pt over the old ones (a forgotten resume lost the trained model): refused in one line before
    torch and before Hydra writes into the folder; resuming, or a folder without checkpoints, is not refused."""
    from omegaconf import OmegaConf

    from nmt.cli import fresh_run_over_checkpoints

    run = tmp_path / "runs" / "a"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "best.pt").write_bytes(b"the trained model")
    (run / "checkpoints" / "last.pt").write_bytes(b"its last state")
    line = refused_before_torch("nmt.train", ["experiment=smoke", f"hydra.run.dir={run}"], tmp_path)
    assert line.endswith(
        f"hydra.run.dir={run} already holds a run's checkpoints (best.pt, last.pt), which a fresh run would "
        "overwrite: add trainer.resume=true to continue that run, or give another hydra.run.dir to start a new one"
    ), line
    assert (run / "checkpoints" / "best.pt").read_bytes() == b"the trained model"
    assert not (run / ".hydra").exists() and not (run / "train.log").exists()
    cfg = OmegaConf.create({"trainer": {"resume": False}})
    assert fresh_run_over_checkpoints(OmegaConf.create({"trainer": {"resume": True}}), [f"hydra.run.dir={run}"]) is None
    assert fresh_run_over_checkpoints(cfg, [f"hydra.run.dir={tmp_path / 'runs' / 'b'}"]) is None  # a new folder
    (tmp_path / "runs" / "c" / "checkpoints").mkdir(parents=True)  # a run stopped before its first checkpoint
    assert fresh_run_over_checkpoints(cfg, [f"hydra.run.dir={tmp_path / 'runs' / 'c'}"]) is None
    assert fresh_run_over_checkpoints(cfg, ["trainer.max_steps=5"]) is None  # Hydra's own new outputs/DATE/TIME


@pytest.mark.parametrize("name", ["best.pt", "last.pt", "step_5.pt"])
def test_average_refuses_to_write_over_a_runs_own_checkpoint(name, tmp_path):
    """``nmt.average run_dir=R output=R/checkpoints/best.pt`` replaced the run's chosen model (or last.pt, what a
    resume reads) with weights only: refused in one line before torch, the file kept; averaged.pt is allowed."""
    from nmt.rundir import training_checkpoint

    ckpts = tmp_path / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    for f in ("best.pt", "last.pt", "step_5.pt", "step_10.pt", "step_20.pt"):
        (ckpts / f).write_bytes(f.encode())
    line = refused_before_torch(
        "nmt.average", [f"run_dir={tmp_path / 'run'}", "last=2", f"output={ckpts / name}"], tmp_path
    )
    assert line.endswith(
        f"output={ckpts / name} is a checkpoint of its training run, which the average (weights only, for translating) "
        f"would replace; write it beside them, e.g. output={ckpts / 'averaged_2.pt'}"
    ), line
    assert (ckpts / name).read_bytes() == name.encode()
    assert not training_checkpoint(ckpts / "averaged.pt") and not training_checkpoint(tmp_path / "best.pt")


def test_python_m_nmt_lists_the_commands_and_points_a_subcommand_to_its_module(tmp_path):
    """``python -m nmt`` was Python's "'nmt' is a package and cannot be directly executed": it lists every
    command (each one a module that runs), and ``python -m nmt train ...`` names the command to type instead."""
    import importlib.util

    from nmt.cli import COMMANDS

    code = "import runpy, sys; runpy.run_module('nmt', run_name='__main__')"
    for argv in ([], ["--help"]):
        proc = subprocess.run(
            [sys.executable, "-c", code, *argv],
            cwd=tmp_path,
            env={**env(tmp_path / "cache"), "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        listed = re.findall(r"^  python -m (nmt\.[\w.]+) ", proc.stdout, flags=re.M)
        assert listed == [*(c.module for c in COMMANDS.values()), "nmt.report", "nmt.data.fetch"], proc.stdout
        for module in listed:  # each listed command exists as a module
            assert importlib.util.find_spec(module) is not None, module
    line = refused_before_torch("nmt", ["train", "experiment=smoke"], tmp_path)
    assert line.endswith("each command is a module of its own: python -m nmt.train experiment=smoke"), line
    line = refused_before_torch("nmt", ["trian"], tmp_path)
    assert line.endswith(": python -m nmt.train --help"), line


@pytest.mark.parametrize(
    "module,purpose,own_key",
    [
        ("nmt.train", "Train an attention-based RNN", "trainer.max_steps"),
        ("nmt.translate", "Translate text with a trained checkpoint", "beam_size"),
        ("nmt.evaluate", "Score a checkpoint on a test set", "baseline"),
        ("nmt.average", "Average the weights of several checkpoints", "run_dir"),
        ("nmt.serve", "translation web demo", "port"),
    ],
)
def test_help_says_what_the_command_does(tmp_path, module, purpose, own_key):
    proc = run_in(tmp_path, module, ["--help"])
    assert proc.returncode == 0, proc.stderr
    assert purpose in proc.stdout and own_key in proc.stdout
    assert f"python -m {module} " in proc.stdout.split("Examples:")[1]
    if module == "nmt.translate":
        assert "trainer." not in proc.stdout and "attention=" not in proc.stdout
        assert re.search(r"^  input +a file; unset: stdin, answered line by line \[unset\]$", proc.stdout, re.M)
    assert "[None]" not in proc.stdout  # a default left unset, as a command line would write it
    assert not list(tmp_path.iterdir())


def test_help_documents_keys_from_the_schema():
    docs = field_help(TrainConfig)
    assert docs["trainer.max_steps"] == "0 = no limit"
    assert "per direction" in docs["encoder.hidden_size"]
    assert docs["data.max_tokens"].startswith("Token budget per batch")  # a comment above the field


def test_validate_keeps_plain_strings_and_reports_each_key():
    from omegaconf import OmegaConf

    cfg = OmegaConf.structured(TrainConfig)
    cfg.attention.name = "bahdanau"
    validate(cfg, "train")  # the defaults are valid
    assert all(isinstance(v, str) for choices in CHOICES.values() for v in choices)
    cfg.trainer.amp, cfg.trainer.accum_steps, cfg.data.num_workers, cfg.attention.name = "fp8", 0, 3, "dott"
    with pytest.raises(ConfigError) as e:
        validate(cfg, "train")
    lines = str(e.value).splitlines()
    assert len(lines) == 4, lines
    assert any("attention.name='dott'" in x and "scaled_dot" in x for x in lines)
    assert any("trainer.accum_steps=0" in x for x in lines) and any("data.num_workers=3" in x for x in lines)


def test_only_single_runs_of_commands_without_a_run_directory_skip_hydras_run():
    from nmt.cli import COMMANDS, runs_in_place

    assert runs_in_place(COMMANDS["translate"], ["checkpoint=a.pt", "beam_size=3"])
    assert runs_in_place(COMMANDS["evaluate"], ["checkpoint=a.pt", "input=t.tsv"])
    assert not runs_in_place(COMMANDS["train"], ["trainer.max_steps=5"])  # a run directory: Hydra's
    assert not runs_in_place(COMMANDS["translate"], ["-m", "checkpoint=a.pt", "beam_size=1,5"])  # a sweep
    assert not runs_in_place(COMMANDS["translate"], ["checkpoint=a.pt", "hydra.run.dir=x"])
    assert not runs_in_place(COMMANDS["translate"], ["checkpoint=a.pt", "hydra/job_logging=disabled"])


def test_the_commands_check_their_config_before_importing_torch():
    """Entry points stay thin: importing one loads the launcher and the schema, not torch, the models or
    matplotlib, so `--help` and a config mistake answer at once; the work comes in after the checks."""
    commands = ["nmt.train", "nmt.translate", "nmt.evaluate", "nmt.serve", "nmt.average"]
    heavy = ["torch", "matplotlib", "nmt.models", "nmt.trainer", "nmt.runtime"]
    code = f"import sys, {', '.join(commands)}; print([m for m in {heavy!r} if m in sys.modules])"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr[-2000:]


@pytest.mark.parametrize("module", ["nmt.translate", "nmt.evaluate", "nmt.serve"])
def test_a_missing_checkpoint_is_refused_before_torch_is_imported(module, tmp_path):
    """The decoding commands look for their files (checkpoint, ensemble, input, output folder) first: a typo
    answers in one line without the seconds of importing torch and the model code."""
    argv = [f"checkpoint={tmp_path}/nope.pt", f"input={tmp_path}/in.tsv"][: 1 if module == "nmt.serve" else 2]
    line = refused_before_torch(module, argv, tmp_path)
    assert line.endswith(f"[{module}][ERROR] - {tmp_path}/nope.pt: checkpoint not found"), line


def test_a_run_folder_given_as_the_checkpoint_is_answered_with_its_checkpoints(tmp_path):
    """checkpoint=RUN_DIR (the folder the run printed first) names the checkpoints in it, best.pt first, as a
    pasteable override (Hydra-quoted: a sweep job's folder holds = and ,), before torch is imported."""
    from nmt.rundir import no_checkpoint

    run = tmp_path / "0_attention=dot,seed=1"
    (run / "checkpoints").mkdir(parents=True)
    for name in ("step_100.pt", "last.pt", "step_200.pt", "best.pt"):
        (run / "checkpoints" / name).write_bytes(b"")
    line = refused_before_torch("nmt.translate", ["checkpoint='" + str(run) + "'"], tmp_path)
    said = (
        f"{run}: a folder, not a checkpoint file; give one of its checkpoints (best.pt, last.pt, step_200.pt, "
        f"step_100.pt), e.g. \"checkpoint='{run}/checkpoints/best.pt'\""
    )
    assert line.endswith(f"[nmt.translate][ERROR] - {said}"), line
    assert no_checkpoint(run / "checkpoints") == said.replace(f"{run}:", f"{run}/checkpoints:", 1)
    assert no_checkpoint(tmp_path / "nope.pt") == f"{tmp_path}/nope.pt: checkpoint not found"


def test_evaluate_refuses_a_missing_baseline_file_before_decoding(tmp_path):
    """baseline=FILE (hypotheses to compare with) is looked for before anything is decoded, not after."""
    (tmp_path / "best.pt").write_bytes(b"")
    (tmp_path / "test.tsv").write_text("a\tb\n", encoding="utf-8")
    argv = [f"checkpoint={tmp_path}/best.pt", f"input={tmp_path}/test.tsv", f"baseline={tmp_path}/base.txt"]
    line = refused_before_torch("nmt.evaluate", argv, tmp_path)
    assert line.endswith(f"[nmt.evaluate][ERROR] - {tmp_path}/base.txt: input file not found"), line


@pytest.mark.parametrize("case", ["port out of range", "port taken", "host not resolvable"])
def test_serve_refuses_a_bad_address_before_loading_the_model(case, tmp_path):
    """port=80000 was served on 14464 (the socket layer takes it modulo 65536), a host name that does not
    resolve ended in a traceback, and a taken port was found only after the model had loaded."""
    (tmp_path / "best.pt").write_bytes(b"")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv, says = {
            "port out of range": (["port=80000"], "port=80000: expected a TCP port, 0 to 65535 (0 = a free one)"),
            "port taken": ([f"port={port}"], f"cannot listen on host=127.0.0.1 port={port}: Address already in use"),
            "host not resolvable": (["host=nowhere.invalid", "port=0"], "cannot listen on host=nowhere.invalid port=0"),
        }[case]
        line = refused_before_torch("nmt.serve", [f"checkpoint={tmp_path}/best.pt", *argv], tmp_path)
    assert says in line, line


@pytest.mark.parametrize(
    ("module", "argv", "says"),
    [
        (
            "nmt.translate",
            ["input=in.txt", "output=in.txt"],
            "in.txt: this command reads that file and would overwrite",
        ),
        ("nmt.translate", ["input=in.txt", "output=o.txt", "attention_out=./o.txt"], "two outputs of this command"),
        ("nmt.evaluate", ["input=in.txt", "hypotheses=in.txt"], "in.txt: this command reads that file"),
        ("nmt.evaluate", ["input=in.txt", "hypotheses=h.txt", "json=h.txt"], "two outputs of this command"),
        ("nmt.average", ["checkpoints=[best.pt,other.pt]", "output=best.pt"], "best.pt: this command reads that"),
    ],
)
def test_an_output_that_is_an_input_is_refused_and_the_input_kept(module, argv, says, tmp_path):
    """``nmt.translate input=a.txt output=a.txt`` emptied a.txt before reading it ("translated 0 lines")."""
    (tmp_path / "in.txt").write_text("Hello.\tHola.\n", encoding="utf-8")
    for name in ("best.pt", "other.pt"):
        (tmp_path / name).write_bytes(b"weights")
    argv = [a.replace("=", f"={tmp_path}/", 1) if a.split("=")[0] != "checkpoints" else a for a in argv]
    argv = [a.replace("[best.pt,other.pt]", f"[{tmp_path}/best.pt,{tmp_path}/other.pt]") for a in argv]
    if module != "nmt.average":
        argv = [f"checkpoint={tmp_path}/best.pt", *argv]
    line = refused_before_torch(module, argv, tmp_path)
    assert says in line, line
    assert (tmp_path / "in.txt").read_text(encoding="utf-8") == "Hello.\tHola.\n"
    assert (tmp_path / "best.pt").read_bytes() == b"weights"


def test_a_resume_with_nothing_to_resume_fetches_no_corpus(tmp_path):
    """``nmt.train trainer.resume=true`` in a folder without runs: the one line, before the default corpus is
    fetched into data/ (it was copied first, then the resume refused) and before torch is imported."""
    line = refused_before_torch("nmt.train", ["trainer.resume=true"], tmp_path)
    assert "trainer.resume=true: no run under outputs/ has a checkpoint to resume; give hydra.run.dir" in line, line
    assert not (tmp_path / "data").exists() and not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(
    ("module", "argv"),
    [
        ("nmt.train", ["device=mps"]),
        ("nmt.train", ["device=cuda:x"]),
        ("nmt.translate", ["checkpoint=best.pt", "device=mps"]),
        # a preset that names its device (cpu_small: device=cpu) checks it without torch too
        ("nmt.train", ["experiment=cpu_small", "trainer.patience=-1"]),
    ],
)
def test_devices_are_checked_without_torch_and_only_cpu_and_cuda_are_accepted(module, argv, tmp_path):
    """nmt runs on CPU and CUDA; device=mps was accepted, then failed with a traceback when the model moved
    there. Checking the key imported torch (seconds) whenever a device was named."""
    (tmp_path / "best.pt").write_bytes(b"")
    line = refused_before_torch(module, argv, tmp_path)
    if "trainer.patience=-1" in argv:
        assert "trainer.patience=-1" in line, line
    else:
        device = argv[-1].split("=")[1]
        assert line.endswith(f"device='{device}' is not a device nmt runs on; choose auto, cpu, cuda or cuda:N"), line


@pytest.mark.parametrize(
    ("line", "found"),
    [
        ("c\n", "expected 2 tab-separated columns (source<TAB>target), found 1"),
        ("c\t\n", "empty target side"),
    ],
)
def test_evaluate_refuses_a_malformed_test_line_instead_of_scoring_fewer_sentences(line, found, tmp_path):
    """Training skips a malformed corpus line with a warning; evaluation scores every line (and hypotheses=
    writes one per line), so one line fewer would be a score over another test set: refused, file:line named."""
    (tmp_path / "best.pt").write_bytes(b"")
    (tmp_path / "test.tsv").write_text("a\tb\n" + line, encoding="utf-8")
    argv = [f"checkpoint={tmp_path}/best.pt", f"input={tmp_path}/test.tsv"]
    err = refused_before_torch("nmt.evaluate", argv, tmp_path)
    assert err.endswith(f"[ERROR] - {tmp_path}/test.tsv:2: {found} (nmt.evaluate scores every line of its input)"), err


def test_the_built_in_attention_choices_are_the_registrys():
    """nmt.config lists the shipped attentions so that checking a config imports no torch; they must be the
    registry's, with the same scores for local attention (parallel, not local themselves)."""
    from nmt.config import BUILTIN_ATTENTIONS, BUILTIN_SCORES, allowed
    from nmt.models.attention import ATTENTIONS
    from nmt.models.attention.local import LocalAttention
    from nmt.models.attention.registry import scores_alone

    assert sorted(BUILTIN_ATTENTIONS) == sorted(ATTENTIONS)
    scores = sorted(k for k, c in ATTENTIONS.items() if scores_alone(c))
    assert sorted(BUILTIN_SCORES) == scores
    assert not any(issubclass(ATTENTIONS[k], LocalAttention) or not ATTENTIONS[k].parallel for k in scores)
    assert allowed("attention.name") == tuple(sorted(ATTENTIONS)) and allowed("attention.score") == tuple(scores)
    # an attention registered by other code (a plugin module imported before the config is checked) is allowed

    class Extra:
        parallel = True

        def score(self, query, state): ...

    ATTENTIONS["extra_for_this_test"] = Extra
    try:
        assert all("extra_for_this_test" in allowed(k) for k in ("attention.name", "attention.score"))
    finally:
        del ATTENTIONS["extra_for_this_test"]


@pytest.mark.parametrize(
    "module,args,status",
    [("nmt.average", ["--help"], 0), ("nmt.translate", ["beam_size=abc"], 2), ("nmt.report", ["/nonexistent"], 2)],
)
def test_a_command_freezes_its_objects_out_of_the_exit_collection(tmp_path, module, args, status):
    """Python's collection at shutdown walked every object torch and Hydra made (1.8 s after a tiny training
    run's last line); each command ends with gc.freeze (nmt.cli.skip_exit_collection), also when it exits
    with an error, and atexit handlers still run after it."""
    probe = (
        "import atexit, gc, runpy, sys\n"
        "atexit.register(lambda: print('frozen', gc.get_freeze_count(), file=sys.stderr))\n"
        f"sys.argv = [{module!r}, *{args!r}]\n"
        f"runpy.run_module({module!r}, run_name='__main__')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env={**env(tmp_path / "cache"), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == status, proc.stderr[-2000:]
    frozen = [int(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("frozen ")]
    assert frozen and frozen[0] > 10_000, proc.stderr[-2000:]
