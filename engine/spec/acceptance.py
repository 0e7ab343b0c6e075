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


def tree_accept(
    p: torch.Tensor | None,
    target_argmax: torch.Tensor | None,
    q: torch.Tensor | None,
    draft: list[int],
    parents: list[int],
    u: list[float],
    u_next: float,
) -> tuple[list[int], int]:
    """Verify a draft tree: walk down from the root, one accepted child per level.

    Row 0 is the root (the pending token); draft node ``i`` is row ``i + 1`` with token
    ``draft[i]`` and parent row ``parents[i] + 1`` (``parents[i] == -1``: the root).
    Greedy (``target_argmax [N+1]``): follow the child whose token is the target's
    argmax. Sampling (``p [N+1, V]``): a node's children, in row order, are tried as
    candidates drawn without replacement from their shared draft distribution
    (``q [N, V]`` per node, ``None``: each child one-hot): child ``j`` is accepted with
    probability ``min(1, p_j(x) / q_j(x))``, where ``q_j`` is ``q`` without the earlier
    children's tokens (renormalised) and ``p_j`` the residual left by the earlier
    rejections, ``normalise(max(0, p_(j-1) - q_(j-1)))``; if all are rejected the
    token is drawn from the last residual (Jeon et al. 2024, recursive rejection
    sampling). Each step is Leviathan's rule with draft ``q_j``, so the emitted tokens
    have the target's distribution. A chain reduces to :func:`speculative_accept`.

    Returns the accepted draft nodes (indices into ``draft``, root to leaf) and the next
    token (the target's own at the first level with no accepted child).
    """
    children: list[list[int]] = [[] for _ in range(len(draft) + 1)]  # by parent row
    for i, parent in enumerate(parents):
        children[parent + 1].append(i)
    path: list[int] = []
    row = 0
    while True:
        if target_argmax is not None:
            best = int(target_argmax[row])
            hit = next((i for i in children[row] if draft[i] == best), None)
            if hit is None:
                return path, best
        else:
            assert p is not None
            hit, residual = _accept_child(p[row], q, draft, children[row], u)
            if hit is None:
                return path, _reference_inverse_cdf(residual, u_next)
        path.append(hit)
        row = hit + 1


def _accept_child(
    p_row: torch.Tensor, q: torch.Tensor | None, draft: list[int], nodes: list[int],
    u: list[float],
) -> tuple[int | None, torch.Tensor]:
    """One level of :func:`tree_accept`: the accepted child, or ``None`` and the residual
    (unnormalised) to draw the next token from."""
    dist, mass = p_row, 1.0  # the target's row is a distribution; residuals are not
    left = None if q is None or not nodes else q[nodes[0]].to(p_row.dtype)  # [V]
    for i in nodes:
        x = draft[i]
        if left is None:
            q_j = torch.zeros_like(dist)
            q_j[x] = 1.0
        else:
            q_j = left
        if u[i] * float(q_j[x]) * mass < float(dist[x]):
            return i, dist
        residual = (dist / mass - q_j).clamp(min=0)
        if float(residual.sum()) <= EPS:  # p == q: rejection had probability zero
            return None, dist
        dist, mass = residual, float(residual.sum())
        if left is not None:
            left = left.clone()
            left[x] = 0.0  # the next child was drawn without this one
            if float(left.sum()) <= EPS:
                return None, dist
            left = left / left.sum()
    return None, dist
