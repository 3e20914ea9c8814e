"""The launcher every command shares: ``--help``, and the config checked in full before Hydra starts.

``@command("translate")`` stands where ``@hydra.main(...)`` stood. Before Hydra makes a run directory
(and so before the corpus, sentencepiece or wandb are touched), the launcher composes the config from
the command line with Hydra's compose API and stops with one line per mistake, exit status 2:

- an unknown key or config option: ``unknown key 'trainer.max_step' — did you mean trainer.max_steps?``, or, with
  no near miss, where the keys are (``--cfg job --package trainer``; a small command's keys by name);
- a section given one value (``trainer=x``; a ``{key: value}`` dict is Hydra's and passes);
- a mandatory key left out (``checkpoint``, evaluate's ``input``, average's ``output``);
- a bad value: ``nmt.config.validate`` (every choice key with its allowed values, cheap structural rules).

Only then does it hand over to Hydra's main, so ``hydra.run.dir``, ``-m`` sweeps, launchers, ``--cfg``
and ``--hydra-help`` work as before. A single run of a command that makes no run directory (translate,
evaluate, average, serve; ``runs_in_place``) runs its task on the checked config instead, with the same
console logging, sparing Hydra's second composition and run set-up. A sweep's swept values are checked
against the choice table and the key's type here, its first ``SWEEP_JOBS_CHECKED`` jobs and one job for each
swept value they lack composed and validated (a problem of some jobs names them), and every job is validated
again as it starts. An ``NmtError`` raised inside a command ends it the same way: one line, exit 2, no traceback.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import itertools
import logging
import logging.config
import os
import re
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
from omegaconf import OmegaConf
from omegaconf.errors import MissingMandatoryValue

from nmt.config import (
    AverageConfig,
    EvaluateConfig,
    ServeConfig,
    TrainConfig,
    TranslateConfig,
    allowed,
    bad_choice,
    did_you_mean,
    expected_value,
    field_help,
    override,
    register_configs,
    schema_keys,
    shell_quote,
    unread_settings,
    validate,
)
from nmt.errors import CheckpointError, NmtError
from nmt.rundir import RunDir, no_checkpoint

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


@dataclass(frozen=True)
class Command:
    """What a command's launcher and ``--help`` need to know about it."""

    name: str  # train | translate | evaluate | serve | average (also the root YAML, except train's)
    config_name: str
    schema: type
    purpose: str
    keys: tuple[str, ...]  # the most-used keys, shown by --help with the schema's comments
    examples: tuple[str, ...]
    groups: tuple[tuple[str, str], ...] = ()  # (config group, what choosing one does)

    @property
    def module(self) -> str:
        return f"nmt.{self.name}"


_DECODE_KEYS = ("checkpoint", "beam_size", "length_penalty", "ensemble", "device")

