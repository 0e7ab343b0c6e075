"""Adaptive draft length and automatic switch-off, from measured costs.

Leviathan et al. 2022: if each draft token is accepted independently with
probability ``alpha``, a pass that drafts ``gamma`` tokens yields on average
``E = (1 - alpha^(gamma+1)) / (1 - alpha)`` tokens and costs
``gamma * c + t(gamma + 1)`` seconds, where ``c`` is one draft step and ``t(k)`` a
target forward over ``k`` tokens. A model drafter whose drafts were all accepted
(chance ``alpha^gamma``) feeds its last draft token on the next pass: one more step,
``c * alpha^gamma``, is added to the cost. :func:`choose_gamma` maximises
``E / cost``; ``gamma = 0`` (plain decoding, ``1 / t(1)``) wins when drafting cannot pay.

:class:`DraftPolicy` measures ``alpha``, ``c`` and ``t(k)`` (exponentially decayed, so
they follow the text), picks ``gamma`` before each pass, and when plain decoding is
predicted faster it stops drafting for a cool-down that doubles on each failed probe,
then probes again. ``c`` is measured per draft step: a pass whose drafter first had to
catch up with more context than the previous pass produced (after plain passes, or
after a lookup drafted for the hybrid) says nothing about the cost of a step and is not
counted. ``t(k)`` is kept as the ratio ``t(k) / t(1)`` to the ``t(1)`` of the same
period (a slow spell of the shared machine moves both; a ratio measured right after a
plain pass pairs two neighbours and weighs more, so a probe corrects a ratio that a
slow spell inflated during a long stretch of drafting; a policy that drafted every one of
``T1_EVERY`` passes runs one plain pass to measure ``t(1)`` again, so a ``t(1)`` taken in a
slow moment cannot make drafting look cheap for good), and the share of an asked
length a drafter really drafts (it stops early when unsure) scales the expected draft
length. A new answer starts from part of the previous answers' acceptance, so one
unlucky first pass does not switch drafting off. All functions are pure or depend
only on the numbers fed to ``update``, so they are tested with synthetic costs.

Calibrated start (:meth:`DraftPolicy.calibrated`): given the machine's measured ``t(1)``,
``t(k) / t(1)`` and the drafter's step cost (:mod:`engine.spec.calibration`), the policy
needs no measuring passes and chooses from its first pass; ``PRIOR_SLOPE`` is then
never used (it is the prior for ``t(k)`` before anything was measured). The calibration's
``t(1)`` is of another moment: where the first ``t(1)`` the policy times itself is more than
``SPIKE`` times faster, the calibration was taken in a slow moment, and that ``t(1)``
replaces it at once (the decoding loop gives the policy the time of a first pass that
runs plain while a drafter has not read the prompt; see :func:`engine.spec.decoding.decode`).
A policy made before the machine was calibrated (an answer that ran while the worker was
still measuring) takes the calibration's figures when it arrives, where it has none of
its own (:meth:`DraftPolicy.fill`): the sizes it never timed are then priced by this
machine, not by ``PRIOR_SLOPE``.

Under load (continuous batching, :mod:`engine.spec.batch`) the loop tells the policy how
many other answers share the coming pass (``others``); the draft length then maximises
the whole pass's tokens per second (:func:`choose_gamma`), so the rows go to drafts for
one user when the machine is idle and to the other users' rows when it is busy. A pass
given to the others is neither a switch-off nor timed.

Bounded switch-off and probing: besides the slow acceptance estimate (``DECAY``), a fast one
(``FAST_DECAY``, about the last two passes) is kept, and drafting switches off as soon as
the slow one predicts plain decoding faster, or the fast one does after a run of passes that
kept no draft which the slow estimate makes unlikely (chance ``(1 - alpha) ** run`` below
``FAST_EVIDENCE``). So a drafter whose drafts all stop being accepted is switched off within
a few passes whatever its history (the evidence of the fast estimate is bounded by
``max_gamma / (1 - FAST_DECAY)`` tokens), while one that keeps about half its first drafts,
as a head or a draft model does on prose, is not switched off by the two or three misses in
a row that such a drafter shows every few dozen passes (a cool-down and one failed probe
would then keep it off for the rest of the answer, where drafting on paid: see the replay in
docs/measurements.md). A probe after a cool-down drafts the length the costs pick at an
acceptance of at least the prior (at least one token); its cost beyond what plain decoding
would have taken for the tokens it produced is measured (its drafting as timed, its
verification at the running ``t(k)``, so that one pass the machine stalled does not read as
a dear probe), and the next cool-down lasts at least that excess divided by ``PROBE_SHARE``
plain passes (:func:`probe_cooldown`), so the probes of a drafter that never pays cost at
most ``PROBE_SHARE`` of plain decoding's time over a long answer; a model drafter whose
reading of the skipped text alone costs more is not probed again until the next answer.
Where the calibration measured that reading per token over a long context, the policy takes
it from there (one short catch-up, with its call's overhead spread over a few tokens or
slowed by the machine, reads dearer per token), so one probe does not end probing for a
drafter whose reading is cheap. A probe is not made at all while not even drafts that were
all accepted would pay at the measured costs (:func:`choose_gamma` at ``alpha = 1``): the
cool-down goes on, and the decoding loop, which has a drafter read the prompt only before
its first draft, never has it read (a draft model on a machine where extra verified rows are
dear costs plain decoding nothing).

A drafter made of parts (the hybrid: a lookup where it finds one, else a model) gets a
:class:`PartPolicies`: one :class:`DraftPolicy` per part, so each part has its own
acceptance, step cost, draft length and switch-off (a lookup that quotes the prompt is
accepted far more often than a model's guesses and costs next to nothing, so its drafts
may be much longer), while ``t(1)`` and ``t(k) / t(1)``, which belong to the machine, are
shared. The loop asks the drafter which part drafts the coming pass
(``Drafter.part_for``), then that part's policy for the length
(:meth:`PartPolicies.select`; a plain :class:`DraftPolicy` selects itself).
"""

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

