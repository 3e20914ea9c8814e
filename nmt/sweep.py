"""The jobs of a finished sweep: found, labelled by what differs between them, and grouped by seed.

A job is a folder at any depth with ``.hydra/config.yaml`` (Hydra writes one per job), a
``metrics.jsonl`` holding at least one validation and ``checkpoints/best.pt``. Jobs are labelled by
their attention, their decoder order (``bahdanau``, ``luong+feed`` with input feeding, ``luong``)
and, when the sweep varied anything else, the other keys whose values differ between jobs
(``decoder.hidden_size=256``), so the same report works for any user sweep. Jobs whose configs
differ only in ``seed`` form one variant, reported as mean ± spread over its seeds.

No model is loaded here: ``nmt.report`` decodes, this module only reads configs and metrics. The two Hydra
callbacks that end a sweep live here too: ``SweepSummary`` (``nmt.train -m``) and ``EvaluateSweep``
(``nmt.evaluate -m``).
"""

from __future__ import annotations

import json
import math
import shlex
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from nmt.config import metric_digits, selection_gain
from nmt.rundir import RunDir, remove_empty_parents

# Keys that never make two jobs different variants: the seed (what a variant is averaged over) and
# run bookkeeping that does not change the model.
NOT_A_VARIANT = ("seed", "trainer.resume", "wandb.")
# Keys shown in their own columns (attention, order) rather than in the variant label.
LABEL_KEYS = ("attention.name", "decoder.order", "decoder.input_feeding")


@dataclass
class Job:
    folder: Path
    name: str  # the folder relative to the sweep directory
    cfg: Any  # the job's .hydra/config.yaml (OmegaConf, unresolved)
    validations: list[dict]  # the metrics.jsonl records, in order
    keys: dict[str, str] = field(default_factory=dict)  # every config key → its value as text

    @property
    def attention(self) -> str:
        return str(OmegaConf.select(self.cfg, "attention.name", default="?"))

    @property
    def order(self) -> str:
        return order_label(self.cfg)

    @property
    def seed(self) -> int | None:
        return OmegaConf.select(self.cfg, "seed", default=None)

    @property
    def metric(self) -> str:
        """The job's ``trainer.select_by``: the validation metric that chose its ``best.pt``."""
        return str(OmegaConf.select(self.cfg, "trainer.select_by", default="bleu") or "bleu")

    @property
    def best(self) -> dict:
        """The validation ``best.pt`` was saved at: the first with the highest ``trainer.select_by`` value
        (the lowest for ``loss``), as nmt.trainer.EarlyStopping keeps it."""
        return max(self.validations, key=lambda r: selection_gain(self.metric, r))

    @property
    def checkpoint(self) -> Path:
        return RunDir(self.folder).best

    def curve(self, metric: str = "bleu") -> tuple[list[float], list[float]]:
        """(training minutes, valid ``metric``) of every validation that holds it (a record written before
        ``acc`` or ``loss`` were logged has none)."""
        points = [(r["elapsed_s"] / 60, r[metric]) for r in self.validations if r.get(metric) is not None]
        return [x for x, _ in points], [y for _, y in points]


@dataclass
class Variant:
    attention: str
    order: str
    label: str  # the other differing keys, "key=value, …" ("" when only attention/order vary)
    jobs: list[Job]  # one per seed, lowest seed first


# trainer.select_by → its name in summaries (nmt.trainer.METRICS spells them out; that module needs torch).
METRIC_NAMES = {"bleu": "BLEU", "chrf": "chrF", "acc": "accuracy", "loss": "loss"}


def ranking(jobs: Iterable[Job]) -> str:
    """The metric to rank jobs by: their shared ``trainer.select_by``, or BLEU when they differ."""
    metrics = {j.metric for j in jobs}
    return metrics.pop() if len(metrics) == 1 else "bleu"


def order_label(cfg: Any) -> str:
    """``bahdanau``, or ``luong+feed`` / ``luong`` for Luong order with / without input feeding."""
    order = str(OmegaConf.select(cfg, "decoder.order", default="?"))
    if order == "luong":
        return "luong+feed" if OmegaConf.select(cfg, "decoder.input_feeding", default=True) else "luong"
    return order


