"""``python -m nmt.report SWEEP [--valid-sentences N] [--data-dir DIR] [--sentence TEXT ...]``: compare
the jobs of a sweep.

For every finished job (``nmt.sweep``) it decodes the first N sentences of the job's ``valid.tsv``
greedily with ``checkpoints/best.pt`` and measures the attention (``nmt.attention_stats``). Jobs
that differ only in ``seed`` are one variant, reported as mean ± spread. Writes into SWEEP:

* ``report.md``: one row per variant, ``attention | order | seeds | BLEU | chrF | entropy |
  max-share | backward | coverage | tok/s | params`` (a ``variant`` column when the sweep varied
  other keys too), then every job, the formulas and the skipped folders;
* ``report_heatmaps.png``: the example sentence(s) under every variant, rows = attention,
  columns = decoder order;
* ``report_curves.png``: valid BLEU against training minutes for every job (``metrics.jsonl``);
* ``report.json``: the same numbers, per job.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

from nmt.attention_stats import attention_stats
from nmt.config import metric_digits, selection_gain
from nmt.data import build_specs
from nmt.data.corpus import load_pairs
from nmt.errors import NmtError
from nmt.plots import curves, grid
from nmt.runtime import load_model
from nmt.search import SearchOptions
from nmt.sweep import Job, Variant, collect, group, mean_spread, ranking
from nmt.translator import Translation, Translator

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "attention"
STATS = ("entropy", "max_share", "backward", "coverage")
EXAMPLE = "The book is on the table."


def title(v: Variant) -> str:
    """``attention · order · other keys`` of a variant, for legends and panel titles."""
    return " · ".join(x for x in (v.attention, v.order, v.label) if x)


def formula(name: str) -> str:
    """The first comment line of configs/attention/NAME.yaml: where each variant's formula is written."""
    path = CONFIGS / f"{name}.yaml"
    if not path.is_file():
        return ""
    first = path.read_text(encoding="utf-8").splitlines()[0]
    return first.lstrip("# ").strip()


def valid_sources(jobs: list[Job], limit: int, data_dir: Path | None) -> dict[str, list[str]]:
    """Job name → the source side of its first ``limit`` valid pairs (0 = all), read for every job
    before any model is loaded, so a missing corpus stops the report at once."""
    read: dict[object, list[str]] = {}
    out = {}
    for j in jobs:
        data = j.cfg.data if data_dir is None else OmegaConf.merge(j.cfg.data, {"dir": str(data_dir)})
        spec = build_specs(data)["valid"]
        if spec not in read:
            try:
                read[spec] = [src for src, _ in load_pairs(spec, limit)]
            except NmtError as e:
                hint = "" if data_dir else " (give the corpus folder with --data-dir)"
                raise NmtError(f"{j.name}: data.dir={data.dir}: {e}{hint}") from e
        out[j.name] = read[spec]
    return out


def decode(job: Job, sources: list[str], examples: list[str]) -> tuple[dict, list[Translation]]:
    """Greedy-decode ``sources`` and ``examples`` with the job's best checkpoint: (numbers, examples)."""
    model, tok = load_model(str(job.checkpoint), torch.device("cpu"))
    tr = Translator(model, tok, torch.device("cpu"), SearchOptions(beam_size=1))
    stats = attention_stats(t.hypothesis.attention for t in tr.translate(sources, return_attention=True))
    numbers = {"params": sum(p.numel() for p in model.parameters()), **stats.as_dict()}
    return numbers, tr.translate(examples, return_attention=True)


def fmt(values: list[float], digits: int) -> str:
    """One value, or ``mean ± spread`` over several seeds."""
    mean, spread = mean_spread(values)
    return f"{mean:.{digits}f}" if len(values) == 1 else f"{mean:.{digits}f} ± {spread:.{digits}f}"


def best_first(variants: list[Variant], by: str) -> list[Variant]:
    """Variants by the mean over their seeds of ``by`` (a trainer.select_by metric) at best.pt, best first."""
    return sorted(variants, key=lambda v: -mean_spread([selection_gain(by, j.best) for j in v.jobs])[0])


# The ranking metrics that have no column of their own: shown after chrF when the jobs were selected by them.
EXTRA = {"loss": "valid loss", "acc": "acc %"}  # the by-metric's column (the table always has BLEU and chrF)
# The curves plot the metric the rows are ranked by (report_curves.png's y axis and caption).
CURVE_LABELS = {"bleu": "BLEU", "chrf": "chrF", "loss": "loss (lower is better)", "acc": "token accuracy %"}


