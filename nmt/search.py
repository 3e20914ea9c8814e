"""Greedy and beam search over a ``Seq2Seq``: encode once, then step the decoder.

Both are batched over sentences (beam search over sentences × beams in one tensor),
so decoding a test set is a handful of large steps rather than a Python loop per
sentence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nmt.data.tokenizer import BOS, EOS, PAD
from nmt.models.seq2seq import Seq2Seq


@dataclass
class Hypothesis:
    tokens: list[int]  # target ids, without BOS/EOS
    score: float  # log-probability, divided by the length penalty when one is used
    attention: torch.Tensor | None = None  # [len(tokens) + 1, S] weights, EOS step included


def length_penalty(length: torch.Tensor, alpha: float) -> torch.Tensor:
    """GNMT length penalty (Wu et al. 2016, eq. 14): ((5 + |Y|) / 6) ** alpha."""
    return ((5.0 + length.float()) / 6.0) ** alpha


def max_lengths(src_len: torch.Tensor, ratio: float, cap: int = 0) -> torch.Tensor:
    """Per-sentence limit on generated tokens (EOS included): ratio * source length + 10."""
    lim = (src_len.float() * ratio).long() + 10
    return lim.clamp(max=cap) if cap else lim


@torch.no_grad()
def greedy(
    model: Seq2Seq, src: torch.Tensor, src_len: torch.Tensor, max_len: torch.Tensor, return_attention: bool = False
) -> list[Hypothesis]:
    """Argmax decoding; max_len [B] per-sentence limits (see ``max_lengths``)."""
    B = src.size(0)
    state = model.start(src, src_len)
    y = torch.full((B,), BOS, dtype=torch.long, device=src.device)
    limit = max_len.to(src.device)
    done = torch.zeros(B, dtype=torch.bool, device=src.device)
    score = torch.zeros(B, device=src.device)
    toks, atts = [], []
    for t in range(int(limit.max())):
        logits, state, w = model.decoder.step(y, state)
        logp = torch.log_softmax(logits.float(), dim=-1)
        best, y = logp.max(dim=-1)
        score += best.masked_fill(done, 0.0)
        y = y.masked_fill(done, PAD)
        toks.append(y)
        if return_attention:
            atts.append(w)
        done |= (y == EOS) | (t + 1 >= limit)
        if bool(done.all()):
            break
    out = torch.stack(toks, 1).tolist()  # [B, t]
    att = torch.stack(atts, 1) if return_attention else None  # [B, t, S]
    hyps = []
    for b in range(B):
        seq = out[b]
        n = seq.index(EOS) if EOS in seq else len([x for x in seq if x != PAD])
        a = att[b, : n + 1, : int(src_len[b])].cpu() if att is not None else None
        hyps.append(Hypothesis(seq[:n], float(score[b]), a))
    return hyps


@torch.no_grad()
def beam_search(
    model: Seq2Seq,
    src: torch.Tensor,
    src_len: torch.Tensor,
    max_len: torch.Tensor,
    beam_size: int = 5,
    alpha: float = 1.0,
    return_attention: bool = False,
) -> list[Hypothesis]:
    """Beam search over all sentences × beams at once; the best hypothesis per sentence.

    Finished beams stay in the beam with their score frozen (they extend only with PAD at
    no cost); the search ends when every beam is finished. Final ranking divides the
    log-probability by the GNMT length penalty with exponent ``alpha``.
    """
    if beam_size == 1:
        return greedy(model, src, src_len, max_len, return_attention)
    B, K, dev = src.size(0), beam_size, src.device
    state = model.start(src, src_len)
    expand = torch.arange(B, device=dev).repeat_interleave(K)  # [B*K]
    state = state.index_select(expand)
    limit = max_len.to(dev).repeat_interleave(K)  # [B*K]
    scores = torch.full((B, K), float("-inf"), device=dev)
    scores[:, 0] = 0.0  # all beams start identical: keep one alive so the first top-k is distinct
    scores = scores.view(-1)
    y = torch.full((B * K,), BOS, dtype=torch.long, device=dev)
    done = torch.zeros(B * K, dtype=torch.bool, device=dev)
    length = torch.zeros(B * K, dtype=torch.long, device=dev)
    hist = torch.empty(B * K, 0, dtype=torch.long, device=dev)
    att_hist = None
    base = (torch.arange(B, device=dev) * K).unsqueeze(1)  # [B, 1]
    for t in range(int(max_len.max())):
        logits, state, w = model.decoder.step(y, state)
        logp = torch.log_softmax(logits.float(), dim=-1)  # [B*K, V]
        V = logp.size(1)
        # Finished beams may only append PAD, at no cost, so their score stays frozen.
        logp[done] = float("-inf")
        logp[done, PAD] = 0.0
        # Beams at their length limit must end now.
        at_limit = ~done & (t + 1 >= limit)
        logp[at_limit] = torch.where(
            torch.arange(V, device=dev) == EOS, logp[at_limit], torch.tensor(float("-inf"), device=dev)
        )
        cand = (scores.unsqueeze(1) + logp).view(B, K * V)
        top, idx = cand.topk(K, dim=1)  # [B, K]
        origin = (base + idx // V).view(-1)  # [B*K] beam each new beam extends
        y = (idx % V).view(-1)
        scores = top.view(-1)
        prev_done = done.index_select(0, origin)
        length = length.index_select(0, origin) + (~prev_done).long()
        done = prev_done | (y == EOS)
        hist = torch.cat([hist.index_select(0, origin), y.unsqueeze(1)], dim=1)
        if return_attention:
            w = w.index_select(0, origin).unsqueeze(1)
            att_hist = w if att_hist is None else torch.cat([att_hist.index_select(0, origin), w], 1)
        state = state.index_select(origin)
        if bool(done.all()):
            break
    final = (scores / length_penalty(length, alpha)).view(B, K)
    best = final.argmax(dim=1)  # [B]
    hyps = []
    seqs = hist.tolist()
    for b in range(B):
        i = b * K + int(best[b])
        seq = seqs[i]
        n = seq.index(EOS) if EOS in seq else len([x for x in seq if x != PAD])
        a = att_hist[i, : n + 1, : int(src_len[b])].cpu() if att_hist is not None else None
        hyps.append(Hypothesis(seq[:n], float(final[b, best[b]]), a))
    return hyps
