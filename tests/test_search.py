"""Beam search: greedy equivalence, never worse than greedy, n-best, length penalty, stopping rule."""

from __future__ import annotations

import math

import pytest
import torch

from nmt.checkpoint import average
from nmt.data.batching import collate
from nmt.data.tokenizer import BOS, EOS
from nmt.models.seq2seq import Ensemble
from nmt.runtime import load_model
from nmt.search import SearchOptions, beam_search, best_candidates, greedy, length_penalty

A, B_, C = 4, 5, 6  # ordinary tokens of the toy model
V = 7


class ToyState:
    def index_select(self, idx):
        return self

    reorder_beams = index_select


class Toy:
    """A 'model' whose next-token distribution depends only on the previous token."""

    def __init__(self, table: dict[int, dict[int, float]]):
        self.table, self.sizes = table, []

    def start(self, src, src_len):
        self.S = src.size(1)
        return ToyState()

    def row(self, prev: int) -> torch.Tensor:
        probs = torch.full((V,), 1e-6)
        for tok, p in self.table.get(prev, {EOS: 1.0}).items():
            probs[tok] = p
        return torch.log(probs / probs.sum())

    def step(self, y, state):
        self.sizes.append(y.numel())
        return torch.stack([self.row(int(t)) for t in y]), state, torch.full((y.numel(), self.S), 1.0 / self.S)


def src_batch(lengths=(3,)):
    return collate([[A] * n for n in lengths], [[A]] * len(lengths))


def test_length_penalty_definition():
    assert float(length_penalty(1, 1.0)) == pytest.approx(1.0)
    assert float(length_penalty(7, 0.5)) == pytest.approx(math.sqrt(2.0))
    assert float(length_penalty(10, 0.0)) == 1.0


def test_stopping_at_the_first_finished_hypothesis_would_be_wrong():
    """EOS at step 1 (p=.5) vs A then EOS (p=.5*.9): the longer one wins once lengths are penalised."""
    toy = Toy({BOS: {EOS: 0.5, A: 0.5}, A: {EOS: 0.9, B_: 0.1}})
    b = src_batch()
    short = beam_search(toy, b.src, b.src_len, SearchOptions(beam_size=2, alpha=0.0))[0][0]
    assert short.tokens == [] and short.score == pytest.approx(math.log(0.5), abs=1e-4)
    long = beam_search(toy, b.src, b.src_len, SearchOptions(beam_size=2, alpha=1.0))[0][0]
    assert long.tokens == [A]
    assert long.score == pytest.approx(math.log(0.45) / ((5 + 2) / 6), abs=1e-4)
    assert long.log_prob == pytest.approx(math.log(0.45), abs=1e-4)


def test_early_stop_may_miss_a_longer_winner_that_exact_finds():
    """EOS at step 1 (p=.5) vs A B C EOS (p=.4): under alpha=1 the longer one scores best
    (log .4 / lp(4) > log .5 / lp(1)), but "early" stops at step 1 because A ending at step 2 would
    score worse than the finished EOS; with alpha=0 both rules agree (the bound is exact)."""
    toy = Toy({BOS: {EOS: 0.5, A: 0.4, C: 0.1}, A: {B_: 1.0}, B_: {C: 1.0}, C: {EOS: 1.0}})
    b = src_batch()
    exact = beam_search(toy, b.src, b.src_len, SearchOptions(beam_size=2, alpha=1.0))[0][0]
    steps_exact = len(toy.sizes)
    toy.sizes.clear()
    early = beam_search(toy, b.src, b.src_len, SearchOptions(beam_size=2, alpha=1.0, stop="early"))[0][0]
    assert early.tokens == [] and len(toy.sizes) == 1
    assert exact.tokens == [A, B_, C] and exact.score > early.score and steps_exact >= 4
    for stop in ("exact", "early"):
        assert beam_search(toy, b.src, b.src_len, SearchOptions(beam_size=2, alpha=0.0, stop=stop))[0][0].tokens == []
    with pytest.raises(ValueError, match="stop must be one of exact, early"):
        SearchOptions(stop="sometimes")


