"""``python -m nmt.report MULTIRUN_DIR [--sentence TEXT]``: compare the jobs of a sweep.

Reads each job's ``.hydra/config.yaml``, ``metrics.jsonl`` and ``checkpoints/best.pt`` and writes
``report.md`` (BLEU, chrF, tokens/s, parameters, wall time and the formula of each variant)
and ``report.png`` (BLEU per variant, and one sentence's attention under every variant) into
the sweep directory.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

from nmt.plots import grid
from nmt.rundir import RunDir
from nmt.runtime import load_model
from nmt.search import SearchOptions
from nmt.translator import Translator

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "attention"


def formula(name: str) -> str:
    """The first comment line of configs/attention/NAME.yaml: where each variant's formula is written."""
    path = CONFIGS / f"{name}.yaml"
    if not path.is_file():
        return ""
    first = path.read_text(encoding="utf-8").splitlines()[0]
    return first.lstrip("# ").strip()


def collect(sweep: Path) -> tuple[list[dict], list[tuple[Path, str]]]:
    """Every job under ``sweep`` at any depth (a folder with ``.hydra/config.yaml``), and the
    jobs left out with the reason."""
    jobs, skipped = [], []
    for cfg_file in sorted(sweep.rglob(".hydra/config.yaml")):
        job = cfg_file.parent.parent
        metrics, best = RunDir(job).metrics, RunDir(job).best
        records = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()] if metrics.is_file() else []
        if not records:
            skipped.append((job, "no validation in metrics.jsonl yet (unfinished or failed?)"))
            continue
        if not best.is_file():
            skipped.append((job, "no checkpoints/best.pt"))
            continue
        cfg = OmegaConf.load(cfg_file)
        last = records[-1]
        name = cfg.attention.name
        jobs.append(
            {
                "job": str(job.relative_to(sweep)),
                "attention": name,
                "order": cfg.decoder.order,
                "cell": cfg.encoder.cell,
                "bleu": max(r["bleu"] for r in records),
                "chrf": max(r["chrf"] for r in records),
                "tgt_tokens_per_s": sum(r["tgt_tokens_per_s"] for r in records) / len(records),
                "steps": last["step"],
                "minutes": last["elapsed_s"] / 60,
                "checkpoint": str(best),
                "formula": formula(name),
            }
        )
    return jobs, skipped


def write_report(sweep: Path, sentence: str) -> tuple[Path, Path]:
    jobs, skipped = collect(sweep)
    for job, why in skipped:
        print(f"skipped {job}: {why}", file=sys.stderr)
    if not jobs:
        raise SystemExit(
            f"{sweep}: no finished jobs (a folder at any depth with .hydra/config.yaml, metrics.jsonl holding a "
            f"validation, and checkpoints/best.pt); {len(skipped)} skipped"
        )
    jobs.sort(key=lambda j: -j["bleu"])
    panels = []
    for j in jobs:
        model, tok = load_model(j["checkpoint"], torch.device("cpu"))
        j["params"] = sum(p.numel() for p in model.parameters())
        tr = Translator(model, tok, torch.device("cpu"), SearchOptions(beam_size=1))
        t = tr.translate([sentence], return_attention=True)[0]
        j["example"] = t.text
        panels.append((f"{j['attention']} ({j['bleu']:.1f} BLEU)", t.hypothesis.attention, t.src_pieces, t.tgt_pieces))

    bars = ([j["attention"] for j in jobs], [j["bleu"] for j in jobs], "valid BLEU")
    png = grid(panels, sweep / "report.png", bars=bars)

    lines = [
        f"# Attention comparison: `{sweep}`",
        "",
        f"Example sentence for the heatmaps: “{sentence}”. BLEU/chrF: best validation of the run "
        "(sacrebleu, greedy, detokenised); tokens/s: mean training target tokens per second.",
        "",
        "| attention | order | BLEU | chrF | tgt tok/s | params | steps | minutes | formula |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for j in jobs:
        lines.append(
            f"| {j['attention']} | {j['order']} | {j['bleu']:.2f} | {j['chrf']:.2f} | "
            f"{j['tgt_tokens_per_s']:,.0f} | {j['params']:,} | {j['steps']} | {j['minutes']:.1f} | "
            f"{j['formula']} |"
        )
    lines += ["", "Translations of the example sentence:", ""]
    lines += [f"- **{j['attention']}**: {j['example']}" for j in jobs]
    lines += ["", f"![BLEU per attention, and the example's attention under each]({png.name})", ""]
    if skipped:
        lines += ["Jobs left out:", ""] + [f"- `{job.relative_to(sweep)}`: {why}" for job, why in skipped] + [""]
    md = sweep / "report.md"
    md.write_text("\n".join(lines), encoding="utf-8")
    (sweep / "report.json").write_text(json.dumps(jobs, indent=1))
    return md, png


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep", type=Path, help="a multirun directory (one subfolder per job)")
    ap.add_argument("--sentence", default="The book is on the table.")
    args = ap.parse_args()
    md, png = write_report(args.sweep, args.sentence)
    print(f"wrote {md} and {png}")


if __name__ == "__main__":
    main()
