"""Subword sampling drawn with our own generator, so a (seed, stream position) gives the same pieces in
every process.

sentencepiece can sample segmentations itself (``encode(..., enable_sampling=True)``), but its generator
is not ours to seed: with sentencepiece 0.2.3 ``set_random_generator_seed`` repeats a draw only within
one process, so a resumed run (a new process) would re-segment its current epoch differently. Here
sentencepiece only supplies the model (pieces, scores, normaliser) and, for n-best sampling, its exact
n-best search; every random choice is made with the numpy ``Generator`` the caller passes in.

- ``UnigramSampler``: Kudo 2018, "Subword Regularization": a segmentation x of a sentence is drawn
  with probability ∝ P(x)^alpha, log P(x) = Σ log-probs of its pieces, either among the ``nbest`` best
  segmentations or (nbest -1) over the whole lattice by forward-filtering backward-sampling.
- ``BpeDropout``: Provilkov et al. 2020, "BPE-Dropout": the greedy merge loop of sentencepiece's BPE
  with each merge skipped with probability p; p = 0 gives sentencepiece's own ``encode``.

Both reproduce sentencepiece's lattice/merge rules for the models nmt trains (normal pieces, the
fixed control pieces and ``<unk>``; no user-defined or byte pieces), including its unknown-character
penalty and the merging of a run of unknown pieces into one ``<unk>``.

Cost (one epoch of spa-eng train.tsv through BatchStream alone, 8,000 pieces, alpha 0.1; 2 cores of
an AMD EPYC, 2026-11-23; sampling off: 14-16 s): whole-lattice unigram 33 s in the first epoch, 21 s
once the word tables are cached, against 17-19 s with sentencepiece's sampler; BPE-dropout 28-36 s
against 18-19 s; l-best (nbest 64) ~3× sentencepiece's 30-33 s, hence -1 as the default.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import itertools
import math
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import sentencepiece as spm

from nmt.errors import CheckpointError

if TYPE_CHECKING:
    from sentencepiece.sentencepiece_model_pb2 import ModelProto

_NORMAL, _UNKNOWN, _CONTROL = 1, 2, 3  # sentencepiece ModelProto.SentencePiece.Type
_BPE = 2  # sentencepiece TrainerSpec.ModelType
UNK_PENALTY = 10.0  # sentencepiece's kUnkPenalty: an unknown character scores min(score) - 10
NBEST_CHUNK = 500  # texts whose n-best lists UnigramSampler holds at once
WORD_CACHE = 1 << 16  # words whose lattice tables UnigramSampler keeps (~0.6 KB each: all of spa-eng's 64k)


@dataclass(frozen=True)
class Sampling:
    """Subword regularisation: a fresh segmentation drawn every time a training pair is tokenised.

    unigram models sample segmentations with probabilities ∝ P(x)^alpha among the ``nbest`` best
    (-1 = all of them, the whole lattice; Kudo 2018, "Subword Regularization"); BPE models drop each
    merge with probability ``alpha`` (Provilkov et al. 2020, "BPE-Dropout"; ``nbest`` is ignored).
    ``alpha`` 0 turns it off. Only the training stream samples: validation, translation, serving and
    evaluation always take the single best segmentation. Drawn with a numpy generator seeded by the
    caller, so the same seed gives the same pieces in any process (see the module docstring).
    """

    alpha: float = 0.0
    nbest: int = -1

    def __bool__(self) -> bool:
        return self.alpha > 0


def sampler_for(sp: spm.SentencePieceProcessor) -> UnigramSampler | BpeDropout:
    """The sampler of a sentencepiece model's type: BPE-dropout for BPE, else unigram sampling."""
    from sentencepiece.sentencepiece_model_pb2 import ModelProto  # lazy: protobuf only where sampling is on

    proto = ModelProto.FromString(sp.serialized_model_proto())
    return (BpeDropout if proto.trainer_spec.model_type == _BPE else UnigramSampler)(sp, proto)