COMMANDS = {
    c.name: c
    for c in (
        Command(
            "train",
            "config",
            TrainConfig,
            "Train an attention-based RNN translation model: the corpus (fetched on first use), a sentencepiece "
            "vocabulary, the encoder-attention-decoder model and its training loop, validating BLEU as it goes. "
            "Everything lands in a run directory (outputs/DATE/TIME, or hydra.run.dir=DIR): the log, the "
            "checkpoints (best.pt to translate with, last.pt to resume from) and attention plots.",
            (
                "data.dir",
                "trainer.max_steps",
                "trainer.max_minutes",
                "trainer.patience",
                "trainer.valid_minutes",
                "trainer.checkpoint_minutes",
                "trainer.lr",
                "trainer.amp",
                "trainer.resume",
                "trainer.init_from",
                "encoder.cell",
                "encoder.hidden_size",
                "decoder.hidden_size",
                "device",
                "model.rnn_impl",
                "wandb.mode",
            ),
            (
                "python -m nmt.train                                  # default corpus, Bahdanau attention",
                "python -m nmt.train attention=general decoder=luong  # swap parts",
                "python -m nmt.train trainer.max_minutes=10 experiment=cpu_small",
                "python -m nmt.train -m attention=dot,general,concat,bahdanau   # a sweep",
                "python -m nmt.train hydra.run.dir=outputs/run1 trainer.resume=true",
                "python -m nmt.train data.dir=my/data trainer.init_from=outputs/run1/checkpoints/best.pt  # fine-tune",
            ),
            (
                ("attention", "the attention score (default bahdanau)"),
                ("decoder", "the decoder order: attend then RNN, or RNN then attend (default bahdanau)"),
                ("data", "the corpus (default spa_eng)"),
                ("experiment", "a published or tested setting (default none)"),
            ),
        ),
        Command(
            "translate",
            "translate",
            TranslateConfig,
            "Translate text with a trained checkpoint: exactly one output line per input line, in input order. "
            "Without input=FILE it reads stdin and answers each line as it arrives, so it works at a prompt "
            "and inside a pipe.",
            (
                "checkpoint",
                "input",
                "output",
                "beam_size",
                "n_best",
                "length_penalty",
                "sample",
                "batch_size",
                "device",
            ),
            (
                "python -m nmt.translate checkpoint=outputs/run1/checkpoints/best.pt",
                "python -m nmt.translate checkpoint=best.pt input=news.en output=news.es",
                "echo 'How are you?' | python -m nmt.translate checkpoint=best.pt beam_size=1",
                "python -m nmt.translate checkpoint=best.pt n_best=3 input=in.txt",
                "python -m nmt.translate checkpoint=best.pt sample=true sample_topk=10 input=mono.en  # sampled",
                "python -m nmt.translate checkpoint=a.pt ensemble=[b.pt] attention_plot=plots input=in.txt",
            ),
        ),
        Command(
            "evaluate",
            "evaluate",
            EvaluateConfig,
            "Score a checkpoint on a test set: BLEU, chrF and TER (sacrebleu's defaults on detokenised output, "
            "with their signatures, comparable with published numbers), also with all of a source's "
            "translations as references, and optionally a paired bootstrap test against a baseline system.",
            ("input", *_DECODE_KEYS, "hypotheses", "json", "baseline"),
            (
                "python -m nmt.evaluate checkpoint=best.pt input=data/spa-eng/test.tsv",
                "python -m nmt.evaluate checkpoint=best.pt input=test.tsv beam_size=10 json=scores.json",
                "python -m nmt.evaluate checkpoint=new.pt input=test.tsv baseline=old.pt",
            ),
        ),
        Command(
            "serve",
            "serve",
            ServeConfig,
            "A small translation web demo: a page where a person types English and sees the translation and "
            "its attention heatmap, and a JSON API (POST /api/translate). It listens on loopback unless host "
            "says otherwise; waitress answers with http_threads worker threads (GET /healthz for probes), "
            "and each line of a request is translated on its own.",
            ("checkpoint", "host", "port", "http_threads", "max_chars", "beam_size", "device"),
            (
                "python -m nmt.serve checkpoint=best.pt",
                "python -m nmt.serve checkpoint=best.pt port=8080",
                "python -m nmt.serve checkpoint=best.pt host=0.0.0.0 beam_size=1",
            ),
        ),
        Command(
            "average",
            "average",
            AverageConfig,
            "Average the weights of several checkpoints of one run (Junczys-Dowmunt et al. 2016; Vaswani et "
            "al. 2017): a cheap ensemble, often +0.5-1 BLEU, that costs one model at decoding time. The result "
            "is for translating, not for resuming.",
            ("output", "checkpoints", "run_dir", "last"),
            (
                "python -m nmt.average output=avg.pt run_dir=outputs/run1 last=5",
                "python -m nmt.average output=avg.pt checkpoints=[a.pt,b.pt,c.pt]",
                "python -m nmt.translate checkpoint=avg.pt input=in.txt   # then use it",
            ),
        ),
    )
}


