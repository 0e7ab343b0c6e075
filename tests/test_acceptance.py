"""The acceptance rule: greedy prefix matching, and lossless speculative sampling."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.spec.acceptance import (
    greedy_accept,
    inverse_cdf,
    speculative_accept,
    speculative_accept_reference,
    tree_accept,
)
from tests.stats import matches

V = 6
P = torch.tensor(
    [
        [0.30, 0.25, 0.20, 0.10, 0.10, 0.05],
        [0.05, 0.05, 0.10, 0.20, 0.25, 0.35],
        [0.50, 0.00, 0.10, 0.10, 0.20, 0.10],
        [0.10, 0.20, 0.30, 0.20, 0.10, 0.10],
    ],
    dtype=torch.float64,
)  # [G+1, V]: the target at each of the 3 draft positions, plus the bonus row
Q = torch.tensor(
    [
        [0.05, 0.10, 0.50, 0.05, 0.20, 0.10],
        [0.40, 0.10, 0.10, 0.10, 0.10, 0.20],
        [0.10, 0.30, 0.10, 0.30, 0.10, 0.10],
    ],
    dtype=torch.float64,
)  # [G, V]: the draft's distributions
DRAWS = 200_000


def test_greedy_accepts_matching_prefix_then_target_token() -> None:
    draft = torch.tensor([[5, 7, 2], [1, 1, 1], [4, 4, 4]])
    argmax = torch.tensor([[5, 7, 9, 4], [0, 1, 1, 1], [4, 4, 4, 8]])
    n, nxt = greedy_accept(argmax, draft)
    assert n.tolist() == [2, 0, 3]
    assert nxt.tolist() == [9, 0, 8]


def test_inverse_cdf_never_picks_zero_probability_tokens() -> None:
    dist = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.0, 0.5]], dtype=torch.float64)
    for u in (0.0, 0.25, 0.5, 0.999999):
        picks = inverse_cdf(dist, torch.tensor([u, u], dtype=torch.float64))
        assert picks[0] == 1
        assert picks[1] in (0, 2)


def _emitted_first_two(  # type: ignore[no-untyped-def]
    rule, q: torch.Tensor | None, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the acceptance step on DRAWS independent sequences; count emitted tokens."""
    g = torch.Generator().manual_seed(seed)
    b, gamma = DRAWS, Q.shape[0]
    if q is None:
        draft = torch.tensor([2, 4, 0]).expand(b, gamma)  # a fixed, deterministic draft
    else:
        draft = torch.multinomial(q.repeat(b, 1), 1, generator=g).reshape(b, gamma)
    p = P.expand(b, -1, -1)
    qb = None if q is None else q.expand(b, -1, -1)
    u = torch.rand(b, gamma, generator=g, dtype=torch.float64)
    u_next = torch.rand(b, generator=g, dtype=torch.float64)
    n, nxt = rule(p, qb, draft, u, u_next)
    first = torch.where(n >= 1, draft[:, 0], nxt)
    second = torch.where(n >= 2, draft[:, 1], nxt)[n >= 1]  # exists only if the first was a draft
    return torch.bincount(first, minlength=V), torch.bincount(second, minlength=V)


def test_speculative_sampling_reproduces_the_target_distribution() -> None:
    first, second = _emitted_first_two(speculative_accept, Q, seed=1)
    assert matches(first, P[0])
    assert matches(second, P[1])


def test_one_hot_drafts_reproduce_the_target_distribution() -> None:
    first, second = _emitted_first_two(speculative_accept, None, seed=2)
    assert matches(first, P[0])
    assert matches(second, P[1])


def _wrong_rule_resamples_from_p(p, q, draft, u, u_next):  # type: ignore[no-untyped-def]
    """A classic bug: on rejection, sample from p instead of the residual max(0, p - q)."""
    n, _ = speculative_accept(p, q, draft, u, u_next)
    rows = torch.arange(p.shape[0])
    return n, inverse_cdf(p[rows, n], u_next)


def _wrong_rule_inverted_ratio(p, q, draft, u, u_next):  # type: ignore[no-untyped-def]
    """Another: accepting with min(1, q/p) by swapping the roles of p and q."""
    p_rows, bonus = p[:, :-1], p[:, -1:]
    swapped = torch.cat([q, bonus], dim=1)
    return speculative_accept(swapped, p_rows, draft, u, u_next)


def test_the_distribution_test_catches_wrong_rules() -> None:
    for wrong in (_wrong_rule_resamples_from_p, _wrong_rule_inverted_ratio):
        first, _ = _emitted_first_two(wrong, Q, seed=3)
        assert not matches(first, P[0]), wrong.__name__


