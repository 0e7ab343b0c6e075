"""Seeded draws: one uniform per (seed, position), inverted through the cumulative sum."""

import torch

from engine.spec.sampling import position_uniform, quantile_token
from tests.stats import matches


def test_position_uniforms_are_pure_and_in_the_open_interval() -> None:
    values = [position_uniform(seed, pos) for seed in (0, 1, 2**40) for pos in range(400)]
    assert all(0.0 < v < 1.0 for v in values)
    assert values == [position_uniform(seed, pos) for seed in (0, 1, 2**40)
                      for pos in range(400)]
    assert len(set(values)) == len(values)
    mean = sum(values) / len(values)
    assert abs(mean - 0.5) < 0.02  # 1,200 draws: 4 standard deviations


def test_the_uniforms_of_a_seed_are_spread_like_independent_draws() -> None:
    """Neighbouring positions (what one answer uses) fill the unit square evenly."""
    pairs = torch.tensor([[position_uniform(5, 2 * i), position_uniform(5, 2 * i + 1)]
                          for i in range(4000)])
    cells = (pairs * 4).floor().long()
    counts = torch.bincount(cells[:, 0] * 4 + cells[:, 1], minlength=16).double()
    assert matches(counts, torch.full((16,), 1 / 16))


def test_quantile_draws_reproduce_the_distribution_and_skip_zeros() -> None:
    probs = torch.tensor([0.0, 0.1, 0.0, 0.45, 0.3, 0.15, 0.0])
    counts = torch.zeros(7)
    for pos in range(3000):
        counts[quantile_token(probs, position_uniform(9, pos))] += 1
    assert counts[0] == counts[2] == counts[6] == 0
    assert matches(counts, probs.double())


def test_quantile_edges() -> None:
    probs = torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0])
    assert [quantile_token(probs, u) for u in (1e-12, 0.4999, 0.5, 1 - 1e-12)] == [1, 1, 3, 3]
    unnormalised = torch.tensor([2.0, 0.0, 6.0])  # scaled by its own total
    assert quantile_token(unnormalised, 0.2) == 0 and quantile_token(unnormalised, 0.3) == 2
