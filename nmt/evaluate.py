"""``python -m nmt.evaluate checkpoint=PATH input=TSV [beam_size=K]``: BLEU, chrF and TER with signatures.

Scores are sacrebleu's defaults on detokenised output against the raw references, so
they can be compared with published numbers. A TSV test set often holds several
translations of one source (spa-eng keeps them adjacent); besides the usual
one-reference-per-line score, the lines are grouped by source and scored again with
all of a source's translations as references.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import sacrebleu
from omegaconf import DictConfig, OmegaConf

from nmt.cli import check_paths, command, in_sweep
from nmt.config import register_configs
from nmt.data.corpus import CorpusSpec, check_layout, load_pairs
from nmt.errors import ConfigError, NmtError

# Startup: only the launcher is imported up front, so `--help` and a config mistake answer in about a
# second; the model code (nmt.runtime, nmt.translator: torch) comes in when there is something to score.

log = logging.getLogger("nmt.evaluate")
register_configs()


def group_references(sources: list[str], refs: list[str]) -> tuple[list[int], list[list[str | None]]]:
    """Indices of the first line of each distinct source, and reference streams padded with None."""
    groups: dict[str, list[str]] = {}
    first: dict[str, int] = {}
    for i, (s, r) in enumerate(zip(sources, refs)):
        groups.setdefault(s, []).append(r)
        first.setdefault(s, i)
    order = list(groups)
    width = max(len(g) for g in groups.values())
    streams = [[groups[s][k] if k < len(groups[s]) else None for s in order] for k in range(width)]
    return [first[s] for s in order], streams


def score(hyps: list[str], sources: list[str], refs: list[str]) -> dict:
    """Single- and multi-reference scores with their sacrebleu signatures."""
    out: dict = {"lines": len(hyps)}
    bleu, chrf, ter = sacrebleu.BLEU(), sacrebleu.CHRF(), sacrebleu.TER()
    for name, metric in (("bleu", bleu), ("chrf", chrf), ("ter", ter)):
        out[name] = round(metric.corpus_score(hyps, [refs]).score, 2)
        out[f"{name}_signature"] = str(metric.get_signature())
    firsts, streams = group_references(sources, refs)
    if len(streams) > 1:
        multi = sacrebleu.BLEU()
        out["multi_ref"] = {
            "sources": len(firsts),
            "max_refs": len(streams),
            "bleu": round(multi.corpus_score([hyps[i] for i in firsts], streams).score, 2),
            "bleu_signature": str(multi.get_signature()),
        }
    return out


def paired_bootstrap(hyps: list[str], base: list[str], refs: list[str], n_samples: int) -> dict:
    """sacrebleu's paired bootstrap resampling (Koehn 2004): is the system's BLEU gain over the baseline real?"""
    from sacrebleu.significance import PairedTest

    if hyps == base:  # sacrebleu's p = 1/(n+1) here would read as "significant"; there is nothing to test
        score = round(sacrebleu.BLEU().corpus_score(hyps, [refs]).score, 2)
        return {
            "baseline_bleu": score,
            "system_bleu": score,
            "p_value": 1.0,
            "system_mean": score,
            "system_ci95": 0.0,
            "samples": 0,
            "significant_at_0.05": False,
            "identical_outputs": True,
        }
    test = PairedTest(
        [("baseline", base), ("system", hyps)], {"BLEU": sacrebleu.BLEU()}, [refs], test_type="bs", n_samples=n_samples
    )
    _, results = test()
    b, s = results["BLEU"]
    return {
        "baseline_bleu": round(b.score, 2),
        "system_bleu": round(s.score, 2),
        "p_value": s.p_value,
        "system_mean": round(s.mean, 2),
        "system_ci95": round(s.ci, 2),
        "samples": n_samples,
        "significant_at_0.05": bool(s.p_value is not None and s.p_value < 0.05),
    }


def format_table(checkpoint: str, test: str, beam: int | str, s: dict) -> str:
    rows = [
        ("BLEU", s["bleu"], s["bleu_signature"]),
        ("chrF", s["chrf"], s["chrf_signature"]),
        ("TER", s["ter"], s["ter_signature"]),
    ]
    if "multi_ref" in s:
        m = s["multi_ref"]
        rows.append(
            (f"BLEU multi-ref ({m['sources']} sources, <= {m['max_refs']} refs)", m["bleu"], m["bleu_signature"])
        )
    lines = [
        f"{checkpoint} on {test} ({s['lines']} lines, {beam if isinstance(beam, str) else f'beam {beam}'})",
        "| metric | score | signature |",
        "|---|---:|---|",
    ]
    lines += [f"| {n} | {v:.2f} | {sig} |" for n, v, sig in rows]
    if "paired_bootstrap" in s:
        pb = s["paired_bootstrap"]
        lines.append(
            f"paired bootstrap ({pb['samples']} samples): baseline BLEU {pb['baseline_bleu']:.2f}, system "
            f"{pb['system_bleu']:.2f} (over the resamples {pb['system_mean']:.2f} ± {pb['system_ci95']:.2f}, 95% CI), "
            f"p = {pb['p_value']:.4f}"
            f"{' (significant at 0.05)' if pb['significant_at_0.05'] else ' (not significant at 0.05)'}"
        )
    return "\n".join(lines)


def check_direction(trained: tuple[int, int] | None, given: tuple[int, int] | None, path: str) -> None:
    """A model trained on the later column as its source (data.columns=[1,0]: Spanish to English from en<TAB>es
    files) would be scored on the wrong side of a source<TAB>reference file: its input's columns must be named."""
    if given is None and trained is not None and trained[0] > trained[1]:
        as_trained = f"[{trained[0]},{trained[1]}]"
        raise ConfigError(
            f"this checkpoint's run read its source from column {trained[0]} and its target from column "
            f"{trained[1]} (data.columns={as_trained}); say which columns of {path} hold the source and the "
            f"reference: columns={as_trained} as in training, or columns=[0,1] if its source comes first"
        )


