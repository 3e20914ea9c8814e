"""One-lever-at-a-time ablation of a preset at equal wall clock (issue 14).

    python scripts/ablation.py --out runs/ablation --minutes 12
    python -m nmt.report runs/ablation --valid-sentences 0     # table of every row + BLEU-vs-minutes plot

Every row trains ``experiment=PRESET`` for the same ``trainer.max_minutes`` with one lever changed
(the first row changes nothing), one after the other, never two at once: rows compete for the same
cores, so run nothing else beside it. Each row then scores its ``best.pt`` and ``averaged.pt`` on the
whole valid.tsv with beam search (``nmt.evaluate``), and ``ablation.md`` in OUT gets one line per
row: valid BLEU/chrF, the steps and target tokens/s it reached, the difference to the first
row, and the greedy validation BLEU at step 600 (equal steps rather than equal time). Tuning data
only: test.tsv is never decoded here.

A row whose folder already has ``ablation.json`` is kept (re-running the command continues an
interrupted ablation); ``--only`` picks rows by name.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from nmt.calibrate import cpu_name
from nmt.config import override

# name, overrides, what the row tests
ROWS: list[tuple[str, list[str], str]] = [
    ("preset", [], "the preset unchanged"),
    ("subword_sampling", ["tokenizer.sample_alpha=0.1"], "unigram sampling, alpha 0.1, all segmentations (Kudo 2018)"),
    (
        "word_dropout",
        ["data.src_word_dropout=0.1", "data.tgt_word_dropout=0.1"],
        "10% of source and target-input tokens → <unk> (Sennrich & Zhang 2019)",
    ),
    (
        "no_layer_norm",
        ["encoder.layer_norm=false", "decoder.layer_norm=false"],
        "plain GRU cells (both presets layer-normalise theirs, gains from 0.1; Ba et al. 2016)",
    ),
    (
        "layer_norm_gain_1",
        ["encoder.layer_norm_gain=1", "decoder.layer_norm_gain=1"],
        "layer-norm gains starting at 1 (the paper's) instead of 0.1",
    ),
    ("tie_all", ["model.tie_all_embeddings=true"], "encoder emb = decoder emb = output layer"),
    ("label_smoothing_0.1", ["trainer.label_smoothing=0.1"], "label smoothing 0.1 (default) not the presets' 0.2"),
    ("vocab_4k", ["tokenizer.vocab_size=4000"], "4k joint unigram pieces instead of 8k"),
    ("subword_sampling_0.2", ["tokenizer.sample_alpha=0.2"], "unigram sampling, alpha 0.2 (1.35x pieces, not 1.9x)"),
    ("vocab_2k", ["tokenizer.vocab_size=2000"], "2k joint unigram pieces instead of 8k"),
    ("ema_0.999", ["trainer.ema_decay=0.999"], "validate and save an exponential moving average of the weights"),
    (
        "subword_sampling_nbest",
        ["tokenizer.sample_alpha=0.5", "tokenizer.sample_nbest=64"],
        "unigram sampling among the 64 best segmentations, alpha 0.5",
    ),
]

# Held equal in every row: checkpoints for averaging, no decoding search at the end of training
# (the rows are scored with one fixed beam below), validation often enough for a curve.
COMMON = [
    "trainer.keep_last=3",
    "trainer.average_last=3",
    "trainer.tune_decoding=false",
    "trainer.valid_every=300",
    "wandb.mode=disabled",
]


AT_STEP = 600  # a second view at equal steps (greedy, first valid_max_sentences lines), immune to CPU speed drift


def evaluate(checkpoint: Path, valid: Path, beam: int, folder: Path, tag: str) -> dict | None:
    if not checkpoint.is_file():
        return None
    out = folder / f"valid_beam{beam}_{tag}.json"
    cmd = [
        sys.executable, "-m", "nmt.evaluate", override("checkpoint", checkpoint), override("input", valid),
        f"beam_size={beam}", "length_penalty=1.0", "stop=exact", override("json", out),
    ]  # fmt: skip
    subprocess.run(cmd, check=True)
    return json.loads(out.read_text())


def validations(folder: Path) -> list[dict]:
    rows = []
    path = folder / "metrics.jsonl"
    if path.is_file():
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if "bleu" in rec:  # a validation record
                rows.append(rec)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("runs/ablation"))
    ap.add_argument("--preset", default="cpu_small")
    ap.add_argument("--minutes", type=float, default=12.0)
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--valid", type=Path, default=Path("data/spa-eng/valid.tsv"))
    ap.add_argument("--only", nargs="*", help="row names (default: all)")
    ap.add_argument("--list", action="store_true", help="print the rows and stop")
    ap.add_argument("extra", nargs="*", help="more overrides for every row (key=value)")
    args = ap.parse_args()
    if args.list:
        for name, ov, what in ROWS:
            print(f"{name:22s} {' '.join(ov) or '-':60s} {what}")
        return
    known = {name for name, _, _ in ROWS}
    for name in args.only or []:
        if name not in known:
            sys.exit(f"--only: unknown row {name!r}; rows: {', '.join(sorted(known))}")
    args.out.mkdir(parents=True, exist_ok=True)
    for name, overrides, what in ROWS:
        if args.only and name not in args.only:
            continue
        folder = args.out / name
        done = folder / "ablation.json"
        if done.is_file():
            print(f"[ablation] {name}: kept ({done})", flush=True)
            continue
        if folder.exists():  # a row stopped before its record: trained again from the start, at equal wall clock
            print(f"[ablation] {name}: {folder} holds an unfinished row; training it again", flush=True)
            shutil.rmtree(folder)
        cmd = [
            sys.executable, "-m", "nmt.train", f"experiment={args.preset}",
            f"trainer.max_minutes={args.minutes:g}", *COMMON, *overrides, *args.extra,
            override("hydra.run.dir", folder),
        ]  # fmt: skip
        print(f"[ablation] {name}: {' '.join(cmd[2:])}", flush=True)
        t0 = time.time()
        subprocess.run(cmd, check=True)
        wall = time.time() - t0
        best = evaluate(folder / "checkpoints" / "best.pt", args.valid, args.beam, folder, "best")
        avg = evaluate(folder / "checkpoints" / "averaged.pt", args.valid, args.beam, folder, "averaged")
        rec = {
            "row": name,
            "what": what,
            "overrides": overrides,
            "minutes": args.minutes,
            "wall_seconds": round(wall, 1),
            "validations": validations(folder),
            "best": best,
            "averaged": avg,
            "cpu": cpu_name(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        }
        done.write_text(json.dumps(rec, indent=1))
    write_table(args)


def score(res: dict | None, key: str) -> float | None:
    """A score from nmt.evaluate's JSON (None when the checkpoint was missing)."""
    return None if not res else res.get(key)