class _Pieces:
    """What sampling needs of a sentencepiece model: ``vocab`` (piece → (id, score)) over the pieces
    text may be cut into, ``prefixes`` (every proper prefix of such a piece, for stopping a match
    early), the longest piece length and the unknown piece's id and lattice score."""

    def __init__(self, sp: spm.SentencePieceProcessor, proto: ModelProto):
        odd = {p.type for p in proto.pieces} - {_NORMAL, _UNKNOWN, _CONTROL}
        if odd or proto.trainer_spec.byte_fallback:
            raise CheckpointError(
                "subword sampling: the sentencepiece model has user-defined or byte pieces; "
                "nmt samples only from models it trained itself (normal pieces only)"
            )
        self.sp = sp
        normal = [(p.piece, i, p.score) for i, p in enumerate(proto.pieces) if p.type == _NORMAL]
        self.vocab = {piece: (i, score) for piece, i, score in normal}
        self.prefixes = {piece[:k] for piece, _, _ in normal for k in range(1, len(piece))} - set(self.vocab)
        self.max_len = max((len(piece) for piece, _, _ in normal), default=1)
        # Every segmentation cuts before each "▁" (see UnigramSampler.sample_lattice)?
        self.word_bounded = not proto.trainer_spec.treat_whitespace_as_suffix and all(
            "▁" not in piece[1:] for piece in self.vocab
        )
        self.unk = sp.unk_id()
        self.unk_score = min((score for _, _, score in normal), default=0.0) - UNK_PENALTY
        # Every id's score as the lattice counts it (the unknown piece's penalty included): [V].
        self.scores = np.array([p.score if p.type == _NORMAL else 0.0 for p in proto.pieces], dtype=np.float64)
        self.scores[self.unk] = self.unk_score


def merge_unknowns(ids: list[int], unk: int) -> list[int]:
    """A run of unknown pieces as one ``unk``, as sentencepiece's encode writes it."""
    return [x for k, x in enumerate(ids) if not (x == unk and k and ids[k - 1] == unk)]


