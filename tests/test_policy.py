"""Adaptive draft length and automatic switch-off, on synthetic costs."""

import itertools
import random
from collections.abc import Callable

import pytest

from engine.spec.decoding import Step, decode
from engine.spec.drafters import Draft, Drafter
from engine.spec.drafters.hybrid import HybridDrafter
from engine.spec.drafters.ngram import NgramDrafter
from engine.spec.drafters.suffix import SuffixDrafter
from engine.spec.policy import (
    NEVER,
    PAIRED,
    PROBE_SHARE,
    SHARED_SLACK,
    SPIKE,
    T1_EVERY,
    DraftPolicy,
    PartPolicies,
    Policy,
    choose_gamma,
    expected_tokens,
    probe_cooldown,
)
from engine.spec.runner import ModelRunner
from engine.spec.sampling import SamplingParams
from tests.tiny import tiny_model


def flat(t1: float, slope: float):  # type: ignore[no-untyped-def]
    return lambda k: t1 * (1 + slope * (k - 1))


def test_expected_tokens_matches_the_paper() -> None:
    assert expected_tokens(0.8, 5) == pytest.approx(3.69, abs=0.01)
    assert expected_tokens(0.6, 2) == pytest.approx(1.96)
    assert expected_tokens(0.5, 0) == 1.0
    assert expected_tokens(1.0, 4) == 5.0


def test_choose_gamma_drafts_long_when_cheap_and_accepted() -> None:
    assert choose_gamma(0.9, 0.001, flat(0.1, 0.02), 8) >= 6
    long = choose_gamma(0.8, 0.005, flat(0.1, 0.05), 8)
    short = choose_gamma(0.5, 0.005, flat(0.1, 0.05), 8)
    assert long > short >= 1


def test_choose_gamma_switches_off_when_drafting_cannot_pay() -> None:
    assert choose_gamma(0.3, 0.05, flat(0.1, 0.9), 8) == 0  # verification costs k times
    assert choose_gamma(0.05, 0.0, flat(0.1, 0.2), 8) == 0  # nothing gets accepted
    assert choose_gamma(0.9, 0.2, flat(0.1, 0.05), 8) == 0  # the draft is slower than the target


def feed(policy: DraftPolicy, passes: int, accept_all: bool, t1: float = 0.1,
         slope: float = 0.3) -> list[int]:
    gammas = []
    for _ in range(passes):
        gamma = policy.next_gamma(room=100)
        gammas.append(gamma)
        accepted = gamma if accept_all else 0
        policy.update(gamma, accepted, 0.001 * gamma, t1 * (1 + slope * gamma))
    return gammas


def test_a_drafter_that_stops_early_is_asked_for_more() -> None:
    costs = flat(0.1, 0.2)
    full = choose_gamma(0.85, 0.03, costs, 8)
    assert 1 <= full < choose_gamma(0.85, 0.03, costs, 8, fill=0.5)


def test_verification_costs_follow_a_slow_spell_as_ratios_to_one_step() -> None:
    policy = DraftPolicy()
    policy.update(4, 4, 0.004, 0.15)  # t(5) measured before any t(1)
    policy.update(0, 0, 0.0, 0.1)
    assert policy.verify_cost(5) == pytest.approx(0.15)
    assert policy.verify_cost(3) == pytest.approx(0.125)  # between t(1) and t(5)
    for _ in range(40):  # the machine gets twice as slow; no draft pass meanwhile
        policy.update(0, 0, 0.0, 0.2)
    assert policy.verify_cost(5) == pytest.approx(0.3, rel=0.01)


def test_policy_turns_off_on_rejections_and_probes_again() -> None:
    policy = DraftPolicy(max_gamma=8, start_gamma=4)
    gammas = feed(policy, 40, accept_all=False)
    assert gammas[:2] == [4, 0]  # one draft pass, then one plain pass to measure t(1)
    assert policy.off_passes > 20 and gammas.count(0) == policy.off_passes + 1  # + calibration
    probes = [i for i, g in enumerate(gammas) if g and i > 0]
    assert probes, "the policy must probe again after a cool-down"
    gaps = [b - a for a, b in itertools.pairwise(probes)]
    assert gaps == sorted(gaps)  # the cool-down grows after each failed probe


