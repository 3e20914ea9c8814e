"""Data-side regularisers of the training stream: subword sampling and word dropout.

Sampling must differ between epochs, repeat for a seed (across processes too: tests/test_subword_sampling.py)
and never reach validation; word dropout must hit real input tokens at the configured rate and nothing
else; and a run with both resumes exactly.
"""

from __future__ import annotations

import copy
import itertools
import re

import pytest
import torch
from hydra import compose, initialize_config_dir

from helpers import REPO, TINY, run_module, tokenizer_cfg
from nmt.config import register_configs, to_plain, validate
from nmt.data import build_tokenizer
from nmt.data.batching import BatchStream, collate, word_dropout
from nmt.data.corpus import CorpusSpec
from nmt.data.tokenizer import BOS, EOS, PAD, UNK, Sampling
from nmt.errors import ConfigError
from nmt.training import config_changes

SAMPLED = Sampling(alpha=0.2, nbest=-1)
NEW_KEYS = [
    ("tokenizer", "sample_alpha"),
    ("tokenizer", "sample_nbest"),
    ("data", "src_word_dropout"),
    ("data", "tgt_word_dropout"),
]


@pytest.fixture(scope="module", params=["unigram", "bpe"])
def tok(request, sample_dir, tmp_path_factory):
    cfg = tokenizer_cfg(tmp_path_factory.mktemp("spm"), model_type=request.param, vocab_size=300, sample_size=2000)
    return build_tokenizer(cfg, CorpusSpec(str(sample_dir / "train.tsv")))


def stream(sample_dir, tok, **kw) -> BatchStream:
    args = dict(max_len=1000, max_tokens=6000, bucket_size=1000, shuffle_buffer=1, seed=7, sampling=SAMPLED)
    args.update(kw)
    return BatchStream(CorpusSpec(str(sample_dir / "train.tsv")), tok.state_dict(), **args)


def sources(batches) -> list[tuple[int, ...]]:
    """Every pair's source ids (EOS and padding stripped), sorted: an epoch's content, whatever its order."""
    return sorted(tuple(row[(row != PAD) & (row != EOS)].tolist()) for b in batches for row in b.src)


def test_sampling_differs_between_epochs_and_keeps_the_text(sample_dir, tok):
    """No shuffle (shuffle_buffer=1): every epoch holds the same pairs, so without sampling the same ids;
    with sampling, new segmentations of the same sentences each epoch."""
    plain = [sources(stream(sample_dir, tok, sampling=Sampling()).epoch_batches(tok, e)) for e in (0, 1)]
    sampled = [sources(stream(sample_dir, tok).epoch_batches(tok, e)) for e in (0, 1)]
    assert plain[0] == plain[1]
    assert sampled[0] != sampled[1] and sampled[0] != plain[0]
    changed = sum(a != b for a, b in zip(sampled[0], plain[0]))
    assert changed > len(plain[0]) // 10  # not a rare event: a real share of the sentences is re-segmented
    # a sampled segmentation is still the sentence: it decodes to the same text
    assert sorted(tok.src.decode(list(s)) for s in sampled[1]) == sorted(tok.src.decode(list(s)) for s in plain[0])


def test_sampling_and_word_dropout_resume_exactly_within_a_process(sample_dir, tok):
    """A stream resumed at a saved position (in the same process) yields exactly the batches the
    uninterrupted one did, into the next epoch, and building the stream twice gives the same batches."""
    kw = dict(word_dropout=(0.1, 0.1))
    full = list(itertools.islice(iter(stream(sample_dir, tok, **kw)), 40))
    again = list(itertools.islice(iter(stream(sample_dir, tok, **kw)), 40))
    resumed = list(itertools.islice(iter(stream(sample_dir, tok, starts=[(0, 12)], **kw)), 28))
    assert full[-1].epoch >= 1  # the comparison crosses an epoch boundary
    for x, y in [*zip(full, again), *zip(full[12:], resumed)]:
        assert (x.epoch, x.index) == (y.epoch, y.index)
        assert torch.equal(x.src, y.src) and torch.equal(x.tgt_in, y.tgt_in) and torch.equal(x.tgt_out, y.tgt_out)


def test_sampling_never_leaks_into_plain_encoding(tok, sample_dir):
    """Validation, translation, serving and evaluation encode with encode_src/encode_tgt: the single best
    segmentation, the same before and right after the training stream sampled."""
    lines = (sample_dir / "valid.tsv").read_text(encoding="utf-8").splitlines()[:100]
    srcs, tgts = [x.split("\t")[0] for x in lines], [x.split("\t")[1] for x in lines]
    before = tok.encode_src(srcs), tok.encode_tgt(tgts)
    sampled = tok.sample_pairs(srcs, tgts, SAMPLED, seed=3)
    assert sampled != before
    assert (tok.encode_src(srcs), tok.encode_tgt(tgts)) == before
    assert tok.sample_pairs(srcs, tgts, SAMPLED, seed=3) == sampled  # and sampling itself is seeded


