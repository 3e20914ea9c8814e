"""Vocabulary shortlists (nmt.shortlist): the counts, the table, and a shortlisted search equal to a full
search whose logits outside the shortlist are -inf; int8 and bf16 rows; the CLI and the script."""

from __future__ import annotations

import copy
import subprocess
import sys
from collections import Counter

import pytest
import torch

from helpers import REPO, env, run_module, source_file
from nmt import checkpoint
from nmt.data.batching import collate
from nmt.data.corpus import CorpusSpec, load_pairs
from nmt.data.tokenizer import EOS
from nmt.models import quant
from nmt.models.decoder import output_rows
from nmt.models.seq2seq import Ensemble
from nmt.runtime import load_model
from nmt.search import SearchOptions, beam_search
from nmt.shortlist import SPECIALS, Shortlist, build, cooccurrence, coverage, from_pairs


def test_cooccurrence_counts_match_a_direct_count():
    g = torch.Generator().manual_seed(0)

    def sentence(vocab: int) -> list[int]:
        return torch.randint(4, vocab, (int(torch.randint(1, 7, (1,), generator=g)),), generator=g).tolist()

    src = [sentence(12) for _ in range(60)]
    tgt = [sentence(15) for _ in range(60)]
    s, t, c, df_s, df_t = cooccurrence(src, tgt, 12, 15)
    want = Counter((a, b) for x, y in zip(src, tgt) for a in set(x) for b in set(y))
    assert dict(zip(zip(s.tolist(), t.tolist()), c.tolist())) == dict(want)
    assert df_s.tolist() == [sum(i in set(x) for x in src) for i in range(12)]
    assert df_t.tolist() == [sum(i in set(y) for y in tgt) for i in range(15)]


def test_build_keeps_the_specials_the_frequent_and_each_source_piece_strongest_associates():
    # source 5 always comes with target 9; target 8 is in every sentence (frequent); 6 goes with 10 or 11
    src = [[5, 6], [5], [5, 7], [6], [6, 7], [7]]
    tgt = [[9, 8, 10], [9, 8], [9, 8, 12], [8, 10], [8, 11, 12], [8, 12]]
    short = build(src, tgt, 8, 13, frequent=1, per_source=2)
    assert short.frequent.tolist() == [0, 1, 2, 3, 8]
    assert short.table.shape == (8, 2)
    assert short.table[5, 0] == 9  # Dice 1.0
    assert short.table[7, 0] == 12  # in all three of its sentences
    assert set(short.table[6].tolist()) == {10, 11} and short.table[6, 0] == 10  # 10 twice, 11 once
    assert short.table[4].tolist() == [EOS, EOS]  # never seen: nothing but the frequent ones
    assert 8 not in short.table.flatten().tolist()  # frequent pieces are not listed again
    ids = short.select(torch.tensor([[5, 6, 0], [7, 0, 0]]))  # 0 = PAD, ignored
    assert ids.tolist() == sorted(ids.tolist()) and ids[:SPECIALS].tolist() == [0, 1, 2, 3]
    assert ids.tolist() == [0, 1, 2, 3, 8, 9, 10, 11, 12]  # the frequent ones, 5: 9 10, 6: 10 11, 7: 12 11
    stored = short.state_dict()
    assert stored["table"].dtype == torch.int16  # ids below 2**15: stored narrow, read back as long
    back = Shortlist.from_state_dict(stored)
    assert torch.equal(back.table, short.table) and back.sizes == (1, 2) and back.table.dtype == torch.long
    with pytest.raises(ValueError, match="per_source"):
        build(src, tgt, 8, 13, frequent=1, per_source=0)


class Masked:
    """The full-vocabulary model with every logit outside ``vocab`` at -inf: what a shortlisted search
    must equal (its softmax is normalised over the shortlist)."""

    def __init__(self, model, vocab):
        self.model, self.vocab = model, vocab

    def start(self, src, src_len):
        return self.model.start(src, src_len)

    def step(self, y, state):
        logits, state, w = self.model.step(y, state)
        masked = torch.full_like(logits, float("-inf"))
        masked[:, self.vocab] = logits[:, self.vocab]
        return masked, state, w


@pytest.fixture(scope="module")
def trained_shortlist(trained, sample_dir):
    run, _, _ = trained
    model, tok = load_model(str(run / "checkpoints" / "best.pt"), torch.device("cpu"))
    short = from_pairs(load_pairs(CorpusSpec(str(sample_dir / "train.tsv"))), tok, frequent=40, per_source=4)
    srcs = [line.split("\t")[0] for line in (sample_dir / "test.tsv").read_text().splitlines()][:60]
    ids = tok.encode_src(srcs)
    return model, tok, short, collate(ids, [[5]] * len(ids))


@pytest.mark.parametrize("opts", [SearchOptions(beam_size=4), SearchOptions(beam_size=3, no_repeat_ngram=2)])
def test_a_shortlisted_search_equals_the_full_search_over_logits_masked_to_the_shortlist(trained_shortlist, opts):
    model, tok, short, b = trained_shortlist
    vocab = short.select(b.src)
    assert SPECIALS < len(vocab) < tok.tgt_vocab_size  # a real restriction
    got = beam_search(model, b.src, b.src_len, opts, vocab=vocab)
    want = beam_search(Masked(model, vocab), b.src, b.src_len, opts)
    allowed = set(vocab.tolist())
    for g, w in zip(got, want):
        assert g[0].tokens == w[0].tokens
        assert g[0].score == pytest.approx(w[0].score, abs=1e-4)
        assert set(g[0].tokens) <= allowed