DECAY = 0.85  # weight of the past in the running estimates, per pass
PRIOR_SLOPE = 0.15  # assumed extra cost per extra verified token, relative to t(1)
FAST_DECAY = 0.5  # the same for the fast estimate that switches drafting off quickly
# The fast estimate switches drafting off only after a run of passes that kept no draft
# whose chance, were the slow estimate's acceptance still true, is below this.
FAST_EVIDENCE = 0.05
MIN_COOLDOWN, MAX_COOLDOWN = 4, 64
CARRY = 0.6  # share of the acceptance evidence a new answer keeps from the earlier ones
# weight of a t(k) / t(1) measured right after a plain pass, against the running ratio
PAIRED = 0.4
SPIKE = 1.25  # the most one pass's time may say beyond the running estimate (a factor)
# The most of plain decoding's time that probing a drafter that does not pay may cost:
# half of the 1 - 0.98 allowance of "never slower than plain", the other half is left
# for the passes that detect the change and for noise. A goal, not a measured figure.
PROBE_SHARE = 0.01
# Passes after which a policy that drafted every one runs a plain pass to measure t(1)
# again (that t(1) then weighs PAIRED): a t(1) left stale, say from a calibration taken
# in a slow moment, would otherwise make every ratio measured against it wrong, and a
# drafter that looks cheaper than it is would never be switched off. At most 1/64 of a
# drafting stretch's passes, so about 1 % of what drafting gains.
T1_EVERY = 64
NEVER = 1 << 30  # a cool-down that lasts the answer
# Under load, the most one answer's drafts (their drafting and their verified rows) may
# lengthen a pass the other answers share: their answers are not to slow down for it.
SHARED_SLACK = 0.02


def within_slack(cost: float, shared: float, others: int) -> bool:
    """Whether a pass of ``cost`` with one answer's drafts may run beside ``others``
    answers whose pass would cost ``shared`` without them (always, alone)."""
    return not others or cost <= (1 + SHARED_SLACK) * shared


