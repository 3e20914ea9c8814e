"""How much decoding work beam search's stopping rule costs, per length-penalty setting.

    python scripts/benchmark_stopping.py CHECKPOINT [--data data/spa-eng] [--sentences 1000] [--alphas 1.0,0.0]
        [--stops exact,early]

nmt's beam search (nmt/search.py) stops a sentence only when no open beam can still overtake its
n-best finished hypotheses. Under the GNMT length penalty (alpha > 0) an open beam's best possible
score is bounded with lp(max length), a loose bound, so sentences keep stepping long after their
best hypothesis ended; with alpha = 0 the bound is tight. This script decodes valid.tsv's sources
(in batches of 64 lines, as ``nmt.translate`` reads a file) once per alpha and prints the time,
output words/s and the beam rows the decoder stepped, against the rows it would have stepped had
every sentence stopped at its best hypothesis' length (``rows / best``: 1.0 = no extra work).
``--stops`` adds the ``stop="early"`` rule (``nmt.translate stop=early``) beside the exact one, and
every row is scored against valid.tsv's references (sacrebleu BLEU, detokenised), so what a rule
saves is shown beside what it costs.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import sacrebleu
import torch

from nmt.runtime import load_model
from nmt.search import SearchOptions
from nmt.translator import Translator


class CountingModel:
    """A Searchable that forwards to a model and counts the beam rows each step decodes."""

    def __init__(self, model):
        self.model, self.rows, self.steps = model, 0, 0
        self.training = model.training

    def eval(self):
        self.model.eval()
        return self

    def train(self, mode: bool = True):
        self.model.train(mode)
        return self

    def start(self, src, src_len):
        return self.model.start(src, src_len)

    def step(self, y, state):
        self.steps += 1
        self.rows += y.numel()
        return self.model.step(y, state)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("--data", default="data/spa-eng")
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--alphas", default="1.0,0.0")
    ap.add_argument("--stops", default="exact", help="comma-separated: exact, early")
    args = ap.parse_args()
    dev = torch.device("cpu")
    model, tok = load_model(args.checkpoint, dev)
    with open(Path(args.data) / "valid.tsv", encoding="utf-8") as f:
        pairs = [line.rstrip("\n").split("\t") for line in f][: args.sentences]
    lines, refs = [p[0] for p in pairs], [p[1] for p in pairs]
    threads = torch.get_num_threads()
    print(f"{args.checkpoint}: {len(lines)} sentences of valid.tsv, beam {args.beam}, {threads} threads")
    print("| alpha | stop | seconds | output words/s | decoder steps | beam rows | rows / best | BLEU |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    runs = [(float(a), s) for a in args.alphas.split(",") for s in args.stops.split(",")]
    for alpha, stop in runs:
        counting = CountingModel(model)
        tr = Translator(counting, tok, dev, SearchOptions(beam_size=args.beam, alpha=alpha, stop=stop))
        t0, out = time.perf_counter(), []
        for i in range(0, len(lines), 64):
            out += tr.translate(lines[i : i + 64])
        secs = time.perf_counter() - t0
        words = sum(len(o.text.split()) for o in out)
        best = sum((len(o.hypothesis.tokens) + 1) * args.beam for o in out)  # EOS included
        bleu = sacrebleu.corpus_bleu([o.text for o in out], [refs]).score
        print(
            f"| {alpha} | {stop} | {secs:.1f} | {words / secs:,.0f} | {counting.steps:,} | {counting.rows:,} | "
            f"{counting.rows / best:.2f} | {bleu:.2f} |"
        )


if __name__ == "__main__":
    main()