def help_text(cmd: Command) -> str:
    """The command's ``--help``: what it does, its most-used keys (meaning from the schema), examples."""
    docs, defaults = field_help(cmd.schema), OmegaConf.structured(cmd.schema)
    wrap = functools.partial(textwrap.fill, width=100, subsequent_indent=" " * 30)
    rows = []
    for key in cmd.keys:
        default = "required" if OmegaConf.is_missing(*_parent(defaults, key)) else OmegaConf.select(defaults, key)
        default = "unset" if default is None else default  # a command line writes null, not Python's None
        doc, choices = docs.get(key, ""), allowed(key)
        if choices and not all(c in doc for c in choices):
            doc += f" One of: {', '.join(choices)}."
        rows.append(wrap(f"  {key:<27} {doc} [{default}]".replace("  [", " [")))
    for group, meaning in cmd.groups:
        rows.append(wrap(f"  {group + '=NAME':<27} {meaning}; one of {', '.join(group_options(group))}"))
    return "\n".join(
        [
            f"usage: python -m {cmd.module} [KEY=VALUE ...]",
            "",
            textwrap.fill(cmd.purpose, width=100),
            "",
            "Most-used keys [default]:",
            *rows,
            "",
            "Examples:",
            *(f"  {e}" for e in cmd.examples),
            "",
            f"Every key with its value: python -m {cmd.module} --cfg job. Hydra's own options: --hydra-help.",
        ]
    )


def _parent(cfg: Any, key: str) -> tuple[Any, str]:
    section, _, name = key.rpartition(".")
    return (OmegaConf.select(cfg, section) if section else cfg), name


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


class Stop(Exception):
    """Mistakes found before Hydra starts: one line each."""

    def __init__(self, lines: Sequence[str]):
        super().__init__("\n".join(lines))
        self.lines = list(lines)


def _one_line(e: BaseException) -> str:
    """An exception (and its cause, where Hydra wraps one) as one line."""
    first = str(e).strip().splitlines() or [type(e).__name__]
    cause = e.__cause__ and str(e.__cause__).strip().splitlines()
    return first[0] + (f": {cause[0]}" if cause and cause[0] not in first[0] else "")


def wrong_type(cmd: Command, e: BaseException) -> str | None:
    """Hydra's "Error merging override data.columns=1: Invalid value assigned: int is not a ListConfig ..." as
    ``data.columns=1: expected a list in brackets, e.g. ...`` (the schema says what the key takes)."""
    m = re.fullmatch(r"Error merging override ([\w.]+)=(.*)", (str(e).strip().splitlines() or [""])[0])
    return m and _expected(cmd, m.group(1), m.group(2))


def _expected(cmd: Command, key: str, value: Any) -> str | None:
    """``key=value: expected <what the schema's type takes>``, or None for a type with no wording."""
    kind = expected_value(cmd.schema, key)
    return f"{key}={value}: expected {kind}{_ensemble_hint(cmd, key)}" if kind else None


def _ensemble_hint(cmd: Command, key: str) -> str:
    """For ``checkpoint`` given several files (a list, or a,b): how a decoding command takes several models."""
    if key != "checkpoint" or "ensemble" not in {f.name for f in dataclasses.fields(cmd.schema)}:
        return ""
    return "; several models decode together as checkpoint=A.pt ensemble=[B.pt,C.pt]"


# Commands that refuse -m: every job of a sweep would read the same input and write the same output in turn
# (translate, average), or the first would never return (serve). The reason, for the one-line refusal.
NO_SWEEP = {
    "translate": "its jobs would read the same input and write the same output in turn; to compare checkpoints or "
    "search settings, sweep python -m nmt.evaluate -m ... input=TSV",
    "serve": "its first job would serve until stopped and the others never start",
    "average": "its jobs would all write the same output=; run it once per averaged checkpoint",
}


