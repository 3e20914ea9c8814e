"""Store a lexical vocabulary shortlist (nmt.shortlist) in an existing checkpoint, or compare sizes.

    python scripts/shortlist.py CHECKPOINT [--data data/spa-eng] [--frequent 500] [--per-source 20]
        [--output OUT.pt] [--sizes 250x10,500x20,1000x40]

Runs trained before shortlists existed have none; this builds one from the training pairs (train.tsv
of ``--data``, tokenised with the checkpoint's own sentencepiece model) and writes the checkpoint
again with it (``--output``, else in place, atomically). ``nmt.translate``/``evaluate``/``serve`` then
search each batch over it when told ``shortlist=true`` (off by default: docs/benchmarks.md, run 9).

Before writing, it prints what the shortlist keeps on valid.tsv: the share of reference target pieces
that are inside their batch's shortlist (batches formed as ``nmt.translate`` forms them at beam 5), and
the mean shortlist size against the whole vocabulary. ``--sizes FxK,...`` prints that for several
sizes and writes nothing.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from nmt import checkpoint
from nmt.data.batching import eval_batches
from nmt.data.corpus import CorpusSpec, load_pairs
from nmt.data.tokenizer import Tokenizer
from nmt.shortlist import Shortlist, build, coverage


def valid_batches(tok: Tokenizer, pairs: list[tuple[str, str]], beam: int = 5, max_tokens: int = 4000):
    """(src [B, S], reference target ids) per batch, as nmt.translator.Translator batches a file."""
    src = tok.encode_src([s for s, _ in pairs])
    ref = tok.encode_tgt([t for _, t in pairs])
    for group, batch in eval_batches(src, None, max(max_tokens // beam, 1)):
        yield batch.src, [ref[i] for i in group]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("--data", default="data/spa-eng")
    ap.add_argument("--frequent", type=int, default=500)
    ap.add_argument("--per-source", type=int, default=20)
    ap.add_argument("--output", help="write the checkpoint with its shortlist here (default: in place)")
    ap.add_argument("--sizes", help="FxK,... : print coverage and size for each, write nothing")
    args = ap.parse_args()

    ckpt = checkpoint.load(args.checkpoint)
    tok = Tokenizer.from_state_dict(ckpt["tokenizer"])
    train = load_pairs(CorpusSpec(str(Path(args.data) / "train.tsv")))
    valid = list(valid_batches(tok, load_pairs(CorpusSpec(str(Path(args.data) / "valid.tsv")))))
    start = time.monotonic()
    src_ids = tok.encode_src([s for s, _ in train])
    tgt_ids = tok.encode_tgt([t for _, t in train])
    print(f"tokenised {len(train):,} training pairs in {time.monotonic() - start:.1f} s")
    sizes = (
        [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
        if args.sizes
        else [(args.frequent, args.per_source)]
    )
    short: Shortlist | None = None
    for f, k in sizes:
        start = time.monotonic()
        short = build(src_ids, tgt_ids, tok.src_vocab_size, tok.tgt_vocab_size, f, k)
        took = time.monotonic() - start
        share, mean = coverage(short, valid)
        print(
            f"frequent {f}, per source piece {k}: built in {took:.1f} s; valid.tsv reference pieces inside their "
            f"batch's shortlist {100 * share:.2f}%; mean shortlist {mean:,.0f} of {tok.tgt_vocab_size:,} pieces"
        )
    if args.sizes or short is None:
        return
    ckpt["shortlist"] = short.state_dict()
    out = args.output or args.checkpoint
    checkpoint.save(out, {k: v for k, v in ckpt.items() if k not in ("format", "version")})
    print(f"wrote {out} with its shortlist ({short.describe()})")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