def row(v: Variant, numbers: dict[str, dict], show_label: bool, by: str = "bleu") -> str:
    """The variant's table row: BLEU/chrF (and the ``by`` metric of EXTRA) as mean ± spread, the rest as
    means over its seeds."""
    per = [numbers[j.name] for j in v.jobs]

    def mean(key: str) -> float:
        return sum(n[key] for n in per) / len(per)

    cells = [v.attention, v.order, *([v.label] if show_label else []), str(len(per))]
    cells += [fmt([n["bleu"] for n in per], 2), fmt([n["chrf"] for n in per], 2)]
    if by in EXTRA:
        cells.append(fmt([n[by] for n in per], metric_digits(by)))
    cells += [f"{mean(s):.3f}" for s in STATS]
    cells += [f"{mean('tgt_tokens_per_s'):,.0f}", f"{round(mean('params')):,}"]
    return "| " + " | ".join(cells) + " |"


def heatmap_grid(variants: list[Variant], examples: dict, bleu: dict[str, float], path: Path, n: int) -> Path:
    """Rows = attention (and variant label), columns = order × the ``n`` example sentences, drawn with
    the lowest seed's model (its BLEU in the title); ``examples``: job name → its n Translations."""
    rows = list(dict.fromkeys((v.attention, v.label) for v in variants))
    orders = list(dict.fromkeys(v.order for v in variants))
    cell = {(v.attention, v.label, v.order): v for v in variants}
    panels = []
    for attention, label in rows:
        for order in orders:
            v = cell.get((attention, label, order))
            for k in range(n):
                if v is None:  # this attention never ran in this order
                    panels.append(None)
                    continue
                first = v.jobs[0].name
                t, name = examples[first][k], f"{title(v)} ({bleu[first]:.1f} BLEU)"
                att = t.hypothesis.attention  # None for a blank example
                panels.append(None if att is None else (name, att, t.src_pieces, t.tgt_pieces))
    return grid(panels, path, cols=len(orders) * n)


def write_report(
    sweep: Path,
    sentences: str | list[str] = EXAMPLE,
    valid_sentences: int = 200,
    data_dir: Path | None = None,
) -> tuple[Path, Path]:
    """Decode, measure and write report.md, report_heatmaps.png, report_curves.png and report.json
    into ``sweep``; returns (report.md, report_heatmaps.png)."""
    texts = [sentences] if isinstance(sentences, str) else list(sentences)
    if not sweep.is_dir():
        raise NmtError(f"{sweep}: no such folder (give the sweep's folder, e.g. multirun/DATE/TIME)")
    jobs, skipped = collect(sweep)
    for folder, why in skipped:
        print(f"skipped {folder}: {why}", file=sys.stderr)
    if not jobs:
        raise NmtError(
            f"{sweep}: no finished jobs (a folder at any depth with .hydra/config.yaml, metrics.jsonl holding a "
            f"validation, and checkpoints/best.pt); {len(skipped)} skipped"
        )
    sources = valid_sources(jobs, valid_sentences, data_dir)
    numbers, examples = {}, {}
    for j in jobs:
        print(f"decoding {len(sources[j.name])} valid sentences with {j.name}", file=sys.stderr)
        found, examples[j.name] = decode(j, sources[j.name], texts)
        best, last = j.best, j.validations[-1]
        numbers[j.name] = {
            "job": j.name,
            "attention": j.attention,
            "order": j.order,
            "seed": j.seed,
            "bleu": best["bleu"],
            "chrf": best["chrf"],
            **{k: best.get(k) for k in EXTRA},  # None in report.json for a record without it
            "best_step": best["step"],
            "tgt_tokens_per_s": sum(r["tgt_tokens_per_s"] for r in j.validations) / len(j.validations),
            "steps": last["step"],
            "minutes": last["elapsed_s"] / 60,
            "example": examples[j.name][0].text,
            **found,
        }
    by = ranking(jobs)  # the jobs' shared trainer.select_by, else BLEU
    variants = best_first(group(jobs), by)
    bleu = {k: x["bleu"] for k, x in numbers.items()}
    heat = heatmap_grid(variants, examples, bleu, sweep / "report_heatmaps.png", len(texts))
    series = [(title(v), *j.curve(by)) for v in variants for j in v.jobs]  # the metric the rows are ranked by
    curve = curves(series, sweep / "report_curves.png", "training minutes", f"valid {CURVE_LABELS[by]}")
    md = sweep / "report.md"
    lines = markdown(sweep, variants, numbers, skipped, texts, valid_sentences, heat, curve, by)
    md.write_text("\n".join(lines), "utf-8")
    (sweep / "report.json").write_text(json.dumps(list(numbers.values()), indent=1))
    return md, heat