# Keys naming a file that every job of a sweep would write in turn, each overwriting the last: refused with -m.
ONE_FILE_PER_RUN = {
    "evaluate": {
        "hypotheses": "every job would write its translations to it in turn, and only the last job's would be left; "
        "run the evaluation whose translations you want without -m (a sweep's json= gets every job's scores)",
    },
}


def one_file_per_run(cmd: Command, overrides: Sequence[str]) -> str | None:
    """The one line refusing a ``-m`` sweep that sets a key of ``ONE_FILE_PER_RUN``, or None."""
    for o in overrides:
        key, _, value = o.partition("=")
        why = ONE_FILE_PER_RUN.get(cmd.name, {}).get(key.lstrip("+"))
        if why and value not in ("", "null"):
            return f"-m with {key}={value}: {why}"
    return None


def several_values(cmd: Command, key: str, text: str) -> str:
    """``key=a,b`` on a command line without -m, said in one line: how to sweep (where the command sweeps) and
    how to write a list or a text with commas instead."""
    how = "several values sweep, which needs -m"
    if cmd.name in NO_SWEEP:
        how = f"one value per key ({cmd.module} runs no sweeps)"
    kind = expected_value(cmd.schema, key) or ""
    if kind.startswith("text"):
        write = "a text with commas is quoted, 'a,b'"
    elif kind.startswith("a list"):
        write = "a list is written [a,b]"
    elif kind:
        write = f"{key} takes {kind}"
    else:
        write = "a list is written [a,b], a text with commas 'a,b'"
    return f"{text}: {how}; {write}{_ensemble_hint(cmd, key)}"


def unreadable(parser: Any, overrides: Sequence[str]) -> str | None:
    """The first override Hydra's grammar refuses, named, with the quoted form that reads its value back
    (a path into a sweep job's folder, ``0_attention=dot,seed=1``, holds ``=`` and ``,``)."""
    for text in overrides:
        try:
            parser.parse_override(text)
        except Exception as e:  # noqa: BLE001
            key, sep, value = text.partition("=")
            quoted = sep and value and value[0] not in "'\"" and not key.startswith("~")
            fix = f"; quote the value for Hydra (in the shell: {shell_quote(override(key, value))})" if quoted else ""
            why = (str(e).strip().splitlines() or [type(e).__name__])[0]  # its cause only repeats it
            return f"{text}: Hydra cannot read this override ({why}){fix}"
    return None


def near_key(key: str, keys: Sequence[str], groups: dict) -> str | None:
    """A did-you-mean for an unknown key: within its section when the section exists ('trainer.max_step' →
    trainer.max_steps, and not some other section's key that merely shares the prefix), or the same leaf in
    another section ('trainer.hidden_size' → encoder.hidden_size); else the closest key or config group."""
    section, _, leaf = key.rpartition(".")
    inside = [k[len(section) + 1 :] for k in keys if section and k.startswith(section + ".")]
    if inside:
        hit = did_you_mean(leaf, inside)
        if hit:
            return f"{section}.{hit}"
        same_leaf = [k for k in keys if k.rpartition(".")[2] == leaf]
        return same_leaf[0] if same_leaf else None
    return did_you_mean(key, [*keys, *(f"{g}=" for g in groups)])


def where_keys_are(cmd: Command, key: str, keys: Sequence[str]) -> str:
    """For an unknown key with no near miss: the command's keys when they are few, else the command that
    prints the ones of the key's section (or all of them)."""
    if len(keys) <= 8:
        return f"the keys of {cmd.module}: {', '.join(keys)}"
    section = key.split(".", 1)[0]
    if "." in key and any(k.startswith(section + ".") for k in keys):
        return f"python -m {cmd.module} --cfg job --package {section} prints the keys of {section} with their values"
    return f"python -m {cmd.module} --cfg job prints every key with its value"