def test_word_dropout_rate_and_what_it_never_touches():
    g = torch.Generator().manual_seed(0)
    srcs = [torch.randint(4, 300, (int(n),), generator=g).tolist() for n in torch.randint(1, 60, (400,), generator=g)]
    tgts = [torch.randint(4, 300, (int(n),), generator=g).tolist() for n in torch.randint(1, 60, (400,), generator=g)]
    clean = collate(srcs, tgts)
    noisy = word_dropout(clean, 0.3, 0.1, seed=5)
    real_src = (clean.src != PAD) & (clean.src != EOS)
    real_tgt = (clean.tgt_in != PAD) & (clean.tgt_in != BOS)
    src_rate = (noisy.src[real_src] == UNK).float().mean().item()
    tgt_rate = (noisy.tgt_in[real_tgt] == UNK).float().mean().item()
    assert abs(src_rate - 0.3) < 0.02 and abs(tgt_rate - 0.1) < 0.015, (src_rate, tgt_rate)
    # only real input pieces change, and only to UNK; the loss targets and the specials stay
    assert torch.equal(noisy.src[~real_src], clean.src[~real_src])
    assert torch.equal(noisy.tgt_in[~real_tgt], clean.tgt_in[~real_tgt])
    assert torch.equal(noisy.tgt_out, clean.tgt_out) and noisy.n_tgt_tokens == clean.n_tgt_tokens
    changed = (noisy.src != clean.src) | (noisy.tgt_in != clean.tgt_in)
    assert ((noisy.src == UNK) | (noisy.src == clean.src)).all() and changed.any()
    # seeded: the same seed the same mask, another seed another
    assert torch.equal(word_dropout(clean, 0.3, 0.1, seed=5).src, noisy.src)
    assert not torch.equal(word_dropout(clean, 0.3, 0.1, seed=6).src, noisy.src)
    assert word_dropout(clean, 0.0, 0.0, seed=5) is clean


def train_cfg(*overrides):
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return compose("config", overrides=["attention=bahdanau", *overrides])


@pytest.mark.parametrize(
    "overrides,expect",
    [
        (["tokenizer.sample_alpha=-0.1"], ["tokenizer.sample_alpha=-0.1: expected >= 0"]),
        (["tokenizer.model_type=bpe", "tokenizer.sample_alpha=1.0"], ["BPE-dropout probability, expected in [0, 1)"]),
        (["tokenizer.sample_nbest=1"], ["tokenizer.sample_nbest=1: expected -1"]),
        (["tokenizer.sample_nbest=513"], ["tokenizer.sample_nbest=513: expected -1 (all segmentations) or 2 to 512"]),
        (
            ["data.src_word_dropout=1.0", "data.tgt_word_dropout=-0.1"],
            ["data.src_word_dropout=1.0: expected a probability in [0, 1)", "data.tgt_word_dropout=-0.1"],
        ),
    ],
)
def test_bad_regulariser_settings_fail_in_one_line_each(overrides, expect):
    with pytest.raises(ConfigError) as e:
        validate(train_cfg(*overrides), "train")
    lines = str(e.value).splitlines()
    assert len(lines) == len(expect)
    for line, want in zip(lines, expect):
        assert want in line


def test_good_regulariser_settings_pass():
    validate(train_cfg("tokenizer.sample_alpha=0.5", "tokenizer.sample_nbest=8", "data.src_word_dropout=0.2"), "train")
    validate(train_cfg("tokenizer.model_type=bpe", "tokenizer.sample_alpha=0.1"), "train")


def step_losses(log: str) -> dict[int, str]:
    return {int(k): v for k, v in re.findall(r"step (\d+)  epoch \d+  train loss (\S+)", log)}


def test_a_regularised_run_and_its_resume_train_on_the_same_batches(tmp_path, sample_dir):
    """Through the CLI: stopped at step 6 and resumed to 12, a run with subword sampling and word dropout
    logs the same loss at every step as one that ran 12 steps at once (the DataLoader worker of the
    resumed run, a new process, redraws the same segmentations and masks). BPE-dropout draws with the
    same generator; tests/test_subword_sampling.py holds both samplers to the same pieces across processes."""
    cache = tmp_path / "cache"
    common = [
        f"data.dir={sample_dir}",
        *TINY,
        "tokenizer.sample_alpha=0.1",
        "data.src_word_dropout=0.1",
        "data.tgt_word_dropout=0.1",
        "trainer.log_every=1",
        "trainer.valid_every=6",
        "data.valid_max_sentences=5",
    ]
    ref = run_module("nmt.train", [*common, "trainer.max_steps=12", f"hydra.run.dir={tmp_path}/ref"], cache)
    logged = "training stream: subword sampling alpha=0.1 nbest=-1, word dropout source 0.1 target input 0.1"
    assert logged in ref.stderr
    run = [*common, f"hydra.run.dir={tmp_path}/run"]
    first = run_module("nmt.train", [*run, "trainer.max_steps=6"], cache)
    second = run_module("nmt.train", [*run, "trainer.max_steps=12", "trainer.resume=true"], cache)
    assert "step 6," in second.stderr and "resuming from" in second.stderr
    resumed = {**step_losses(first.stderr), **step_losses(second.stderr)}
    assert len(resumed) == 12 and resumed == step_losses(ref.stderr)


def test_a_checkpoint_written_before_these_keys_still_resumes():
    """A saved config without the new keys (an older checkpoint) matches a current one that leaves them at
    their defaults, and only a real change is refused."""
    current = to_plain(train_cfg())
    saved = copy.deepcopy(current)
    for section, key in NEW_KEYS:
        del saved[section][key]
    assert config_changes(saved, current, []) == []
    current["data"]["src_word_dropout"] = 0.1
    assert config_changes(saved, current, []) == [("data.src_word_dropout", 0.0, 0.1)]
