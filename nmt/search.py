"""Beam search over a ``Seq2Seq`` (greedy is beam size 1): encode once, then step the decoder.

Batched over sentences × beams in one tensor, so a test set is decoded in a few large
steps rather than a Python loop per sentence. Sentences whose search is over leave
the batch, so the work shrinks as the batch finishes.

Scoring (Wu et al. 2016, GNMT, eq. 14): s(Y, X) = log P(Y|X) / lp(Y) + cp(X; Y) with
lp(Y) = ((5 + |Y|) / 6)^α and cp = β Σ_i log(min(Σ_j a_ij, 1)) over source positions i;
|Y| counts the target tokens including EOS.

Stopping rule: a sentence is done when it has ``n_best`` finished hypotheses and none of
its open beams can still overtake the n_best-th of them. An open beam's log-probability
can only fall as it grows, and its length penalty is at most lp(max length), so
open_score / lp(max_len) (coverage penalty ≤ 0 bounded by 0) is an upper bound on any
hypothesis it can still become. Stopping at the first ``n_best`` finished hypotheses, as
many toolkits do, is wrong under a length penalty: a longer open beam may still win.

Sampling (``sample=True``, beam size 1) draws each next token from the model's distribution instead of taking
the best: at a temperature, from the k most probable (top-k; Fan et al. 2018) and/or the smallest set holding
probability p (top-p, nucleus; Holtzman et al. 2020). Back-translation from samples trains better models than
from beam search (Edunov et al. 2018, "Understanding Back-Translation at Scale"). Each sentence draws from its
own generator, seeded by the seed and its source ids: the same line with the same seed gets the same sample
whatever the batch, process or order it is decoded in (up to the last bits of the products, which may differ
with the batch's shape and move a draw that falls on a boundary; and a vocabulary shortlist is the batch's own).

``stop="early"`` trades that guarantee for speed: an open beam counts as beatable once it could
not overtake by ending at the very next step (open_score / lp(t + 1)), the heuristic of Hugging
Face's ``early_stopping=False``. With α = 0 both rules are the same (the bound is exact); with
α > 0 "early" decodes fewer steps and may miss a longer hypothesis that "exact" finds
(scripts/benchmark_stopping.py measures both: steps, words/s, BLEU).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from nmt.data.tokenizer import BOS, EOS, PAD
from nmt.models.seq2seq import Ensemble, Seq2Seq

NEG_INF = float("-inf")
# anything with start(src, src_len) (and start(src, src_len, vocab) for a shortlisted search) and step(y, state),
# whose state has index_select(idx) (any rows) and reorder_beams(idx) (back-pointers within each sentence's beams)
Searchable = Seq2Seq | Ensemble


@dataclass
class Hypothesis:
    tokens: list[int]  # target ids, without BOS/EOS
    score: float  # s(Y, X) above: what hypotheses are ranked by
    log_prob: float  # log P(Y|X), EOS included
    attention: torch.Tensor | None = None  # [len(tokens) + 1, S] weights, the EOS step included


@dataclass
class SearchOptions:
    beam_size: int = 5
    n_best: int = 1
    alpha: float = 1.0  # length penalty exponent (0 = raw log-probability)
    beta: float = 0.0  # coverage penalty weight (0 = off)
    max_len_ratio: float = 2.0  # at most max_len_ratio * source length + 10 tokens, EOS included
    min_len_ratio: float = 0.0  # EOS is blocked before min_len_ratio * source length tokens
    max_len_cap: int = 0  # absolute cap on generated tokens (0 = none)
    no_repeat_ngram: int = 0  # block any n-gram of this size from occurring twice (0 = off)
    stop: str = "exact"  # exact: stop when no open beam can still win | early: ... by ending next step
    sample: bool = False  # draw each token instead of searching (beam_size 1; see the module docstring)
    sample_topk: int = 0  # sample: from the k most probable tokens (0 = all)
    sample_topp: float = 1.0  # sample: from the smallest set of tokens holding this probability (1 = all)
    temperature: float = 1.0  # sample: p ** (1 / temperature), renormalised
    sample_seed: int = 0  # sample: with a sentence's source ids, seeds its draws

    def __post_init__(self) -> None:
        if self.stop not in STOP_RULES:
            raise ValueError(f"stop must be one of {', '.join(STOP_RULES)}, not {self.stop!r}")
        if self.sample and self.beam_size != 1:
            raise ValueError("sampling draws each hypothesis on its own: beam_size must be 1 (n_best: how many draws)")


STOP_RULES = ("exact", "early")


def length_penalty(length: torch.Tensor | int, alpha: float) -> torch.Tensor:
    """GNMT length penalty ((5 + |Y|) / 6) ** alpha."""
    return ((5.0 + torch.as_tensor(length, dtype=torch.float)) / 6.0) ** alpha


def coverage_penalty(coverage: torch.Tensor, mask: torch.Tensor, beta: float) -> torch.Tensor:
    """β Σ_i log(min(Σ_j a_ij, 1)) over real source positions; coverage, mask [N, S] → [N]."""
    if beta == 0.0:
        return torch.zeros(coverage.size(0), device=coverage.device)
    pen = torch.log(coverage.clamp(min=1e-6, max=1.0)).masked_fill(~mask, 0.0)
    return beta * pen.sum(-1)


def _block_repeats(logp: torch.Tensor, hist: torch.Tensor, n: int, vocab: torch.Tensor | None = None) -> None:
    """Forbid (in place) tokens that would complete an n-gram already present in a hypothesis; with a
    shortlist ``vocab`` (sorted ids), logp's columns are its positions."""
    t = hist.size(1)
    if n <= 0 or t < n:
        return
    windows = hist.unfold(1, n, 1)  # [N, t-n+1, n]
    prefix = hist[:, t - n + 1 :]  # [N, n-1] the last n-1 tokens
    match = (windows[:, :, :-1] == prefix.unsqueeze(1)).all(-1)  # [N, t-n+1]
    rows, cols = match.nonzero(as_tuple=True)
    banned = windows[rows, cols, -1]
    if vocab is not None:  # ids -> shortlist positions (an id outside the shortlist cannot be chosen anyway)
        pos = torch.searchsorted(vocab, banned).clamp(max=vocab.numel() - 1)
        inside = vocab[pos] == banned
        rows, banned = rows[inside], pos[inside]
    logp[rows, banned] = NEG_INF