def check_overrides(cmd: Command, overrides: Sequence[Any], multirun: bool = True) -> list[str]:
    """Unknown keys and config options (with a did-you-mean), and swept values outside a choice key's table.
    Without ``multirun``, a key's several values (``data.columns=0,1``) are left to ``several_values``, which says
    how to write a list, rather than each value judged alone ("data.columns=1: expected a list")."""
    keys, groups = schema_keys(cmd.schema), dict(cmd.groups)
    problems = []
    for o in overrides:
        key = o.key_or_group
        if key.startswith("hydra") or o.is_add() or o.is_delete():
            continue  # Hydra's own keys; +key=value and ~key are Hydra's to refuse (the schema admits no new keys)
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
        if key in groups:
            options = group_options(key)
            for v in values:
                if v not in (*options, "null"):
                    hint = did_you_mean(v, options)
                    problems.append(
                        f"{key}={v}: there is no config '{key}/{v}' (configs/{key}/); choose one of "
                        f"{', '.join(options)}" + (f" — did you mean {key}={hint}?" if hint else "")
                    )
        elif key not in keys:
            hint = near_key(key, keys, groups)
            problems.append(
                f"unknown key '{key}'"
                + (f" — did you mean {hint.rstrip('=')}?" if hint else f" ({where_keys_are(cmd, key, keys)})")
            )
        elif (
            any(k.startswith(key + ".") for k in keys) and not o.is_sweep_override() and not isinstance(o.value(), dict)
        ):
            some = [k for k in keys if k.startswith(key + ".")][:3]
            problems.append(f"{key} is a section, not a key: set its keys one by one ({', '.join(some)}, ...)")
        elif o.is_sweep_override() and allowed(key):
            problems += [p for p in map(functools.partial(bad_choice, key), values) if p]
        elif o.is_sweep_override() and multirun:  # each job would stop on its own with Hydra's multi-line error
            problems += [p for p in (wrong_sweep_value(cmd, key, v) for v in o.sweep_iterator()) if p]
    return problems


def wrong_sweep_value(cmd: Command, key: str, value: Any) -> str | None:
    """A swept value the key's type refuses (``trainer.lr=fast,0.1``), said as ``wrong_type`` says it."""
    from omegaconf.errors import ValidationError

    try:
        OmegaConf.update(OmegaConf.structured(cmd.schema), key, value, merge=True)
    except ValidationError:
        return _expected(cmd, key, value) or f"{key}={value}: not a value this key takes"
    return None