def test_policy_comes_back_on_when_drafts_are_accepted_again() -> None:
    policy = DraftPolicy(max_gamma=8)
    feed(policy, 30, accept_all=False)
    later = feed(policy, 60, accept_all=True)
    assert later[-1] >= 4 and later[-10:].count(0) == 0


def test_a_long_catch_up_is_not_taken_for_the_cost_of_draft_steps() -> None:
    policy = DraftPolicy()
    policy.update(4, 2, 0.04, 0.2, catch_up=1)  # 10 ms a step
    policy.update(4, 4, 0.04, 0.2, catch_up=1)
    policy.update(4, 1, 0.05, 0.2, catch_up=2)  # the last draft fed again: 5 steps
    assert policy.draft_cost == pytest.approx(0.01)
    policy.update(0, 0, 0.0, 0.1)  # a plain pass: the drafter sat it out
    policy.update(4, 4, 0.5, 0.2, catch_up=12)  # caught up on 12 tokens first
    assert policy.draft_cost == pytest.approx(0.01)
    policy.update(4, 1, 0.1, 0.2, catch_up=5)  # what the last pass produced (an EAGLE head)
    assert policy.draft_cost > 0.01


def test_a_new_answer_keeps_part_of_the_acceptance_seen_before() -> None:
    policy = DraftPolicy(max_gamma=8)
    feed(policy, 30, accept_all=True)
    policy.new_answer()
    assert policy.alpha > 0.9
    gamma = policy.next_gamma(room=100)
    policy.update(gamma, 0, 0.001 * gamma, 0.1 * (1 + 0.3 * gamma))  # one unlucky first pass
    assert policy.next_gamma(room=100) > 0  # not switched off on that alone


def test_policy_respects_the_room_left() -> None:
    policy = DraftPolicy(max_gamma=8, start_gamma=8)
    assert policy.next_gamma(room=3) == 2
    assert policy.next_gamma(room=1) == 0


