"""Token-budget batches: budget respected, padding masks right, deterministic, resumable."""

from __future__ import annotations

import itertools

import pytest
import torch

from helpers import tokenizer_cfg
from nmt.data import build_tokenizer
from nmt.data.batching import (
    BatchStream,
    collate,
    eval_batches,
    shard_starts,
    shuffle_options,
    token_budget_groups,
)
from nmt.data.corpus import CorpusSpec
from nmt.data.tokenizer import BOS, EOS, PAD
from nmt.errors import CorpusError


@pytest.fixture(scope="module")
def tok(sample_dir, tmp_path_factory):
    cfg = tokenizer_cfg(tmp_path_factory.mktemp("spm"), vocab_size=300, sample_size=2000)
    return build_tokenizer(cfg, CorpusSpec(str(sample_dir / "train.tsv")))


def stream(sample_dir, tok, **kw):
    args = dict(max_len=50, max_tokens=300, bucket_size=500, shuffle_buffer=200, seed=7)
    args.update(kw)
    return BatchStream(CorpusSpec(str(sample_dir / "train.tsv")), tok.state_dict(), **args)


def test_collate_layout():
    b = collate([[5, 6], [7]], [[8], [9, 10, 11]])
    assert b.src.tolist() == [[5, 6, EOS], [7, EOS, PAD]]
    assert b.src_len.tolist() == [3, 2]
    assert b.tgt_in.tolist() == [[BOS, 8, PAD, PAD], [BOS, 9, 10, 11]]
    assert b.tgt_out.tolist() == [[8, EOS, PAD, PAD], [9, 10, 11, EOS]]
    assert b.n_tgt_tokens == 6
    assert all(t.dtype == torch.long and t.is_contiguous() for t in (b.src, b.tgt_in, b.tgt_out))


def test_budget_lengths_and_no_pair_lost(sample_dir, tok):
    s = stream(sample_dir, tok, max_len=30)
    batches = list(s.epoch_batches(tok, 0))
    n_pairs = sum(b.src.size(0) for b in batches)
    for b in batches:
        width = max(b.src.size(1), b.tgt_in.size(1))
        assert b.src.size(0) == 1 or b.src.size(0) * width <= 300
        assert b.src.size(1) <= 30 and b.tgt_in.size(1) <= 30
        assert int((b.tgt_out != PAD).sum()) == b.n_tgt_tokens
        assert (b.src != PAD).sum(1).tolist() == b.src_len.tolist()
    # every pair that fits the length filter is in exactly one batch
    srcs = [line.split("\t")[0] for line in (sample_dir / "train.tsv").read_text().splitlines()]
    tgts = [line.split("\t")[1] for line in (sample_dir / "train.tsv").read_text().splitlines()]
    ids_s, ids_t = tok.encode_src(srcs), tok.encode_tgt(tgts)
    fits = sum(0 < len(a) < 30 and 0 < len(b) < 30 for a, b in zip(ids_s, ids_t))
    assert n_pairs == fits
    # bucketing keeps padding low
    real = sum(b.n_tgt_tokens for b in batches)
    padded = sum(b.tgt_out.numel() for b in batches)
    assert padded < 1.2 * real


def test_a_stream_that_keeps_no_pair_says_so_instead_of_reading_the_corpus_forever(sample_dir, tok):
    """data.max_len=2 passes validation, but no sentence of the corpus has fewer than 2 pieces on both sides:
    each epoch yielded nothing and the endless stream re-read the corpus for ever, before its first batch."""
    with pytest.raises(CorpusError, match=r"train.tsv: no training pair left: all \d+ have data.max_len=2 pieces"):
        next(iter(stream(sample_dir, tok, max_len=2)))


def test_max_sentences_caps_the_pairs_per_batch_and_loses_none(sample_dir, tok):
    assert token_budget_groups([0, 1, 2, 3, 4], [2] * 5, 100, max_sentences=2) == [[0, 1], [2, 3], [4]]
    assert token_budget_groups([0, 1, 2, 3, 4], [2] * 5, 6, max_sentences=4) == [[0, 1, 2], [3, 4]]  # tokens bind
    assert token_budget_groups([0, 1, 2], [2] * 3, 100) == [[0, 1, 2]]  # 0: no cap
    capped = list(stream(sample_dir, tok, max_tokens=3000, max_sentences=16).epoch_batches(tok, 0))
    free = list(stream(sample_dir, tok, max_tokens=3000).epoch_batches(tok, 0))
    assert max(b.src.size(0) for b in capped) == 16 < max(b.src.size(0) for b in free)
    assert sum(b.src.size(0) for b in capped) == sum(b.src.size(0) for b in free)


def test_deterministic_for_a_seed_and_epochs_differ(sample_dir, tok):
    a = [b.src for b in stream(sample_dir, tok).epoch_batches(tok, 0)]
    b = [b.src for b in stream(sample_dir, tok).epoch_batches(tok, 0)]
    c = [b.src for b in stream(sample_dir, tok).epoch_batches(tok, 1)]
    assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, c))


def test_resume_position_reproduces_the_stream(sample_dir, tok):
    full = list(itertools.islice(iter(stream(sample_dir, tok)), 30))
    resumed = list(itertools.islice(iter(stream(sample_dir, tok, starts=[(0, 12)])), 18))
    assert [(b.epoch, b.index) for b in resumed] == [(b.epoch, b.index) for b in full[12:]]
    assert all(torch.equal(x.src, y.src) for x, y in zip(resumed, full[12:]))