def preflight(
    cmd: Command, overrides: Sequence[str], multirun: bool = True, warn: Callable[[str], Any] | None = None
) -> Any:
    """Compose the config the way Hydra will and check it in full; raise Stop listing every mistake. Returns
    the composed config (without the ``hydra`` section and any ``hydra.*`` overrides; a sweep's first job's).
    ``multirun``: ``-m`` was given, so ``key=a,b`` sweeps (without it such a value is refused). ``warn`` gets
    one line for each key set here that the run does not read (nmt.config.unread_settings), once the config
    has passed."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(list(overrides))
    except Exception as e:  # noqa: BLE001  (Hydra's syntax errors: reported in one line)
        raise Stop([unreadable(parser, overrides) or _one_line(e)]) from None
    if problems := check_overrides(cmd, parsed, multirun):
        raise Stop(problems)
    ours = [o for o in parsed if not o.key_or_group.startswith("hydra")]
    if not multirun and (several := [o for o in ours if o.is_sweep_override()]):
        raise Stop([several_values(cmd, o.get_key_element(), o.input_line) for o in several])
    fixed = [o.input_line for o in ours if not o.is_sweep_override()]
    # A sweep's jobs, as Hydra's basic sweeper makes them (sweep_jobs_to_check; each job is checked again as
    # it starts): a rule between keys may hold in every job only with the swept value in place
    # (-m trainer.scheduler=step trainer.decay_every=100,200), or fail in some jobs alone.
    swept = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] for o in ours if o.is_sweep_override()]
    jobs = sweep_jobs_to_check(swept)
    register_configs()
    found: dict[str, list[tuple[str, ...]]] = {}
    unread: dict[str, list[tuple[str, ...]]] = {}
    keys = _keys_set(ours)
    cfg = None
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3", job_name=cmd.name):
        for job in jobs:
            cfg, problems = _check_job(cmd, compose, [*fixed, *job])
            for line in problems:
                found.setdefault(line, []).append(job)
            for line in unread_settings(cfg, keys) if cfg is not None and warn is not None else ():
                unread.setdefault(line, []).append(job)
    if found:
        raise Stop(naming_jobs(found, len(jobs)))
    for line in naming_jobs(unread, len(jobs)) if warn is not None else ():
        warn(line)
    return cfg


def _keys_set(parsed: Sequence[Any]) -> list[str]:
    """The config keys that parsed overrides set (Hydra's own and deletions left out)."""
    return [o.key_or_group for o in parsed if not o.is_delete() and not o.key_or_group.startswith("hydra")]


def keys_set(overrides: Sequence[str]) -> list[str]:
    """The config keys a command line's overrides set, e.g. ``["attention", "attention.heads"]``: what
    nmt.config.unread_settings looks at. ``overrides`` have passed the preflight, so they parse."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return _keys_set(OverridesParser.create().parse_overrides(list(overrides)))


def job_overrides() -> list[str]:
    """This Hydra job's command-line overrides (a sweep job's with its own values); none outside Hydra."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def in_sweep() -> bool:
    """Whether this is a job of a ``-m`` sweep (False outside Hydra)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


SWEEP_JOBS_CHECKED = 32  # ~0.08 s a job: a 64-job preflight took 5 s (2-core family-26 EPYC, 2026-11-28)


def sweep_jobs_to_check(swept: list[list[str]], first: int = SWEEP_JOBS_CHECKED) -> list[tuple[str, ...]]:
    """The sweep's jobs the preflight composes: its first ``first`` jobs in Hydra's order (the last key varies
    fastest), then, for each swept value no such job holds, one more job with that value in place of the first
    job's (at most ``first`` more), so a value that breaks a rule alone (``trainer.patience=0,-1`` swept beside
    a key of 40 values: -1 first comes in the 41st job) stops the sweep before its first job, not hours later."""
    jobs = list(itertools.islice(itertools.product(*swept), first))
    seen = [{job[i] for job in jobs} for i in range(len(swept))]
    more = []
    for i, values in enumerate(swept):
        for v in values:
            if v not in seen[i] and len(more) < first:
                more.append(jobs[0][:i] + (v,) + jobs[0][i + 1 :])
                seen[i].add(v)  # once, even when the value is listed twice
    return jobs + more


def _check_job(cmd: Command, compose: Callable[..., Any], overrides: list[str]) -> tuple[Any, list[str]]:
    """One run's config composed and checked: (the config, its problems, one line each)."""
    try:
        cfg = compose(cmd.config_name, overrides=overrides)
    except Exception as e:  # noqa: BLE001  (composition/type errors name the override; one line)
        return None, [wrong_type(cmd, e) or _one_line(e)]
    problems = []
    if missing := sorted(OmegaConf.missing_keys(cfg)):
        docs, see = field_help(cmd.schema), f"see python -m {cmd.module} --help"
        problems = [f"{k}=... is required: {docs.get(k, 'it has no default')}; {see}" for k in missing]
    try:  # the other keys' mistakes too, in the same answer (no rule reads the required keys)
        validate(cfg, cmd.name)
    except NmtError as e:
        problems += str(e).splitlines()
    except MissingMandatoryValue:  # a rule that does read one: it is named above
        pass
    return cfg, problems


def naming_jobs(found: dict[str, list[tuple[str, ...]]], checked: int) -> list[str]:
    """Every problem found, one line each: as is when every checked job has it, else after the jobs that do."""
    lines = []
    for line, jobs in found.items():
        if len(jobs) == checked:
            lines.append(line)
        else:
            named = "; ".join(" ".join(job) for job in jobs[:3]) + (f"; {len(jobs) - 3} more" if len(jobs) > 3 else "")
            lines.append(f"in the sweep's job{'s' * (len(jobs) > 1)} {named}: {line}")
    return lines


