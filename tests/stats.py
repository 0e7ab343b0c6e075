"""Small statistics helpers for distribution tests (no SciPy needed)."""

import math

import torch

Z_1E6 = 4.753  # standard normal quantile for a one-sided p-value of 1e-6


def chi2_critical(df: int, z: float = Z_1E6) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile for ``df`` degrees."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi2_statistic(
    counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0
) -> tuple[float, int]:
    """Pearson's statistic of ``counts`` against ``probs``, pooling sparse cells.

    Returns ``(statistic, degrees of freedom)``.
    """
    total = float(counts.sum())
    expected = probs.double() * total
    observed = counts.double()
    sparse = expected < min_expected
    if sparse.any():
        expected = torch.cat([expected[~sparse], expected[sparse].sum().reshape(1)])
        observed = torch.cat([observed[~sparse], observed[sparse].sum().reshape(1)])
    keep = expected > 0
    if bool((observed[~keep] > 0).any()):
        return math.inf, 1
    expected, observed = expected[keep], observed[keep]
    stat = float(((observed - expected) ** 2 / expected).sum())
    return stat, max(int(keep.sum()) - 1, 1)


def matches(counts: torch.Tensor, probs: torch.Tensor) -> bool:
    """True if ``counts`` are plausible draws from ``probs`` (p-value above 1e-6)."""
    stat, df = chi2_statistic(counts, probs)
    return stat < chi2_critical(df)