def test_an_ensemble_searches_the_same_shortlist_in_every_member(trained_shortlist):
    model, _, short, b = trained_shortlist
    vocab, opts = short.select(b.src), SearchOptions(beam_size=3)
    single = beam_search(model, b.src, b.src_len, opts, vocab=vocab)
    pair = beam_search(Ensemble([model, model]), b.src, b.src_len, opts, vocab=vocab)
    assert [h[0].tokens for h in pair] == [h[0].tokens for h in single]


def test_a_shortlist_of_the_whole_vocabulary_is_the_plain_search(trained_shortlist):
    model, tok, _, b = trained_shortlist
    opts = SearchOptions(beam_size=3)
    got = beam_search(model, b.src, b.src_len, opts, vocab=torch.arange(tok.tgt_vocab_size))
    want = beam_search(model, b.src, b.src_len, opts)
    assert [h[0].tokens for h in got] == [h[0].tokens for h in want]
    assert [h[0].score for h in got] == pytest.approx([h[0].score for h in want], abs=1e-5)
    with pytest.raises(ValueError, match="special ids"):
        beam_search(model, b.src, b.src_len, opts, vocab=torch.arange(1, tok.tgt_vocab_size))


def test_int8_and_bf16_shortlist_rows_are_the_full_products_rows(trained_shortlist, seeded):
    model, _, short, b = trained_shortlist
    vocab = short.select(b.src)
    x = torch.randn(7, model.decoder.out.in_features)
    q = quant.quantize(copy.deepcopy(model), "int8").decoder.out
    torch.testing.assert_close(q.rows(vocab)(x), q(x)[:, vocab], rtol=1e-5, atol=1e-5)
    full = model.decoder.out
    with torch.no_grad():
        torch.testing.assert_close(output_rows(full, vocab, None)(x), full(x)[:, vocab], rtol=1e-5, atol=1e-5)
        bf16 = output_rows(full, vocab, torch.bfloat16)(x)
        assert bf16.dtype == torch.bfloat16
        torch.testing.assert_close(bf16.float(), full(x)[:, vocab], rtol=0.05, atol=0.05)


def test_coverage_counts_reference_pieces_inside_the_batch_shortlist():
    short = Shortlist(torch.arange(5), torch.tensor([[3], [3], [3], [3], [3], [6], [7]]), (1, 1))
    src = torch.tensor([[5, 0], [5, 0]])  # shortlist {0..4, 6}
    share, size = coverage(short, [(src, [[6, 4], [7, 9]])])
    assert share == pytest.approx(2 / 4) and size == 6


def test_the_script_stores_a_shortlist_that_translate_uses_unless_told_not_to(trained, tmp_path, sample_dir):
    run, cache, _ = trained
    best = tmp_path / "with_shortlist.pt"
    script = [sys.executable, str(REPO / "scripts" / "shortlist.py"), str(run / "checkpoints" / "best.pt")]
    sizes = subprocess.run(
        [*script, "--data", str(sample_dir), "--sizes", "10x2,80x8"],
        env={**env(cache), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert sizes.count("valid.tsv reference pieces inside") == 2 and not best.exists()
    subprocess.run(
        [*script, "--data", str(sample_dir), "--frequent", "40", "--per-source", "4", "--output", str(best)],
        env={**env(cache), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=True,
    )
    lines, src = source_file(sample_dir, tmp_path, 30)
    outs = {}
    for use in ("true", "false"):
        out = tmp_path / f"{use}.txt"
        proc = run_module(
            "nmt.translate", [f"checkpoint={best}", f"input={src}", f"output={out}", f"shortlist={use}"], cache
        )
        outs[use] = out.read_text().splitlines()
        said = "vocabulary shortlist: each batch searches the 40 most frequent target pieces + 4 per source piece"
        assert (said in proc.stderr) == (use == "true")
    assert len(outs["true"]) == len(outs["false"]) == len(lines)
    # shortlist=false (the default) is the search of the checkpoint as it was before the script stored one
    plain = tmp_path / "plain.txt"
    run_module("nmt.translate", [f"checkpoint={run}/checkpoints/best.pt", f"input={src}", f"output={plain}"], cache)
    assert plain.read_text().splitlines() == outs["false"]
    # asked of a checkpoint without one (from before trainer.shortlist): a warning, and the whole vocabulary
    ckpt = checkpoint.load(run / "checkpoints" / "best.pt")
    assert "shortlist" in ckpt  # trainer.shortlist (default) stored one at the end of the run
    del ckpt["shortlist"]
    checkpoint.save(tmp_path / "old.pt", ckpt)
    old = run_module(
        "nmt.translate", [f"checkpoint={tmp_path}/old.pt", f"input={src}", f"output={plain}", "shortlist=true"], cache
    )
    assert "stores no vocabulary shortlist" in old.stderr and plain.read_text().splitlines() == outs["false"]
