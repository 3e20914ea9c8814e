"""Each score function against a direct re-computation of its formula, and exact masking."""

from __future__ import annotations

import pytest
import torch

from nmt.models.attention import ATTENTIONS, build_attention

B, T, S, H, K = 3, 4, 6, 8, 8


def random_inputs():
    keys = torch.randn(B, S, K)
    mask = torch.ones(B, S, dtype=torch.bool)
    mask[1, 4:] = False
    mask[2, 1:] = False  # a one-token source
    return torch.randn(B, T, H), keys, mask


def reference_scores(name: str, attn, q: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Scores [B, T, S] written out element by element from the papers' formulas."""
    out = torch.empty(B, T, S)
    for b in range(B):
        for t in range(T):
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
                else:
                    raise AssertionError(f"no reference formula for {name}")
                out[b, t, s] = v
    return out


@pytest.mark.parametrize("name", sorted(ATTENTIONS))
def test_score_matches_formula(name, seeded):
    q, keys, mask = random_inputs()
    attn = build_attention(name, H, K, dim=5)
    state = attn.prepare(keys, mask)
    got = attn.score(q, state.proj)
    torch.testing.assert_close(got, reference_scores(name, attn, q, keys), rtol=1e-5, atol=1e-5)
    ctx, w = attn(q, state)
    ref_w = torch.softmax(got.masked_fill(~mask.unsqueeze(1), float("-inf")), dim=-1)
    torch.testing.assert_close(w, ref_w)
    torch.testing.assert_close(ctx, torch.einsum("bts,bsk->btk", ref_w, keys))


@pytest.mark.parametrize("name", sorted(ATTENTIONS))
def test_padding_gets_exactly_zero_weight(name, seeded):
    q, keys, mask = random_inputs()
    attn = build_attention(name, H, K)
    _, w = attn(q, attn.prepare(keys, mask))
    assert torch.all(w[~mask.unsqueeze(1).expand_as(w)] == 0.0)
    torch.testing.assert_close(w.sum(-1), torch.ones(B, T))
    assert torch.all(w[2, :, 0] == 1.0)  # a single real position takes all the weight


@pytest.mark.parametrize("name", sorted(ATTENTIONS))
def test_one_query_equals_all_queries(name, seeded):
    q, keys, mask = random_inputs()
    attn = build_attention(name, H, K)
    state = attn.prepare(keys, mask)
    ctx_all, w_all = attn(q, state)
    for t in range(T):
        ctx, w = attn(q[:, t], state)
        torch.testing.assert_close(ctx, ctx_all[:, t])
        torch.testing.assert_close(w, w_all[:, t])


def test_dot_rejects_mismatched_sizes():
    with pytest.raises(ValueError, match="decoder.hidden_size"):
        build_attention("dot", 8, 16)


def test_unknown_attention_lists_choices():
    with pytest.raises(ValueError, match="choose one of.*bahdanau"):
        build_attention("bahdnau", 8, 8)