def write_table(args) -> None:
    recs = []
    for name, _, _ in ROWS:
        path = args.out / name / "ablation.json"
        if path.is_file():
            recs.append(json.loads(path.read_text()))
    if not recs:
        return
    base = score(recs[0]["best"], "bleu") if recs[0]["row"] == "preset" else None
    lines = [
        f"Valid BLEU/chrF: whole {args.valid.name}, beam {args.beam}, length penalty 1.0, sacrebleu defaults. "
        f"Each row trained `experiment={args.preset}` for {args.minutes:g} minutes of wall clock; "
        f"CPU: {recs[0]['cpu']}.",
        "",
        "| row | change | steps | tgt tok/s | BLEU best.pt | Δ | chrF | BLEU averaged.pt | greedy BLEU at step 600 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in recs:
        vals = r["validations"]
        last = vals[-1] if vals else {}
        b = score(r["best"], "bleu")
        chrf = score(r["best"], "chrf")
        avg = score(r["averaged"], "bleu")
        delta = "" if base is None or b is None or r["row"] == "preset" else f"{b - base:+.2f}"
        tps = last.get("tgt_tokens_per_s")
        change = " ".join(f"`{o}`" for o in r["overrides"]) or "—"
        cells = [
            r["row"],
            change,
            str(last.get("step", "")),
            "" if tps is None else f"{tps:,.0f}",
            "" if b is None else f"{b:.2f}",
            delta,
            "" if chrf is None else f"{chrf:.2f}",
            "" if avg is None else f"{avg:.2f}",
            next((f"{v['bleu']:.2f}" for v in vals if v.get("step") == AT_STEP), ""),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    (args.out / "ablation.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