def _dist(draw: st.DrawFn, rows: int, vocab: int) -> torch.Tensor:
    weights = draw(
        st.lists(
            st.lists(st.floats(0, 1), min_size=vocab, max_size=vocab).filter(
                lambda r: sum(r) > 0.01
            ),
            min_size=rows, max_size=rows,
        )
    )
    t = torch.tensor(weights, dtype=torch.float64)
    return t / t.sum(-1, keepdim=True)


@st.composite
def _cases(draw: st.DrawFn) -> tuple:  # type: ignore[type-arg]
    vocab = draw(st.integers(2, 7))
    gamma = draw(st.integers(0, 4))
    p = _dist(draw, gamma + 1, vocab)
    q = _dist(draw, gamma, vocab) if gamma and draw(st.booleans()) else None
    draft = draw(st.lists(st.integers(0, vocab - 1), min_size=gamma, max_size=gamma))
    u = draw(st.lists(st.floats(0, 0.999), min_size=gamma, max_size=gamma))
    return p, q, draft, u, draw(st.floats(0, 0.999))


@settings(max_examples=300, deadline=None)
@given(_cases())
def test_vectorised_rule_equals_the_reference_loop(case: tuple) -> None:  # type: ignore[type-arg]
    p, q, draft, u, u_next = case
    expected = speculative_accept_reference(p, q, draft, u, u_next)
    n, nxt = speculative_accept(
        p.unsqueeze(0),
        None if q is None else q.unsqueeze(0),
        torch.tensor([draft], dtype=torch.long).reshape(1, len(draft)),
        torch.tensor([u], dtype=torch.float64).reshape(1, len(draft)),
        torch.tensor([u_next], dtype=torch.float64),
    )
    assert (int(n[0]), int(nxt[0])) == expected


@settings(max_examples=200, deadline=None)
@given(_cases())
def test_a_chain_shaped_tree_is_verified_as_the_chain(case: tuple) -> None:  # type: ignore[type-arg]
    p, q, draft, u, u_next = case
    path, nxt = tree_accept(p, None, q, draft, list(range(-1, len(draft) - 1)), u, u_next)
    assert path == list(range(len(path)))
    assert (len(path), nxt) == speculative_accept_reference(p, q, draft, u, u_next)


def test_greedy_tree_follows_the_target_argmax_down_any_branch() -> None:
    draft, parents = [5, 8, 7, 2, 3], [-1, -1, 0, 1, 1]  # 5 and 8 under the root; 7 under 5
    assert tree_accept(None, torch.tensor([8, 7, 3, 0, 1, 9]), None, draft, parents,
                       [], 0.0) == ([1, 4], 9)
    assert tree_accept(None, torch.tensor([5, 7, 3, 0, 1, 9]), None, draft, parents,
                       [], 0.0) == ([0, 2], 0)
    assert tree_accept(None, torch.tensor([6, 7]), None, draft, parents, [], 0.0) == ([], 6)


TREE_DRAWS = 30_000
TREE_PARENTS = [-1, -1, 0]  # two candidates for the first token; one child under the first


def _tree_emissions(q: torch.Tensor | None, seed: int) -> tuple[torch.Tensor, ...]:
    """Sample trees (siblings without replacement from Q[0], the grandchild from Q[1]),
    verify each against P's rows; count the first emitted token, and the second after
    each of the two first-level candidates."""
    g = torch.Generator().manual_seed(seed)
    first, after_a, after_b = (torch.zeros(V, dtype=torch.long) for _ in range(3))
    for _ in range(TREE_DRAWS):
        if q is None:
            draft, probs = [2, 4, 0], None
        else:
            a, b = torch.multinomial(q[0], 2, replacement=False, generator=g).tolist()
            draft = [a, b, int(torch.multinomial(q[1], 1, generator=g))]
            probs = torch.stack([q[0], q[0], q[1]])
        u = torch.rand(3, generator=g, dtype=torch.float64).tolist()
        u_next = float(torch.rand(1, generator=g, dtype=torch.float64))
        path, nxt = tree_accept(P, None, probs, draft, TREE_PARENTS, u, u_next)
        emitted = [draft[i] for i in path] + [nxt]
        first[emitted[0]] += 1
        if path[:1] == [0]:
            after_a[emitted[1]] += 1
        elif path[:1] == [1]:
            after_b[emitted[1]] += 1
    return first, after_a, after_b


def test_tree_sampling_reproduces_the_target_distribution() -> None:
    for q, seed in ((Q, 4), (None, 5)):
        first, after_a, after_b = _tree_emissions(q, seed)
        assert matches(first, P[0])
        assert matches(after_a, P[1])  # row 1: after the first candidate
        assert matches(after_b, P[2])  # row 2: after the second (no children: its residual)