class UnigramSampler:
    """Segmentations of a unigram model drawn with probability ∝ P(x)^alpha (Kudo 2018, §3.2)."""

    def __init__(self, sp: spm.SentencePieceProcessor, proto: ModelProto):
        self.p = _Pieces(sp, proto)
        self._tables: dict[float, Callable[[str], list]] = {}  # alpha → cached word → backward tables

    def sample(self, texts: list[str], sampling: Sampling, rng: np.random.Generator) -> list[list[int]]:
        """One drawn segmentation (ids) per text: among the ``nbest`` best, or the whole lattice for -1."""
        if sampling.nbest == -1:
            return self.sample_lattice(texts, sampling.alpha, rng)
        return self.sample_nbest(texts, sampling.alpha, sampling.nbest, rng)

    def sample_nbest(self, texts: list[str], alpha: float, nbest: int, rng: np.random.Generator) -> list[list[int]]:
        """l-best sampling: sentencepiece's exact n-best search, then one candidate per text drawn with
        probability softmax(alpha · score), score = Σ piece log-probs (what sentencepiece draws from).

        In chunks of NBEST_CHUNK texts: the candidates of a whole 20,000-pair bucket as Python lists
        would take over a gigabyte. Costs ~3× sentencepiece's own l-best sampler (measured in the module
        docstring): the n candidates of every text cross into Python, where sentencepiece keeps them in C++.
        """
        u = rng.random(len(texts))  # [N], one draw per text whatever the chunking
        out: list[list[int]] = []
        for at in range(0, len(texts), NBEST_CHUNK):
            out += self._pick_nbest(texts[at : at + NBEST_CHUNK], alpha, nbest, u[at : at + NBEST_CHUNK])
        return out

    def _pick_nbest(self, texts: list[str], alpha: float, nbest: int, u: np.ndarray) -> list[list[int]]:
        """Vectorised over ``texts``: the candidates' ids are concatenated once and scored with one cumsum
        [C], normalised per text by subtracting its best score, and one uniform ``u`` per text picks from
        the running sums of exp(alpha · (score - best))."""
        cands = self.p.sp.nbest_encode(texts, nbest_size=nbest)  # lists: ~2× faster than nbest_encode_as_numpy
        per_text = np.array([len(c) for c in cands])  # [N] candidates of each text (< nbest when there are fewer)
        flat = [ids for c in cands for ids in c]  # C candidates
        sizes = np.array([len(ids) for ids in flat])  # [C]
        ids = np.fromiter(itertools.chain.from_iterable(flat), dtype=np.int64, count=int(sizes.sum()))
        running = np.concatenate([[0.0], np.cumsum(self.p.scores[ids])])  # [Σ sizes + 1]
        score = running[np.cumsum(sizes)] - running[np.cumsum(sizes) - sizes]  # [C]; an empty text's one candidate: 0
        first = np.concatenate([[0], np.cumsum(per_text)[:-1]])  # [N] index of each text's first (best) candidate
        weight = np.exp(alpha * (score - np.repeat(score[first], per_text)))  # [C], the best one is 1
        cum = np.cumsum(weight)
        before = np.concatenate([[0.0], cum])[first]  # [N] running sum up to each text's first candidate
        total = cum[first + per_text - 1] - before  # [N]
        pick = np.searchsorted(cum, before + u * total, side="right")  # [N] global candidate index
        pick = np.minimum(pick, first + per_text - 1)  # rounding at the top end stays within the text
        return [flat[k] for k in pick]

    def sample_lattice(self, texts: list[str], alpha: float, rng: np.random.Generator) -> list[list[int]]:
        """Whole-lattice sampling by forward-filtering backward-sampling (sentencepiece's nbest -1):
        forward log-sums of alpha · score over every path into each position, then from the end each
        step back takes an incoming piece with probability ∝ exp(forward(start) + alpha · score).

        Word by word: no piece crosses the boundary before a "▁" (sentencepiece splits by whitespace
        when it trains), so every path passes through it and P(x)^alpha factorises over words. The
        backward tables of a word depend only on the word and alpha, so the most recent WORD_CACHE of
        them are kept (a Zipfian corpus repeats its words: ~4× faster than rebuilding them on spa-eng); the draws
        do not depend on the cache: the word at character c of a text uses the uniforms from c on.
        """
        if alpha not in self._tables:
            self._tables[alpha] = functools.lru_cache(maxsize=WORD_CACHE)(functools.partial(self._table, alpha=alpha))
        table = self._tables[alpha]
        normalised = self.p.sp.normalize(texts)
        u = rng.random(sum(len(t) for t in normalised)).tolist()  # at most one draw per character
        out, at = [], 0
        for text in normalised:
            ids: list[int] = []
            for word in self._words(text):
                ids += self._draw(table(word), u, at)
                at += len(word)
            out.append(merge_unknowns(ids, self.p.unk))
        return out

    def _words(self, text: str) -> list[str]:
        """A normalised text cut before every "▁" (or whole, for a model whose pieces cross it)."""
        if not self.p.word_bounded:
            return [text] if text else []
        head, *rest = text.split("▁")
        return ([head] if head else []) + ["▁" + w for w in rest]

    def _table(self, word: str, alpha: float) -> tuple[array, array, array, array]:
        """The backward tables of ``word``, flat and compact (~0.6 KB a word): the incoming pieces of end
        position j are entries ``off[j-1]:off[j]`` of ``starts``, ``ids`` and ``cum``, the running sums of
        their probabilities P(piece | a path ends at j) ∝ exp(forward(start) + alpha · score)."""
        ends = self.lattice(word)
        fwd = [0.0] * (len(word) + 1)  # log Σ over paths into position j of exp(alpha · score)
        off, starts, ids, cum = array("i", [0]), array("i"), array("i"), array("d")
        for j in range(1, len(word) + 1):
            vals = [fwd[i] + alpha * s for i, _, s in ends[j]]
            top = max(vals)
            fwd[j] = top + math.log(sum(math.exp(v - top) for v in vals))
            cum.extend(itertools.accumulate(math.exp(v - fwd[j]) for v in vals))
            starts.extend(i for i, _, _ in ends[j])
            ids.extend(x for _, x, _ in ends[j])
            off.append(len(cum))
        return off, starts, ids, cum

    @staticmethod
    def _draw(table: tuple[array, array, array, array], u: list[float], at: int) -> list[int]:
        """One path backwards from the end of a word through its tables, with the uniforms u[at:]."""
        off, starts, pieces, cum = table
        out, j = [], len(off) - 1
        while j > 0:
            lo, hi = off[j - 1], off[j]
            k = min(bisect.bisect_right(cum, u[at] * cum[hi - 1], lo, hi), hi - 1)
            at += 1
            out.append(pieces[k])
            j = starts[k]
        return out[::-1]

    def lattice(self, text: str) -> list[list[tuple[int, int, float]]]:
        """``ends[j]``: every piece ending at character j of a normalised text as (start, id, score), as
        sentencepiece builds its lattice (a character no one-character piece covers is ``<unk>``)."""
        p, n = self.p, len(text)
        ends: list[list[tuple[int, int, float]]] = [[] for _ in range(n + 1)]
        for i in range(n):
            single = False
            for k in range(1, min(p.max_len, n - i) + 1):
                s = text[i : i + k]
                hit = p.vocab.get(s)
                if hit is None:
                    if s in p.prefixes:
                        continue
                    break
                single |= k == 1
                ends[i + k].append((i, hit[0], hit[1]))
            if not single:
                ends[i + 1].append((i, p.unk, p.unk_score))
        return ends