def markdown(sweep, variants, numbers, skipped, texts, valid_sentences, heat, curve, by="bleu") -> list[str]:
    """The lines of report.md; ``by``: the metric the variants are ordered by (best first)."""
    show_label = any(v.label for v in variants)
    head = ["attention", "order", *(["variant"] if show_label else []), "seeds", "BLEU", "chrF"]
    head += [EXTRA[by]] if by in EXTRA else []
    head += ["entropy", "max-share", "backward", "coverage", "tok/s", "params"]
    n = f"the first {valid_sentences}" if valid_sentences else "all"
    lines = [
        f"# Sweep report: `{sweep}`",
        "",
        "BLEU/chrF: the validation each run saved `best.pt` at (its best by `trainer.select_by`, BLEU unless "
        "set; sacrebleu, greedy, detokenised); with several seeds "
        "`mean ± spread`, spread = (max − min) / 2, so the interval spans every seed. Attention statistics "
        f"(`nmt/attention_stats.py`), from greedy decoding of {n} valid.tsv sentences with `best.pt`, "
        "mean over seeds: entropy = mean entropy of a target step's weights (nats); max-share = mean weight "
        "on the single best source position; backward = share of steps whose most-attended source position "
        "moved back; coverage = evenness of the mass each source position received (1 = even). tok/s: "
        "mean training target tokens per second; params: model parameters. Rows: best first by "
        + ("valid BLEU." if by == "bleu" else f"`trainer.select_by={by}`, which every job shares."),
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" if h in ("attention", "order", "variant") else "---:" for h in head) + "|",
    ]
    lines += [row(v, numbers, show_label, by) for v in variants]
    lines += ["", "Every job:", "", "| job | seed | BLEU | chrF | best at step | steps | minutes |"]
    lines += ["|---|---:|---:|---:|---:|---:|---:|"]
    for v in variants:
        for j in v.jobs:
            x = numbers[j.name]
            lines.append(
                f"| `{j.name}` | {x['seed']} | {x['bleu']:.2f} | {x['chrf']:.2f} | {x['best_step']} | "
                f"{x['steps']} | {x['minutes']:.1f} |"
            )
    lines += ["", "Formulas (first line of `configs/attention/NAME.yaml`):", ""]
    lines += [f"- **{a}**: {formula(a)}" for a in dict.fromkeys(v.attention for v in variants)]
    lines += ["", f"Translations of “{texts[0]}” (lowest seed of each variant):", ""]
    for v in variants:
        lines.append(f"- **{title(v)}**: {numbers[v.jobs[0].name]['example']}")
    lines += [
        "",
        f"![the example sentence(s) under every variant: rows = attention, columns = order]({heat.name})",
        "",
        f"![valid {CURVE_LABELS[by]} against training minutes, every job]({curve.name})",
        "",
    ]
    if skipped:
        lines += ["Jobs left out:", ""] + [f"- `{f.relative_to(sweep)}`: {why}" for f, why in skipped] + [""]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python -m nmt.report", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("sweep", type=Path, help="a multirun directory (one subfolder per job, at any depth)")
    ap.add_argument(
        "--sentence",
        action="append",
        help="an example sentence for the heatmaps (repeat for several; default: 'The book is on the table.')",
    )
    ap.add_argument(
        "--valid-sentences",
        type=int,
        default=200,
        help="valid.tsv sentences decoded per job for the attention statistics (0 = all; default 200)",
    )
    ap.add_argument("--data-dir", type=Path, help="read valid.tsv from here instead of each job's data.dir")
    args = ap.parse_args()
    if args.valid_sentences < 0:
        ap.error(f"--valid-sentences must be >= 0 (0 = all), got {args.valid_sentences}")
    try:
        md, heat = write_report(args.sweep, args.sentence or EXAMPLE, args.valid_sentences, args.data_dir)
    except NmtError as e:
        print(f"nmt.report: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"wrote {md}, {heat.name}, report_curves.png and report.json")


if __name__ == "__main__":
    try:
        main()
    finally:
        gc.freeze()  # no collection walking every object at exit (nmt.cli.skip_exit_collection says why)