def test_min_length_and_repeat_blocking():
    toy = Toy({BOS: {EOS: 0.6, A: 0.4}, A: {EOS: 0.5, A: 0.45, B_: 0.05}, B_: {A: 0.9, EOS: 0.1}})
    b = src_batch((4,))
    hyp = beam_search(toy, b.src, b.src_len, SearchOptions(beam_size=3, alpha=0.0, min_len_ratio=1.0))[0][0]
    assert len(hyp.tokens) >= 4  # min length = 1.0 * (4 pieces + EOS) - its EOS
    hyp = beam_search(
        toy, b.src, b.src_len, SearchOptions(beam_size=3, alpha=0.0, min_len_ratio=1.5, no_repeat_ngram=2)
    )[0][0]
    bigrams = list(zip(hyp.tokens, hyp.tokens[1:]))
    assert len(bigrams) == len(set(bigrams)) and len(hyp.tokens) >= 7


def test_finished_sentences_leave_the_batch():
    toy = Toy({BOS: {A: 1.0}, A: {A: 1.0}})  # only the length limit ends a sentence
    b = src_batch((1, 3, 8))
    out = beam_search(toy, b.src, b.src_len, SearchOptions(beam_size=2, alpha=1.0, max_len_ratio=1.0))
    assert [len(h[0].tokens) + 1 for h in out] == [12, 14, 19]  # limit: ratio * (n + EOS) + 10
    assert toy.sizes[0] == 3  # the first step once per sentence: its beams start identical
    rest = toy.sizes[1:]  # then 3 sentences x 2 beams, shrinking as sentences end
    assert rest[0] == 6 and rest[-1] == 2 and sorted(rest, reverse=True) == rest


def test_a_beam_wider_than_the_vocabulary():
    """The first step searches one beam per sentence, whose candidates (V) can be fewer than the beam:
    the missing beams start dead, and the search still finds every hypothesis there is."""
    toy = Toy({BOS: {A: 0.5, B_: 0.3, C: 0.2}, A: {EOS: 1.0}, B_: {EOS: 1.0}, C: {EOS: 1.0}})
    b = src_batch((2, 3))
    out = beam_search(toy, b.src, b.src_len, SearchOptions(beam_size=V + 1, n_best=3, alpha=0.0))
    for nbest in out:
        assert [h.tokens for h in nbest] == [[A], [B_], [C]]
        assert [round(math.exp(h.log_prob), 3) for h in nbest] == [0.5, 0.3, 0.2]


@pytest.fixture(scope="module")
def trained_model(trained):
    run, _, _ = trained
    model, tok = load_model(str(run / "checkpoints" / "best.pt"), torch.device("cpu"))
    return model, tok, run


def sample_batch(tok, sample_dir, n: int = 200):
    srcs = [line.split("\t")[0] for line in (sample_dir / "test.tsv").read_text().splitlines()][:n]
    ids = tok.encode_src(srcs)
    return ids, collate(ids, [[A]] * len(ids))


def naive_greedy(model, src_ids: list[int], limit: int) -> list[int]:
    b = collate([src_ids], [[A]])
    state = model.start(b.src, b.src_len)
    y, out = torch.tensor([BOS]), []
    for _ in range(limit):
        logits, state, _ = model.step(y, state)
        y = logits.argmax(-1)
        if int(y) == EOS:
            break
        out.append(int(y))
    return out


def test_beam_one_equals_greedy(trained_model, sample_dir):
    model, tok, _ = trained_model
    ids, b = sample_batch(tok, sample_dir, 40)
    batched = greedy(model, b.src, b.src_len)
    for i, s in enumerate(ids):
        limit = int((len(s) + 1) * 2.0) + 10
        assert batched[i].tokens == naive_greedy(model, s, limit)[: limit - 1], i