def within(sample: float, running: float) -> float:
    """``sample`` held to ``running / SPIKE .. running * SPIKE``: a pass that a shared
    machine stalled (twice as long now and then) moves a running estimate by no more than
    a pass ``SPIKE`` times as long, where a mean would take it for dearer rows and switch
    drafting off; a lasting change still moves it, a few passes later."""
    return min(max(sample, running / SPIKE), running * SPIKE)


def expected_tokens(alpha: float, gamma: float) -> float:
    """Mean tokens per pass for acceptance rate ``alpha`` and ``gamma`` drafts."""
    if gamma <= 0:
        return 1.0
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


Point = tuple[int, float]  # (k, t(k) / t(1))


def on_line(lo: Point, hi: Point, k: int) -> float:
    """The ratio at ``k`` on the line through ``lo`` and ``hi`` (never falling)."""
    return lo[1] + max(0.0, hi[1] - lo[1]) * (k - lo[0]) / (hi[0] - lo[0])


def ratio_between(ratios: Mapping[int, float], k: int) -> float | None:
    """``t(k) / t(1)`` from measured ``ratios``: measured, else linear between the measured
    sizes around ``k`` (t(1) = 1); ``None`` beyond the longest measured size, where
    callers extrapolate as they see fit."""
    if k <= 1:
        return 1.0
    if k in ratios:
        return ratios[k]
    points = sorted([(1, 1.0), *ratios.items()])
    hi = min((p for p in points if p[0] > k), default=None)
    if hi is None:
        return None
    return on_line(max(p for p in points if p[0] < k), hi, k)


def choose_gamma(
    alpha: float, draft_cost: float, verify_cost: Callable[[int], float], max_gamma: int,
    fill: float = 1.0, others: int = 0, others_rows: int | None = None,
) -> int:
    """The draft length in ``0..max_gamma`` with the highest expected tokens per second.

    ``fill``: the share of the asked length a drafter really drafts (it stops early
    when unsure, a lookup finds fewer): asking ``gamma`` yields ``fill * gamma`` drafts.
    ``others``: answers whose rows share the pass (continuous batching), at least one
    token each, ``others_rows`` rows in all (default one each, their drafts included).
    The rate is then the whole pass's, ``(others + E) / (drafting + t(others_rows + gamma
    + 1))``, and a length whose drafting and rows would make the shared pass more than
    :data:`SHARED_SLACK` longer is left out: drafts take the rows that are nearly free
    and never slow the other answers down (in a round of answers the last to finish sets
    the time, so one answer's gain at the others' cost lowers the total).
    """
    rows = others if others_rows is None else others_rows
    shared = verify_cost(rows + 1)  # the pass without this answer's drafts
    best, best_rate = 0, (others + 1.0) / shared
    for gamma in range(1, max_gamma + 1):
        drafts = max(1.0, fill * gamma)
        drafting = draft_cost * (drafts + alpha**drafts)  # + the next pass's catch-up step
        cost = drafting + verify_cost(rows + round(drafts) + 1)
        if not within_slack(cost, shared, others):
            continue
        rate = (others + expected_tokens(alpha, drafts)) / cost
        if rate > best_rate * 1.02:  # prefer shorter drafts unless clearly better
            best, best_rate = gamma, rate
    return best