def flatten(node: Any, prefix: str = "") -> dict[str, str]:
    """Nested dicts → {"a.b.c": "value as text"} (lists and scalars are leaves)."""
    if not isinstance(node, dict):
        return {prefix: json.dumps(node, sort_keys=True) if isinstance(node, list) else str(node)}
    out: dict[str, str] = {}
    for k, v in node.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def collect(sweep: Path) -> tuple[list[Job], list[tuple[Path, str]]]:
    """Every job under ``sweep`` at any depth, and the folders left out with the reason."""
    jobs, skipped = [], []
    for cfg_file in sorted(sweep.rglob(".hydra/config.yaml")):
        folder = cfg_file.parent.parent
        run = RunDir(folder)
        lines = run.metrics.read_text().splitlines() if run.metrics.is_file() else []
        validations = [r for r in (json.loads(x) for x in lines if x.strip()) if "bleu" in r]
        if not validations:
            skipped.append((folder, "no validation in metrics.jsonl yet (unfinished or failed?)"))
            continue
        if not run.best.is_file():
            skipped.append((folder, "no checkpoints/best.pt"))
            continue
        cfg = OmegaConf.load(cfg_file)
        keys = flatten(OmegaConf.to_container(cfg, resolve=False))
        # A sweep's job by its folder below the sweep; a single run given as the folder itself by its own name.
        name = str(folder.relative_to(sweep)) if folder != sweep else folder.resolve().name
        jobs.append(Job(folder, name, cfg, validations, keys))
    return jobs, skipped


def variant_keys(jobs: Iterable[Job]) -> list[str]:
    """The config keys, besides seed, attention and order, that tell variants apart: those whose values
    differ between jobs. An ``attention.*`` parameter counts only when it differs between jobs of the
    same attention (``attention.window`` exists for local attention alone, which is no variant)."""
    jobs = list(jobs)
    all_keys = sorted({k for j in jobs for k in j.keys})
    found = []
    for k in all_keys:
        if k in LABEL_KEYS or k.startswith(NOT_A_VARIANT):
            continue
        if k.startswith("attention."):
            by_attention: dict[str, set] = {}
            for j in jobs:
                by_attention.setdefault(j.attention, set()).add(j.keys.get(k))
            differs = any(len(values) > 1 for values in by_attention.values())
        else:
            differs = len({j.keys.get(k) for j in jobs}) > 1
        if differs:
            found.append(k)
    return found


def group(jobs: list[Job]) -> list[Variant]:
    """Jobs that differ only in seed (and run bookkeeping) → one Variant each, in first-seen order."""
    keys = variant_keys(jobs)
    usual = one_at_a_time(jobs, keys)
    variants: dict[tuple, Variant] = {}
    for j in jobs:
        shown = [k for k in keys if k in j.keys and j.keys[k] != usual.get(k, object())]  # a key a job lacks: left out
        label = ", ".join(f"{k}={j.keys[k]}" for k in shown) or ("baseline" if usual else "")
        v = variants.setdefault((j.attention, j.order, label), Variant(j.attention, j.order, label, []))
        v.jobs.append(j)
    for v in variants.values():
        v.jobs.sort(key=lambda j: (j.seed is None, j.seed if j.seed is not None else 0, j.name))
    return list(variants.values())


def one_at_a_time(jobs: list[Job], keys: list[str]) -> dict[str, str]:
    """An ablation's usual values: when several keys vary and each has one value held by more than
    half of the jobs (a baseline with one lever changed per job), key → that value, so that labels
    name only what a job changed (and the unchanged job reads "baseline"); else ``{}`` (a grid)."""
    if len(keys) < 2:
        return {}
    usual = {}
    for k in keys:
        values = [j.keys.get(k) for j in jobs]
        top = max(set(values), key=values.count)
        if values.count(top) * 2 <= len(values):
            return {}
        usual[k] = top
    return usual


def mean_spread(values: list[float]) -> tuple[float, float]:
    """(mean, spread) with spread = (max − min) / 2: mean ± spread spans every seed's value, which
    with 2–3 seeds says more honestly than a standard deviation how far one run can land."""
    return sum(values) / len(values), (max(values) - min(values)) / 2


def resume_sweep_command(sweep: Path) -> str | None:
    """The command that continues the sweep in ``sweep`` (its ``multirun.yaml`` holds the sweep's overrides):
    each job resumes from its own folder, found by the same name (configs/config.yaml leaves trainer.resume out
    of job names); a job with no checkpoint yet starts, a finished one stops at once and keeps what its end wrote
    (``finished.json``).
    None when ``sweep`` holds no multirun.yaml (a single run)."""
    from nmt.config import override, train_command

    saved = sweep / "multirun.yaml"
    if not saved.is_file():
        return None
    task = OmegaConf.select(OmegaConf.load(saved), "hydra.overrides.task", default=None) or []
    return train_command(task, [override("hydra.sweep.dir", sweep), "trainer.resume=true"], multirun=True)


