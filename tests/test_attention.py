"""Each attention against a direct re-computation of its paper formula, and exact masking."""

from __future__ import annotations

import math

import pytest
import torch

from nmt.models.attention import ATTENTIONS, build_attention

B, T, S, H, K = 3, 4, 6, 8, 8
GLOBAL = ["dot", "scaled_dot", "general", "concat", "bahdanau", "location"]
LOCAL = ["local_m", "local_p"]


def random_inputs():
    keys = torch.randn(B, S, K)
    mask = torch.ones(B, S, dtype=torch.bool)
    mask[1, 4:] = False
    mask[2, 1:] = False  # a one-token source
    return torch.randn(B, T, H), keys, mask


def reference_scores(name: str, attn, q: torch.Tensor, keys: torch.Tensor, cov=None) -> torch.Tensor:
    """Scores [B, T, S] written out element by element from the papers' formulas."""
    out = torch.empty(B, q.size(1), S)
    for b in range(B):
        for t in range(q.size(1)):
            for s in range(S):
                h, a = q[b, t], keys[b, s]
                if name == "dot":
                    v = h @ a
                elif name == "scaled_dot":
                    v = h @ a / H**0.5
                elif name == "general":
                    v = h @ (attn.W.weight @ a)  # hᵀ W_a a
                elif name == "concat":
                    W = torch.cat([attn.W_q.weight, attn.W_k.weight], dim=1)  # W_a [h; a]
                    v = attn.v.weight[0] @ torch.tanh(W @ torch.cat([h, a]) + attn.W_q.bias)
                elif name == "bahdanau":
                    # vᵀ tanh(W1 a + W2 h): W1 = U_a on keys (with bias), W2 = W_a on the state
                    v = attn.v.weight[0] @ torch.tanh(attn.W_k.weight @ a + attn.W_k.bias + attn.W_q.weight @ h)
                elif name == "location":
                    v = attn.W.weight[s] @ h + attn.W.bias[s]  # (W_a h_t)_s
                elif name == "coverage":
                    u = attn.W_k.weight @ a + attn.W_k.bias + attn.W_q.weight @ h + attn.V.weight[:, 0] * cov[b, s]
                    v = attn.v.weight[0] @ torch.tanh(u)
                else:
                    raise AssertionError(f"no reference formula for {name}")
                out[b, t, s] = v
    return out


def masked_softmax(scores, mask):
    return torch.softmax(scores.masked_fill(~mask.unsqueeze(1), float("-inf")), dim=-1)


@pytest.mark.parametrize("name", GLOBAL)
def test_score_matches_formula(name, seeded):
    q, keys, mask = random_inputs()
    attn = build_attention(name, H, K, dim=5)
    state = attn.prepare(keys, mask)
    got = attn.score(q, state)
    torch.testing.assert_close(got, reference_scores(name, attn, q, keys), rtol=1e-5, atol=1e-5)
    ctx, w = attn(q, state)
    ref_w = masked_softmax(got, mask)
    torch.testing.assert_close(w, ref_w)
    torch.testing.assert_close(ctx, torch.einsum("bts,bsk->btk", ref_w, keys))


def test_coverage_matches_formula_and_accumulates(seeded):
    q, keys, mask = random_inputs()
    attn = build_attention("coverage", H, K, dim=5)
    state = attn.prepare(keys, mask)
    total = torch.zeros(B, S)
    for t in range(T):
        cov = state.coverage.clone()
        torch.testing.assert_close(cov, total)
        scores = attn.score(q[:, t : t + 1], state)
        torch.testing.assert_close(
            scores, reference_scores("coverage", attn, q[:, t : t + 1], keys, cov), rtol=1e-5, atol=1e-5
        )
        _, w = attn(q[:, t], state)
        torch.testing.assert_close(w, masked_softmax(scores, mask)[:, 0])
        state = attn.advance(state, w)
        total = total + w
    assert state.t == T


@pytest.mark.parametrize("name", LOCAL)
@torch.no_grad()
def test_local_weights_match_formula(name, seeded):
    q, keys, mask = random_inputs()
    D = 2
    attn = build_attention(name, H, K, dim=5, window=D, score="general")
    state = attn.prepare(keys, mask)
    state.t = 3  # as if three target words were already produced
    scores = attn.score(q, state)
    torch.testing.assert_close(scores, reference_scores("general", attn.inner, q, keys))
    _, w = attn(q, state)
    src_len = mask.sum(-1)
    for b in range(B):
        for t in range(T):
            if name == "local_m":
                p = min(3 + t, int(src_len[b]) - 1)
            else:  # p_t = S · sigmoid(v_pᵀ tanh(W_p h_t))
                p = float(src_len[b]) * torch.sigmoid(attn.v_p.weight[0] @ torch.tanh(attn.W_p.weight @ q[b, t]))
            inside = [s for s in range(S) if abs(s - p) <= D and mask[b, s]]
            soft = torch.softmax(scores[b, t, inside], dim=-1)
            for s in range(S):
                expect = 0.0
                if s in inside:
                    expect = soft[inside.index(s)] * math.exp(-((s - float(p)) ** 2) / (2 * (D / 2) ** 2))
                assert float(w[b, t, s]) == pytest.approx(float(expect), abs=1e-6), (b, t, s)
                if s not in inside:
                    assert w[b, t, s] == 0.0  # exactly zero outside the window and on padding