def probe_cooldown(t1: float, step: float, drafted: int, accepted: int, draft_s: float,
                   verify_s: float, catch_up: int, read: float | None = None) -> int:
    """Plain passes to wait before the next probe so that probing costs at most
    ``PROBE_SHARE`` of plain decoding's time. A probe costs its drafts and verification
    beyond what plain decoding takes for the tokens it produced (a fixed excess) plus a
    model drafter's reading of the ``catch_up - 1`` tokens it skipped: ``read`` s per
    token where the caller knows it (the calibration's measurement over a long context),
    an excess per plain pass waited, and the rest of this probe's reading (a call's own
    overhead) fixed; else all of this probe's reading per skipped token. When the reading
    per token alone costs ``PROBE_SHARE`` of a pass, no wait suffices: the drafter is not
    probed again in this answer (a huge cool-down)."""
    drafting = drafted * step
    skipped = max(1, catch_up - 1)
    took = max(0.0, draft_s - drafting)  # reading what it skipped
    per_token = took / skipped if read is None else read
    rest = max(0.0, took - per_token * skipped)
    reading = per_token / t1
    fixed = max(0.0, drafting + rest + verify_s - (accepted + 1) * t1) / t1
    if reading >= PROBE_SHARE:
        return NEVER
    return math.ceil(fixed / (PROBE_SHARE - reading))


