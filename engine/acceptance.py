"""The lossless acceptance rule of speculative decoding, as pure functions.

Leviathan et al. 2022 (Alg. 1) and Chen et al. 2023: a draft token ``x`` proposed
with draft probability ``q(x)`` is accepted with probability ``min(1, p(x) / q(x))``
where ``p`` is the target's distribution at that position. At the first rejection
the emitted token is drawn from the residual ``normalise(max(0, p - q))``; if every
draft token is accepted a bonus token is drawn from the target's next distribution.
The emitted sequence then has exactly the target's distribution.

A drafter without probabilities (n-gram or suffix lookup) counts as ``q = one-hot``:
the token is accepted with probability ``p(x)`` and the residual is ``p`` with ``x``
removed. Greedy decoding accepts while the draft equals the target's argmax.

All randomness comes in as explicit uniforms ``u`` (one per draft position) and
``u_next`` (one per sequence, used by inverse-CDF sampling), so the functions are
deterministic and the vectorised version can be checked against the reference.

Worked example (greedy): draft ``[5, 7, 2]``, target argmax ``[5, 7, 9, 4]`` ->
two accepted, the target's ``9`` replaces the rejected ``2``: emit ``[5, 7, 9]``.
"""

import torch

EPS = 1e-12


def inverse_cdf(dist: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Sample from unnormalised ``dist`` ``[B, V]`` with uniforms ``u`` ``[B]`` -> ``[B]``."""
    cdf = dist.cumsum(-1)  # [B, V]
    value = (u * cdf[:, -1]).unsqueeze(-1)  # [B, 1]
    idx = torch.searchsorted(cdf, value, right=True).squeeze(-1)  # [B]
    return idx.clamp_(max=dist.shape[-1] - 1)


def greedy_accept(
    target_argmax: torch.Tensor, draft: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification.

    Args:
        target_argmax: ``[B, G+1]`` the target's argmax after each prefix.
        draft: ``[B, G]`` proposed tokens.
    Returns:
        ``n_matches`` ``[B]`` accepted drafts, ``next_token`` ``[B]`` the target's token
        at the first mismatch (or the bonus token after all ``G`` matched).
    """
    matches = (draft == target_argmax[:, : draft.shape[1]]).long()  # [B, G]
    n_matches = matches.cumprod(-1).sum(-1)  # [B]
    next_token = target_argmax.gather(1, n_matches.unsqueeze(-1)).squeeze(-1)  # [B]
    return n_matches, next_token


def speculative_accept(
    p: torch.Tensor,
    q: torch.Tensor | None,
    draft: torch.Tensor,
    u: torch.Tensor,
    u_next: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling over a batch of independent sequences.

    Args:
        p: ``[B, G+1, V]`` target probabilities after each prefix.
        q: ``[B, G, V]`` draft probabilities, or ``None`` for one-hot drafts.
        draft: ``[B, G]`` proposed tokens (long).
        u: ``[B, G]`` uniforms in [0, 1) for the accept tests.
        u_next: ``[B]`` uniforms in [0, 1) for the recovered or bonus token.
    Returns:
        ``n_matches`` ``[B]`` and ``next_token`` ``[B]``.
    """
    b, g = draft.shape
    if q is None:
        q = torch.zeros(b, g, p.shape[-1], dtype=p.dtype).scatter_(-1, draft.unsqueeze(-1), 1.0)
    p_x = p[:, :g].gather(-1, draft.unsqueeze(-1)).squeeze(-1)  # [B, G]
    q_x = q.gather(-1, draft.unsqueeze(-1)).squeeze(-1)  # [B, G]
    accepted = (u * q_x < p_x).long()  # u < p(x)/q(x), without dividing by q(x)
    n_matches = accepted.cumprod(-1).sum(-1)  # [B]
    q_pad = torch.cat([q.to(p.dtype), torch.zeros(b, 1, p.shape[-1], dtype=p.dtype)], dim=1)
    rows = torch.arange(b)
    p_n = p[rows, n_matches]  # [B, V]: the target at the first rejection (or the bonus row)
    p_prime = (p_n - q_pad[rows, n_matches]).clamp_(min=0)  # [B, V] residual max(0, p - q)
    # p == q at a rejected position has probability zero; guard the rounding case anyway.
    empty = p_prime.sum(-1, keepdim=True) <= EPS
    p_prime = torch.where(empty, p_n, p_prime)
    return n_matches, inverse_cdf(p_prime, u_next)


def speculative_accept_reference(
    p: torch.Tensor, q: torch.Tensor | None, draft: list[int], u: list[float], u_next: float
) -> tuple[int, int]:
    """One sequence, written as a plain loop over Leviathan et al. Alg. 1 (for tests).

    Args: ``p`` ``[G+1, V]``, ``q`` ``[G, V]`` or ``None``, ``draft`` of length ``G``.
    """
    for i, x in enumerate(draft):
        q_x = 1.0 if q is None else float(q[i, x])
        if u[i] * q_x < float(p[i, x]):
            continue
        q_row = torch.zeros_like(p[i]) if q is None else q[i].to(p.dtype)
        if q is None:
            q_row[x] = 1.0
        residual = torch.clamp(p[i] - q_row, min=0)
        if float(residual.sum()) <= EPS:
            residual = p[i]
        return i, _reference_inverse_cdf(residual, u_next)
    return len(draft), _reference_inverse_cdf(p[len(draft)], u_next)


def _reference_inverse_cdf(dist: torch.Tensor, u: float) -> int:
    target = u * float(dist.sum())
    running = 0.0
    for token, mass in enumerate(dist.tolist()):
        running += mass
        if running > target:
            return token
    return int(dist.shape[0]) - 1