class SweepSummary(Callback):
    """``nmt.train -m``'s last lines (registered in configs/config.yaml as a Hydra callback): every job of
    the sweep folder with its best validation, best first, the folders without one, and the command that
    tables them. Without it a sweep ended on its last job's own lines. Printed to stderr, not logged: the
    root logger still writes into the last job's train.log when the basic launcher has run the jobs."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep = Path(config.hydra.sweep.dir)
        jobs, skipped = collect(sweep)
        by = ranking(jobs)
        if by == "bleu":
            head = "best valid BLEU first (greedy, as validated)"
        else:
            head = f"best valid {METRIC_NAMES[by]} first (trainer.select_by={by}; BLEU greedy, as validated)"
        lines = [f"sweep {sweep}: {len(jobs)} job(s) with a validation, {head}:"]
        for j in sorted(jobs, key=lambda j: -selection_gain(by, j.best)):
            b = j.best
            score = "" if by == "bleu" else f"{METRIC_NAMES[by]} {b.get(by, math.nan):.{metric_digits(by)}f}  BLEU "
            lines.append(f"  {score}{b['bleu']:6.2f}  step {b['step']:>6}  {j.name}")
        lines += [f"  (no result) {f.name}: {why}" for f, why in skipped]
        lines.append(f"tables, curves and attention statistics: python -m nmt.report {shlex.quote(str(sweep))}")
        print("\n".join(lines), file=sys.stderr)


def override_values(overrides: Iterable[str]) -> dict[str, str]:
    """``["beam_size=5", "checkpoint=a.pt"]`` → ``{"beam_size": "5", "checkpoint": "a.pt"}``, Hydra's own keys left
    out."""
    pairs = (o.split("=", 1) for o in overrides if "=" in o)
    return {k.lstrip("+~"): v for k, v in pairs if not k.lstrip("+~").startswith("hydra.")}


def evaluation_table(jobs: list[tuple[dict[str, str], dict]]) -> list[str]:
    """``nmt.evaluate -m``'s last lines: one row per job (its overrides, its scores), best BLEU first, with a column
    for each key whose value differs between the jobs (the swept ones)."""
    keys = list(dict.fromkeys(k for o, _ in jobs for k in o))  # in command-line order
    swept = [k for k in keys if len({o.get(k) for o, _ in jobs}) > 1] or keys[:1]
    inputs = {o.get("input") for o, _ in jobs}
    on = f" on {inputs.pop()}" if len(inputs) == 1 and None not in inputs else ""
    lines = [
        f"{len(jobs)} evaluations{on}, best BLEU first:",
        "| " + " | ".join([*swept, "BLEU", "chrF", "TER", "lines"]) + " |",
        "|" + "---|" * len(swept) + "---:|---:|---:|---:|",
    ]
    for o, s in sorted(jobs, key=lambda j: -j[1]["bleu"]):
        cells = [o.get(k, "") for k in swept] + [
            f"{s['bleu']:.2f}",
            f"{s['chrf']:.2f}",
            f"{s['ter']:.2f}",
            str(s["lines"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def remove_empty_sweep(sweep: Path, job_dirs: Iterable[Path], empty_parents: int) -> None:
    """Remove what Hydra made for a sweep whose jobs wrote nothing: the empty job folders, then ``multirun.yaml``
    and the sweep folder when nothing else is left in it, then up to ``empty_parents`` of its parents left empty
    (Hydra's ``multirun/DATE/``, ``multirun/``)."""
    for d in job_dirs:
        try:
            d.rmdir()
        except OSError:  # not empty, or gone
            pass
    if not sweep.is_dir() or {p.name for p in sweep.iterdir()} - {"multirun.yaml"}:
        return
    (sweep / "multirun.yaml").unlink(missing_ok=True)
    try:
        sweep.rmdir()
    except OSError:
        return
    remove_empty_parents(sweep, empty_parents)


class EvaluateSweep(Callback):
    """``nmt.evaluate -m``'s end (registered in configs/evaluate.yaml): one table of every job's scores, ``json=``
    written once as the list of them (the jobs write none, so the last would not overwrite the others), and no
    empty job folders left behind (an evaluation writes nothing into its folder). The basic launcher runs the
    jobs in this process, so their scores reach ``on_job_end``."""

    def __init__(self) -> None:
        self.jobs: list[tuple[dict[str, str], dict]] = []
        self.dirs: list[Path] = []

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        hc = getattr(job_return, "hydra_cfg", None)
        out = None if hc is None else OmegaConf.select(hc, "hydra.runtime.output_dir", default=None)
        if out:
            self.dirs.append(Path(out))
        value = getattr(job_return, "_return_value", None)  # .return_value raises for a failed job
        if isinstance(value, dict) and "bleu" in value:
            self.jobs.append((override_values(job_return.overrides or []), value))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.jobs:
            print("\n" + "\n".join(evaluation_table(self.jobs)), flush=True)
        json_path = OmegaConf.select(config, "json", default=None)
        if json_path and self.jobs:
            rows = [{"overrides": o, **s} for o, s in self.jobs]
            Path(json_path).write_text(json.dumps(rows, indent=1) + "\n")
            print(f"all {len(rows)} evaluations' scores: {json_path}", file=sys.stderr)
        given = any(o.startswith("hydra.sweep.dir=") for o in OmegaConf.select(config, "hydra.overrides.hydra") or [])
        remove_empty_sweep(Path(config.hydra.sweep.dir), self.dirs, 0 if given else 2)
