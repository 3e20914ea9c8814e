"""nmt.attention_stats on matrices whose statistics are known by hand."""

from __future__ import annotations

import math

import pytest
import torch

from nmt.attention_stats import attention_stats


def test_identity_alignment_is_sharp_monotone_and_covers_every_source_position():
    s = attention_stats([torch.eye(5)])
    assert s.entropy == pytest.approx(0.0, abs=1e-9)
    assert s.max_share == pytest.approx(1.0)
    assert s.backward == 0.0
    assert s.coverage == pytest.approx(1.0)
    assert (s.sentences, s.rows) == (1, 5)


def test_uniform_attention_has_maximal_entropy_and_even_coverage():
    s = attention_stats([torch.full((4, 5), 0.2)])
    assert s.entropy == pytest.approx(math.log(5))
    assert s.max_share == pytest.approx(0.2)
    assert s.coverage == pytest.approx(1.0)


def test_reversed_alignment_moves_backwards_at_every_step():
    s = attention_stats([torch.eye(5).flip(1)])
    assert s.backward == pytest.approx(1.0)
    assert s.entropy == pytest.approx(0.0, abs=1e-9) and s.max_share == pytest.approx(1.0)
    assert s.coverage == pytest.approx(1.0)


def test_coverage_falls_when_attention_piles_onto_few_source_positions():
    one = torch.zeros(3, 4)
    one[:, 0] = 1.0  # every step on the first source position
    assert attention_stats([one]).coverage == pytest.approx(0.0, abs=1e-9)
    two = torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0, 0]])  # column shares [.5, .5, 0, 0]
    assert attention_stats([two]).coverage == pytest.approx(math.log(2) / math.log(4))


def test_rows_are_pooled_over_sentences_and_coverage_averaged_per_sentence():
    half = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])  # entropies log 2 and 0, maxima .5 and 1
    s = attention_stats([torch.eye(3), torch.eye(3).flip(1), half])
    assert s.rows == 3 + 3 + 2 and s.sentences == 3
    assert s.entropy == pytest.approx(math.log(2) / 8)
    assert s.max_share == pytest.approx((7 + 0.5) / 8)
    assert s.backward == pytest.approx(2 / (2 + 2 + 1))  # only the reversed sentence moves back
    cov_half = -(0.25 * math.log(0.25) * 2 + 0.5 * math.log(0.5)) / math.log(3)
    assert s.coverage == pytest.approx((1 + 1 + cov_half) / 3)


def test_rows_that_sum_below_one_are_renormalised_and_empty_ones_skipped():
    """Local attention's Gaussian leaves rows summing to less than 1; a row without mass says nothing."""
    a = torch.eye(4) * 0.3
    a[2] = 0.0
    s = attention_stats([a, None, torch.empty(0, 0)])
    assert s.max_share == pytest.approx(1.0) and s.rows == 3 and s.sentences == 1


def test_nothing_to_measure_gives_nan():
    s = attention_stats([])
    assert s.sentences == 0 and math.isnan(s.entropy) and math.isnan(s.coverage)
