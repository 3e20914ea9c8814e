"""Token-budget batches from length buckets, built in a DataLoader worker.

Why this shape: sorting a bucket of pairs by length before cutting batches keeps
padding near zero, and a token budget (not a sentence count) keeps every batch the
same amount of work, so the step time and memory stay flat. The whole pipeline
(read → tokenise → bucket → pad) runs in a worker process so it overlaps compute.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import multiprocessing
import os
import random
import signal
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import IterableDataset

from nmt.data.corpus import CorpusSpec, stream_pairs
from nmt.data.tokenizer import BOS, EOS, PAD, UNK, Sampling, Tokenizer
from nmt.errors import CorpusError, NmtError

log = logging.getLogger(__name__)


@dataclass
class Batch:
    src: torch.Tensor  # [B, S] source ids + EOS, PAD-padded
    src_len: torch.Tensor  # [B] (int64, on CPU: pack_padded_sequence wants it there)
    tgt_in: torch.Tensor  # [B, T] BOS + target ids
    tgt_out: torch.Tensor  # [B, T] target ids + EOS
    n_tgt_tokens: int  # real (non-pad) target tokens, known without a device sync
    epoch: int = 0
    index: int = 0  # position of this batch within its shard's epoch, for resuming the stream
    shard: int = 0  # which data shard it came from (see BatchStream)

    def to(self, device: torch.device) -> Batch:
        nb = device.type == "cuda"
        return self._map(lambda t: t.to(device, non_blocking=nb))

    def pin_memory(self) -> Batch:
        return self._map(torch.Tensor.pin_memory)

    def _map(self, fn) -> Batch:
        """The id tensors through ``fn``; src_len stays on the CPU (pack_padded_sequence wants it there)."""
        return dataclasses.replace(self, src=fn(self.src), tgt_in=fn(self.tgt_in), tgt_out=fn(self.tgt_out))


def pad(seqs: Sequence[Sequence[int]]) -> torch.Tensor:
    """[B, max len] int64 tensor, PAD-filled. Filled as one Python list and made a tensor once: a tensor per
    row was half of a training batch's time in the DataLoader worker (docs/benchmarks.md)."""
    width = max(len(s) for s in seqs)
    flat = [PAD] * (len(seqs) * width)
    for i, s in enumerate(seqs):
        flat[i * width : i * width + len(s)] = s
    return torch.tensor(flat, dtype=torch.long).view(len(seqs), width)


def collate(
    src: Sequence[list[int]], tgt: Sequence[list[int]], epoch: int = 0, index: int = 0, shard: int = 0
) -> Batch:
    """Pieces (without BOS/EOS) → a padded Batch."""
    return Batch(
        src=pad([s + [EOS] for s in src]),
        src_len=torch.tensor([len(s) + 1 for s in src], dtype=torch.long),
        tgt_in=pad([[BOS] + t for t in tgt]),
        tgt_out=pad([t + [EOS] for t in tgt]),
        n_tgt_tokens=sum(len(t) + 1 for t in tgt),
        epoch=epoch,
        index=index,
        shard=shard,
    )


def token_budget_groups(
    order: Sequence[int], lengths: Sequence[int], max_tokens: int, max_sentences: int = 0
) -> list[list[int]]:
    """Cut ``order`` (indices sorted by length) into groups with n * max(len) <= max_tokens and, when
    ``max_sentences`` > 0, n <= max_sentences."""
    groups: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in order:
        new_longest = max(longest, lengths[i])
        full = max_sentences and len(cur) >= max_sentences
        if cur and (full or new_longest * (len(cur) + 1) > max_tokens):
            groups.append(cur)
            cur, new_longest = [], lengths[i]
        cur.append(i)
        longest = new_longest
    if cur:
        groups.append(cur)
    return groups


