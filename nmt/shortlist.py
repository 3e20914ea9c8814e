"""Lexical vocabulary shortlists for decoding: each batch's vocabulary projection over the target pieces
its sources make likely, not over the whole vocabulary.

The projection onto the vocabulary is most of a search step's arithmetic (docs/benchmarks.md). A
lexical shortlist (Jean et al. 2015, "On Using Very Large Target Vocabulary for Neural Machine
Translation", section 3.2; Marian's ``--shortlist``, Junczys-Dowmunt et al. 2018) keeps, for a batch
of sources, the union of

* the ``frequent`` most frequent target pieces (function words, punctuation; the special ids always), and
* for every source piece in the batch, the ``per_source`` target pieces that co-occur with it most
  strongly in the training pairs (Dice coefficient over sentences, 2·c(s, t) / (c(s) + c(t)),
  Och & Ney 2003's baseline association measure; the frequent pieces are not counted twice).

The search then projects onto those rows of the output layer only, and normalises its softmax over
them: scores are those of a model whose vocabulary is the shortlist, so a search may differ from the
full one (docs/benchmarks.md measures the BLEU change beside the speed). Built once from the training
pairs, at the end of training (``trainer.shortlist_frequent`` / ``shortlist_per_source``) or by
``scripts/shortlist.py`` for an existing checkpoint, and stored in the checkpoint (a few hundred KB).

Shapes: ``frequent`` [F] target ids, sorted, ids 0..3 (PAD, UNK, BOS, EOS) among them; ``table``
[V_src, K] target ids (EOS where a source piece has fewer than K associates). ``select(src)`` of a
batch [B, S] → sorted target ids [V'] whose first four are 0..3, so EOS keeps its index in the
shortlisted logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from nmt.data.tokenizer import EOS, PAD, Tokenizer

SPECIALS = 4  # PAD, UNK, BOS, EOS: ids 0..3, always in a shortlist (EOS must keep its index)
# Training pairs read to build one at the end of a run (the first ones of the split): co-occurrence
# counting holds ~100 (source, target) pairs per sentence in memory, ~0.5 GB at this many.
MAX_PAIRS = 500_000


@dataclass
class Shortlist:
    frequent: torch.Tensor  # [F] long, sorted, 0..SPECIALS-1 included
    table: torch.Tensor  # [V_src, K] long
    sizes: tuple[int, int] = (0, 0)  # (frequent, per_source) as asked when built, for the log

    def to(self, device: torch.device | str) -> Shortlist:
        """This shortlist with its tensors on ``device`` (the translator moves it once, not every batch)."""
        return Shortlist(self.frequent.to(device), self.table.to(device), self.sizes)

    def select(self, src: torch.Tensor) -> torch.Tensor:
        """The sorted target ids a batch of sources src [B, S] (PAD ignored) may translate into: [V']."""
        table, frequent = self.table.to(src.device), self.frequent.to(src.device)  # no copy once moved (``to``)
        pieces = torch.unique(src[src != PAD])
        return torch.unique(torch.cat([frequent, table[pieces].flatten()]))

    def describe(self) -> str:
        f, k = self.sizes
        return f"the {f} most frequent target pieces + {k} per source piece"

    def state_dict(self) -> dict:
        """Stored in the narrowest integer type that holds the ids (int16 for vocabularies up to 32k):
        the table is V_src × K ids, and best.pt should stay about the size of the weights."""
        top = max((int(t.max()) for t in (self.table, self.frequent) if t.numel()), default=0)
        dtype = torch.int16 if top < 2**15 else torch.int32
        return {"frequent": self.frequent.to(dtype), "table": self.table.to(dtype), "sizes": list(self.sizes)}

    @classmethod
    def from_state_dict(cls, state: dict) -> Shortlist:
        return cls(state["frequent"].long(), state["table"].long(), tuple(state["sizes"]))


def _unique_pieces(sents: Sequence[Sequence[int]], vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """Each sentence's distinct pieces: (sentence index, piece id), sorted by sentence then piece."""
    lens = np.fromiter((len(s) for s in sents), dtype=np.int64, count=len(sents))
    flat = np.fromiter((i for s in sents for i in s), dtype=np.int64, count=int(lens.sum()))
    key = np.unique(np.repeat(np.arange(len(sents), dtype=np.int64), lens) * vocab + flat)
    return key // vocab, key % vocab


def cooccurrence(
    src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]], src_vocab: int, tgt_vocab: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Sentence-level counts over aligned pairs: (s, t, c(s, t)) for every co-occurring pair, and the
    number of sentences holding each source piece [V_src] and each target piece [V_tgt]."""
    if len(src) != len(tgt):
        raise ValueError(f"{len(src)} source sentences but {len(tgt)} target sentences")
    s_sent, s_tok = _unique_pieces(src, src_vocab)
    t_sent, t_tok = _unique_pieces(tgt, tgt_vocab)
    n = len(src)
    t_count = np.bincount(t_sent, minlength=n)  # distinct target pieces per sentence
    t_start = np.cumsum(t_count) - t_count
    reps = t_count[s_sent]  # each source piece meets every target piece of its sentence
    total = int(reps.sum())
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(reps) - reps, reps)
    tgt_rep = t_tok[np.repeat(t_start[s_sent], reps) + within]
    pair, count = np.unique(np.repeat(s_tok, reps) * tgt_vocab + tgt_rep, return_counts=True)
    return (
        pair // tgt_vocab,
        pair % tgt_vocab,
        count,
        np.bincount(s_tok, minlength=src_vocab),
        np.bincount(t_tok, minlength=tgt_vocab),
    )


def build(
    src: Sequence[Sequence[int]],
    tgt: Sequence[Sequence[int]],
    src_vocab: int,
    tgt_vocab: int,
    frequent: int = 500,
    per_source: int = 20,
) -> Shortlist:
    """A shortlist from tokenised training pairs (ids without BOS/EOS); see the module docstring."""
    if frequent < 0 or per_source < 1:
        raise ValueError(f"shortlist sizes: frequent={frequent} (>= 0), per_source={per_source} (>= 1)")
    s, t, c, df_s, df_t = cooccurrence(src, tgt, src_vocab, tgt_vocab)
    order = np.argsort(-df_t[SPECIALS:], kind="stable")[:frequent] + SPECIALS
    common = np.union1d(np.arange(SPECIALS), order)
    keep = ~np.isin(t, common) & (s >= SPECIALS)
    s, t, c = s[keep], t[keep], c[keep]
    dice = 2.0 * c / (df_s[s] + df_t[t])
    by = np.lexsort((t, -dice, s))  # per source piece, strongest first (ties: lower id)
    s, t = s[by], t[by]
    first = np.searchsorted(s, s, side="left")
    rank = np.arange(len(s)) - first
    take = rank < per_source
    table = np.full((src_vocab, per_source), EOS, dtype=np.int64)
    table[s[take], rank[take]] = t[take]
    return Shortlist(torch.from_numpy(common.astype(np.int64)), torch.from_numpy(table), (frequent, per_source))


def coverage(
    shortlist: Shortlist, batches: Sequence[tuple[torch.Tensor, Sequence[Sequence[int]]]]
) -> tuple[float, float]:
    """(share of reference target pieces inside their batch's shortlist, mean shortlist size) over
    ``batches`` of (src [B, S], the batch's reference target ids): what a choice of sizes keeps."""
    inside = total = 0
    sizes = []
    for src, refs in batches:
        ids = shortlist.select(src)
        sizes.append(len(ids))
        ref = torch.tensor([i for r in refs for i in r], dtype=torch.long)
        inside += int(torch.isin(ref, ids).sum())
        total += len(ref)
    return inside / max(total, 1), float(np.mean(sizes)) if sizes else 0.0


def from_pairs(
    pairs: Sequence[tuple[str, str]], tokenizer: Tokenizer, frequent: int = 500, per_source: int = 20
) -> Shortlist:
    """``build`` over raw (source, target) text pairs, tokenised with the model's own ``tokenizer``."""
    srcs, tgts = [s for s, _ in pairs], [t for _, t in pairs]
    return build(
        tokenizer.encode_src(srcs),
        tokenizer.encode_tgt(tgts),
        tokenizer.src_vocab_size,
        tokenizer.tgt_vocab_size,
        frequent,
        per_source,
    )
