"""What a model's attention looks like, in four numbers, over a set of sentences.

Input: one weight matrix A [T, S] per sentence (T target steps, the EOS step included; S real source
positions, padding already cut off, as ``Hypothesis.attention`` holds them). Rows are first
renormalised to sum to 1: local attention (Luong et al. 2015, eq. 10) multiplies its softmax by an
unnormalised Gaussian, so its rows sum to less than 1, and the statistics should describe where the
attention points, not how much of it the Gaussian let through. Rows with no mass are left out.

With a_t the renormalised row t of A and ``log`` the natural logarithm:

* ``entropy`` = mean over rows of H(a_t) = -Σ_s a_ts log a_ts, in nats. 0 for a one-hot row,
  log S for a uniform one: how spread out one step's attention is.
* ``max_share`` = mean over rows of max_s a_ts: the share of a step's mass on its single best
  source position (1 = hard alignment, 1/S = uniform).
* ``backward`` = share of steps t > 0 with argmax_s a_ts < argmax_s a_{t-1,s}: how often the focus
  jumps back in the source (0 for a monotone alignment such as English→Spanish mostly is).
* ``coverage`` = mean over sentences of H(c) / log S with c_s = Σ_t a_ts / T, the share of the
  sentence's attention that source position s received: the evenness of the column sums,
  1 = every source position got the same total mass, 0 = all of it fell on one position (S = 1
  counts as 1). The normalised entropy rather than a Gini coefficient, because it is on the same
  (entropy) scale as the ``entropy`` column and comparable across sentence lengths; it answers
  Tu et al. 2016's question (is some source word never translated, or translated twice?) without
  a reference alignment.

Rows (entropy, max_share) and step pairs (backward) are pooled over all sentences, so every target
token weighs the same, as corpus BLEU does; coverage is a per-sentence quantity, averaged.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class AttentionStats:
    entropy: float  # nats, mean over target steps
    max_share: float  # mean row maximum, in [1/S, 1]
    backward: float  # share of steps t > 0 whose argmax moved back, in [0, 1]
    coverage: float  # evenness of the column sums, in [0, 1]
    sentences: int  # matrices that contributed
    rows: int  # target steps that contributed

    def as_dict(self) -> dict:
        return asdict(self)


def _rows(att: torch.Tensor) -> torch.Tensor:
    """A [T, S] → the rows with mass, each renormalised to sum to 1 (float64, so sums are exact enough)."""
    a = att.detach().to(torch.float64).clamp(min=0.0)
    mass = a.sum(-1)
    keep = mass > 0
    return a[keep] / mass[keep].unsqueeze(-1)


def _entropy(p: torch.Tensor) -> torch.Tensor:
    """-Σ p log p over the last dimension, with 0 log 0 = 0."""
    return -(p * torch.log(p.clamp(min=1e-300))).sum(-1)


def attention_stats(matrices: Iterable[torch.Tensor | None]) -> AttentionStats:
    """The four statistics of the module docstring over ``matrices`` (each [T, S]; None, empty ones
    and rows with no mass are skipped). With nothing to measure every statistic is NaN."""
    ent = top = 0.0
    back = pairs = rows = sentences = 0
    cover = []
    for att in matrices:
        if att is None or att.numel() == 0:
            continue
        a = _rows(att)
        if a.size(0) == 0:
            continue
        sentences, rows = sentences + 1, rows + a.size(0)
        ent += float(_entropy(a).sum())
        top += float(a.max(-1).values.sum())
        focus = a.argmax(-1)  # [T]
        back += int((focus[1:] < focus[:-1]).sum())
        pairs += a.size(0) - 1
        S = a.size(1)
        cover.append(1.0 if S == 1 else float(_entropy(a.mean(0))) / math.log(S))
    if not sentences:
        nan = float("nan")
        return AttentionStats(nan, nan, nan, nan, 0, 0)
    return AttentionStats(
        entropy=ent / rows,
        max_share=top / rows,
        backward=back / pairs if pairs else 0.0,
        coverage=sum(cover) / len(cover),
        sentences=sentences,
        rows=rows,
    )