def stream_seed(*position: object) -> int:
    """A 31-bit seed named by a place in the stream, e.g. ``("pieces", seed, epoch, shard, bucket)``.

    A stable hash rather than a running generator: what is drawn for one place never depends on what
    was drawn before it, so a resumed run that rebuilds an epoch redraws every batch exactly.
    """
    digest = hashlib.blake2b(repr(position).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 33


def word_dropout(batch: Batch, src_p: float, tgt_p: float, seed: int) -> Batch:
    """Whole tokens of the model's inputs replaced by UNK: each source piece with probability ``src_p``,
    each decoder input piece (``tgt_in``) with ``tgt_p`` (Sennrich et al. 2016, "Edinburgh Neural Machine
    Translation Systems for WMT 16", after Gal & Ghahramani 2016). ``tgt_out``, the loss targets, and
    PAD/BOS/EOS are never touched: the model still has to predict every real token, from damaged context.

    It is drawn here, in the DataLoader worker, rather than on the device in the model: the mask is a
    function of the batch's place in the stream (``seed``), so a resumed run redraws it exactly without
    saving anything, the model's own RNG stream (its dropout masks) is the same with it on or off, it
    overlaps the step like the rest of the batch building, and validation, translation and serving,
    which never go through BatchStream, cannot get it by mistake.
    """
    if not (src_p or tgt_p):
        return batch
    gen = torch.Generator().manual_seed(seed)
    return dataclasses.replace(batch, src=_drop(batch.src, src_p, gen), tgt_in=_drop(batch.tgt_in, tgt_p, gen))


def _drop(ids: torch.Tensor, p: float, gen: torch.Generator) -> torch.Tensor:
    """``ids`` [B, T] with each real piece (not PAD/BOS/EOS) set to UNK with probability ``p``."""
    hit = torch.rand(ids.shape, generator=gen) < p  # drawn even when p = 0, so tgt_in's mask does not depend on src_p
    return ids.masked_fill(hit & (ids != PAD) & (ids != BOS) & (ids != EOS), UNK)


def shuffle_options(ds) -> dict:
    """Keyword arguments for ``ds.shuffle``: ``max_buffer_input_shards=1`` for a one-shard stream (a local TSV).

    ``datasets`` (5.2 here) fills a shuffle buffer through an interleaving of up to 10 input shards, which
    hands every row through a thread-pool future: 80-110 µs a row, 8-11 s per pass over the 105k training pairs
    on a 2-core AMD EPYC, paid by the DataLoader worker in every epoch and by a resume skipping to its batch
    (docs/benchmarks.md). With one shard the interleaving yields the rows in the same order, so it is left
    out; the shuffled stream is the same, row for row (tests/test_batching.py). A Hub dataset of several
    shards keeps the default, which mixes its shards. Older ``datasets`` without the keyword: nothing."""
    import inspect

    if getattr(ds, "num_shards", 0) == 1 and "max_buffer_input_shards" in inspect.signature(ds.shuffle).parameters:
        return {"max_buffer_input_shards": 1}
    return {}


class BatchStream(IterableDataset):
    """Endless stream of training batches, epoch after epoch, deterministic for a seed.

    Sharding: the shuffled pair stream is dealt round-robin into ``num_shards`` shards
    (``datasets.distributed.split_dataset_by_node``), and each shard is bucketed and cut
    into batches on its own. A run has ``world_size * accum_steps`` shards; rank r owns
    shards ``r*accum_steps ... r*accum_steps + accum_steps - 1`` and yields one batch of
    each in turn, which the trainer takes as the micro-batches of one update. So a global
    update is the same set of batches whether it is spread over 4 ranks or accumulated
    in one process with accum_steps=4, and each rank tokenises only its own pairs.

    ``starts`` gives, per owned shard, ``(epoch, batches to skip)`` so that a resumed run
    continues each shard where the interrupted one stopped: the same seed rebuilds the
    same batches and the first ones are dropped.

    Subword sampling (``sampling``) happens where a bucket is tokenised, before the length filter and
    the sort, so batches are packed by the sampled lengths; word dropout (``word_dropout``: source and
    target input probabilities) is applied to each finished batch. Both draw from seeds named by the
    stream position (``stream_seed``: bucket, resp. batch index within the shard's epoch), so each epoch
    draws afresh and both are exact on resume: a resumed run (a new process) rebuilds its current epoch
    with the same segmentations and masks (Tokenizer.sample_pairs draws with its own seeded generator).
    """

    def __init__(
        self,
        spec: CorpusSpec,
        tokenizer_state: dict,
        max_len: int,
        max_tokens: int,
        bucket_size: int,
        shuffle_buffer: int,
        seed: int,
        shards: Sequence[int] = (0,),
        num_shards: int = 1,
        starts: Sequence[tuple[int, int]] | None = None,
        sampling: Sampling | None = None,
        word_dropout: tuple[float, float] = (0.0, 0.0),
        max_sentences: int = 0,
    ):
        super().__init__()
        self.spec, self.tokenizer_state = spec, tokenizer_state
        self.max_len, self.max_tokens, self.max_sentences = max_len, max_tokens, max_sentences
        self.bucket_size, self.shuffle_buffer, self.seed = bucket_size, shuffle_buffer, seed
        self.shards, self.num_shards = list(shards), num_shards
        self.starts = list(starts) if starts is not None else [(0, 0)] * len(self.shards)
        self.sampling, self.word_dropout = sampling or Sampling(), word_dropout

    def __iter__(self) -> Iterator[Batch]:
        tok = Tokenizer.from_state_dict(self.tokenizer_state)  # built here: lives in the worker
        streams = [self.shard_batches(tok, s, *start) for s, start in zip(self.shards, self.starts)]
        while True:
            for stream in streams:
                yield next(stream)

    def shard_batches(self, tok: Tokenizer, shard: int, start_epoch: int, skip: int) -> Iterator[Batch]:
        epoch = start_epoch
        while True:
            yield from self.epoch_batches(tok, epoch, shard, skip if epoch == start_epoch else 0)
            epoch += 1

    def _buckets(self, epoch: int, shard: int) -> Iterator[list[dict]]:
        ds = stream_pairs(self.spec)
        if self.shuffle_buffer > 1:
            ds = ds.shuffle(seed=self.seed, buffer_size=self.shuffle_buffer, **shuffle_options(ds))
        if self.num_shards > 1:
            from datasets.distributed import split_dataset_by_node  # lazy: decoding never loads datasets

            ds = split_dataset_by_node(ds, rank=shard, world_size=self.num_shards)
        ds.set_epoch(epoch)  # after the split: it copies the dataset and resets the epoch
        bucket: list[dict] = []
        for row in ds:
            bucket.append(row)
            if len(bucket) >= self.bucket_size:
                yield bucket
                bucket = []
        if bucket:
            yield bucket

    def epoch_batches(self, tok: Tokenizer, epoch: int, shard: int = 0, skip: int = 0) -> Iterator[Batch]:
        """One epoch of a shard's batches, from batch index ``skip`` on (a resume). The skipped ones are still
        cut, so the shuffles draw as they did, but not padded into tensors (about a quarter of a skip's time)."""
        rng = random.Random((self.seed * 1_000_003 + epoch) * 1_009 + shard)
        index, too_long, total = 0, 0, 0
        for n, bucket in enumerate(self._buckets(epoch, shard)):
            srcs, tgts = self._encode(tok, bucket, stream_seed("pieces", self.seed, epoch, shard, n))
            total += len(bucket)
            keep = [
                i for i in range(len(bucket)) if 0 < len(srcs[i]) < self.max_len and 0 < len(tgts[i]) < self.max_len
            ]
            too_long += len(bucket) - len(keep)
            lengths = {i: max(len(srcs[i]), len(tgts[i])) + 1 for i in keep}
            # Sort by padded length, then target length, random tie-break: both sides pack tightly.
            keys = {i: (lengths[i], len(tgts[i]), rng.random()) for i in keep}
            order = sorted(keep, key=keys.__getitem__)
            groups = token_budget_groups(order, lengths, self.max_tokens, self.max_sentences)
            rng.shuffle(groups)
            for g in groups:
                if index < skip:
                    index += 1
                    continue
                batch = collate([srcs[i] for i in g], [tgts[i] for i in g], epoch, index, shard)
                yield word_dropout(batch, *self.word_dropout, stream_seed("words", self.seed, epoch, shard, index))
                index += 1
        if index == 0:  # not one batch: the next epoch would be the same, and the stream would spin forever
            raise CorpusError(
                f"{self.spec.label}: no training pair left"
                + (f" (shard {shard} of {self.num_shards})" if self.num_shards > 1 else "")
                + (
                    f": all {total} have data.max_len={self.max_len} pieces or more on one side; raise data.max_len"
                    if total
                    else ": the shard holds none; use fewer shards (world size x trainer.accum_steps)"
                )
            )
        if too_long and shard == self.shards[0] and epoch == self.starts[0][0]:
            log.info(
                "epoch %d: left out %d of %d pairs of data.max_len=%d pieces or more (shard %d of %d)",
                epoch,
                too_long,
                total,
                self.max_len,
                shard,
                self.num_shards,
            )

    def _encode(self, tok: Tokenizer, bucket: list[dict], seed: int) -> tuple[list[list[int]], list[list[int]]]:
        """Source and target ids of a bucket: sampled segmentations when subword sampling is on."""
        srcs, tgts = [r["src"] for r in bucket], [r["tgt"] for r in bucket]
        if self.sampling:
            return tok.sample_pairs(srcs, tgts, self.sampling, seed)
        return tok.encode_src(srcs), tok.encode_tgt(tgts)


def shard_starts(positions: Sequence[Sequence[int]], num_shards: int) -> tuple[list[tuple[int, int]], bool]:
    """Where each of ``num_shards`` shards resumes, from the saved last-consumed ``[epoch, index]`` per shard.

    Returns (starts, exact). With as many shards as were saved, every shard continues exactly
    after its last batch. With a different count (the world size or accum_steps changed) the pairs
    are dealt differently, so no exact position exists: every shard starts in the oldest saved
    epoch, having skipped the same share of it as the old shards had on average.
    """
    if not positions:
        return [(0, 0)] * num_shards, True
    if len(positions) == num_shards:
        return [(e, i + 1) for e, i in positions], True
    epoch = min(e for e, _ in positions)
    done = [i + 1 for e, i in positions if e == epoch]
    skip = round(sum(done) / len(done) * len(positions) / num_shards)
    return [(epoch, skip)] * num_shards, False


# Seconds a DataLoader worker keeps serving after a SIGTERM before it exits by itself.
WORKER_TERM_GRACE_S = 30


def worker_init(_worker_id: int) -> None:
    """Ctrl-C, `timeout` or a cluster's pre-emption signal the whole process group, and the main
    process must outlive its worker long enough to save a checkpoint (a worker that dies first makes
    the DataLoader raise in the middle of the step). So a worker ignores SIGINT, and on SIGTERM keeps
    serving for WORKER_TERM_GRACE_S seconds, then exits with status 0 (which the DataLoader does not
    treat as a failure). The grace also ends a worker that multiprocessing's exit hook terminates in
    a script that never closed its DataLoader; normally the DataLoader shuts it down itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: signal.alarm(WORKER_TERM_GRACE_S))
    signal.signal(signal.SIGALRM, lambda *_: os._exit(0))


def worker_errors(batches: Iterator[Batch]) -> Iterator[Batch]:
    """Re-raise a user-fixable error from the DataLoader worker as its one-line self: the DataLoader
    wraps it in the worker's whole traceback ("Caught CorpusError in DataLoader worker process 0...")."""
    try:
        yield from batches
    except GeneratorExit:  # closed, or collected at interpreter exit (when NmtError may already be gone)
        raise
    except NmtError as e:
        lines = [x for x in str(e).splitlines() if x.strip()]
        if len(lines) > 1 and "DataLoader worker" in lines[0]:
            last = lines[-1]  # "nmt.errors.CorpusError: the message"
            raise type(e)(last.split(": ", 1)[1] if last.startswith("nmt.") and ": " in last else last) from None
        raise


def worker_context() -> multiprocessing.context.BaseContext:
    """fork where the platform has it (cheap, inherits the parent's imports), else spawn."""
    return multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")


def eval_batches(
    src_ids: list[list[int]], tgt_ids: list[list[int]] | None, max_tokens: int
) -> Iterator[tuple[list[int], Batch]]:
    """Length-sorted batches over an in-memory set; yields (original indices, batch).

    Sources longer than the budget still get a batch of their own, so nothing is dropped.
    """
    tgts = tgt_ids if tgt_ids is not None else [[] for _ in src_ids]
    for g in eval_groups(src_ids, tgt_ids, max_tokens):
        yield g, collate([src_ids[i] for i in g], [tgts[i] for i in g])


def eval_groups(src_ids: list[list[int]], tgt_ids: list[list[int]] | None, max_tokens: int) -> list[list[int]]:
    """The index groups of ``eval_batches``, without collating them."""
    tgts = tgt_ids if tgt_ids is not None else [[] for _ in src_ids]
    lengths = [max(len(s), len(t)) + 1 for s, t in zip(src_ids, tgts)]
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    return token_budget_groups(order, lengths, max_tokens)