# Commands whose configs give Hydra nothing to do for a single run: no run directory (hydra.run.dir: .), no
# output subdirectory, logs to the console only (configs/translate.yaml and the others).
IN_PLACE = ("translate", "evaluate", "average", "serve")


def runs_in_place(cmd: Command, argv: Sequence[str]) -> bool:
    """True when the command can run its task on the preflight's config without Hydra's run machinery: a
    command of IN_PLACE, one run (no -m), no hydra.* override. Saves Hydra composing the config again and
    setting up a run (0.12 s of a one-line nmt.translate's 1.70 s, medians: docs/benchmarks.md, run 11)."""
    return cmd.name in IN_PLACE and not any(
        a in ("-m", "--multirun") or a.lstrip("+~").startswith("hydra") for a in argv
    )


def fresh_run_over_checkpoints(cfg: Any, overrides: Sequence[str]) -> str | None:
    """A training run started afresh (no ``trainer.resume``) in a ``hydra.run.dir`` that already holds a run's
    checkpoints would write its own best.pt and last.pt over them (a 2-hour run's, for a forgotten resume): the
    one line that refuses it, checked before Hydra writes its .hydra/ files into that folder; None when nothing
    would be lost. (A folder Hydra names itself, outputs/DATE/TIME, is new; a sweep's job checks its own folder as
    it starts, nmt.train.main.)"""
    given = [o.split("=", 1)[1] for o in overrides if o.startswith("hydra.run.dir=")]
    if cfg is None or cfg.trainer.resume or not given:
        return None
    return RunDir(given[-1].strip("'\"")).refuse_fresh_run(f"hydra.run.dir={given[-1]}")


def check_paths(
    checkpoints: Sequence[str | None] = (), inputs: Sequence[str | None] = (), outputs: Sequence[str | None] = ()
) -> None:
    """Refuse, before torch or any model is loaded, a checkpoint or input file that does not exist and an
    output file whose folder does not exist (a checkpoint's contents are checked when it is loaded)."""
    for path in checkpoints:
        if path and not Path(path).is_file():
            raise CheckpointError(no_checkpoint(path))
    for path in inputs:
        if path and not Path(path).is_file():
            raise NmtError(f"{path}: input file not found")
    for path in outputs:
        if path and not Path(path).resolve().parent.is_dir():
            raise NmtError(f"{path}: its folder {Path(path).parent} does not exist (create it, or write elsewhere)")
    read = [p for p in (*checkpoints, *inputs) if p]
    written = [p for p in outputs if p]
    for i, path in enumerate(written):  # input=a.txt output=a.txt emptied a.txt before a line was read
        if any(same_file(path, r) for r in read):
            raise NmtError(f"{path}: this command reads that file and would overwrite it; write the output elsewhere")
        if any(same_file(path, w) for w in written[:i]):
            raise NmtError(f"{path}: two outputs of this command name that file; give each its own")


def same_file(a: str, b: str) -> bool:
    """Whether two paths name one file (the same path, or links to one file)."""
    pa, pb = Path(a), Path(b)
    if pa.resolve() == pb.resolve():
        return True
    return pa.exists() and pb.exists() and os.path.samefile(pa, pb)


def console_logging() -> None:
    """The logging Hydra sets up for IN_PLACE commands (configs/hydra/job_logging/nmt.yaml, console only)."""
    spec = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "hydra" / "job_logging" / "nmt.yaml"))
    spec["handlers"].pop("file")
    spec["root"]["handlers"] = ["console"]
    logging.config.dictConfig(spec)


def _warn(cmd: Command, line: str) -> None:
    print(f"[{cmd.module}][WARNING] - {line}", file=sys.stderr)


def _fail(cmd: Command, lines: Sequence[str]) -> None:
    for line in lines:
        print(f"[{cmd.module}][ERROR] - {line}", file=sys.stderr)
    sys.exit(2)


