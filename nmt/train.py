"""``python -m nmt.train``: config → data, tokenizer, model, trainer → a trained checkpoint.

Examples::

    python -m nmt.train                                  # default corpus, Bahdanau attention
    python -m nmt.train attention=general decoder=luong  # swap parts
    python -m nmt.train -m attention=dot,general,concat,bahdanau   # sweep
    python -m nmt.train hydra.run.dir=outputs/run1 trainer.resume=true
    python -m nmt.train trainer.resume=true               # the newest run of this command under outputs/
    torchrun --standalone --nproc_per_node 4 -m nmt.train hydra.run.dir=outputs/ddp   # data-parallel
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from nmt.cli import command
from nmt.config import register_configs, resume_args, then_args
from nmt.data import build_specs, check_corpus, prepare_corpus
from nmt.errors import NmtError
from nmt.rundir import RunDir, run_to_resume

# Startup: only the launcher is imported up front, so `--help` and a config mistake answer in about a
# second; the training code (nmt.runner: torch, the models, the data) comes in once the config is checked.

log = logging.getLogger("nmt.train")

register_configs()


def detach_file_log() -> list[logging.FileHandler]:
    """Remove (and close) the root logger's file handlers, returning them."""
    root = logging.getLogger()
    gone = [h for h in root.handlers if isinstance(h, logging.FileHandler)]
    for h in gone:
        root.removeHandler(h)
        h.close()
    return gone


def adopt(fresh: Path, chosen: RunDir) -> None:
    """Log into the run being resumed instead of the folder Hydra made for this invocation, and drop
    that folder when it holds nothing but Hydra's own files."""
    for h in detach_file_log():
        new = logging.FileHandler(chosen.log, mode="a", encoding="utf-8")
        new.setFormatter(h.formatter)
        new.setLevel(h.level)
        logging.getLogger().addHandler(new)
    RunDir(fresh).remove_if_unused()


def become_resume(run_dir: Path) -> NoReturn:
    """``trainer.restart_minutes``: replace this process (same PID, terminal, environment and command line,
    plus ``hydra.run.dir`` and ``trainer.resume=true``) with the resume of ``run_dir``: a fresh heap."""
    args = then_args(sys.argv[1:], resume_args(run_dir))
    for h in logging.getLogger().handlers:
        h.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "nmt.train", *args])


@command("train")
def main(cfg: DictConfig) -> float:
    try:
        hc = HydraConfig.get()
        run_dir = Path(hc.runtime.output_dir)
        overrides = list(hc.overrides.task)
        given = any(o.split("=", 1)[0] == "hydra.run.dir" for o in hc.overrides.hydra)
        # Which run to continue is found first: a resume with nothing to resume must not fetch the corpus.
        if cfg.trainer.resume and not given and hc.mode.name == "RUN" and "RANK" not in os.environ:
            chosen = run_to_resume(overrides, Path(hc.run.dir).parent.parent, run_dir)  # else: the error below
            log.info(
                "trainer.resume=true without hydra.run.dir: continuing the newest run of this command, %s", chosen.root
            )
            adopt(run_dir, chosen)
            run_dir = chosen.root
        # A sweep's job in a folder that holds a run (hydra.sweep.dir given again without trainer.resume=true); a
        # single run was checked by the launcher, before Hydra wrote into its folder.
        if hc.mode.name == "MULTIRUN" and not cfg.trainer.resume:
            if held := RunDir(run_dir).refuse_fresh_run(f"the sweep job's folder {run_dir}", "hydra.sweep.dir"):
                raise NmtError(held)
        if "RANK" not in os.environ:  # one process: the corpus is found (or fetched) and checked before torch
            prepare_corpus(cfg.data)  # (torchrun's ranks do it in run(), rank 0 first)
            check_corpus(build_specs(cfg.data))
        from nmt.runner import Restart, resume_command, run

        try:
            result = run(cfg, run_dir, overrides, restartable=hc.mode.name == "RUN" and "RANK" not in os.environ)
        except Restart as r:
            become_resume(r.run_dir)
        except KeyboardInterrupt:  # a second Ctrl-C while the first waited for the step to end: stop at once
            kept = RunDir(run_dir).is_resumable()
            log.warning(
                "interrupted again: stopped at once, without saving this step; %s",
                f"the newest checkpoint is kept, resume with: {resume_command(overrides, run_dir)}"
                if kept
                else "no checkpoint had been written yet",
            )
            sys.exit(130)
    except NmtError as e:
        if RunDir(run_dir).holds_only_hydra_files():  # a mistake found before any work: no empty folder is left
            detach_file_log()
            # Hydra's own outputs/DATE/TIME: the DATE and outputs folders go too when left empty
            RunDir(run_dir).remove_if_unused(empty_parents=0 if given else 2)
        log.error("%s", e)
        sys.exit(2)
    return float(result.get("bleu", 0.0))  # the sweep objective, for optimiser plugins


def cli() -> None:
    if int(os.environ.get("RANK", "0")) > 0:
        sys.argv.append("hydra.output_subdir=null")  # rank 0 alone writes the run's .hydra/ config copies
    main()


if __name__ == "__main__":
    cli()