def test_a_resume_cuts_the_skipped_batches_but_builds_no_tensors_for_them(sample_dir, tok, monkeypatch):
    """Padding the skipped batches into tensors was about a quarter of a resume's wait for its first batch
    (scripts/benchmark_resume.py); the skipped batches are still cut, so the stream goes on exactly."""
    import nmt.data.batching as batching

    built = []
    monkeypatch.setattr(batching, "collate", lambda *a, **k: built.append(a[3]) or collate(*a, **k))
    first = next(iter(stream(sample_dir, tok, starts=[(0, 12)])))
    assert first.index == 12 and built == [12]


def pairs_of(batches, tok):
    """(source ids, target ids) of every pair in the batches, padding stripped."""
    return sorted(
        (tuple(b.src[i][b.src[i] != PAD].tolist()), tuple(b.tgt_out[i][b.tgt_out[i] != PAD].tolist()))
        for b in batches
        for i in range(b.src.size(0))
    )


def test_shards_partition_an_epoch(sample_dir, tok):
    """Two shards of one epoch hold exactly the pairs of the unsharded epoch, none twice."""
    whole = pairs_of(stream(sample_dir, tok).epoch_batches(tok, 0), tok)
    two = stream(sample_dir, tok, shards=[0, 1], num_shards=2)
    parts = [pairs_of(two.epoch_batches(tok, 0, shard), tok) for shard in (0, 1)]
    assert parts[0] and parts[1] and not set(parts[0]) & set(parts[1])
    assert sorted(parts[0] + parts[1]) == whole


def test_rank_streams_interleave_to_the_accumulating_stream(sample_dir, tok):
    """Rank r of 2 (accum 1) yields exactly the micro-batches r of one process with accum_steps=2."""
    one = list(itertools.islice(iter(stream(sample_dir, tok, shards=[0, 1], num_shards=2)), 20))
    ranks = [list(itertools.islice(iter(stream(sample_dir, tok, shards=[r], num_shards=2)), 10)) for r in (0, 1)]
    for r in (0, 1):
        assert [(b.shard, b.epoch, b.index) for b in one[r::2]] == [(b.shard, b.epoch, b.index) for b in ranks[r]]
        assert all(torch.equal(x.tgt_out, y.tgt_out) for x, y in zip(one[r::2], ranks[r]))


def test_shard_starts():
    assert shard_starts([[0, 4], [1, 2]], 2) == ([(0, 5), (1, 3)], True)
    # a different shard count: the oldest epoch, the old shards' mean position rescaled
    starts, exact = shard_starts([[3, 9], [3, 19]], 1)
    assert (starts, exact) == ([(3, 30)], False)
    starts, exact = shard_starts([[2, 29]], 3)
    assert (starts, exact) == ([(2, 10)] * 3, False)


def test_eval_batches_cover_everything_in_order():
    src = [[5] * n for n in (3, 9, 1, 4, 200)]
    seen = []
    for idx, b in eval_batches(src, None, max_tokens=20):
        seen += idx
        assert b.src.size(0) == len(idx)
    assert sorted(seen) == list(range(5))  # the over-long one still gets a batch of its own


def test_an_unfinished_batch_stream_closes_quietly_at_interpreter_exit(monkeypatch):
    """At exit Python closes a suspended generator after it may have cleared module globals; the stream's
    error handler must not then evaluate ``except NmtError`` (None by then: "Exception ignored ... TypeError")."""
    from nmt.data import batching

    stream = batching.worker_errors(iter(range(3)))
    assert next(stream) == 0
    monkeypatch.setattr(batching, "NmtError", None)  # what interpreter teardown leaves behind
    stream.close()  # raised TypeError before the fix


def test_a_one_shard_stream_is_shuffled_without_the_shard_interleaving_and_in_the_same_order(sample_dir):
    """``shuffle_options`` leaves out datasets' shard interleaving for a local TSV (one shard), which cost 80-110 µs
    a row; the shuffled rows must come in exactly the order of datasets' default shuffle, epoch by epoch."""
    from nmt.data.corpus import stream_pairs

    spec = CorpusSpec(str(sample_dir / "train.tsv"))
    ds = stream_pairs(spec)
    assert shuffle_options(ds) == {"max_buffer_input_shards": 1}
    for epoch in (0, 1):
        rows = []
        for options in ({}, shuffle_options(ds)):
            shuffled = stream_pairs(spec).shuffle(seed=3, buffer_size=500, **options)
            shuffled.set_epoch(epoch)
            rows.append([(r["src"], r["tgt"]) for r in shuffled])
        assert rows[0] == rows[1] and len(rows[0]) > 1000
        assert rows[0] != [(r["src"], r["tgt"]) for r in stream_pairs(spec)]  # shuffled, not the file's order


def test_the_training_loader_takes_data_max_sentences_from_the_config(sample_dir, tok):
    from helpers import compose_cfg
    from nmt.runner import build_loader

    cfg = compose_cfg([f"data.dir={sample_dir}", "data.max_sentences=8", "data.num_workers=0", "data.max_tokens=3000"])
    loader = build_loader(cfg, CorpusSpec(str(sample_dir / "train.tsv")), tok, torch.device("cpu"))
    sizes = [next(loader).src.size(0) for _ in range(30)]
    assert max(sizes) == 8