def launch(
    cmd: Command, hydra_main: Callable[[], Any], argv: Sequence[str], task: Callable[..., Any] | None = None
) -> Any:
    """``--help``, then the checks, then Hydra (which parses ``sys.argv`` again, as it always has); or, for a
    single run of a command that needs no run directory (``runs_in_place``), ``task(config, overrides)`` on the
    checked config. A ``-m`` sweep's keys that some jobs do not read are named here, before its first job; a job
    names its own as it starts (in its log)."""
    from hydra._internal.utils import get_args_parser

    args = get_args_parser().parse_args(list(argv))
    if args.help:
        print(help_text(cmd))
        sys.exit(0)
    if args.multirun and (args.cfg or args.info):  # Hydra answered this with a traceback
        flag = "--cfg" if args.cfg else "--info"
        _fail(cmd, [f"-m and {flag} together: {flag} shows one run's config; drop -m and give one value per key"])
    if args.multirun and cmd.name in NO_SWEEP:  # a translate sweep over stdin died in its second job's traceback
        _fail(cmd, [f"-m: {cmd.module} runs no sweeps: {NO_SWEEP[cmd.name]}"])
    if args.multirun and (one := one_file_per_run(cmd, args.overrides)):
        _fail(cmd, [one])
    # Hydra's own modes, and other config sources than ours, pass through unchecked.
    passthrough = (args.hydra_help, args.cfg, args.info, args.shell_completion, args.config_path, args.config_name)
    if not any(passthrough) and not args.config_dir and not args.experimental_rerun:
        try:
            warn = functools.partial(_warn, cmd) if args.multirun else None
            cfg = preflight(cmd, args.overrides, multirun=args.multirun, warn=warn)
        except Stop as e:
            _fail(cmd, e.lines)
        if cmd.name == "train" and not args.multirun and (held := fresh_run_over_checkpoints(cfg, args.overrides)):
            _fail(cmd, [held])
        if task is not None and runs_in_place(cmd, argv):
            console_logging()
            return task(cfg, args.overrides)
    return hydra_main()


def skip_exit_collection() -> None:
    """Called as a command ends: the objects alive now (torch's, Hydra's, datasets', the model's) are frozen out of
    the garbage collector, so the collection Python runs as the interpreter shuts down does not walk them all
    (1.8 s after the last line of a tiny training run on a 2-core AMD EPYC; docs/benchmarks.md). The operating
    system frees the process's memory either way; atexit handlers (logging, wandb) still run; every file a
    command writes is closed before it returns. For the end of a ``python -m nmt.X`` process only, not for
    library code that goes on running."""
    gc.freeze()


def command(name: str) -> Callable[[Callable[[Any], Any]], Callable[[], Any]]:
    """Decorator for a command's task function (it replaces ``@hydra.main``): the returned function
    launches the command from ``sys.argv``. Each (sweep) job's config is validated again as it starts, a key
    its command line sets that it does not read is one warning in its log (the console and train.log), and an
    ``NmtError`` anywhere in the task becomes one logged line and exit status 2."""
    cmd = COMMANDS[name]

    def wrap(task: Callable[[Any], Any]) -> Callable[[], Any]:
        log = logging.getLogger(cmd.module)

        @functools.wraps(task)  # Hydra names the job (and train.log) after the unwrapped function's file
        def job(cfg: Any, overrides: Sequence[str] | None = None) -> Any:
            try:
                validate(cfg, cmd.name)
                for line in unread_settings(cfg, keys_set(job_overrides() if overrides is None else overrides)):
                    log.warning("%s", line)
                return task(cfg)
            except NmtError as e:
                for line in str(e).splitlines():
                    log.error("%s", line)
                sys.exit(2)

        hydra_main = hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name=cmd.config_name)(job)

        def main() -> Any:
            try:
                return launch(cmd, hydra_main, sys.argv[1:], job)
            finally:
                skip_exit_collection()

        return main

    return wrap