class BpeDropout:
    """BPE segmentation with each merge skipped with probability p (Provilkov et al. 2020).

    sentencepiece's BPE ``encode`` in Python: the normalised text starts as characters, and the
    adjacent pair whose concatenation is the best-scoring piece (sentencepiece's BPE scores are merge
    priorities; ties: leftmost) is merged until none is left. With dropout a merge taken from the queue
    is skipped with probability p, as sentencepiece does it (the pair comes back only if a neighbour's
    merge makes it anew); p = 0 is sentencepiece's deterministic ``encode``.
    """

    def __init__(self, sp: spm.SentencePieceProcessor, proto: ModelProto):
        self.p = _Pieces(sp, proto)

    def sample(self, texts: list[str], sampling: Sampling, rng: np.random.Generator) -> list[list[int]]:
        """One segmentation (ids) per text, each merge skipped with probability ``sampling.alpha``."""
        dropout = sampling.alpha
        normalised = self.p.sp.normalize(texts)
        # at most len - 1 merges are taken (each joins two symbols); a skipped one needs a draw too,
        # and there are at most as many queued pairs as pushes: 2 per merge + the first len - 1.
        u = rng.random(sum(3 * len(t) for t in normalised)) if dropout > 0 else None
        out, at = [], 0
        for text in normalised:
            out.append(self._encode(text, dropout, None if u is None else u[at : at + 3 * len(text)].tolist()))
            at += 3 * len(text)
        return out

    def _encode(self, text: str, dropout: float, u: list[float] | None) -> list[int]:
        vocab = self.p.vocab
        sym = list(text)  # symbol i's text; "" once merged into its left neighbour
        nxt = list(range(1, len(text))) + [-1]
        prv = list(range(-1, len(text) - 1))
        queue: list[tuple[float, int, int, str]] = []  # (-score, left, right, merged piece): a min-heap

        def push(left: int, right: int) -> None:
            if left >= 0 and right >= 0:
                piece = sym[left] + sym[right]
                if piece in vocab:
                    heapq.heappush(queue, (-vocab[piece][1], left, right, piece))

        for i in range(1, len(text)):
            push(i - 1, i)
        k = 0
        while queue:
            _, left, right, piece = heapq.heappop(queue)
            if sym[left] + sym[right] != piece or not sym[right]:
                continue  # stale: one side has merged since
            if u is not None:
                k += 1
                if u[k - 1] < dropout:
                    continue
            sym[left], sym[right] = piece, ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            push(prv[left], left)
            push(left, nxt[left])
        ids, i = [], 0 if text else -1
        while i >= 0:
            ids.append(vocab.get(sym[i], (self.p.unk,))[0])
            i = nxt[i]
        return merge_unknowns(ids, self.p.unk)
