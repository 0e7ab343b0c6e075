"""The decoding loop: plain and speculative decoding are one generator.

Each pass feeds the pending token plus the drafter's proposals to the target in one
forward, accepts drafts by the lossless rule (:mod:`engine.spec.acceptance`), emits the
accepted tokens and one token of the target's own, and crops the target's cache back
to what was kept. With no drafter (or ``k == 0``) a pass is one ordinary decoding
step, so plain decoding is the same loop. The loop yields a :class:`Step` per pass;
the caller streams, measures or stops by closing the generator.

Cache invariant: before a pass the target's cache holds ``context[:-1]``; the last
context token is fed at the start of the pass.

A draft may be a tree (``Draft.parents``, from drafters that branch where the runner
verifies trees): the pass then feeds every branch at once with a tree attention mask
(:meth:`ModelRunner.forward_tree`), accepts one path (:func:`verify_tree`) and keeps
only that path's cache entries (:meth:`ModelRunner.keep_path`).

A drafter with ``wants_hidden = True`` (EAGLE heads) gets the target's features of
``context[:-1]`` (``[len(context) - 1, H]``, kept by the runner during the verification
passes: no extra target forward) through ``observe_hidden`` before each ``propose``.
"""

import threading
import time
from collections.abc import Collection, Generator, Sequence
from dataclasses import dataclass, field

import torch

from engine.protocol import SpeculationStats
from engine.spec.acceptance import greedy_accept, speculative_accept, tree_accept
from engine.spec.batch import sharing, sharing_rows
from engine.spec.drafters import EMPTY_DRAFT, Draft, Drafter
from engine.spec.policy import Policy
from engine.spec.runner import ModelRunner
from engine.spec.sampling import SamplingParams, position_uniform, probabilities, quantile_token


@dataclass(frozen=True)
class Step:
    """What one target pass produced (tokens already cut at a stop token)."""

    tokens: tuple[int, ...]
    from_draft: tuple[bool, ...]  # True where the token was an accepted draft token
    drafted: int
    accepted: int
    draft_s: float
    verify_s: float
    finish_reason: str | None = None  # "stop", "length", "cancelled" on the last step
    forwarded: bool = True  # False for a closing step that ran no target pass
    auto_off: bool = False  # the policy ran this pass plain because drafting did not pay
    drafter_prefill_s: float = 0.0  # the drafter's reading of the prompt, before its first draft

    @classmethod
    def closing(cls, reason: str) -> "Step":
        return cls((), (), 0, 0, 0.0, 0.0, reason, forwarded=False)


def seeded_tokens(logits: torch.Tensor, params: SamplingParams, positions: Sequence[int]
                  ) -> torch.Tensor:
    """The target's token after each row of ``logits`` ``[R, V]`` in a seeded answer, row
    ``r`` picking the token at ``positions[r]`` (:func:`engine.spec.sampling.quantile_token`)."""
    assert params.seed is not None
    p = probabilities(logits, params)  # [R, V]
    return torch.tensor([quantile_token(p[r], position_uniform(params.seed, pos))
                         for r, pos in enumerate(positions)], dtype=torch.long)  # [R]


def verify(
    logits: torch.Tensor, draft: Draft, params: SamplingParams, generator: torch.Generator,
    position: int = 0,
) -> tuple[int, int]:
    """Accept a prefix of ``draft`` against target ``logits`` ``[G+1, V]``; row ``r``
    gives the token at context position ``position + r``.

    Greedy: drafts equal to the target's argmax. Seeded sampling: drafts equal to the
    seed's token at their position (:func:`seeded_tokens`): the same match rule, so the
    answer does not depend on the drafts. Otherwise Leviathan's rule with ``generator``.
    Returns ``(n_accepted, next_token)``.
    """
    tokens = torch.tensor([draft.tokens], dtype=torch.long).reshape(1, len(draft))  # [1, G]
    if params.greedy:
        n, nxt = greedy_accept(logits.argmax(-1).unsqueeze(0), tokens)
    elif params.seed is not None:
        picked = seeded_tokens(logits, params, range(position, position + len(draft) + 1))
        n, nxt = greedy_accept(picked.unsqueeze(0), tokens)
    else:
        p = probabilities(logits, params).unsqueeze(0)  # [1, G+1, V]
        q = None if draft.probs is None else draft.probs.unsqueeze(0)  # [1, G, V]
        u = torch.rand(1, len(draft), generator=generator, dtype=torch.float64)
        u_next = torch.rand(1, generator=generator, dtype=torch.float64)
        q64 = None if q is None else q.double()
        n, nxt = speculative_accept(p.double(), q64, tokens, u, u_next)
    return int(n[0]), int(nxt[0])