@dataclass
class DraftPolicy:
    """Per-answer controller of the draft length (``next_gamma`` / ``update``)."""

    max_gamma: int = 8
    start_gamma: int = 4
    alpha_prior: float = 0.6
    accepted: float = 0.0
    rejected: float = 0.0
    draft_cost: float | None = None  # seconds per draft step
    t1: float | None = None  # seconds of a target forward over one token
    ratio: dict[int, float] = field(default_factory=dict)  # tokens fed k -> t(k) / t(1)
    unscaled: dict[int, float] = field(default_factory=dict)  # seconds, before t(1) is known
    cooldown: int = 0  # plain passes left before the next probe
    next_cooldown: int = MIN_COOLDOWN
    off_passes: int = 0  # passes run plain because drafting did not pay
    last_off: bool = False  # whether the last next_gamma() switched drafting off
    probe: bool = False  # the cool-down is over: draft once more to re-measure acceptance
    last_yield: int = 1  # tokens the last pass produced
    asked: float = 0.0  # decayed sums of the draft lengths asked for and really drafted
    got: float = 0.0
    last_asked: int = 0
    fast_accepted: float = 0.0  # the fast estimate's evidence (FAST_DECAY)
    fast_rejected: float = 0.0
    missed_run: int = 0  # draft passes in a row that kept no draft
    probing: bool = False  # the pass being run is a probe
    min_cooldown: int = 0  # the cool-down that keeps probing within PROBE_SHARE (passes)
    others: int = 0  # answers sharing the coming pass (set by the loop; 0 when alone)
    others_rows: int = 0  # their rows in it
    yielded: bool = False  # whether the last next_gamma() gave the pass to the others' rows
    read_share: float | None = None  # a token the drafter reads, in t(1) (calibrated)
    t1_fresh: bool = False  # the pass before was plain: it measured t(1) just now
    since_t1: int = 0  # passes since the last one that measured t(1)
    t1_prior: bool = False  # t1 is a calibration's, not yet checked by a t(1) of its own

    @classmethod
    def calibrated(cls, t1: float, ratios: dict[int, float], draft_cost: float | None,
                   max_gamma: int = 8, read_share: float | None = None) -> "DraftPolicy":
        """A policy that starts from measured figures: ``t1`` seconds of a one-token
        forward, ``ratios`` ``t(k) / t(1)``, ``draft_cost`` seconds per draft step (None:
        measured on the first draft pass), ``read_share`` the drafter's reading of a
        token in ``t(1)`` s (None: each probe's own reading)."""
        policy = cls(max_gamma=max_gamma)
        policy.t1, policy.ratio, policy.draft_cost = t1, dict(ratios), draft_cost
        policy.read_share, policy.t1_prior = read_share, True
        return policy

    def fill(self, calibrated: "DraftPolicy") -> None:
        """Take ``calibrated``'s figures (:meth:`calibrated`) where this policy has none of
        its own: a policy created before the machine was calibrated knew only the sizes it
        had timed, and priced the others at ``PRIOR_SLOPE``, a constant from another
        machine. What it measured itself stays."""
        if self.t1 is None and calibrated.t1 is not None:
            self.t1, self.t1_prior = calibrated.t1, True
        for k, ratio in calibrated.ratio.items():
            self.ratio.setdefault(k, ratio)
        if self.draft_cost is None:
            self.draft_cost = calibrated.draft_cost
        if self.read_share is None:
            self.read_share = calibrated.read_share

    def select(self, part: str | None) -> "DraftPolicy":
        """The policy for a pass drafted by ``part``: itself (one drafter, one policy)."""
        del part
        return self

    def new_answer(self) -> None:
        """Keep the measured costs and ``CARRY`` of the acceptance evidence."""
        self.accepted *= CARRY
        self.rejected *= CARRY
        self.fast_accepted *= CARRY
        self.fast_rejected *= CARRY
        self.missed_run = 0
        self.cooldown, self.next_cooldown, self.off_passes = 0, MIN_COOLDOWN, 0
        self.probe = self.probing = False
        self.min_cooldown = 0
        self.last_yield = 1
        self.t1_fresh = False

    @property
    def alpha(self) -> float:
        """Acceptance rate estimate (geometric MLE with a weak prior)."""
        a, r = self.accepted + self.alpha_prior, self.rejected + (1 - self.alpha_prior)
        return a / (a + r)

    @property
    def fast_alpha(self) -> float:
        """The same estimate over about the last two draft passes."""
        a = self.fast_accepted + self.alpha_prior
        r = self.fast_rejected + (1 - self.alpha_prior)
        return a / (a + r)

    @property
    def run_unlikely(self) -> bool:
        """Whether the passes in a row that kept no draft are too many for the slow
        estimate's acceptance (each pass's first draft rejected, ``1 - alpha``)."""
        return self.missed_run > 0 and (1 - self.alpha) ** self.missed_run < FAST_EVIDENCE

    def verify_cost(self, k: int) -> float:
        """Cost of a target forward over ``k`` tokens: ``t(1)`` times the measured (or
        interpolated) ratio ``t(k) / t(1)``. Ratios are measured against the ``t(1)`` of
        the same period, so a slow spell of the machine moves both alike."""
        return (self.t1 or 1.0) * self.ratio_at(k)

    def ratio_at(self, k: int) -> float:
        """``t(k) / t(1)``: measured, else linear between measured sizes (and t(1) = 1);
        beyond the longest measured size, that size's slope from t(1) on."""
        between = ratio_between(self.ratio, k)
        if between is not None:
            return between
        longest = max(self.ratio.items(), default=(2, 1.0 + PRIOR_SLOPE))
        return on_line((1, 1.0), longest, k)

    def next_gamma(self, room: int) -> int:
        """Draft length for the next pass (0 = plain), at most ``room - 1``."""
        limit = min(self.max_gamma, room - 1)
        self.last_off = self.yielded = False
        self.last_asked = 0
        if limit <= 0:
            return 0
        if self.cooldown > 0:
            self.cooldown -= 1
            self.probe = self.cooldown == 0
            self.off_passes += 1
            self.last_off = True
            return 0
        if self.t1 is not None and self.since_t1 >= T1_EVERY and not self.others:
            self.last_off = True  # a plain pass, chosen to measure t(1) again
            return 0
        fill = self.got / self.asked if self.asked > 0 else 1.0
        hopeful = max(self.alpha, self.alpha_prior)
        if (self.probe or self.draft_cost is None) and self.others and not choose_gamma(
                hopeful, self.draft_cost or 0.0, self.verify_cost, limit, fill,
                self.others, max(self.others, self.others_rows)):
            # a probe or first draft would not pay under this load even at its most hopeful
            # (a free drafter for an unmeasured one): it waits for a quieter pass
            self.yielded = True
            return 0
        if self.probe and self.draft_cost is not None and self.t1 is not None:
            self.probe = False
            if not choose_gamma(1.0, self.draft_cost, self.verify_cost, limit, fill):
                # not even drafts that were all accepted would pay at this machine's costs
                # (a draft model where rows are dear): no probe, no reading, a longer wait
                return self._switch_off()
            self.probing = True
            self.last_asked = max(1, choose_gamma(hopeful, self.draft_cost, self.verify_cost,
                                                  limit, fill))
            return self.last_asked  # re-measure the acceptance at a bounded cost
        if self.draft_cost is None or self.probe:
            self.probe = False
            self.last_asked = min(self.start_gamma, limit)
            return self.last_asked  # measure a draft and t(gamma+1)
        if self.t1 is None:
            return 0  # one plain pass measures t(1), the cost to beat
        gamma = choose_gamma(self.alpha, self.draft_cost, self.verify_cost, limit, fill)
        if gamma and self.run_unlikely and not choose_gamma(
                self.fast_alpha, self.draft_cost, self.verify_cost, limit, fill):
            gamma = 0  # the last passes say drafting stopped paying
        if gamma and self.others:
            # under load the pass's rows may yield more as other answers' rows: no
            # switch-off, no cool-down, drafting resumes as soon as the load allows
            gamma = choose_gamma(self.alpha, self.draft_cost, self.verify_cost, gamma, fill,
                                 self.others, max(self.others, self.others_rows))
            self.yielded = gamma == 0
            if self.yielded:
                return 0
        self.last_asked = gamma
        return self._switch_off() if gamma == 0 else gamma

    def _switch_off(self) -> int:
        """A plain pass that starts a cool-down (doubling each time, up to the maximum)."""
        self.cooldown = max(self.next_cooldown, self.min_cooldown) - 1
        self.next_cooldown = min(self.next_cooldown * 2, MAX_COOLDOWN)
        self.off_passes += 1
        self.last_off = True
        return 0

    def _measured(self, fed: int, seconds: float) -> None:
        """Fold one verification's time into ``t1`` or the ratio for ``fed`` tokens. A
        ratio taken right after a plain pass pairs two neighbours (as the calibration's
        do) and weighs ``PAIRED``; one taken after a stretch of draft passes divides by a
        ``t(1)`` of an earlier moment (a slow spell meanwhile reads as dearer rows) and
        weighs ``1 - DECAY``. A pass the machine stalled counts as at most ``SPIKE`` times
        the running figure (see :func:`within`)."""
        fresh, self.t1_fresh = self.t1_fresh, fed == 1
        stale, self.since_t1 = self.since_t1 >= T1_EVERY, 0 if fed == 1 else self.since_t1 + 1
        prior, self.t1_prior = self.t1_prior, self.t1_prior and fed != 1
        if fed == 1 and self.t1 is not None and prior and seconds * SPIKE < self.t1:
            # the first t(1) this policy times is far below the calibration's, which was
            # then taken in a slow moment (a stall makes a pass longer, never shorter)
            self.t1 = seconds
        elif fed == 1 and self.t1 is not None and stale:
            # the re-measure after a stretch of drafting (see T1_EVERY): a stall can make
            # a pass longer, never shorter, so a faster one moves t(1) all the way
            self.t1 = (1 - PAIRED) * self.t1 + PAIRED * min(seconds, SPIKE * self.t1)
        elif fed == 1:
            self.t1 = seconds if self.t1 is None else (
                DECAY * self.t1 + (1 - DECAY) * within(seconds, self.t1))
            for k, raw in self.unscaled.items():  # measured before t(1) was known
                self.ratio.setdefault(k, raw / self.t1)
            self.unscaled.clear()
        elif self.t1 is None:
            self.unscaled[fed] = seconds
        else:
            old = self.ratio.get(fed)
            now = seconds / self.t1
            weight = PAIRED if fresh else 1 - DECAY
            self.ratio[fed] = now if old is None else (
                (1 - weight) * old + weight * within(now, old))

    def update(self, drafted: int, accepted: int, draft_s: float, verify_s: float,
               catch_up: int = 0) -> None:
        """Feed one pass's outcome: drafts proposed and kept, their timings, and the
        context tokens the drafter fed before drafting (``Draft.catch_up``). A pass shared
        with other answers (``others``) says nothing about ``t(k)`` and is not timed."""
        if not self.others:
            self._measured(drafted + 1, verify_s)
        else:
            self.t1_fresh = False
        last_yield, self.last_yield = self.last_yield, accepted + 1
        if self.probing and self.t1 is not None and drafted > 0:
            # the probe's verification at the running t(k), this pass's time folded in: one
            # pass the shared machine stalled would otherwise read as a probe many times
            # dearer, and stop probing for a long stretch of an answer where drafting pays
            self.min_cooldown = probe_cooldown(self.t1, self.draft_cost or 0.0, drafted,
                                               accepted, draft_s,
                                               self.verify_cost(drafted + 1), catch_up,
                                               None if self.read_share is None
                                               else self.read_share * self.t1)
        self.probing = False
        if self.last_asked > 0 and drafted > 0:  # (a lookup that found nothing: no draft)
            self.asked = DECAY * self.asked + self.last_asked
            self.got = DECAY * self.got + drafted
        self.last_asked = 0
        if drafted == 0:
            return
        if self.draft_cost is None or catch_up <= max(2, last_yield):
            per_step = draft_s / (drafted + (catch_up >= 2))  # a short catch-up: about a step
            self.draft_cost = per_step if self.draft_cost is None else (
                DECAY * self.draft_cost + (1 - DECAY) * per_step
            )
        missed = 1 if accepted < drafted else 0
        self.accepted = DECAY * self.accepted + accepted
        self.rejected = DECAY * self.rejected + missed
        self.fast_accepted = FAST_DECAY * self.fast_accepted + accepted
        self.fast_rejected = FAST_DECAY * self.fast_rejected + missed
        self.missed_run = self.missed_run + 1 if accepted == 0 else 0
        if accepted == drafted:
            self.next_cooldown = MIN_COOLDOWN
            self.min_cooldown = 0