class Clock:
    """Stands in for the ``time`` module in :mod:`engine.spec.decoding`: each reading is a
    millisecond after the one before (a target pass takes 1 ms), and a drafter can
    spend more, so the costs the policy measures do not depend on the machine."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 0.001
        return self.now

    def spend(self, seconds: float) -> None:
        self.now += seconds


class SlowWrongDrafter(Drafter):
    """Takes 20 ms of the clock per draft token and proposes tokens the target rejects."""

    name = "wrong"

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def propose(self, context, k, params, generator):  # type: ignore[no-untyped-def]
        self.clock.spend(0.02 * k)
        return Draft(tuple([63] * k))


def clocked(monkeypatch: pytest.MonkeyPatch, prompt: list[int], max_new_tokens: int,
            first_token_first: bool = False,
            ) -> tuple[Clock, Callable[..., tuple[list[int], list[Step]]]]:
    """A :class:`Clock` standing in for the loop's time, and ``run(drafter, policy)``: greedy
    decoding of ``prompt`` on a tiny target, giving its tokens and steps."""
    clock = Clock()
    monkeypatch.setattr("engine.spec.decoding.time", clock)
    target = tiny_model("llama", vocab_size=64, seed=1, scale=4.0)

    def run(drafter: Drafter | None, policy: Policy | None) -> tuple[list[int], list[Step]]:
        steps = list(decode(ModelRunner(target), prompt, params=SamplingParams(),
                            max_new_tokens=max_new_tokens, max_context=256, drafter=drafter,
                            policy=policy, first_token_first=first_token_first))
        return [t for s in steps for t in s.tokens], steps

    return clock, run


def test_adaptive_decoding_stays_identical_and_switches_off(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    clock, run = clocked(monkeypatch, [5, 6, 7, 8, 5, 6, 7], 40)
    plain, _ = run(None, None)
    assert run(NgramDrafter(), DraftPolicy())[0] == plain
    tokens, steps = run(SlowWrongDrafter(clock), DraftPolicy())
    assert tokens == plain
    assert sum(s.auto_off for s in steps) > 10


ZEN5 = {2: 1.08, 3: 1.43, 4: 1.67, 5: 2.06, 8: 3.21}  # t(k)/t(1), machines-measured.md


def ratio(k: int) -> float:
    """t(k)/t(1) on the Zen 5 machine, linear between and beyond the measured sizes."""
    points = sorted([(1, 1.0), *ZEN5.items()])
    for (k0, r0), (k1, r1) in itertools.pairwise(points):
        if k <= k1:
            return r0 + (r1 - r0) * (k - k0) / (k1 - k0)
    (k0, r0), (k1, r1) = points[-2:]
    return r1 + (r1 - r0) * (k - k1) / (k1 - k0)


def simulate(policy: DraftPolicy, passes: int, accepts: bool, step: float,
             catch_up_cost: float = 0.0, catch_up_call: float = 0.0
             ) -> tuple[list[int], float, int]:
    """Run ``passes`` passes at t(1) = 1 s: a drafter whose drafts are all accepted or all
    rejected, ``step`` s a draft step, and ``catch_up_cost`` s per token it skipped plus
    ``catch_up_call`` s once (a model drafter reading what the plain passes produced in
    one call). Returns the draft lengths, the seconds spent and the tokens produced."""
    gammas, seconds, tokens, skipped = [], 0.0, 0, 0
    for _ in range(passes):
        gamma = policy.next_gamma(room=10_000)
        gammas.append(gamma)
        if gamma == 0:
            skipped += 1
            policy.update(0, 0, 0.0, 1.0)
            seconds, tokens = seconds + 1.0, tokens + 1
            continue
        accepted = gamma if accepts else 0
        draft_s = gamma * step + skipped * catch_up_cost + (catch_up_call if skipped else 0.0)
        verify_s = ratio(gamma + 1)
        policy.update(gamma, accepted, draft_s, verify_s, catch_up=skipped + 1)
        skipped = 0
        seconds, tokens = seconds + draft_s + verify_s, tokens + accepted + 1
    return gammas, seconds, tokens


def calibrated(step: float) -> DraftPolicy:
    return DraftPolicy.calibrated(1.0, {k: ratio(k) for k in range(2, 17)}, step, max_gamma=15)


def test_a_calibrated_policy_drafts_from_its_first_pass() -> None:
    gammas, _, _ = simulate(calibrated(0.01), 3, accepts=True, step=0.01)
    assert all(g > 0 for g in gammas)  # no pass spent measuring t(1) or the step


@pytest.mark.parametrize("history", [0, 200])
def test_a_drafter_that_stops_paying_is_switched_off_within_four_passes(history: int) -> None:
    policy = calibrated(0.3)
    simulate(policy, history, accepts=True, step=0.3)  # however long it was accepted before
    policy.new_answer()
    gammas, _, _ = simulate(policy, 8, accepts=False, step=0.3)
    assert 0 in gammas[:4], gammas
    assert max(gammas) >= (1 if history == 0 else 2)  # it did draft before switching off


def test_a_few_misses_in_a_row_do_not_switch_off_a_drafter_that_keeps_half() -> None:
    # a head on a machine where rows are cheap: its first draft is kept every other pass,
    # and three misses in a row (one chance in eight at that rate) are no reason to stop
    policy = DraftPolicy.calibrated(1.0, {k: 1 + 0.14 * (k - 1) for k in range(2, 10)}, 0.07)
    outcomes = [True, False] * 20 + [False, False, False] + [True, False] * 4
    gammas = []
    for kept in outcomes:
        gamma = policy.next_gamma(room=10_000)
        gammas.append(gamma)
        if gamma:
            policy.update(gamma, 1 if kept else 0, 0.07 * gamma, 1 + 0.14 * gamma)
        else:
            policy.update(0, 0, 0.0, 1.0)
    assert all(g > 0 for g in gammas), gammas
    assert policy.missed_run == 1


@pytest.mark.parametrize("catch_up_cost", [0.0, 0.005, 0.05])
def test_probing_a_drafter_that_never_pays_costs_under_two_percent(
        catch_up_cost: float) -> None:
    policy = calibrated(0.3)
    gammas, seconds, tokens = simulate(policy, 4000, accepts=False, step=0.3,
                                       catch_up_cost=catch_up_cost)
    plain = tokens * 1.0  # what plain decoding takes for the same tokens
    assert seconds <= 1.02 * plain
    probes = sum(g > 0 for g in gammas[100:])
    if catch_up_cost < PROBE_SHARE:
        assert probes >= 5  # it keeps probing all the same
    else:  # re-reading the skipped text alone would cost more: no probe until next answer
        assert probes == 0


@pytest.mark.parametrize("calibrated_read", [False, True])
def test_a_cheap_reading_with_a_dear_call_keeps_being_probed(calibrated_read: bool) -> None:
    # an EAGLE head: a token read costs 0.5 % of a step, but each catch-up call costs a
    # tenth of a step on top, which a probe after a short wait spreads over few tokens
    policy = calibrated(0.05)
    if calibrated_read:
        policy.read_share = 0.005  # what the calibration measured over a long context
    gammas, seconds, tokens = simulate(policy, 2000, accepts=False, step=0.05,
                                       catch_up_cost=0.005, catch_up_call=0.1)
    probes = sum(g > 0 for g in gammas[100:])
    if calibrated_read:
        assert probes >= 5  # waits long enough to spread the call, then probes again
        assert seconds <= 1.02 * tokens
    else:  # the first probe's reading, 0.1 s over 4 tokens, reads as dear as a model's
        assert probes == 0


def test_the_cooldown_spreads_a_known_reading_and_the_call_overhead_apart() -> None:
    # 8 tokens skipped; 0.3 s of reading beyond the one draft step: 0.02 s a token by
    # the probe's own figure (never probed again), 0.005 a token and 0.26 s of call by the
    # calibration's
    assert probe_cooldown(1.0, 0.05, 1, 0, 0.35, 1.1, catch_up=9) == NEVER
    wait = probe_cooldown(1.0, 0.05, 1, 0, 0.35, 1.1, catch_up=9, read=0.005)
    fixed = 0.05 + (0.3 - 8 * 0.005) + 1.1 - 1.0  # drafting, the call, the extra row
    assert wait == pytest.approx(fixed / (PROBE_SHARE - 0.005), abs=1)


def test_a_probe_the_machine_stalled_does_not_lengthen_the_cool_down() -> None:
    waits = []
    for verify_s in (1.2, 3.6):  # the same probe, its pass stalled three times as long
        policy = DraftPolicy.calibrated(1.0, {2: 1.2, 3: 1.4}, 0.05, max_gamma=2)
        policy.read_share = 0.004
        policy.probing = True
        policy.update(1, 0, 0.05 + 0.004 * 8, verify_s, catch_up=9)
        waits.append(policy.min_cooldown)
    assert waits[0] > 0
    assert waits[1] <= 1.25 * waits[0], waits


def test_a_ratio_measured_right_after_a_plain_pass_weighs_more() -> None:
    policy = DraftPolicy.calibrated(1.0, {2: 1.0}, 0.05)
    for _ in range(10):  # a slow spell during a stretch of drafting: read as dearer rows
        policy.update(1, 1, 0.05, 1.5)
    inflated = policy.ratio[2]
    assert inflated > 1.3
    policy.update(0, 0, 0.0, 1.5)  # a plain pass: t(1) of this moment
    assert policy.t1 is not None
    policy.update(1, 1, 0.05, 1.5)  # and a pass right after it: the two pair
    paired = (1 - PAIRED) * inflated + PAIRED * 1.5 / policy.t1
    assert policy.ratio[2] == pytest.approx(paired)
    policy.update(1, 1, 0.05, 1.5)  # the next is against the same t(1), no longer paired
    assert policy.ratio[2] == pytest.approx(0.85 * paired + 0.15 * 1.5 / policy.t1)


def test_a_stalled_pass_moves_the_costs_by_at_most_a_spike() -> None:
    policy = DraftPolicy.calibrated(0.05, {2: 1.05}, 0.004)
    policy.update(1, 1, 0.004, 0.2)  # the machine stalled: four times t(2)
    assert policy.ratio[2] == pytest.approx(0.85 * 1.05 + 0.15 * 1.05 * SPIKE)
    policy.update(0, 0, 0.0, 0.5)  # and a plain pass ten times as long
    assert policy.t1 == pytest.approx(0.85 * 0.05 + 0.15 * 0.05 * SPIKE)
    for _ in range(30):  # a lasting change is followed all the same
        policy.update(1, 1, 0.004, 0.1)
    assert policy.t1 is not None
    assert policy.ratio[2] * policy.t1 == pytest.approx(0.1, rel=0.01)


def stalling(alpha: float, stall_every: int, seed: int, answers: int = 6,
             tokens: int = 256) -> float:
    """Speedup over plain of an EAGLE-like head (a step 0.075 t(1), reading 0.007 t(1) a
    skipped token plus 0.1 a catch-up call, each draft accepted with chance ``alpha``) on
    a machine whose passes jitter by ±10 % and, one in ``stall_every`` (0: never), take
    1.8 times as long; t(1) = 1 s, the Zen 5 ratios."""
    rng = random.Random(seed)

    def slow() -> float:
        return (1.8 if stall_every and rng.randrange(stall_every) == 0 else 1.0) * \
            rng.uniform(0.9, 1.1)

    policy = DraftPolicy.calibrated(1.0, {k: ratio(k) for k in range(2, 6)}, 0.075, 4)
    policy.read_share = 0.007  # as the calibration measures it over a long context
    spent, plain = 0.0, 0.0
    for _ in range(answers):
        policy.new_answer()
        made = skipped = 0
        while made < tokens:
            gamma = policy.next_gamma(room=10_000)
            if gamma == 0:
                seconds = slow()
                policy.update(0, 0, 0.0, seconds)
                spent, made, skipped = spent + seconds, made + 1, skipped + 1
                continue
            accepted = 0
            while accepted < gamma and rng.random() < alpha:
                accepted += 1
            draft_s = gamma * 0.075 * slow() + (0.1 + 0.007 * skipped if skipped else 0.0)
            verify_s = ratio(gamma + 1) * slow()
            policy.update(gamma, accepted, draft_s, verify_s, catch_up=skipped + 1)
            spent, made, skipped = spent + draft_s + verify_s, made + accepted + 1, 0
        plain += tokens * (1 + (0.8 / stall_every if stall_every else 0.0))
    return plain / spent


@pytest.mark.parametrize("alpha", [0.45, 0.6])
def test_a_machine_that_stalls_now_and_then_keeps_a_paying_head_drafting(alpha: float) -> None:
    steady = sum(stalling(alpha, 0, seed) for seed in range(4)) / 4
    stalled = sum(stalling(alpha, 20, seed) for seed in range(4)) / 4
    assert steady > 1.15
    assert stalled >= 0.93 * steady  # (0.88 of it for alpha = 0.45 with means of the costs)


def test_a_head_that_never_pays_costs_little_on_a_stalling_machine() -> None:
    assert min(stalling(0.0, 20, seed) for seed in range(4)) >= 0.98


def test_a_probe_that_is_accepted_brings_drafting_back() -> None:
    policy = calibrated(0.05)
    simulate(policy, 300, accepts=False, step=0.05)
    gammas, _, _ = simulate(policy, 400, accepts=True, step=0.05)
    assert gammas[-20:].count(0) == 0


LOOKUP = 0.00005  # seconds a lookup's draft step takes (0.1 % of a 50 ms step)


def knee(t1: float, slope: float, knee_rows: int, steep: float) -> Callable[[int], float]:
    """A pass costs ``t1`` plus ``slope`` per extra row up to ``knee_rows``, then ``steep``
    per row (the machine turns compute-bound)."""
    def cost(k: int) -> float:
        extra = min(k, knee_rows) - 1
        return t1 * (1 + slope * extra + steep * max(0, k - knee_rows))
    return cost


def test_under_load_drafts_take_only_rows_that_barely_slow_the_others() -> None:
    cheap = knee(0.05, 0.004, 8, 0.9)  # rows nearly free up to 8, then nearly a step each
    alone = choose_gamma(0.7, LOOKUP, cheap, 8)
    assert alone >= 3  # idle machine: drafts fill the cheap rows
    assert choose_gamma(0.7, LOOKUP, cheap, 8, others=0) == alone
    two = choose_gamma(0.7, LOOKUP, cheap, 8, others=2)
    assert 0 < two <= alone
    shared = cheap(3)  # the pass of two other answers and this one's token
    assert cheap(3 + two) <= (1 + SHARED_SLACK) * shared  # the others barely slow down
    assert choose_gamma(0.7, LOOKUP, cheap, 8, others=8) == 0  # busy: every row costs a step
    # rows that each add 4 % to a pass: alone they pay, beside others they would slow
    # the others' answers for this one's gain (the whole pass's rate would still rise)
    dear = knee(0.05, 0.04, 8, 0.9)
    assert choose_gamma(0.7, LOOKUP, dear, 8) > 0
    assert choose_gamma(0.7, LOOKUP, dear, 8, others=2) == 0
    # a drafter whose own step stalls the others for longer than the slack: none either
    assert choose_gamma(0.9, 0.02, cheap, 8, others=2) == 0


def test_a_pass_given_to_the_others_is_not_a_switch_off_and_is_not_timed() -> None:
    ratios = {k: knee(1.0, 0.04, 4, 1.0)(k) for k in range(2, 17)}
    policy = DraftPolicy.calibrated(0.05, ratios, 0.001)
    assert policy.next_gamma(room=100) > 0
    policy.others = 6
    assert policy.next_gamma(room=100) == 0
    assert policy.yielded and not policy.last_off and policy.cooldown == 0
    t1 = policy.t1
    policy.update(0, 0, 0.0, 0.5)  # a crowded pass's time is not t(1)
    assert policy.t1 == t1
    policy.others = 0
    assert policy.next_gamma(room=100) > 0  # back to drafting as soon as the load allows


def test_the_others_drafts_count_as_rows_of_the_pass() -> None:
    cost = knee(0.05, 0.004, 8, 0.9)
    assert choose_gamma(0.7, LOOKUP, cost, 8, others=1) > 0
    # the same single other answer, verifying 7 drafts of its own: no cheap rows are left
    assert choose_gamma(0.7, LOOKUP, cost, 8, others=1, others_rows=8) == 0


def test_under_load_the_first_draft_and_probes_wait_for_a_pass_where_they_could_pay() -> None:
    ratios = {k: knee(1.0, 0.04, 4, 1.0)(k) for k in range(2, 17)}
    fresh = DraftPolicy.calibrated(0.05, ratios, None)  # drafter's cost not measured yet
    fresh.others = 6
    assert fresh.next_gamma(room=100) == 0 and fresh.yielded
    fresh.others = 0
    assert fresh.next_gamma(room=100) == fresh.start_gamma  # alone: the first draft runs

    policy = DraftPolicy.calibrated(0.05, ratios, 0.001)
    policy.probe = True  # a cool-down just ended
    policy.others = 6
    assert policy.next_gamma(room=100) == 0 and policy.yielded and policy.probe
    policy.others = 0
    assert policy.next_gamma(room=100) > 0 and policy.probing  # the probe runs once quiet


def test_each_part_keeps_its_own_acceptance_and_the_machine_costs_are_shared() -> None:
    lookup, head, shared = calibrated(0.0), calibrated(0.1), calibrated(0.05)
    parts = PartPolicies({"suffix": lookup, "eagle": head})
    assert parts.select("suffix") is lookup and parts.select("eagle") is head
    assert parts.select(None) is head and parts.select("other") is head  # the dearest
    for _ in range(30):  # the lookup quotes the prompt, the head guesses one of its drafts
        for name, hits, step in (("suffix", None, 0.0), ("eagle", 1, 0.1)):
            for policy in (parts.select(name), shared):
                gamma = policy.next_gamma(room=10_000)
                accepted = gamma if hits is None else min(hits, gamma)
                policy.update(gamma, accepted, gamma * step, ratio(gamma + 1))
    assert lookup.alpha > 0.9 > head.alpha
    assert parts.select("suffix").next_gamma(10_000) >= shared.next_gamma(10_000) + 2
    assert parts.select("eagle").next_gamma(10_000) <= 2
    assert lookup.ratio is head.ratio and parts.ratio is lookup.ratio  # one t(k) table
    parts.select("suffix").update(0, 0, 0.0, 3.0)  # a slow plain pass in the lookup's turn
    assert parts.select("eagle").t1 == lookup.t1 > 1.0 and parts.t1 == lookup.t1
    assert parts.draft_cost == head.draft_cost and parts.max_gamma == 15
    with pytest.raises(ValueError, match="at least one"):
        PartPolicies({})


def test_a_lookup_keeps_drafting_after_the_model_part_is_switched_off(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    clock, run = clocked(monkeypatch, [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7], 60)
    table: dict[str, Drafter] = {"suffix": SuffixDrafter(), "draft": SlowWrongDrafter(clock)}
    hybrid = HybridDrafter(table)
    plain, _ = run(None, None)
    parts = PartPolicies({"suffix": DraftPolicy(max_gamma=8), "draft": DraftPolicy(max_gamma=8)})
    tokens, steps = run(hybrid, parts)
    assert tokens == plain
    assert parts.parts["draft"].off_passes > 0  # the wrong model was switched off ...
    assert parts.parts["suffix"].accepted > 1  # ... while the lookup's drafts were kept
    assert sum(s.accepted for s in steps[-20:]) > 0  # and it went on drafting


def test_a_drafter_that_could_not_pay_even_if_always_right_is_never_probed() -> None:
    """A step of 1.5 t(1) on the Zen 5 machine's rows loses even with every draft accepted:
    it is never probed, whatever the cool-downs; a step of 0.3 t(1), which pays when its
    drafts are accepted, still is (its probing bounded by the test above)."""
    hopeless, _, _ = simulate(calibrated(1.5), 400, accepts=False, step=1.5)
    assert not any(hopeless)
    assert choose_gamma(1.0, 1.5, ratio, 15) == 0 and choose_gamma(1.0, 0.3, ratio, 15) > 0
    probed, _, _ = simulate(calibrated(0.3), 400, accepts=False, step=0.3)
    assert sum(g > 0 for g in probed) >= 3


class ReadingDrafter(SlowWrongDrafter):
    """A model drafter's shape: it reads the prompt first (a second of the clock)."""

    reads_prompt = True

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.reads: list[int] = []  # the context's length at each reading

    def prefill(self, context):  # type: ignore[no-untyped-def]
        self.reads.append(len(context))
        self.clock.spend(1.0)