def verify_tree(
    logits: torch.Tensor, draft: Draft, params: SamplingParams, generator: torch.Generator,
    position: int = 0,
) -> tuple[list[int], int]:
    """Accept one path of the tree ``draft`` against target ``logits`` ``[N+1, V]`` (row 0
    after the pending token, giving the token at context position ``position``; row
    ``i + 1`` after draft node ``i``, one position further than its parent's row).

    Returns the accepted nodes (indices into ``draft.tokens``) and the next token.
    """
    assert draft.parents is not None
    tokens, parents = list(draft.tokens), list(draft.parents)
    if params.greedy:
        return tree_accept(None, logits.argmax(-1), None, tokens, parents, [], 0.0)
    if params.seed is not None:
        depth = [0]  # of each row: the root's, then each node's (parents come first)
        for parent in parents:
            depth.append(depth[parent + 1] + 1)
        picked = seeded_tokens(logits, params, [position + d for d in depth])
        return tree_accept(None, picked, None, tokens, parents, [], 0.0)
    p = probabilities(logits, params).double()  # [N+1, V]
    q = None if draft.probs is None else draft.probs.double()  # [N, V]
    u = torch.rand(len(tokens), generator=generator, dtype=torch.float64).tolist()
    u_next = float(torch.rand(1, generator=generator, dtype=torch.float64))
    return tree_accept(p, None, q, tokens, parents, u, u_next)


def make_generator(seed: int | None) -> torch.Generator:
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def prefill_drafter(drafter: Drafter | None, target: ModelRunner, context: Sequence[int]
                    ) -> None:
    """Let ``drafter`` catch up with ``context`` before the first pass (idempotent)."""
    if drafter is None or not drafter.reads_prompt:
        return
    if drafter.wants_hidden:
        drafter.observe_hidden(target.hidden)
    drafter.prefill(context)