class PartPolicies:
    """One :class:`DraftPolicy` per part of a drafter made of parts, in the order the
    drafter tries them (the last is the dearest: the model behind a lookup).

    The parts share the machine's costs: one ``ratio`` (``t(k) / t(1)``) table with its
    unscaled measurements, and ``t(1)``, which the part selected for a pass takes from
    the part that ran the pass before. Everything else (acceptance, step cost, asked and
    drafted lengths, cool-down) is each part's own.
    """

    def __init__(self, parts: Mapping[str, DraftPolicy]) -> None:
        if not parts:
            raise ValueError("a drafter made of parts needs a policy for at least one")
        self.parts = dict(parts)
        first = next(iter(self.parts.values()))
        for policy in self.parts.values():
            policy.ratio, policy.unscaled = first.ratio, first.unscaled
            policy.t1 = first.t1
        self.active = first

    def select(self, part: str | None) -> DraftPolicy:
        """The policy of ``part`` (the dearest part's for an unknown one), given the
        latest ``t(1)``."""
        policy = self.parts.get(part or "") or self.dearest
        if policy is not self.active:
            if self.active.t1 is not None:
                policy.t1, policy.t1_fresh = self.active.t1, self.active.t1_fresh
                policy.since_t1, policy.t1_prior = self.active.since_t1, self.active.t1_prior
            self.active = policy
        return policy

    def new_answer(self) -> None:
        for policy in self.parts.values():
            policy.new_answer()

    @property
    def max_gamma(self) -> int:
        return max(policy.max_gamma for policy in self.parts.values())

    @property
    def dearest(self) -> DraftPolicy:
        return list(self.parts.values())[-1]

    @property
    def t1(self) -> float | None:
        """The latest ``t(1)`` measured by any part."""
        return self.active.t1

    @property
    def ratio(self) -> dict[int, float]:
        return self.active.ratio

    @property
    def draft_cost(self) -> float | None:
        """The dearest part's step: what a pass may cost."""
        return self.dearest.draft_cost


Policy = DraftPolicy | PartPolicies  # what the decoding loop takes
