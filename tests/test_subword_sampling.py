"""Subword sampling with our own generator (nmt.data.subwords): the same seed gives the same pieces in
any process, the draws follow the distributions of Kudo 2018 / Provilkov et al. 2020, and the
segmentation sentencepiece itself would give is what they reduce to (BPE at p = 0, the unigram
lattice's best path)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from helpers import REPO, tokenizer_cfg
from nmt.data import build_tokenizer
from nmt.data.batching import BatchStream
from nmt.data.corpus import CorpusSpec
from nmt.data.subwords import Sampling, UnigramSampler, merge_unknowns, sampler_for
from nmt.data.tokenizer import EOS, PAD, Tokenizer

ODD = ["", " ", "ünïcödé ★★ 漢字 test", "a  b\tc", "¿Qué?¡Sí!"]  # empty, unknown characters, runs of them


@pytest.fixture(scope="module", params=["unigram", "bpe"])
def tok(request, sample_dir, tmp_path_factory):
    cfg = tokenizer_cfg(tmp_path_factory.mktemp("spm"), model_type=request.param, vocab_size=300, sample_size=2000)
    return build_tokenizer(cfg, CorpusSpec(str(sample_dir / "train.tsv")))


@pytest.fixture(scope="module")
def texts(sample_dir) -> list[str]:
    pairs = [x.split("\t") for x in (sample_dir / "train.tsv").read_text(encoding="utf-8").splitlines()]
    return [s for s, _ in pairs] + [t for _, t in pairs] + ODD


def settings(tok) -> list[Sampling]:
    unigram = sampler_for(tok.src).__class__ is UnigramSampler
    return [Sampling(0.2, -1), Sampling(0.5, 8)] if unigram else [Sampling(0.1)]


SAMPLE_IN_A_NEW_PROCESS = """
import json, sys
from nmt.data.subwords import Sampling
from nmt.data.tokenizer import Tokenizer
tok = Tokenizer(open(sys.argv[1], "rb").read())
lines = json.loads(open(sys.argv[2], encoding="utf-8").read())
out = [tok.sample_pairs(lines, lines[::-1], Sampling(a, n), seed=12345) for a, n in json.loads(sys.argv[3])]
print(json.dumps(out))
"""


def test_the_same_seed_gives_the_same_pieces_in_two_new_processes(tok, texts, tmp_path):
    """The lead measured sentencepiece's own sampler drawing differently in every new process for one
    seed; ours must not: two fresh interpreters and this one agree piece for piece."""
    model, lines = tmp_path / "spm.model", tmp_path / "lines.json"
    model.write_bytes(tok.src_proto)
    lines.write_text(json.dumps(texts[:300]), encoding="utf-8")
    which = json.dumps([[s.alpha, s.nbest] for s in settings(tok)])
    runs = [
        subprocess.run(
            [sys.executable, "-c", SAMPLE_IN_A_NEW_PROCESS, str(model), str(lines), which],
            cwd=REPO,
            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        for _ in range(2)
    ]
    here = [list(map(list, tok.sample_pairs(texts[:300], texts[:300][::-1], s, seed=12345))) for s in settings(tok)]
    assert json.loads(runs[0]) == json.loads(runs[1]) == here
    plain = tok.encode_src(texts[:300])
    assert all(sum(a != b for a, b in zip(got[0], plain)) > 30 for got in here)  # it did sample


def test_another_seed_gives_other_pieces_of_the_same_text(tok, texts):
    some = texts[::5]
    for s in settings(tok):
        a, b = (tok.sample_pairs(some, some, s, seed) for seed in (1, 2))
        assert a != b and a == tok.sample_pairs(some, some, s, 1)
        assert tok.src.decode(a[0]) == tok.src.decode(b[0]) == tok.src.decode(tok.encode_src(some))


def test_bpe_dropout_at_zero_is_sentencepiece_encode(sample_dir, tmp_path, texts):
    cfg = tokenizer_cfg(tmp_path, model_type="bpe", vocab_size=300, sample_size=2000)
    bpe = build_tokenizer(cfg, CorpusSpec(str(sample_dir / "train.tsv")))
    assert sampler_for(bpe.src).sample(texts, Sampling(0.0), np.random.default_rng(0)) == bpe.encode_src(texts)


def viterbi(sampler: UnigramSampler, text: str) -> list[int]:
    """The best path through our lattice (ties: the first piece found, as sentencepiece keeps it)."""
    ends = sampler.lattice(text)
    best: list[tuple[float, int, int]] = [(0.0, -1, -1)]
    for j in range(1, len(text) + 1):
        best.append(max(((best[i][0] + s, i, x) for i, x, s in ends[j]), key=lambda t: t[0]))
    ids, j = [], len(text)
    while j > 0:
        ids.append(best[j][2])
        j = best[j][1]
    return merge_unknowns(ids[::-1], sampler.p.unk)


def test_our_unigram_lattice_is_sentencepieces(sample_dir, tmp_path, texts):
    """Its best path is sentencepiece's encode on every sentence of the sample corpus (and odd text):
    the same pieces, scores and unknown-character penalty, so sampling from it samples P(x)^alpha."""
    cfg = tokenizer_cfg(tmp_path, model_type="unigram", vocab_size=300, sample_size=2000)
    uni = build_tokenizer(cfg, CorpusSpec(str(sample_dir / "train.tsv")))
    sampler = sampler_for(uni.src)
    assert [viterbi(sampler, t) for t in uni.src.normalize(texts)] == uni.encode_src(texts)


def exact(tok, text: str, alpha: float, nbest: int) -> dict[tuple[int, ...], float]:
    """P(x)^alpha normalised over the ``nbest`` best segmentations (all when fewer exist)."""
    cands = tok.src.nbest_encode(text, nbest_size=nbest)
    scores = [alpha * sum(tok.src.get_score(i) for i in c) for c in cands]
    z = math.log(sum(math.exp(s - max(scores)) for s in scores)) + max(scores)
    return {tuple(c): math.exp(s - z) for c, s in zip(cands, scores)}


@pytest.mark.parametrize("nbest", [-1, 4])
def test_unigram_draws_follow_p_of_x_to_the_alpha(sample_dir, tmp_path, nbest):
    """Kudo 2018: a segmentation x is drawn with probability ∝ P(x)^alpha, among all of them (-1: the
    lattice, checked against every segmentation listed by sentencepiece's n-best) or the best 4."""
    cfg = tokenizer_cfg(tmp_path, model_type="unigram", vocab_size=300, sample_size=2000)
    uni = build_tokenizer(cfg, CorpusSpec(str(sample_dir / "train.tsv")))
    text, alpha, n = "We are friends.", 0.5, 20000
    every = exact(uni, text, alpha, 512)  # sentencepiece lists at most 512
    assert 20 < len(every) < 512  # a real choice, and sentencepiece listed every segmentation
    want = every if nbest == -1 else exact(uni, text, alpha, nbest)
    draws = sampler_for(uni.src).sample([text] * n, Sampling(alpha, nbest), np.random.default_rng(0))
    drawn = Counter(map(tuple, draws))
    assert set(drawn) <= set(want)
    total_variation = sum(abs(drawn[x] / n - p) for x, p in want.items()) / 2
    assert total_variation < 0.03, total_variation


def test_sampling_off_is_plain_encoding_and_builds_no_sampler(tok, sample_dir):
    """alpha = 0: the stream encodes with sentencepiece's encode, and no sampler is built (nor paid for)."""
    fresh = Tokenizer.from_state_dict(tok.state_dict())
    spec = CorpusSpec(str(sample_dir / "train.tsv"))
    args = dict(max_len=1000, max_tokens=6000, bucket_size=1000, shuffle_buffer=1, seed=7, sampling=Sampling())
    batches = list(BatchStream(spec, fresh.state_dict(), **args).epoch_batches(fresh, 0))
    sources = [x.split("\t")[0] for x in (sample_dir / "train.tsv").read_text(encoding="utf-8").splitlines()]
    got = sorted(row[(row != PAD) & (row != EOS)].tolist() for b in batches for row in b.src)
    assert got == sorted(fresh.encode_src(sources)) and fresh._samplers is None