def machine(draft_cost: float) -> DraftPolicy:
    """A calibrated policy at this clock's t(1) (1 ms), Zen 5's rows."""
    return DraftPolicy.calibrated(0.001, {k: ratio(k) for k in range(2, 9)}, draft_cost)


def test_a_drafter_reads_the_prompt_only_before_its_first_draft(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt = [5, 6, 7, 8, 5, 6, 7]
    clock, run = clocked(monkeypatch, prompt, 30)
    plain, _ = run(None, None)
    never = ReadingDrafter(clock)  # a step of 5 t(1): no pass drafts, nothing is read
    tokens, steps = run(never, machine(0.005))
    assert tokens == plain and never.reads == []
    assert not any(s.drafted or s.drafter_prefill_s for s in steps)
    drafts = ReadingDrafter(clock)  # a cheap step: it drafts from its first pass
    tokens, steps = run(drafts, machine(0.00001))
    first = next(i for i, s in enumerate(steps) if s.drafted)
    assert tokens == plain and drafts.reads == [len(prompt) + first]
    assert [s.drafter_prefill_s >= 1.0 for s in steps[: first + 1]] == [False] * first + [True]
    assert steps[first].draft_s < 1.0  # the reading is not counted as drafting


def test_a_hybrids_lookup_passes_do_not_have_its_model_read_the_prompt(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    clock, run = clocked(monkeypatch, [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7], 60)
    model = ReadingDrafter(clock)
    hybrid = HybridDrafter({"suffix": SuffixDrafter(), "draft": model})
    plain, _ = run(None, None)
    parts = PartPolicies({"suffix": DraftPolicy(max_gamma=8), "draft": machine(0.005)})
    tokens, steps = run(hybrid, parts)
    assert tokens == plain and sum(s.drafted for s in steps) > 0
    assert parts.parts["suffix"].accepted > 1 and model.reads == []
    assert hybrid.reads_for("suffix") is False and hybrid.reads_for("draft") is True


def test_a_stale_t1_is_measured_again_while_drafting_every_pass() -> None:
    """A calibration taken in a slow moment (t(1) twice the machine's) makes every ratio
    measured against it look half as dear, and a drafter that drafts every pass never
    measures t(1) again: a plain pass every T1_EVERY passes does, and the ratios follow."""
    policy = DraftPolicy.calibrated(2.0, {k: ratio(k) for k in range(2, 17)}, 0.01,
                                    max_gamma=4)
    gammas, _, _ = simulate(policy, 400, accepts=True, step=0.01)
    plain = [i for i, g in enumerate(gammas) if g == 0]
    assert len(plain) == 400 // (T1_EVERY + 1)  # one pass in T1_EVERY + 1, no more
    assert policy.t1 is not None and policy.t1 < 1.1  # the machine's is 1.0
    assert policy.ratio[5] == pytest.approx(ratio(5), rel=0.15)
    parts = PartPolicies({"suffix": DraftPolicy.calibrated(1.0, {2: 1.1}, 0.0),
                          "draft": DraftPolicy.calibrated(1.0, {2: 1.1}, 0.3)})
    parts.select("suffix").since_t1 = 7
    assert parts.select("draft").since_t1 == 7  # the machine's, shared by the parts


def test_a_calibrated_t1_gives_way_to_a_first_one_far_faster() -> None:
    """The calibration's t(1) is of another moment: where the first t(1) a calibrated
    policy times is more than SPIKE times faster, the calibration was taken in a slow
    moment and that t(1) replaces it; later ones, and a first one within SPIKE or slower
    (a stall), move it as usual; a hybrid's parts share that."""
    policy = DraftPolicy.calibrated(2.0, {2: 1.1}, 0.01)
    policy.update(0, 0, 0.0, 1.0)
    assert policy.t1 == pytest.approx(1.0) and not policy.t1_prior
    policy.update(0, 0, 0.0, 0.5)
    assert policy.t1 == pytest.approx(0.85 * 1.0 + 0.15 * 1.0 / SPIKE)
    for first in (1.7, 9.0):  # jitter, a stall
        usual = DraftPolicy.calibrated(2.0, {2: 1.1}, 0.01)
        usual.update(0, 0, 0.0, first)
        assert usual.t1 == pytest.approx(0.85 * 2.0 + 0.15 * min(first, 2.0 * SPIKE))
        assert not usual.t1_prior
    parts = PartPolicies({"suffix": DraftPolicy.calibrated(2.0, {2: 1.1}, 0.0),
                          "draft": DraftPolicy.calibrated(2.0, {2: 1.1}, 0.3)})
    parts.select("suffix").update(0, 0, 0.0, 1.0)
    draft = parts.select("draft")
    assert draft.t1 == pytest.approx(1.0) and not draft.t1_prior
    draft.update(0, 0, 0.0, 0.5)
    assert draft.t1 == pytest.approx(0.85 * 1.0 + 0.15 * 1.0 / SPIKE)  # not replaced again


def test_the_first_token_s_plain_pass_times_t1_for_the_policy(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the first token first, a drafter that reads the prompt leaves the first pass
    plain; that pass's time reaches the policy as a t(1), so a calibration taken in a slow
    moment (here 2.2 times this clock's 1 ms) is corrected before the first draft."""
    prompt = [5, 6, 7, 8, 5, 6, 7]
    clock, run = clocked(monkeypatch, prompt, 1, first_token_first=True)
    policy = DraftPolicy.calibrated(0.0022, {k: ratio(k) for k in range(2, 9)}, 0.00001)
    _, steps = run(ReadingDrafter(clock), policy)
    assert len(steps) == 1 and steps[0].drafted == 0
    assert policy.t1 == pytest.approx(0.001) and policy.t1_fresh
    parts = PartPolicies({"lookup": machine(0.0), "model": machine(0.00001)})
    parts.select("lookup").t1 = parts.select("model").t1 = 0.0022
    _, steps = run(ReadingDrafter(clock), parts)
    assert parts.t1 == pytest.approx(0.001)


def test_a_policy_takes_calibrated_figures_only_where_it_has_none() -> None:
    calibrated = DraftPolicy.calibrated(0.03, {2: 1.1, 3: 1.2, 4: 1.4}, 0.004, read_share=0.01)
    early = DraftPolicy()  # made before the calibration: it timed t(2) only
    early.ratio[2] = 1.3
    early.fill(calibrated)
    assert early.t1 == 0.03 and early.t1_prior  # the calibration's, until it times its own
    assert early.ratio == {2: 1.3, 3: 1.2, 4: 1.4}
    assert early.draft_cost == 0.004 and early.read_share == 0.01
    timed = DraftPolicy(t1=0.05, draft_cost=0.002)
    timed.fill(calibrated)
    assert timed.t1 == 0.05 and not timed.t1_prior and timed.draft_cost == 0.002