TopK = Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]


def row_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest entries of each row of x [R, V] and their columns, best first: ``torch.topk``. The
    plain selection; ``blocked_topk`` is the CPU fast path beside it."""
    return x.topk(k, dim=1)


TOPK_BLOCK = 64  # columns per block in blocked_topk


def blocked_topk(x: torch.Tensor, k: int, block: int = TOPK_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """``row_topk`` through block maxima, for a wide x [R, V] (the vocabulary) on a CPU.

    The row is cut into blocks of ``block`` columns. The k largest entries all lie in the k blocks with
    the largest maxima (or in the last, partial block): an entry e outside them is beaten by each of those
    k maxima, so it is not among the k largest, or it ties with them. So the top k of those blocks' k·block
    entries (and the partial block's) are the top k of the row: the same values, and among equal values
    perhaps other columns, as ``torch.topk`` itself leaves ties in no fixed order. One pass of block
    maxima (vectorised) and two small selections replace one selection over all V columns, which PyTorch's
    CPU kernel does element by element (``scripts/benchmark_kernels.py`` measures the two side by side;
    docs/benchmarks.md has the ratios per CPU). Rows narrower than 2k blocks (or k > block) take
    ``row_topk``.
    """
    R, V = x.shape
    nb = V // block
    if nb < 2 * k or k > block:
        return row_topk(x, k)
    x = x.contiguous()
    full = x[:, : nb * block].unflatten(1, (nb, block))  # [R, nb, block] (a view)
    blocks = full.amax(dim=2).topk(k, dim=1).indices.sort(dim=1).values  # [R, k], in column order
    starts = torch.arange(R, device=x.device).unsqueeze(1) * V + blocks * block  # [R, k] flat offsets
    # every run of `block` consecutive entries of x as a row of a (read-only, overlapping) view, so that one
    # row selection gathers the k blocks of every row: ~5x cheaper than full[arange, blocks] or a gather
    runs = x.view(-1).as_strided((R * V - block + 1, block), (1, 1))
    cand = runs.index_select(0, starts.flatten()).view(R, k * block)  # [R, k·block]
    if nb * block < V:  # the partial block is always a candidate
        cand = torch.cat([cand, x[:, nb * block :]], dim=1)
    top, pos = cand.topk(k, dim=1)
    # candidate position -> column: within one of the k blocks, or in the partial block after them
    in_block = pos < k * block
    cols = blocks.gather(1, (pos // block).clamp(max=k - 1)) * block + pos % block
    return top, torch.where(in_block, cols, pos - k * block + nb * block)


def log_probs(logits: torch.Tensor) -> torch.Tensor:
    """log softmax of a step's logits [N, V] over the vocabulary, in float32 whatever the products' dtype: one
    fused pass (about half the time of logsumexp's max/sub/exp/sum passes on a CPU; docs/benchmarks.md run 10).
    The plain normalisation; ``log_probs_in_place`` is the CPU fast path beside it."""
    return torch.log_softmax(logits, dim=-1, dtype=torch.float32)


def log_probs_in_place(logits: torch.Tensor) -> torch.Tensor:
    """``log_probs``, bit for bit, written over the float32 copy of bf16 logits (over float32 logits
    themselves, which a search step uses once): one [N, V] buffer a step instead of two. On a CPU the second
    fresh buffer cost more than the normalisation (docs/benchmarks.md, "Run 31")."""
    x = logits.float()
    return torch.log_softmax(x, dim=-1, out=x)


def best_candidates(
    scores: torch.Tensor, logp: torch.Tensor, k: int, topk: TopK = row_topk
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The k best continuations of each sentence: scores [n, K] of its open beams, logp [n·K, V] the
    log-probabilities of their next tokens (masked tokens at -inf) → (score + log p [n, k], flat beam
    index [n, k], token [n, k]), best first.

    The k best of a sentence's K·V candidates are among the k best of each of its beams (within a beam
    they rank by token log-probability, the beam's own score being shared), so the top k is taken per
    beam first (``topk``: row_topk, or blocked_topk on the CPU fast path) and then over the K·k: two small
    selections, and the beam scores are only added to the K·k.
    """
    n, K = scores.shape
    V = logp.size(1)
    per_beam = min(k, V)
    beam_top, beam_tok = topk(logp, per_beam)  # [n·K, per_beam]
    cand = (scores.reshape(-1, 1) + beam_top).view(n, K * per_beam)
    top, idx = cand.topk(min(k, K * per_beam), dim=1)
    origin = torch.arange(n, device=scores.device).unsqueeze(1) * K + idx // per_beam
    return top, origin, beam_tok.view(n, K * per_beam).gather(1, idx)


def sentence_generators(
    src: torch.Tensor, src_len: torch.Tensor, seed: int, draws: list[int] | None = None
) -> list[torch.Generator]:
    """One CPU generator per sentence of src [B, S], seeded by ``seed`` and the sentence's own source ids (a
    stable hash, not Python's), so its draws do not depend on the batch, process or order it is decoded in.
    ``draws``: each row's draw number when a sentence is sampled several times (draw 0 is the single draw)."""
    gens = []
    for i, (row, n) in enumerate(zip(src.tolist(), src_len.tolist())):
        j = draws[i] if draws is not None else 0
        material = (seed, row[:n]) if j == 0 else (seed, row[:n], j)
        digest = hashlib.blake2b(repr(material).encode(), digest_size=8).digest()
        gens.append(torch.Generator().manual_seed(int.from_bytes(digest, "little") & (2**63 - 1)))
    return gens


def sampled_candidates(
    scores: torch.Tensor, logp: torch.Tensor, opts: SearchOptions, gens: list[torch.Generator]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``best_candidates`` for sampling (one beam per sentence): each row draws one token from softmax(logp / T)
    restricted to its top k / top p, by inverse CDF with one uniform from its own generator. Returns (score +
    log p of the drawn token, row, token), each [n, 2]: the second column is an empty candidate (-inf), so
    that beam search's bookkeeping (the K = 1 best of 2K) runs unchanged. Masked tokens (-inf) are never drawn.
    """
    n, V = logp.shape
    z = logp / opts.temperature
    if 0 < opts.sample_topk < V:
        vals, cols = z.topk(opts.sample_topk, dim=1)  # sorted, best first
    elif opts.sample_topp < 1.0:
        vals, cols = z.sort(dim=1, descending=True)
    else:
        vals, cols = z, None
    probs = torch.softmax(vals.double(), dim=1)
    if opts.sample_topp < 1.0:  # keep a token while the mass before it is below p (so the best is always kept)
        probs = probs.masked_fill(probs.cumsum(1) - probs >= opts.sample_topp, 0.0)
    cdf = probs.cumsum(1)
    u = torch.stack([torch.rand((), generator=g, dtype=torch.float64) for g in gens]).to(cdf.device)
    pick = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).clamp(max=cdf.size(1) - 1)
    tok = pick if cols is None else cols.gather(1, pick)  # [n, 1]
    rows = torch.arange(n, device=logp.device).unsqueeze(1)
    top = torch.cat([scores + logp.gather(1, tok), torch.full_like(scores, NEG_INF)], dim=1)
    return top, torch.cat([rows, rows], dim=1), torch.cat([tok, torch.full_like(tok, PAD)], dim=1)


@torch.no_grad()
def beam_search(
    model: Searchable,
    src: torch.Tensor,
    src_len: torch.Tensor,
    opts: SearchOptions,
    return_attention: bool = False,
    vocab: torch.Tensor | None = None,
    draws: list[int] | None = None,
) -> list[list[Hypothesis]]:
    """n-best lists (best first) for each sentence of the batch; src [B, S], src_len [B].

    ``vocab``: a vocabulary shortlist for this batch (nmt.shortlist: sorted target ids [V'] starting with
    the special ids, so EOS keeps its index): every step scores and normalises over those ids only.
    Sampling with ``n_best`` > 1 draws each sentence ``n_best`` times (rows of one batch; ``draws`` numbers
    them) and lists the draws best first.
    """
    if opts.sample and opts.n_best > 1:
        n = opts.n_best
        rows = torch.arange(src.size(0), device=src.device).repeat_interleave(n)
        one = dataclasses.replace(opts, n_best=1)
        each = beam_search(
            model, src[rows], src_len[rows], one, return_attention, vocab, draws=list(range(n)) * src.size(0)
        )
        return [
            sorted((h[0] for h in each[i * n : (i + 1) * n]), key=lambda h: h.score, reverse=True)
            for i in range(src.size(0))
        ]
    B, K, dev = src.size(0), opts.beam_size, src.device
    if opts.n_best > K:
        raise ValueError(f"n_best ({opts.n_best}) cannot exceed beam_size ({K})")
    if vocab is not None:
        vocab = vocab.to(dev)
        if vocab.numel() <= EOS or not bool((vocab[: EOS + 1] == torch.arange(EOS + 1, device=dev)).all()):
            raise ValueError("a shortlist must be sorted target ids that start with the special ids 0..EOS")
    src_len_d = src_len.to(dev)
    max_len = (src_len_d.float() * opts.max_len_ratio).long() + 10
    if opts.max_len_cap:
        max_len = max_len.clamp(max=opts.max_len_cap)
    min_len = (src_len_d.float() * opts.min_len_ratio).long().clamp(max=max_len - 1)
    # One beam is greedy search: with nothing to choose between, a length penalty would only
    # keep extending the argmax path past its first EOS.
    alpha, beta = (opts.alpha, opts.beta) if K > 1 else (0.0, 0.0)
    bound_lp = length_penalty(max_len, alpha).to(dev)  # [B] the largest lp a hypothesis can reach

    # the CPU fast path's selection and normalisation where the model runs it (Seq2Seq.fast_search), else the plain ones
    fast = getattr(model, "fast_search", False)
    topk, normalise = (blocked_topk, log_probs_in_place) if fast else (row_topk, log_probs)
    state = model.start(src, src_len) if vocab is None else model.start(src, src_len, vocab)
    gens = sentence_generators(src.cpu(), src_len.cpu(), opts.sample_seed, draws) if opts.sample else []
    active = torch.arange(B, device=dev)  # sentences still searching
    # A sentence's K beams start identical, so the first step runs once per sentence and its output and
    # state are copied to the K beams ([B] -> [B*K] rows, sentence-major), not computed K times.
    y = torch.full((B,), BOS, dtype=torch.long, device=dev)
    logits, state, w = model.step(y, state)
    beams = active.repeat_interleave(K)
    logits, state = logits.index_select(0, beams), state.index_select(beams)
    w = w.index_select(0, beams) if w is not None else None
    scores = torch.full((B, K), NEG_INF, device=dev)
    scores[:, 0] = 0.0  # the K beams start identical: keep one alive so the first top-k is distinct
    hist = torch.empty(B * K, 0, dtype=torch.long, device=dev)
    src_mask = (src != PAD).repeat_interleave(K, dim=0)  # [N, S]
    need_att = return_attention or beta > 0
    coverage = torch.zeros(src_mask.shape, device=dev) if need_att else None
    att_hist = [] if return_attention else None
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    kth_finished = torch.full((B,), NEG_INF, device=dev)  # score of each sentence's n_best-th finished one

    for t in range(int(max_len.max())):
        if t > 0:  # step 0 ran above, once per sentence
            logits, state, w = model.step(y, state)
        logp = normalise(logits)  # [N, V] log p over the vocabulary (or shortlist), before any masking
        step_len = t + 1  # tokens including the one chosen now
        beam_sent = active.repeat_interleave(K)  # [N] original sentence of each beam
        logp[step_len <= min_len[beam_sent], EOS] = NEG_INF
        _block_repeats(logp, hist, opts.no_repeat_ngram, vocab)
        at_max = step_len >= max_len[beam_sent]
        if bool(at_max.any()):  # beams at their limit may only end
            forced = logp[at_max, EOS].clone()
            logp[at_max] = NEG_INF
            logp[at_max, EOS] = forced
        if need_att:
            coverage = coverage + w.float()
            if return_attention:
                att_hist.append(w.float())
        if opts.sample:
            top, origin, tok = sampled_candidates(scores, logp, opts, gens)  # [n, 2] each
        else:
            top, origin, tok = best_candidates(scores, logp, 2 * K, topk)  # [n, 2K] each
        if vocab is not None:
            tok = vocab[tok]  # shortlist positions -> target ids
        is_eos = (tok == EOS) & (top > NEG_INF)
        is_eos[:, K:] = False  # only EOS among the K best candidates finish (standard beam search)

        # Finished hypotheses move out of the beam (host work only for the few that end now).
        ends = is_eos.nonzero()  # [E, 2]: (row, candidate) of each hypothesis that ends now
        if len(ends):
            rows, cols = ends.unbind(1)
            beams = origin[rows, cols]
            raw = top[rows, cols]
            final = raw / length_penalty(step_len, alpha).to(dev)
            if beta > 0:
                final = final + coverage_penalty(coverage[beams], src_mask[beams], beta)
            # to Python once per step, not once per hypothesis
            sents, toks, finals, raws = active[rows].tolist(), hist[beams].tolist(), final.tolist(), raw.tolist()
            atts = torch.stack(att_hist, 1)[beams] if return_attention else None
            for i, b in enumerate(sents):
                att = atts[i, :, : int(src_len[b])].cpu() if atts is not None else None
                finished[b].append(Hypothesis(toks[i], finals[i], raws[i], att))
            for b in set(sents):
                if len(finished[b]) >= opts.n_best:
                    kth_finished[b] = sorted((h.score for h in finished[b]), reverse=True)[opts.n_best - 1]

        # The K best candidates that did not end stay open.
        open_rank = top.masked_fill(tok == EOS, NEG_INF)  # an EOS candidate never continues
        keep_vals, keep_pos = open_rank.topk(K, dim=1)  # [n, K]
        beams = origin.gather(1, keep_pos).view(-1)
        y = tok.gather(1, keep_pos).view(-1)
        scores = keep_vals
        hist = torch.cat([hist.index_select(0, beams), y.unsqueeze(1)], dim=1)
        if need_att:
            coverage = coverage.index_select(0, beams)
            if return_attention:
                att_hist = [a.index_select(0, beams) for a in att_hist]
        # Back-pointers stay within a sentence (origin = its row * K + beam), whose beams share the
        # encoder side: only each hypothesis' own state moves, and src_mask (per sentence) stays.
        state = state.reorder_beams(beams)

        # Done: n_best finished hypotheses, and no open beam can overtake the n_best-th of them
        # (-inf >= -inf also ends a sentence that has no open beam left).
        if opts.stop == "exact":
            best_open = scores.max(dim=1).values / bound_lp[active]  # [n]
        else:  # early: what the best open beam would score if it ended at the next step
            best_open = scores.max(dim=1).values / length_penalty(step_len + 1, alpha).to(dev)
        done = kth_finished[active] >= best_open
        keep = ~done
        if not bool(keep.any()):
            break
        if not bool(keep.all()):  # finished sentences leave the batch: later steps do less work
            active, scores = active[keep], scores[keep]
            gens = [g for g, k in zip(gens, keep.tolist()) if k] if gens else gens
            sel = keep.repeat_interleave(K).nonzero(as_tuple=True)[0]
            y, hist, state, src_mask = y[sel], hist[sel], state.index_select(sel), src_mask[sel]
            if need_att:
                coverage = coverage[sel]
                if return_attention:
                    att_hist = [a[sel] for a in att_hist]

    return [sorted(f, key=lambda h: h.score, reverse=True)[: opts.n_best] for f in finished]


def greedy(
    model: Searchable,
    src: torch.Tensor,
    src_len: torch.Tensor,
    max_len_ratio: float = 2.0,
    return_attention: bool = False,
) -> list[Hypothesis]:
    """Argmax decoding: beam search with one beam (the same code path)."""
    opts = SearchOptions(beam_size=1, max_len_ratio=max_len_ratio)
    return [h[0] for h in beam_search(model, src, src_len, opts, return_attention)]