def decode(
    target: ModelRunner,
    prompt: Sequence[int],
    *,
    params: SamplingParams,
    max_new_tokens: int,
    max_context: int,
    stop_ids: Collection[int] = (),
    drafter: Drafter | None = None,
    num_draft_tokens: int = 4,
    policy: Policy | None = None,
    cancel: threading.Event | None = None,
    first_token_first: bool = False,
    generator: torch.Generator | None = None,
) -> Generator[Step, None, None]:
    """Generate after ``prompt`` (non-empty, shorter than ``max_context``), one pass per step.

    With a ``policy`` the draft length is chosen per pass (adaptive, may be 0);
    otherwise it is ``num_draft_tokens`` whenever there is room. A drafter that reads the
    prompt itself (``prefill``: a draft model, an EAGLE head) does so right before its
    first draft (reported apart, as that step's ``drafter_prefill_s``), so an answer in
    which the policy never drafts does not pay for it. With ``first_token_first`` the
    first pass of such a drafter runs plain: the first token comes as soon as the target
    has read the prompt, and the drafter's reading costs the same later; the policy is
    given that pass's time as a t(1).
    ``generator`` (default: one seeded with ``params.seed``) draws the drafters' samples
    and, in unseeded sampling, the acceptance tests (a seeded answer's tokens come from
    :func:`seeded_tokens`).
    """
    generator = generator or make_generator(params.seed)
    context = list(prompt)
    wants_hidden = drafter is not None and drafter.wants_hidden
    target.keep_hidden(wants_hidden, drafter.feature_layers if drafter is not None else ())
    target.sync(context[:-1])
    ready = not (first_token_first and drafter is not None and drafter.reads_prompt)
    read = False  # the drafter has read the prompt (it does so before its first draft)
    produced = 0
    while True:
        if cancel is not None and cancel.is_set():
            yield Step.closing("cancelled")
            return
        room = min(max_new_tokens - produced, max_context - len(context))
        if room <= 0:
            yield Step.closing("length")
            return
        prefill_s = 0.0
        ready = ready or produced > 0
        t0 = time.perf_counter()
        k, auto_off, active, part = 0, False, None, None
        if drafter is not None and ready:
            if policy is not None:
                # the part that drafts this pass, if the drafter has parts, and its policy
                part = drafter.part_for(context, min(policy.max_gamma, room - 1))
                active = policy.select(part)
                active.others, active.others_rows = sharing(), sharing_rows()
            k = active.next_gamma(room) if active else min(num_draft_tokens, room - 1)
            auto_off = active is not None and active.last_off
        elif drafter is not None and policy is not None:
            # plain while the drafter has not read the prompt: it times t(1) for the
            # policy all the same, a sample of this moment the first draft pairs with
            active = policy.select(None)
            active.others, active.others_rows = sharing(), sharing_rows()
        draft = EMPTY_DRAFT
        if drafter is not None and k > 0:
            if not read and drafter.reads_for(part):
                start = time.perf_counter()
                prefill_drafter(drafter, target, context)
                read, prefill_s = True, time.perf_counter() - start
            if wants_hidden:
                drafter.observe_hidden(target.hidden)
            draft = drafter.propose(context, k, params, generator)
            if draft.parents is not None and len(draft) >= target.tree_rows:
                draft = draft.main_chain()  # too many rows for one step
        t1 = time.perf_counter()
        draft_s = t1 - t0 - prefill_s  # the drafter's reading is not drafting
        if draft.parents is None:
            logits = target.forward([context[-1], *draft.tokens], rows=len(draft) + 1)  # [G+1, V]
            n, nxt = verify(logits, draft, params, generator, len(context))
            target.truncate(len(context) + n)
            kept = list(draft.tokens[:n])
        else:
            logits = target.forward_tree([context[-1], *draft.tokens],
                                         [-1, *(p + 1 for p in draft.parents)])  # [N+1, V]
            path, nxt = verify_tree(logits, draft, params, generator, len(context))
            target.keep_path(len(context) - 1, [0, *(i + 1 for i in path)])
            n, kept = len(path), [draft.tokens[i] for i in path]
        t2 = time.perf_counter()
        if drafter is not None and len(draft):
            drafter.observe(context, len(draft), n)
        if active is not None:  # a tree's depth is what its acceptance is measured on
            active.update(draft.depth, n, draft_s, t2 - t1, draft.catch_up)
        tokens, flags = [*kept, nxt], [True] * n + [False]
        finish = None
        for i, token in enumerate(tokens):
            if token in stop_ids:
                tokens, flags, finish = tokens[:i], flags[:i], "stop"
                break
        context += tokens
        produced += len(tokens)
        if finish is None and produced >= max_new_tokens:
            finish = "length"
        yield Step(tuple(tokens), tuple(flags), len(draft), n, draft_s, t2 - t1, finish,
                   auto_off=auto_off, drafter_prefill_s=prefill_s)
        if finish is not None:
            return


@dataclass
class StatsRecorder:
    """Accumulates :class:`Step` s into :class:`SpeculationStats`."""

    method: str
    enabled: bool
    prompt_tokens: int
    cached_tokens: int = 0
    started: float = field(default_factory=time.perf_counter)
    prefill_s: float = 0.0
    first_token_at: float | None = None
    passes: int = 0
    drafted: int = 0
    accepted: int = 0
    tokens: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    per_position: list[int] = field(default_factory=list)
    adaptive: bool = False
    auto_off_passes: int = 0
    trial: bool = False  # auto's one-time trial of a runner-up (calibration.Choice.trial)

    def record(self, step: Step) -> None:
        self.passes += step.forwarded
        self.prefill_s += step.drafter_prefill_s
        self.auto_off_passes += step.auto_off
        if step.tokens and self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        self.drafted += step.drafted
        self.accepted += step.accepted
        self.tokens += len(step.tokens)
        self.draft_s += step.draft_s
        self.verify_s += step.verify_s
        if step.drafted > len(self.per_position):
            self.per_position += [0] * (step.drafted - len(self.per_position))
        for i in range(step.accepted):
            self.per_position[i] += 1

    def finish(self) -> SpeculationStats:
        now = time.perf_counter()
        ttft = None if self.first_token_at is None else self.first_token_at - self.started
        return SpeculationStats(
            method=self.method, enabled=self.enabled, prompt_tokens=self.prompt_tokens,
            cached_tokens=self.cached_tokens, completion_tokens=self.tokens, passes=self.passes,
            drafted=self.drafted, accepted=self.accepted,
            accepted_per_position=tuple(self.per_position),
            prefill_s=self.prefill_s, draft_s=self.draft_s, verify_s=self.verify_s,
            total_s=now - self.started, time_to_first_token_s=ttft,
            adaptive=self.adaptive, auto_off_passes=self.auto_off_passes, trial=self.trial,
        )