@command("evaluate")
def main(cfg: DictConfig) -> dict:
    # baseline: a checkpoint decoded with the same search settings, or a file of hypotheses, one per input line
    model_baseline = cfg.baseline if cfg.baseline and cfg.baseline.endswith(".pt") else None
    file_baseline = None if model_baseline else cfg.baseline
    check_paths([cfg.checkpoint, *cfg.ensemble, model_baseline], [cfg.input, file_baseline], [cfg.hypotheses, cfg.json])
    # Every line is scored, and hypotheses= writes one line per input line: a malformed line is refused (one
    # line naming file:line, exit 2) before torch is loaded, not skipped into a score over fewer sentences.
    columns = tuple(cfg.columns) if cfg.columns else None
    check_layout(cfg.input, columns, "columns")  # a file with, e.g., a third column: how to read it, in one line
    spec = CorpusSpec(cfg.input, strict=True, columns=columns)
    pairs = load_pairs(spec, why_strict="nmt.evaluate scores every line of its input", columns_key="columns")
    from nmt.runtime import load_translator
    from nmt.translator import report_truncated, workers

    tr = load_translator(cfg)
    check_direction(tr.trained_columns, columns, cfg.input)
    sources, refs = [s for s, _ in pairs], [r for _, r in pairs]
    tr.warn_truncated = False  # named line by line below
    with workers(tr, cfg.workers) as tx:
        out = tx.translate(sources)
    hyps = [t.text for t in out]
    report_truncated([i + 1 for i, t in enumerate(out) if t.truncated], cfg.input, tr.max_input_len)
    s = score(hyps, sources, refs)
    beam, alpha, stop = tr.search.beam_size, tr.search.alpha, tr.search.stop  # as given, else the checkpoint's (logged)
    s.update(checkpoint=cfg.checkpoint, input=cfg.input, beam_size=beam, length_penalty=alpha, stop=stop)
    o = tr.search
    if o.sample:  # the table and the json say what was drawn, not a beam
        s.update({k: getattr(o, k) for k in ("sample", "sample_topk", "sample_topp", "temperature", "sample_seed")})
    if cfg.baseline:
        if model_baseline:
            same = {"checkpoint": model_baseline, "ensemble": [], "beam_size": beam, "length_penalty": alpha}
            same["stop"] = stop
            base_tr = load_translator(OmegaConf.merge(cfg, same))
            with workers(base_tr, cfg.workers) as tx:
                base = [t.text for t in tx.translate(sources)]
        else:
            base = Path(file_baseline).read_text(encoding="utf-8").splitlines()
        if len(base) != len(hyps):
            raise NmtError(f"{cfg.baseline}: {len(base)} lines, expected one per line of {cfg.input} ({len(hyps)})")
        s["paired_bootstrap"] = paired_bootstrap(hyps, base, refs, cfg.bootstrap_samples)
    print(format_table(cfg.checkpoint, cfg.input, f"sampled, seed {o.sample_seed}" if o.sample else beam, s))
    if cfg.hypotheses:
        Path(cfg.hypotheses).write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    if cfg.json and not in_sweep():  # a sweep writes json= once, every job's scores (nmt.sweep.EvaluateSweep)
        Path(cfg.json).write_text(json.dumps(s, indent=1) + "\n")
    return s


if __name__ == "__main__":
    main()