@pytest.mark.parametrize("name", LOCAL)
@torch.no_grad()
def test_every_score_the_config_allows_runs_inside_local_attention(name, seeded):
    """attention.score=multihead passed the config check and raised NotImplementedError at the first batch
    (it has a softmax per head, no one score); every score the config allows must run, step by step as in
    one call, and leave exactly zero outside the window."""
    from nmt.config import allowed

    q, keys, mask = random_inputs()
    for score in allowed("attention.score"):
        attn = build_attention(name, H, K, dim=6, window=1, score=score)
        state = attn.prepare(keys, mask)
        _, w_all = attn(q, state)
        assert torch.isfinite(w_all).all() and (w_all[~mask.unsqueeze(1).expand_as(w_all)] == 0).all(), score
        assert ((w_all > 0).sum(-1) <= 3).all(), score  # a window of half-width 1: at most 3 positions
        for t in range(T):
            _, w = attn(q[:, t], state)
            torch.testing.assert_close(w, w_all[:, t])
            state = attn.advance(state, w)
    with pytest.raises(ValueError, match="attention.score='multihead' cannot score local attention"):
        build_attention(name, H, K, score="multihead")


def test_local_attention_hands_its_score_that_scores_options():
    """local_m/local_p scored by location built it with 256 positions whatever attention.max_positions said."""
    attn = build_attention("local_p", H, K, dim=6, window=2, score="location", max_positions=7, heads=3)
    assert attn.inner.W.out_features == 7 and attn.window == 2


def test_multihead_matches_formula(seeded):
    q, keys, mask = random_inputs()
    heads, dim = 2, 6
    attn = build_attention("multihead", H, K, dim=dim, heads=heads)
    ctx, w = attn(q, attn.prepare(keys, mask))
    d = dim // heads
    ctx_heads, ws = [], []
    for h in range(heads):
        Wq, bq = attn.W_q.weight[h * d : (h + 1) * d], attn.W_q.bias[h * d : (h + 1) * d]
        Wk = attn.W_k.weight[h * d : (h + 1) * d]
        e = torch.tanh((q @ Wq.T + bq).unsqueeze(2) + (keys @ Wk.T).unsqueeze(1)) @ attn.v[h]  # [B, T, S]
        a = masked_softmax(e, mask)
        ws.append(a)
        ctx_heads.append(a @ keys)
    torch.testing.assert_close(ctx, torch.cat(ctx_heads, -1) @ attn.W_o.weight.T)
    torch.testing.assert_close(w, torch.stack(ws).mean(0))


@pytest.mark.parametrize("name", sorted(ATTENTIONS))
def test_padding_gets_exactly_zero_weight(name, seeded):
    q, keys, mask = random_inputs()
    attn = build_attention(name, H, K)
    state = attn.prepare(keys, mask)
    if attn.parallel:
        _, w = attn(q, state)
    else:
        w = torch.stack([attn(q[:, 0], state)[1]], 1)
    assert torch.all(w[~mask.unsqueeze(1).expand_as(w)] == 0.0)
    sums = w.sum(-1)
    if name in LOCAL:  # the Gaussian factor is not renormalised (Luong et al. 2015, eq. 10)
        assert torch.all(sums <= 1.0 + 1e-6) and torch.all(sums > 0)
    else:
        torch.testing.assert_close(sums, torch.ones_like(sums))
        assert torch.all(w[2, :, 0] == 1.0)  # a single real position takes all the weight


@pytest.mark.parametrize("name", sorted(n for n, c in ATTENTIONS.items() if c.parallel))
def test_one_query_at_a_time_equals_all_queries(name, seeded):
    q, keys, mask = random_inputs()
    attn = build_attention(name, H, K)
    state = attn.prepare(keys, mask)
    ctx_all, w_all = attn(q, state)
    for t in range(T):
        ctx, w = attn(q[:, t], state)
        torch.testing.assert_close(ctx, ctx_all[:, t])
        torch.testing.assert_close(w, w_all[:, t])
        state = attn.advance(state, w)


def test_size_and_option_errors():
    with pytest.raises(ValueError, match="decoder.hidden_size"):
        build_attention("dot", 8, 16)
    with pytest.raises(ValueError, match="choose one of.*bahdanau"):
        build_attention("bahdnau", 8, 8)
    with pytest.raises(ValueError, match="attention.score='coverage' cannot score local attention"):
        build_attention("local_p", 8, 8, score="coverage")
    with pytest.raises(ValueError, match="must divide"):
        build_attention("multihead", 8, 8, dim=6, heads=4)
