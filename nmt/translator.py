"""Text in, text out: tokenise, batch by length, search, restore input order, detokenise.

Used by validation during training and by ``nmt.translate``, so the BLEU the trainer
selects checkpoints on is computed exactly the way users will translate.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import sys
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np
import torch

from nmt.data.batching import eval_batches, eval_groups
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NmtError, line_list
from nmt.search import Hypothesis, Searchable, SearchOptions, beam_search
from nmt.shortlist import Shortlist

log = logging.getLogger(__name__)


@dataclass
class Translation:
    text: str  # the best hypothesis, detokenised
    hypothesis: Hypothesis
    src_pieces: list[str]
    tgt_pieces: list[str]
    n_best: list[tuple[str, float]]  # (text, score) for each of the n-best, best first
    truncated: bool = False  # the source had more than max_input_len pieces: only its first ones were translated


def blank() -> Translation:
    """What a blank input line translates to."""
    return Translation("", Hypothesis([], 0.0, 0.0, None), [], [], [("", 0.0)])


class Translator:
    def __init__(
        self,
        model: Searchable,  # a Seq2Seq or an Ensemble
        tokenizer: Tokenizer,
        device: torch.device,
        search: SearchOptions | None = None,
        max_tokens: int = 4000,
        max_input_len: int = 256,
        shortlist: Shortlist | None = None,
        trained_columns: tuple[int, int] | None = None,
    ):
        """``shortlist``: search each batch over its lexical shortlist of target pieces (nmt.shortlist).
        ``trained_columns``: the (source, target) TSV columns the model's training read (its data.columns)."""
        self.model, self.tok, self.device = model, tokenizer, device
        self.trained_columns = trained_columns
        self.search = search or SearchOptions()
        self.max_tokens, self.max_input_len = max_tokens, max_input_len
        self.shortlist = shortlist.to(device) if shortlist is not None else None
        # Log how many inputs of each call were truncated; nmt.translate and nmt.evaluate turn it off and name
        # the lines once, at the end (report_truncated), from each Translation's ``truncated``.
        self.warn_truncated = True

    @torch.no_grad()
    def translate(self, texts: list[str], return_attention: bool = False) -> list[Translation]:
        """One translation per input, in input order; blank inputs give empty outputs."""
        was_training = self.model.training
        self.model.eval()
        ids, too_long, keep = self._encode(texts)
        if self.warn_truncated and any(too_long):
            log.warning("%d input line(s) longer than %d pieces were truncated", sum(too_long), self.max_input_len)
        results: list[Translation | None] = [None] * len(texts)
        for group, batch in eval_batches([ids[i] for i in keep], None, self._budget()):
            b = batch.to(self.device)
            vocab = None if self.shortlist is None else self.shortlist.select(b.src)
            nbests = beam_search(self.model, b.src, b.src_len, self.search, return_attention, vocab)
            for j, nbest in zip(group, nbests):
                i = keep[j]
                texts_out = self.tok.decode_tgt([h.tokens for h in nbest])
                best = nbest[0]
                results[i] = Translation(
                    texts_out[0],
                    best,
                    self.tok.src.id_to_piece(ids[i]) + ["</s>"],
                    self.tok.tgt_pieces(best.tokens) + ["</s>"],
                    [(t, h.score) for t, h in zip(texts_out, nbest)],
                    too_long[i],
                )
        self.model.train(was_training)
        return [r if r is not None else blank() for r in results]

    def plan(self, texts: list[str]) -> list[list[int]]:
        """The search batches ``translate(texts)`` makes, as lists of indices into ``texts``, the most work
        first (sentences x their padded length); blank inputs form no batch. ``translate`` over one of these
        lists makes that one batch again (its sentences fit the budget in any order), so decoding processes
        that take them one at a time (``Workers``) search exactly the batches this process would."""
        ids, _, keep = self._encode(texts)
        groups = [[keep[j] for j in g] for g in eval_groups([ids[i] for i in keep], None, self._budget())]
        return sorted(groups, key=lambda g: len(g) * max(len(ids[i]) for i in g), reverse=True)

    def _encode(self, texts: list[str]) -> tuple[list[list[int]], list[bool], list[int]]:
        """Source ids cut to max_input_len, which inputs were longer, and the indices of the non-blank ones."""
        ids = self.tok.encode_src([t.strip() for t in texts])
        too_long = [len(s) > self.max_input_len for s in ids]
        ids = [s[: self.max_input_len] for s in ids]
        return ids, too_long, [i for i, s in enumerate(ids) if s]

    def _budget(self) -> int:
        """Source tokens per search batch: beams multiply the batch, so sentences x beams x length stays
        near max_tokens."""
        width = self.search.n_best if self.search.sample else self.search.beam_size  # rows per sentence
        return max(self.max_tokens // width, 1)


def report_truncated(lines: list[int], name: str, limit: int) -> None:
    """One warning naming the input lines (1-based) whose sources were cut to their first ``limit`` pieces."""
    if lines:
        shown = line_list(lines)
        log.warning(
            "%s: %d line%s longer than max_input_len=%d pieces %s truncated to the first %d: line%s %s "
            "(max_input_len=N raises the limit)",
            name,
            len(lines),
            "" if len(lines) == 1 else "s",
            limit,
            "was" if len(lines) == 1 else "were",
            limit,
            "" if len(lines) == 1 else "s",
            shown,
        )


# ---- several processes (CPU) -------------------------------------------------------------------------------
# Beam search on a CPU is many small steps: each has host work (top-k, bookkeeping, Python) that one thread does
# while the other cores wait, and products too small to split well across threads. Translating shares of the
# input in one-thread processes keeps every core busy instead (CTranslate2's inter_threads, Marian's
# --cpu-threads): docs/benchmarks.md, run 11. The processes are forked once the model is loaded, so they share
# its weights and start at once; each sets one thread (a forked child must not use its parent's OpenMP pool).

_SHARED: Translator | None = None  # the translator the forked processes inherit


def _worker_init() -> None:
    # Ctrl-C at a terminal reaches every process of the group: a worker ends at once, silently, and the parent
    # (which gets it too) stops as it always has.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    torch.set_num_threads(1)  # and never touches its parent's OpenMP pool, which did not survive the fork


def _translate_share(texts: list[str], return_attention: bool) -> list[Translation]:
    # attention goes back by value (numpy), not through torch's shared-memory handles
    return _swap_attention(_SHARED.translate(texts, return_attention))


def _swap_attention(out: list[Translation]) -> list[Translation]:
    """Attention matrices tensor -> numpy (in a worker) and numpy -> tensor (back in the parent)."""

    def swap(a: torch.Tensor | np.ndarray | None) -> np.ndarray | torch.Tensor | None:
        return a.numpy() if isinstance(a, torch.Tensor) else torch.from_numpy(a) if isinstance(a, np.ndarray) else a

    return [replace(t, hypothesis=replace(t.hypothesis, attention=swap(t.hypothesis.attention))) for t in out]


AUTO_MAX = 8  # workers=auto forks at most this many processes (one per CPU thread), else keeps one


def resolve_workers(requested: int, device: torch.device, interactive: bool = False) -> tuple[int, str]:
    """How many processes decode (the decoding commands' ``workers``), and why, for the log.

    0 (auto): one per CPU thread torch would use (``threads``), on Linux CPUs, for file input, up to AUTO_MAX
    threads; above that, one process with all of them, as before (many processes multiply the search's memory,
    and only 2 cores were measured). 1: this process only. CUDA decodes in this process (one GPU is shared by
    batching, not by processes), and so does a line-by-line stdin session or a platform without fork."""
    if requested == 1:
        return 1, "workers=1"
    if device.type != "cpu":
        return 1, f"workers apply to CPU decoding; {device.type} decodes in this process"
    if interactive:
        return 1, "stdin is answered line by line in this process"
    if not sys.platform.startswith("linux") or "fork" not in multiprocessing.get_all_start_methods():
        return 1, "decoding in several processes needs Linux (fork)"
    n = requested or torch.get_num_threads()
    if not requested and n > AUTO_MAX:
        return 1, f"workers=auto uses one process above {AUTO_MAX} CPU threads ({n}); workers=N sets N"
    how = "as given" if requested else "workers=auto: one per CPU thread"
    return n, f"{n} processes of one thread each ({how}; workers=1 decodes in this process)"


class Workers:
    """``translate`` over ``n`` forked one-thread processes (n = 1: the translator itself, in this process):
    the lines are cut into the search batches one process would make (``Translator.plan``), each process takes
    the next batch when it is free, and results come back in input order. Use as a
    context manager; the processes end with it. A process that dies (out of memory, killed) ends the command
    with an NmtError instead of leaving it waiting."""

    def __init__(self, tr: Translator, n: int):
        self.tr, self.n, self._pool = tr, max(1, n), None

    def __enter__(self) -> Workers:
        global _SHARED
        if self.n > 1:
            _SHARED = self.tr
            ctx = multiprocessing.get_context("fork")
            self._pool = ProcessPoolExecutor(self.n, mp_context=ctx, initializer=_worker_init)
        return self

    def __exit__(self, *exc) -> None:
        global _SHARED
        if self._pool is not None:
            # after an error here, shares not yet started are dropped (Ctrl-C at a terminal ends the workers too)
            self._pool.shutdown(wait=exc[0] is None, cancel_futures=True)
            self._pool, _SHARED = None, None

    def translate(self, texts: list[str], return_attention: bool = False) -> list[Translation]:
        if self._pool is None or len(texts) < 2:
            return self.tr.translate(texts, return_attention)
        # One search batch per share, the most work first, each taken by the next process that is free: the
        # processes stay busy to the end, and search exactly the batches one process would (Translator.plan).
        groups = self.tr.plan(texts)
        shares = [[texts[i] for i in g] for g in groups]
        try:
            done = list(self._pool.map(_translate_share, shares, [return_attention] * len(shares)))
        except BrokenProcessPool:
            raise NmtError(
                f"a decoding process died (out of memory, or killed); workers=1 decodes in this process, "
                f"workers=N in N (now {self.n})"
            ) from None
        out = [blank() for _ in texts]  # blank lines form no batch
        for g, share in zip(groups, done):
            for i, t in zip(g, _swap_attention(share)):
                out[i] = t
        return out


@contextmanager
def workers(tr: Translator, requested: int, interactive: bool = False) -> Iterator[Workers]:
    """``Workers`` for the decoding commands' ``workers`` key (``resolve_workers``), with a log line."""
    n, why = resolve_workers(requested, tr.device, interactive)
    if n > 1:
        log.info("decoding in %s", why)
    elif requested > 1:
        log.info("decoding in one process: %s", why)
    with Workers(tr, n) as w:
        yield w