def test_beam_never_scores_worse_than_greedy_and_nbest_is_sorted(trained_model, sample_dir):
    model, tok, _ = trained_model
    _, b = sample_batch(tok, sample_dir)
    g = greedy(model, b.src, b.src_len)
    nbest = beam_search(model, b.src, b.src_len, SearchOptions(beam_size=5, n_best=5, alpha=0.0))
    for i, (gh, hyps) in enumerate(zip(g, nbest)):
        assert hyps[0].log_prob >= gh.log_prob - 1e-4, i
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True) and len(hyps) == 5
        assert len({tuple(h.tokens) for h in hyps}) == len(hyps)


def test_ensemble_of_a_model_with_itself_is_the_model(trained_model, sample_dir):
    model, tok, _ = trained_model
    _, b = sample_batch(tok, sample_dir, 30)
    opts = SearchOptions(beam_size=4)
    single = beam_search(model, b.src, b.src_len, opts)
    double = beam_search(Ensemble([model, model]), b.src, b.src_len, opts)
    for s, d in zip(single, double):
        assert s[0].tokens == d[0].tokens and s[0].score == pytest.approx(d[0].score, abs=1e-4)


def test_averaging_identical_checkpoints_is_the_identity(trained_model):
    model, _, run = trained_model
    path = str(run / "checkpoints" / "best.pt")
    avg = average([path, path])
    for k, v in model.state_dict().items():
        torch.testing.assert_close(avg["model"][k], v)


def test_early_stop_never_beats_exact_and_equals_it_without_length_penalty(trained_model, sample_dir):
    model, tok, _ = trained_model
    _, b = sample_batch(tok, sample_dir, 100)
    run = {}
    for stop in ("exact", "early"):
        for alpha in (0.0, 1.0):
            run[stop, alpha] = beam_search(model, b.src, b.src_len, SearchOptions(beam_size=4, alpha=alpha, stop=stop))
    for i in range(len(run["exact", 0.0])):
        assert run["exact", 0.0][i][0].tokens == run["early", 0.0][i][0].tokens, i
        assert run["exact", 1.0][i][0].score >= run["early", 1.0][i][0].score - 1e-5, i


def test_stop_key_reaches_the_search_and_is_validated(trained_model):
    from omegaconf import OmegaConf

    from nmt.config import DecodeConfig, validate
    from nmt.errors import ConfigError
    from nmt.runtime import load_translator, search_options

    _, _, run = trained_model
    cfg = OmegaConf.merge(OmegaConf.structured(DecodeConfig), {"checkpoint": "x.pt", "stop": "sometimes"})
    with pytest.raises(ConfigError, match=r"stop='sometimes' is unknown; choose one of exact, early"):
        validate(cfg, "translate")
    best = str(run / "checkpoints" / "best.pt")
    cfg = OmegaConf.merge(OmegaConf.structured(DecodeConfig), {"checkpoint": best, "device": "cpu", "stop": "early"})
    assert load_translator(cfg).search.stop == "early"
    assert "stop=early" in search_options(cfg)[1]
    assert "stop" not in search_options(OmegaConf.merge(cfg, {"stop": "exact"}))[1]
    unset = OmegaConf.merge(cfg, {"stop": None})  # the default: the checkpoint's choice, else exact
    assert OmegaConf.structured(DecodeConfig).stop is None and search_options(unset)[0].stop == "exact"


@pytest.mark.parametrize("K,V_", [(5, 40), (4, 7), (1, 3)])
def test_best_candidates_equal_the_full_k_by_v_selection(K, V_):
    """The search's two-stage selection (the 2K best per beam, then the 2K best of those) picks the same
    continuations with the same scores as ranking all K·V candidates of log_softmax at once, with dead
    beams (-inf) and masked tokens (-inf) among them."""
    torch.manual_seed(0)
    n = 6
    scores = -torch.rand(n, K) * 5
    scores[0, 1:] = float("-inf")  # a sentence's first step: one live beam
    logp = torch.log_softmax(torch.randn(n * K, V_) * 3, -1)
    logp[2, 0] = logp[5, 1] = float("-inf")  # masked after normalising, as the search masks
    k = min(2 * K, K * V_)
    full = (scores.view(-1, 1) + logp).view(n, K * V_)
    ref_top, ref_idx = full.topk(k, dim=1)
    top, origin, tok = best_candidates(scores, logp, 2 * K)
    torch.testing.assert_close(top, ref_top)
    live = ref_top > float("-inf")  # among equal -inf candidates any order is right
    ref_origin = torch.arange(n).unsqueeze(1) * K + ref_idx // V_
    assert torch.equal(origin[live], ref_origin[live]) and torch.equal(tok[live], (ref_idx % V_)[live])


