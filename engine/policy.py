"""Adaptive draft length and automatic switch-off, from measured costs.

Leviathan et al. 2022: if each draft token is accepted independently with
probability ``alpha``, a pass that drafts ``gamma`` tokens yields on average
``E = (1 - alpha^(gamma+1)) / (1 - alpha)`` tokens and costs
``gamma * c + t(gamma + 1)`` seconds, where ``c`` is one draft step and ``t(k)`` a
target forward over ``k`` tokens. :func:`choose_gamma` maximises ``E / cost``;
``gamma = 0`` (plain decoding, ``1 / t(1)``) wins when drafting cannot pay.

:class:`DraftPolicy` measures ``alpha``, ``c`` and ``t(k)`` on the current answer
(exponentially decayed, so it follows the text), picks ``gamma`` before each pass,
and when plain decoding is predicted faster it stops drafting for a cool-down that
doubles on each failed probe, then probes again. All functions are pure or depend
only on the numbers fed to ``update``, so they are tested with synthetic costs.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

DECAY = 0.85  # weight of the past in the running estimates, per pass
PRIOR_SLOPE = 0.15  # assumed extra cost per extra verified token, relative to t(1)
MIN_COOLDOWN, MAX_COOLDOWN = 4, 64


def expected_tokens(alpha: float, gamma: int) -> float:
    """Mean tokens per pass for acceptance rate ``alpha`` and ``gamma`` drafts."""
    if gamma <= 0:
        return 1.0
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def choose_gamma(
    alpha: float, draft_cost: float, verify_cost: Callable[[int], float], max_gamma: int
) -> int:
    """The draft length in ``0..max_gamma`` with the highest expected tokens per second."""
    best, best_rate = 0, 1.0 / verify_cost(1)
    for gamma in range(1, max_gamma + 1):
        rate = expected_tokens(alpha, gamma) / (gamma * draft_cost + verify_cost(gamma + 1))
        if rate > best_rate * 1.02:  # prefer shorter drafts unless clearly better
            best, best_rate = gamma, rate
    return best


@dataclass
class DraftPolicy:
    """Per-answer controller of the draft length (``next_gamma`` / ``update``)."""

    max_gamma: int = 8
    start_gamma: int = 4
    alpha_prior: float = 0.6
    accepted: float = 0.0
    rejected: float = 0.0
    draft_cost: float | None = None  # seconds per drafted token
    verify: dict[int, float] = field(default_factory=dict)  # tokens fed -> seconds
    cooldown: int = 0  # plain passes left before the next probe
    next_cooldown: int = MIN_COOLDOWN
    off_passes: int = 0  # passes run plain because drafting did not pay
    last_off: bool = False  # whether the last next_gamma() switched drafting off
    probe: bool = False  # the cool-down is over: draft once more to re-measure acceptance

    def new_answer(self) -> None:
        """Forget the acceptance of the previous answer; keep the measured costs."""
        self.accepted = self.rejected = 0.0
        self.cooldown, self.next_cooldown, self.off_passes = 0, MIN_COOLDOWN, 0
        self.probe = False

    @property
    def alpha(self) -> float:
        """Acceptance rate estimate (geometric MLE with a weak prior)."""
        a, r = self.accepted + self.alpha_prior, self.rejected + (1 - self.alpha_prior)
        return a / (a + r)

    def verify_cost(self, k: int) -> float:
        """Measured or interpolated cost of a target forward over ``k`` tokens."""
        if k in self.verify:
            return self.verify[k]
        base = self.verify.get(1) or min(self.verify.values(), default=1.0)
        known = sorted(self.verify)
        if len(known) >= 2:
            lo, hi = known[0], known[-1]
            slope = max(0.0, (self.verify[hi] - self.verify[lo]) / (hi - lo))
            return self.verify[lo] + slope * (k - lo) if k > lo else self.verify[lo]
        return base * (1 + PRIOR_SLOPE * (k - 1))

    def next_gamma(self, room: int) -> int:
        """Draft length for the next pass (0 = plain), at most ``room - 1``."""
        limit = min(self.max_gamma, room - 1)
        self.last_off = False
        if limit <= 0:
            return 0
        if self.cooldown > 0:
            self.cooldown -= 1
            self.probe = self.cooldown == 0
            self.off_passes += 1
            self.last_off = True
            return 0
        if self.draft_cost is None or self.probe:
            self.probe = False
            return min(self.start_gamma, limit)  # measure a draft and t(gamma+1)
        if 1 not in self.verify:
            return 0  # one plain pass measures t(1), the cost to beat
        gamma = choose_gamma(self.alpha, self.draft_cost, self.verify_cost, limit)
        if gamma == 0:
            self.cooldown = self.next_cooldown - 1
            self.next_cooldown = min(self.next_cooldown * 2, MAX_COOLDOWN)
            self.off_passes += 1
            self.last_off = True
        return gamma

    def update(self, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        """Feed one pass's outcome: drafts proposed and kept, and their timings."""
        fed = drafted + 1
        old = self.verify.get(fed)
        self.verify[fed] = verify_s if old is None else DECAY * old + (1 - DECAY) * verify_s
        if drafted == 0:
            return
        per_token = draft_s / drafted
        self.draft_cost = per_token if self.draft_cost is None else (
            DECAY * self.draft_cost + (1 - DECAY) * per_token
        )
        self.accepted = DECAY * self.accepted + accepted
        self.rejected = DECAY * self.rejected + (1 if accepted < drafted else 0)
        if accepted == drafted:
            self.next_cooldown = MIN_COOLDOWN