def tiny_model(attention: str, cell: str, order: str, feeding: bool):
    from omegaconf import OmegaConf

    from nmt.config import TrainConfig
    from nmt.models.build import build_model

    torch.manual_seed(0)
    cfg = OmegaConf.structured(TrainConfig)
    cfg.encoder.update(cell=cell, emb_size=8, hidden_size=6, layers=2, dropout=0.0)
    cfg.decoder.update(order=order, emb_size=8, hidden_size=12, layers=2, dropout=0.0, input_feeding=feeding)
    cfg.attention.name = attention
    return build_model(cfg.encoder, cfg.attention, cfg.decoder, 20, V, rnn_impl="eager", device="cpu").eval()


@pytest.mark.parametrize(
    "attention,cell,order,feeding",
    [
        ("bahdanau", "gru", "bahdanau", True),
        ("general", "lstm", "luong", True),
        ("coverage", "gru", "bahdanau", True),
        ("multihead", "lstm", "luong", False),
    ],
)
def test_beam_reordering_moves_the_hypotheses_and_keeps_the_encoder_side(attention, cell, order, feeding):
    """Back-pointers within each sentence's K beams (what beam search makes): ``reorder_beams`` gives the
    state that ``index_select`` gives, without copying the per-sentence keys, projections and mask."""
    model, K = tiny_model(attention, cell, order, feeding), 3
    b = collate([[A, B_, C, A], [C, B_], [A, A, A]], [[A]] * 3)
    with torch.no_grad():
        state = model.start(b.src, b.src_len).index_select(torch.arange(3).repeat_interleave(K))
        _, state, _ = model.step(torch.randint(4, V, (3 * K,)), state)  # hidden, feed, coverage now differ per beam
        within = torch.randint(K, (3, K), generator=torch.Generator().manual_seed(1))  # beam of the same sentence
        idx = (torch.arange(3).unsqueeze(1) * K + within).view(-1)
        fast, full = state.reorder_beams(idx), state.index_select(idx)
    hidden = lambda s: s.hidden if isinstance(s.hidden, tuple) else (s.hidden,)  # noqa: E731
    for got, want in zip(hidden(fast), hidden(full)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    for name in ("keys", "proj", "mask", "coverage"):
        got, want = getattr(fast.attn, name), getattr(full.attn, name)
        assert (got is None) == (want is None) == (name == "coverage" and attention != "coverage")
        if got is not None:
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    if feeding and order == "luong":
        torch.testing.assert_close(fast.feed, full.feed, rtol=0, atol=0)
    assert fast.attn.keys.data_ptr() == state.attn.keys.data_ptr()  # not copied
    assert fast.attn.proj.data_ptr() == state.attn.proj.data_ptr()


# ---- sampling (sample=True): drawn from the model's distribution, reproducibly per sentence ----


def distinct_sources(n: int):
    """n different source sentences (their ids seed their draws): the base-3 digits of i as tokens A, B_, C."""
    rows = []
    for i in range(n):
        rows.append([(A, B_, C)[(i // 3**d) % 3] for d in range(8)])
    return collate(rows, [[A]] * n)


def first_token_shares(toy, opts, n: int = 3000) -> dict[int, float]:
    b = distinct_sources(n)
    out = beam_search(toy, b.src, b.src_len, opts)
    firsts = [h[0].tokens[0] for h in out]
    return {t: firsts.count(t) / n for t in set(firsts)}


THREE_WAY = {BOS: {A: 0.5, B_: 0.3, C: 0.2}, A: {EOS: 1.0}, B_: {EOS: 1.0}, C: {EOS: 1.0}}


@pytest.mark.parametrize(
    "extra,expect",
    [
        ({}, {A: 0.5, B_: 0.3, C: 0.2}),
        ({"sample_topk": 2}, {A: 0.5 / 0.8, B_: 0.3 / 0.8}),  # C is not among the 2 most probable
        ({"sample_topp": 0.6}, {A: 0.5 / 0.8, B_: 0.3 / 0.8}),  # A (0.5) < 0.6, so B_ is kept; A + B_ >= 0.6
        ({"temperature": 0.5}, {A: 0.25 / 0.38, B_: 0.09 / 0.38, C: 0.04 / 0.38}),  # p ** 2, renormalised
    ],
)
def test_sampling_draws_from_the_models_distribution(extra, expect):
    shares = first_token_shares(Toy(THREE_WAY), SearchOptions(beam_size=1, sample=True, **extra))
    assert set(shares) == set(expect), shares  # nothing outside top-k / top-p is ever drawn
    for t, p in expect.items():  # 3,000 draws: one standard error is <= 0.009
        assert shares[t] == pytest.approx(p, abs=0.04), (t, shares)


def test_a_sampled_hypothesis_carries_the_models_log_probability_of_its_tokens():
    toy = Toy(THREE_WAY)
    b = distinct_sources(50)
    out = beam_search(toy, b.src, b.src_len, SearchOptions(beam_size=1, sample=True, temperature=3.0))
    for (h,) in out:  # the temperature shapes the draw, not the score (at T = 3 even 1e-6 tokens get drawn)
        path = [BOS, *h.tokens, EOS]
        expect = sum(float(toy.row(a)[b]) for a, b in zip(path, path[1:]))
        assert h.log_prob == pytest.approx(expect, abs=1e-4), path


def test_sampling_needs_one_beam():
    with pytest.raises(ValueError, match="beam_size must be 1"):
        SearchOptions(beam_size=5, sample=True)


def test_n_draws_of_a_sentence_hold_its_single_draw_best_first(trained_model, sample_dir):
    """n_best=N with sampling: N draws per sentence (one batch, each its own generator), best score first; draw
    0 is the sample that n_best=1 draws."""
    model, tok, _ = trained_model
    _, b = sample_batch(tok, sample_dir, 12)
    one = beam_search(model, b.src, b.src_len, SearchOptions(beam_size=1, sample=True, sample_topk=20))
    four = beam_search(model, b.src, b.src_len, SearchOptions(beam_size=1, n_best=4, sample=True, sample_topk=20))
    assert [len(d) for d in four] == [4] * 12
    for (single,), draws in zip(one, four):
        assert single.tokens in [d.tokens for d in draws]
        assert [d.score for d in draws] == sorted((d.score for d in draws), reverse=True)
    assert any(len({tuple(d.tokens) for d in draws}) > 1 for draws in four)  # the draws are not one sample


def test_a_sentence_draws_the_same_sample_in_any_batch(trained_model, sample_dir):
    """Each sentence's draws come from its own generator (seed + source ids): decoding it in another batch, or
    in another order, gives the same sample; another seed gives another."""
    model, tok, _ = trained_model
    ids, b = sample_batch(tok, sample_dir, 40)
    opts = SearchOptions(beam_size=1, sample=True, sample_topk=20)
    whole = [h[0].tokens for h in beam_search(model, b.src, b.src_len, opts)]
    back = collate(ids[20:][::-1], [[A]] * 20)  # the second half alone, reversed
    part = [h[0].tokens for h in beam_search(model, back.src, back.src_len, opts)][::-1]
    assert part == whole[20:]
    other = [
        h[0].tokens
        for h in beam_search(
            model, b.src, b.src_len, SearchOptions(beam_size=1, sample=True, sample_topk=20, sample_seed=1)
        )
    ]
    assert other != whole
    greedy_like = SearchOptions(beam_size=1, sample=True, temperature=1e-4)  # a near-zero temperature is argmax
    assert [h[0].tokens for h in beam_search(model, b.src, b.src_len, greedy_like)] == [
        h.tokens for h in greedy(model, b.src, b.src_len)
    ]
