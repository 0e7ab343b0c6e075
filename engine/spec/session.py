"""ChatEngine: chat messages in, streamed text and speculation statistics out.

This is the engine's front door for the terminal chat, the worker and the benchmark.
It owns the loaded target, the drafters and the target's KV cache, which persists
between requests: a follow-up question in the same conversation only feeds the new
tokens, because the cache is synced to the new prompt by their shared prefix.

A long prompt is read in chunks of :data:`READ_CHUNK` tokens: between them the answer
reports its progress (:class:`PromptProgress`) and can be cancelled, so a document that
takes the target half a minute to read shows how far it got and stops when asked.

A conversation that outgrows the model's context is refused
(:class:`PromptTooLongError`, ``overflow="stop"``) or, with ``overflow="rolling_window"``,
loses its oldest turns (a user message and the answers after it) until the prompt
leaves room for the answer (``max_tokens``, at most half the context); the leading
system messages and the latest turn are always kept, and a :class:`ContextWindow`
event says how many messages were left out. The window moves :data:`ROLL_TURNS` turns
at a time, so follow-up questions keep the same start and reuse the cached prompt.

``continue_final=True`` continues the last message, an assistant's partial answer (one
stopped at its token limit): the prompt is the chat template up to the answer's
generation prompt followed by the answer's own tokens, so where the answer's text
tokenizes back to the tokens it was generated as, greedy decoding continues exactly as
it would have with a larger limit. Only the new text is streamed.

``cache="cold"`` answers as if the engine had never seen the prompt: it runs on empty
copies of the target's runner and of every drafter's own cache (a shallow copy whose
runners are copied and ``reset``: so a ``reset`` must give new caches, never clear the
ones it holds), so nothing cached, parked or not, is reused, and the suffix lookup drafts
from the office's earlier answers but does not remember this one. The office's caches
are left as they were: a conversation cached before is still cached after. The speed
demo runs both its sides cold, so both read the whole prompt and neither drafts from the
other's answer. The default ``"warm"`` reuses every cache and remembers the answer.

Method ``auto`` (the default) picks, per answer, the method predicted fastest for the
question's kind on this machine (:mod:`engine.spec.calibration`): from the calibration the
worker measures or loads in the background (:meth:`ChatEngine.calibrate`) and the
acceptance each method showed. Before any calibration it runs n-gram lookup, which
needs no model of its own and costs next to nothing when it finds no draft. Every answer
folds what it measured (t(1), t(k)/t(1), the drafter's step cost, its acceptance) back
into the calibration, and adaptive policies start from the calibrated figures; a slot
keeps one policy per method and kind of question. An explicit method always wins.

A ChatEngine runs one generation at a time, unless it serves in slots: after
:meth:`ChatEngine.open_slots` up to that many answers run together, each in its own slot
(``generate(..., slot=i)``, slot 0 being the engine's own runner and drafters), on lanes
of one :class:`~engine.spec.batch.Batch` whose passes carry all their rows. Each slot
has its own target cache, drafter caches and adaptive policies; the suffix lookup's
office memory, the calibration and the pool of parked caches are shared, so a
conversation cached by any slot is found by all (an answer in slots parks its cache when
it ends). The lanes take turns, so the engine is still run by one thread at a time.
"""

import copy
import logging
import os
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from engine.errors import BadRequestError, PromptTooLongError
from engine.models.loading import LoadedModel, load_pair
from engine.models.memory import slots_that_fit
from engine.models.registry import Progress
from engine.protocol import (
    CACHE_STATES,
    COLD,
    CONTEXT_OVERFLOW,
    METHODS,
    STOP_AT_LIMIT,
    WARM,
    Completion,
    ContextWindow,
    PromptProgress,
    TextChunk,
)
from engine.spec.batch import batched, sharing
from engine.spec.calibration import (
    KINDS,
    Calibration,
    CalibrationCache,
    Choice,
    Seen,
    agrees,
    cache_key,
    choose,
    classify,
    machine_identity,
    measure,
    measure_t1,
    model_identity,
    predict,
    shipped_observations,
    timed_forwards,
)
from engine.spec.decoding import StatsRecorder, Step, decode
from engine.spec.detokenize import IncrementalDetokenizer
from engine.spec.drafters import Drafter
from engine.spec.drafters.draft_model import DraftModelDrafter
from engine.spec.drafters.eagle import eagle_for
from engine.spec.drafters.hybrid import HybridDrafter
from engine.spec.drafters.ngram import NgramDrafter
from engine.spec.drafters.suffix import SuffixDrafter
from engine.spec.policy import DraftPolicy, PartPolicies, Policy
from engine.spec.runner import PARKED, ModelRunner
from engine.spec.sampling import SamplingParams

log = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant")
MAX_DRAFT_TOKENS = 16
MAX_ADAPTIVE = 8  # the adaptive policy's longest draft
READ_CHUNK = 128  # prompt tokens read between progress reports and cancel checks (~3 s)
ROLL_TURNS = 4  # a rolling window leaves out the oldest turns this many at a time
ADAPTIVE: Literal["adaptive"] = "adaptive"
AUTO = "auto"  # the method predicted fastest on this machine, per answer
# The method an engine starts with: the machine's figures choose (see the module).
# Admins switch to another method per worker or per request.
DEFAULT_METHOD = AUTO
FALLBACK_METHOD = "ngram"  # auto's choice before anything is measured
CALIBRATION_BUDGET_S = 4.0  # of background measuring at worker start
SLOT_POSITIONS = 8192  # positions an answer's caches are counted at when sizing the slots
DraftLength = int | Literal["adaptive"]
Event = ContextWindow | PromptProgress | TextChunk | Completion


def validate_messages(messages: Any, continue_final: bool = False) -> list[dict[str, str]]:
    """Check the OpenAI-style message list; return it as plain dicts.

    The last message is a non-empty question, or, with ``continue_final``, the
    assistant's answer to continue."""
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise BadRequestError("messages must be a non-empty list of {role, content} objects")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise BadRequestError(f"messages[{i}] must be an object with role and content")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise BadRequestError(f"messages[{i}].role must be one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise BadRequestError(f"messages[{i}].content must be a string")
        out.append({"role": role, "content": content})
    if continue_final:
        if out[-1]["role"] != "assistant":
            raise BadRequestError("to continue an answer, the last message must be the "
                                  "assistant's answer so far")
    elif out[-1]["role"] != "user" or not out[-1]["content"].strip():
        raise BadRequestError("the last message must be a non-empty user message")
    return out


def split_turns(messages: Sequence[dict[str, str]]
                ) -> tuple[list[dict[str, str]], list[list[dict[str, str]]]]:
    """The leading system messages, and the rest as turns: each starts at a user message
    and holds the answers after it (messages before the first question are a turn too)."""
    start = 0
    while start < len(messages) and messages[start]["role"] == "system":
        start += 1
    turns: list[list[dict[str, str]]] = []
    for message in messages[start:]:
        if not turns or message["role"] == "user":
            turns.append([])
        turns[-1].append(message)
    return list(messages[:start]), turns


def _window_starts(turns: int) -> list[int]:
    """How many leading turns a rolling window may leave out, fewest first: multiples of
    :data:`ROLL_TURNS`, and all but the latest turn."""
    return sorted({min(k, turns - 1) for k in range(ROLL_TURNS, turns - 1 + ROLL_TURNS,
                                                    ROLL_TURNS)})


@dataclass(frozen=True)
class Prompt:
    """A conversation as the target reads it."""

    ids: list[int]
    dropped_messages: int = 0  # left out by a rolling window
    answer_ids: tuple[int, ...] = ()  # the continued answer's tokens, at the end of ``ids``


def _ahead(first: ContextWindow, events: Iterator[Event]) -> Generator[Event, None, None]:
    yield first
    yield from events


def _check_cache(cache: Any) -> None:
    if cache not in CACHE_STATES:
        raise BadRequestError(f"cache must be one of {', '.join(CACHE_STATES)}, not {cache!r}")


def _emptied(obj: Any, table: Mapping[str, Any], cold_table: Mapping[str, Any]) -> Any:
    """A shallow copy of ``obj`` (a runner or a drafter) with caches of its own: its
    runners are emptied copies too, a reference to the drafter ``table`` becomes
    ``cold_table``, and then its ``reset`` runs on the copy."""
    twin = copy.copy(obj)
    for name, value in list(getattr(twin, "__dict__", {}).items()):
        if isinstance(value, ModelRunner):
            setattr(twin, name, _emptied(value, table, cold_table))
        elif value is table:
            setattr(twin, name, cold_table)
    twin.reset()
    return twin


PolicyKey = tuple[str, str | None]  # (method, kind of question): a slot's adaptive policies


@dataclass
class Slot:
    """What one of several answers running together owns (see the module)."""

    runner: ModelRunner
    drafters: dict[str, Drafter]
    policies: dict[PolicyKey, Policy]  # by (method, kind of question)


SHARED_DRAFTERS = ("suffix",)  # one office memory for every slot


def _check_max_tokens(max_tokens: Any) -> None:
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadRequestError("max_tokens must be a positive integer")


class TextAssembler:
    """Collects answer text with per-character draft flags and applies stop strings.

    Text that could be the start of a stop string is held back until it is clear.
    """

    def __init__(self, stop: Sequence[str]) -> None:
        self.stop = [s for s in stop if s]
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.text = ""
        self.flags: list[bool] = []
        self.sent = 0
        self.stopped = False

    def add(self, piece: str, from_draft: bool) -> None:
        self.text += piece
        self.flags += [from_draft] * len(piece)

    def take(self, final: bool = False) -> TextChunk:
        """Return the text that is now safe to show."""
        start = max(0, self.sent - self.hold)
        hits = [i for s in self.stop if (i := self.text.find(s, start)) >= 0]
        if hits:
            cut = min(hits)
            self.text, self.flags, self.stopped = self.text[:cut], self.flags[:cut], True
            end = cut
        else:
            end = len(self.text) if final else len(self.text) - self.hold
        end = max(end, self.sent)
        pieces: list[tuple[str, bool]] = []
        for i in range(self.sent, end):
            if pieces and pieces[-1][1] == self.flags[i]:
                pieces[-1] = (pieces[-1][0] + self.text[i], self.flags[i])
            else:
                pieces.append((self.text[i], self.flags[i]))
        chunk = TextChunk(self.text[self.sent : end], tuple(pieces))
        self.sent = end
        return chunk


class ChatEngine:
    """A loaded target with its drafters, generating answers to chat messages."""

    def __init__(
        self,
        target: LoadedModel,
        draft: LoadedModel | None = None,
        *,
        method: str | None = None,
        num_draft_tokens: DraftLength = ADAPTIVE,
        corpus: Sequence[str] = (),
        head: str | os.PathLike[str] | None = None,
        data_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.target = target
        self.draft = draft
        self.data_dir = data_dir
        self.runner = ModelRunner(target.model)
        corpus_ids = [target.tokenizer.encode(t, add_special_tokens=False) for t in corpus]
        self.drafters: dict[str, Drafter] = {
            "ngram": NgramDrafter(),
            "suffix": SuffixDrafter(corpus_ids),
        }
        if draft is not None:
            self.drafters["draft"] = DraftModelDrafter(draft, target.vocab_size)
            self.drafters["hybrid"] = HybridDrafter(self.drafters)
        eagle = eagle_for(target, None if head is None else Path(head), data_dir)
        if eagle is not None:
            self.drafters["eagle"] = eagle
            self.drafters["hybrid-eagle"] = HybridDrafter(self.drafters, model="eagle")
        self.policies: dict[PolicyKey, Policy] = {}
        self.slots: list[Slot] = [Slot(self.runner, self.drafters, self.policies)]
        self.calibration: Calibration | None = None
        # what the benchmark saw these models do, until this engine's answers show more
        self.observations = shipped_observations(
            [target.name, None if draft is None else draft.name])
        self.calibration_key = cache_key(machine_identity(self.runner.model_forward.plan.variant),
                                         model_identity([target, draft]))
        self._cache: CalibrationCache | None = None
        self.last_choice: Choice | None = None
        self.method = self.check_method(method or DEFAULT_METHOD)
        self.num_draft_tokens = self.check_num_draft_tokens(num_draft_tokens)

    @classmethod
    def load(
        cls,
        target: str,
        draft: str | None = None,
        *,
        dtype: str = "float32",
        data_dir: str | os.PathLike[str] | None = None,
        progress: Progress | None = None,
        accel: str = "auto",
        **kwargs: Any,
    ) -> "ChatEngine":
        """Prepare and load models by name or path, then build the engine."""
        loaded_target, loaded_draft = load_pair(
            target, draft, dtype=dtype, data_dir=data_dir, progress=progress, accel=accel
        )
        return cls(loaded_target, loaded_draft, data_dir=data_dir, **kwargs)

    def reload_head(self) -> None:
        """Draft with the target's installed head from now on (the office trained a new one)."""
        eagle = eagle_for(self.target, data_dir=self.data_dir)
        if eagle is not None:
            self.drafters["eagle"] = eagle
            # the hybrid finds the head by name in its table, so it drafts with the new one
            hybrid = self.drafters.setdefault("hybrid-eagle",
                                              HybridDrafter(self.drafters, model="eagle"))
            for slot in self.slots:
                if slot.drafters is not self.drafters:
                    slot.drafters["eagle"] = _emptied(eagle, self.drafters, slot.drafters)
                    if "hybrid-eagle" not in slot.drafters:
                        slot.drafters["hybrid-eagle"] = _emptied(hybrid, self.drafters,
                                                                 slot.drafters)
                for key in [k for k in slot.policies if k[0] in ("eagle", "hybrid-eagle")]:
                    del slot.policies[key]  # their measured acceptance was the old head's
            for method in ("eagle", "hybrid-eagle"):
                self.observations.forget(method)

    def slot_bytes(self) -> int:
        """Memory one more slot's target cache takes at :data:`SLOT_POSITIONS` positions."""
        config = self.target.model.config
        heads = int(config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        per_position = int(config.num_hidden_layers) * 2 * kv_heads * head_dim * 4  # float32
        return per_position * min(SLOT_POSITIONS, int(self.target.max_context))

    def open_slots(self, count: int) -> int:
        """Serve up to ``count`` answers together from now on (see the module), as many
        as the memory available now holds (:func:`slots_that_fit`); returns how many
        slots there are. Idempotent; fewer than before drops the extra slots."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"the number of slots must be a positive integer, not {count!r}")
        count = slots_that_fit(self.slot_bytes(), count)
        batched(self.runner)
        while len(self.slots) < count:
            table: dict[str, Drafter] = {}
            for name, drafter in self.drafters.items():
                table[name] = (drafter if name in SHARED_DRAFTERS
                               else _emptied(drafter, self.drafters, table))
            runner = _emptied(self.runner, self.drafters, table)
            self.slots.append(Slot(runner, table, {}))
        del self.slots[count:]
        for slot in self.slots:
            slot.runner.park_limit = PARKED + count - 1  # every slot's conversation, parked
        return len(self.slots)

    def _slot(self, index: int) -> Slot:
        if isinstance(index, bool) or not isinstance(index, int) \
                or not 0 <= index < len(self.slots):
            raise BadRequestError(f"slot must be 0 to {len(self.slots) - 1}, not {index!r}")
        slot = self.slots[index]
        slot.runner.parked = self.runner.parked  # one pool (a reset may have replaced it)
        return slot

    @property
    def max_adaptive(self) -> int:
        """The adaptive policy's longest draft: with a calibration, as long as a
        verification was measured (the policy weighs the measured t(k)); before, what one
        cheap verification can hold."""
        if self.calibration is not None:
            return MAX_DRAFT_TOKENS - 1
        rows = self.target.efficient_rows
        return MAX_ADAPTIVE if rows is None else max(1, min(MAX_ADAPTIVE, rows - 1))

    @property
    def methods(self) -> list[str]:
        """Methods usable now: ``auto``, ``off`` and each loaded drafter."""
        return [AUTO, "off", *self.drafters]

    def check_method(self, method: str) -> str:
        if method == AUTO:
            return method
        if method not in METHODS:
            raise BadRequestError(f"unknown method {method!r}: use one of {', '.join(METHODS)}")
        if method not in self.methods:
            raise BadRequestError(
                f"method {method!r} is not available with the loaded models; "
                f"available: {', '.join(self.methods)}"
            )
        return method

    @staticmethod
    def check_num_draft_tokens(k: DraftLength) -> DraftLength:
        """A fixed draft length 1..MAX_DRAFT_TOKENS, or ``"adaptive"``."""
        if k == ADAPTIVE:
            return k
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_DRAFT_TOKENS:
            raise BadRequestError(
                f"num_draft_tokens must be an integer from 1 to {MAX_DRAFT_TOKENS} "
                f"or {ADAPTIVE!r}"
            )
        return k

    def encode(self, messages: Any) -> list[int]:
        """Validate ``messages`` and apply the chat template; return prompt ids."""
        return self.fit(messages).ids

    def _render(self, messages: list[dict[str, str]], continue_final: bool
                ) -> tuple[list[int], tuple[int, ...]]:
        """Prompt ids, and the ids of the answer being continued at their end."""
        tok = self.target.tokenizer

        def ids(text: str) -> list[int]:
            return list(tok.encode(text, add_special_tokens=False))

        if not continue_final:
            return ids(tok.apply_chat_template(messages, tokenize=False,
                                               add_generation_prompt=True)), ()
        whole = tok.apply_chat_template(messages, tokenize=False, continue_final_message=True)
        head = tok.apply_chat_template(messages[:-1], tokenize=False,
                                       add_generation_prompt=True) if messages[:-1] else None
        if head is None or not whole.startswith(head):  # a template that renders answers
            return ids(whole), ()  # differently from how it prompts for them
        answer = ids(whole[len(head):])
        return ids(head) + answer, tuple(answer)

    def _too_long(self, tokens: int, what: str = "conversation") -> PromptTooLongError:
        return PromptTooLongError(
            f"the {what} is {tokens} tokens but {self.target.name} holds at most "
            f"{self.target.max_context - 1} before answering; shorten it or start a new one"
        )

    def fit(self, messages: Any, *, continue_final: bool = False,
            overflow: str = STOP_AT_LIMIT, reserve: int = 0) -> Prompt:
        """Validate ``messages`` and tokenize them with the chat template, fitting them
        into the context as ``overflow`` says (a rolling window leaves ``reserve`` tokens,
        at most half the context, for the answer)."""
        checked = validate_messages(messages, continue_final)
        if overflow not in CONTEXT_OVERFLOW:
            raise BadRequestError(f"context_overflow must be one of {', '.join(CONTEXT_OVERFLOW)}"
                                  f", not {overflow!r}")
        limit = self.target.max_context
        room = min(max(reserve, 0), limit // 2)
        ids, answer = self._render(checked, continue_final)
        if len(ids) + room <= limit or overflow == STOP_AT_LIMIT:
            if len(ids) >= limit:
                raise self._too_long(len(ids))
            return Prompt(ids, 0, answer)
        head, turns = split_turns(checked)
        starts = _window_starts(len(turns))
        if not starts:  # one turn: nothing to leave out
            if len(ids) >= limit:
                raise self._too_long(len(ids))
            return Prompt(ids, 0, answer)
        tried: dict[int, Prompt] = {}

        def window(k: int) -> Prompt:
            if k not in tried:
                kept = head + [m for turn in turns[k:] for m in turn]
                window_ids, window_answer = self._render(kept, continue_final)
                tried[k] = Prompt(window_ids, sum(len(t) for t in turns[:k]), window_answer)
            return tried[k]

        low, high = 0, len(starts) - 1  # the first start whose window fits, else the last
        while low < high:
            mid = (low + high) // 2
            if len(window(starts[mid]).ids) + room <= limit:
                high = mid
            else:
                low = mid + 1
        fitted = window(starts[low])
        if len(fitted.ids) >= limit:
            raise self._too_long(len(fitted.ids), "system prompt with the latest question")
        log.info("rolling window: %d of %d messages left out, %d prompt tokens",
                 fitted.dropped_messages, len(checked), len(fitted.ids))
        return fitted

    def generate(
        self,
        messages: Any,
        params: SamplingParams | None = None,
        *,
        max_tokens: int = 512,
        stop: Sequence[str] = (),
        method: str | None = None,
        num_draft_tokens: DraftLength | None = None,
        cancel: threading.Event | None = None,
        overflow: str = STOP_AT_LIMIT,
        continue_final: bool = False,
        cache: str = WARM,
        slot: int = 0,
    ) -> Generator[Event, None, None]:
        """Answer ``messages`` (or continue its last, ``continue_final``): yields a
        :class:`ContextWindow` when a rolling window (``overflow``) left messages out,
        :class:`PromptProgress` while reading a long prompt, then :class:`TextChunk` s,
        then one :class:`Completion`. ``cache`` is ``"warm"`` or ``"cold"``; ``slot``:
        which of :meth:`open_slots`' slots runs it (see the module)."""
        _check_max_tokens(max_tokens)
        _check_cache(cache)
        prompt = self.fit(messages, continue_final=continue_final, overflow=overflow,
                          reserve=max_tokens)
        questions = [m for m in messages if m.get("role") == "user"]
        kind = classify(str(questions[-1].get("content", ""))) if questions else None
        events = self.generate_ids(
            prompt.ids, params, max_tokens=max_tokens, stop=stop, method=method,
            num_draft_tokens=num_draft_tokens, cancel=cancel, answer_prefix=prompt.answer_ids,
            cache=cache, kind=kind, slot=slot,
        )
        if prompt.dropped_messages:
            return _ahead(ContextWindow(prompt.dropped_messages, len(prompt.ids)), events)
        return events

    def generate_ids(
        self,
        prompt: Sequence[int],
        params: SamplingParams | None = None,
        *,
        max_tokens: int = 512,
        stop: Sequence[str] = (),
        method: str | None = None,
        num_draft_tokens: DraftLength | None = None,
        cancel: threading.Event | None = None,
        answer_prefix: Sequence[int] = (),
        cache: str = WARM,
        kind: str | None = None,
        slot: int = 0,
    ) -> Generator[Event, None, None]:
        """Like :meth:`generate` for an already tokenized prompt; ``answer_prefix`` are the
        ids at its end that belong to the answer being continued (its text is not sent
        again, and the new text joins it as one detokenization would); ``kind``: the
        question's kind (:func:`engine.spec.calibration.classify`) if known, for ``auto``."""
        _check_cache(cache)
        seat = self._slot(slot)
        params = params or SamplingParams()
        method = self.check_method(self.method if method is None else method)
        trial = False  # auto's one-time trial of a runner-up (Choice.trial)
        if method == AUTO:
            heads = [name for name, d in seat.drafters.items() if d.wants_hidden]
            rereads: dict[str, int] = {}
            if heads and cache != COLD:  # a warm cache may lack the head's features
                ids = prompt[:-1]
                again = seat.runner.cached(ids, False) - seat.runner.cached(ids, True)
                rereads = dict.fromkeys(heads, again)
            # what each drafter with a model of its own would read first (all of its
            # window on a cold start, or where its cache holds another conversation)
            table = self._cold(seat)[1] if cache == COLD else seat.drafters
            reads = {name: d.unread(prompt) for name, d in table.items() if d.reads_prompt}
            self.last_choice = self.choice(kind, sharing(), rereads, reads)
            method = self.check_method(self.last_choice.method)
            trial = self.last_choice.trial
        k = self.check_num_draft_tokens(
            self.num_draft_tokens if num_draft_tokens is None else num_draft_tokens
        )
        _check_max_tokens(max_tokens)
        if not prompt or len(prompt) >= self.target.max_context:
            raise PromptTooLongError(
                f"the prompt must hold 1 to {self.target.max_context - 1} tokens, not {len(prompt)}"
            )
        if isinstance(stop, str):
            stop = [stop]
        return self._run(list(prompt), params, max_tokens, list(stop), method, k, cancel,
                         tuple(answer_prefix), cache == COLD, kind, seat, trial)

    def _new_policy(self, drafter: str) -> DraftPolicy:
        return (DraftPolicy(max_gamma=self.max_adaptive) if self.calibration is None
                else self.calibration.policy(drafter, self.max_adaptive))

    def _policy(self, method: str, kind: str | None, policies: dict[PolicyKey, Policy]
                ) -> Policy:
        """The method's adaptive policy for this kind of question in a slot's ``policies``:
        costs and acceptance measured on earlier answers of the kind are kept (a head
        guesses code far better than a summary's wording, so what one summary showed
        must not switch it off for the code question after it); a new one starts from
        the calibration's figures when there is one. A drafter made of parts gets one
        policy per part (:class:`PartPolicies`), each starting from that part's
        calibrated step."""
        key = (method, kind)
        if key not in policies:
            parts = self.drafters[method].parts
            policies[key] = (
                PartPolicies({part: self._new_policy(part) for part in parts}) if parts
                else self._new_policy(method))
        policy = policies[key]
        policy.new_answer()
        return policy

    # --- calibration and the automatic method --------------------------------------

    def calibrate(self, cache: str | os.PathLike[str] | None = None,
                  budget_s: float = CALIBRATION_BUDGET_S,
                  clock: Callable[[], float] = time.perf_counter,
                  ) -> Generator[None, None, Calibration]:
        """Load this machine's and models' calibration from ``cache`` (a JSON file), or
        measure it in slices (one ``next()`` each, :func:`engine.spec.calibration.measure`)
        and save it there. A cached one is used (from the first slice on) while t(1) is
        measured again (:func:`engine.spec.calibration.measure_t1`); if the two disagree
        (:func:`engine.spec.calibration.agrees`) it is measured again, keeping what the
        methods were seen to accept, after the context the check read (read once)."""
        self._cache = None if cache is None else CalibrationCache(Path(cache))
        timed = None  # the context read for the check, kept for a measurement after it
        if self._cache is not None:
            cached, observations = self._cache.load(self.calibration_key)
            if cached is not None:
                self.calibration, self.observations = cached, observations
                self._fill_policies()
                timed = yield from timed_forwards(self.target.model, clock)
                now = yield from measure_t1(self.target.model, clock=clock, timed=timed)
                if agrees(cached.t1, now):
                    log.info("calibration for this machine and models read from %s "
                             "(t(1) %.1f ms cached, %.1f ms now)", cache, cached.t1 * 1000,
                             now * 1000)
                    return self.calibration or cached  # answers run meanwhile folded in
                log.info("the cached calibration's t(1) is %.1f ms, %.1f ms now: measuring "
                         "again", cached.t1 * 1000, now * 1000)
                # meanwhile, its ratios (each paired with a t(1) of its moment) with t(1) now
                self.calibration = replace(cached, t1=now)
        calibration = yield from measure(self.target.model, self.drafters,
                                         self.calibration_key, budget_s, clock=clock,
                                         timed=timed)
        self.calibration = calibration
        self._fill_policies()
        log.info("calibrated: t(1) %.1f ms, t(8)/t(1) %.2f, t(16)/t(1) %.2f; steps %s",
                 calibration.t1 * 1000, calibration.ratio_at(8), calibration.ratio_at(16),
                 ", ".join(f"{k} {v:.3f}" for k, v in calibration.step.items()))
        self._save()
        return calibration

    def _fill_policies(self) -> None:
        """Give the adaptive policies that answers created before the calibration existed
        its figures where they have none of their own (:meth:`DraftPolicy.fill`)."""
        if self.calibration is None:
            return
        for slot in self.slots:
            for (method, _), policy in slot.policies.items():
                parts = policy.parts if isinstance(policy, PartPolicies) else {method: policy}
                for name, part in parts.items():
                    part.fill(self.calibration.policy(name, self.max_adaptive))

    def _save(self) -> None:
        if self._cache is not None:
            self._cache.save(self.calibration_key, self.calibration, self.observations)

    def choice(self, kind: str | None, others: int = 0,
               rereads: Mapping[str, int] | None = None,
               reads: Mapping[str, int] | None = None) -> Choice:
        """The method ``auto`` runs on a question of ``kind`` now, and why; ``others``:
        answers already decoding beside it (continuous batching); ``rereads``: prompt
        tokens the target would read again per method (cached without the features an
        EAGLE head needs); ``reads``: tokens each method's drafter would read itself first
        (``Drafter.unread``)."""
        if self.calibration is None:
            return choose((), kind, FALLBACK_METHOD)
        predictions = predict(self.calibration, self.observations, self.drafters, kind,
                              self.max_adaptive, others=others,
                              parts={n: d.parts for n, d in self.drafters.items()},
                              rereads=rereads, reads=reads)
        return choose(predictions, kind, FALLBACK_METHOD, explore=not others)

    def speculation_report(self) -> dict[str, Any]:
        """The calibration, ``auto``'s choice per kind and the draft head in use (what
        :func:`engine.spec.drafters.eagle.eagle_for` says of it; ``None`` without one), as
        the worker reports them."""
        eagle = self.drafters.get("eagle")
        return {
            "calibration": None if self.calibration is None else self.calibration.summary(),
            "overall": self.choice(None).to_json(),
            "kinds": {kind: self.choice(kind).to_json() for kind in KINDS},
            "head": None if eagle is None else dict(getattr(eagle, "info", {})),
        }

    def _learn(self, method: str, kind: str | None, steps: list[Step],
               prompt_tokens: int, policy: Policy | None, timed: bool = True) -> None:
        """Fold one answer's figures into the observations and, if ``timed`` (it ran
        alone), its timings into the calibration. An answer with no pass after its first
        token (``max_tokens: 1``, a warm-up) shows nothing of its method, and its length
        is no answer's: it is left out of the observations, where it would shorten the
        kind's typical answer and so weigh every drafter's prompt reading more."""
        later = [s for s in steps[1:] if s.forwarded]
        if method != "off" and later:
            seen = Seen(answers=1.0)
            for i, step in enumerate(steps):
                if not step.forwarded or step.auto_off or (i == 0 and not step.drafted):
                    continue
                seen = seen.add(Seen(float(step.accepted),
                                     float(step.accepted < step.drafted and step.drafted > 0),
                                     1.0, float(step.drafted > 0)))
            # its speed after the first token, in t(1) of this moment (the policy's, else
            # the calibration's); the drafter's reading of the prompt is left out, as
            # predict costs that apart
            t1 = policy.t1 if policy is not None and policy.t1 else (
                None if self.calibration is None else self.calibration.t1)
            if timed and t1 and later:
                seen.tokens = float(sum(len(s.tokens) for s in later))
                seen.cost = sum(s.draft_s + s.verify_s for s in later) / t1
            self.observations.record(method, kind or "chat", seen, prompt_tokens,
                                     sum(len(s.tokens) for s in steps))
        if self.calibration is not None and timed:
            if policy is not None and policy.t1 is not None:
                step_s = {} if policy.draft_cost is None else {method: policy.draft_cost}
                self.calibration = self.calibration.fold(t1=policy.t1, ratios=policy.ratio,
                                                         step=step_s)
            elif method == "off":
                plain = sorted(s.verify_s for s in steps if s.forwarded)
                if plain:
                    self.calibration = self.calibration.fold(t1=plain[len(plain) // 2])
        self._save()

    @staticmethod
    def _cold(slot: Slot) -> tuple[ModelRunner, dict[str, Drafter]]:
        """Copies of a slot's runner and drafter table with every cache empty; the
        engine's own are untouched (see the module)."""
        table: dict[str, Drafter] = {}
        table.update((name, _emptied(d, slot.drafters, table)) for name, d in slot.drafters.items())
        return _emptied(slot.runner, slot.drafters, table), table

    @staticmethod
    def _read_prompt(runner: ModelRunner, ids: list[int], cancel: threading.Event | None
                     ) -> Generator[PromptProgress, None, bool]:
        """Feed ``ids`` into the target's cache :data:`READ_CHUNK` tokens at a time,
        checking ``cancel`` between chunks; a read of more than one chunk reports its
        progress (from 0). Returns False when cancelled."""
        start = runner.common_prefix(ids)
        total = len(ids) - start
        report = total > READ_CHUNK
        if report:
            yield PromptProgress(0, total)
        for end in [*range(start + READ_CHUNK, len(ids), READ_CHUNK), len(ids)]:
            if cancel is not None and cancel.is_set():
                return False
            runner.sync(ids[:end])
            if report:
                yield PromptProgress(end - start, total)
        return True

    def _run(
        self,
        prompt: list[int],
        params: SamplingParams,
        max_tokens: int,
        stop: list[str],
        method: str,
        k: DraftLength,
        cancel: threading.Event | None,
        answer_prefix: tuple[int, ...] = (),
        cold: bool = False,
        kind: str | None = None,
        slot: Slot | None = None,
        trial: bool = False,
    ) -> Generator[Event, None, None]:
        slot = slot or self.slots[0]
        adaptive = k == ADAPTIVE and method != "off"
        recorder = StatsRecorder(method, method != "off", len(prompt), adaptive=adaptive,
                                 trial=trial)
        runner, drafters = self._cold(slot) if cold else (slot.runner, slot.drafters)
        drafter = drafters.get(method)
        runner.keep_hidden(drafter is not None and drafter.wants_hidden,
                           drafter.feature_layers if drafter is not None else ())
        # another conversation's parked cache, if it fits
        recorder.cached_tokens = runner.resume(prompt[:-1])
        read = yield from self._read_prompt(runner, prompt[:-1], cancel)  # the drafter's later
        recorder.prefill_s = time.perf_counter() - recorder.started
        if not read:
            yield Completion("", "cancelled", (), recorder.finish())
            return
        detok = IncrementalDetokenizer(self.target.tokenizer, answer_prefix)
        text = TextAssembler(stop)
        policy = self._policy(method, kind, slot.policies) if adaptive else None
        seen: list[Step] = []
        steps = decode(
            runner, prompt, params=params, max_new_tokens=max_tokens,
            max_context=self.target.max_context, stop_ids=self.target.eos_ids,
            drafter=None if method == "off" else drafters[method],
            num_draft_tokens=k if isinstance(k, int) else MAX_ADAPTIVE,
            policy=policy, cancel=cancel,
            first_token_first=True,
        )
        finish = "length"
        crowded = False  # whether other answers shared a pass (its timings are not t(k))
        for step in steps:
            crowded = crowded or sharing() > 0
            recorder.record(step)
            seen.append(step)
            for token, flag in zip(step.tokens, step.from_draft, strict=True):
                text.add(detok.add(token), flag)
            if step.finish_reason is not None:
                finish = step.finish_reason
                text.add(detok.flush(), False)
            chunk = text.take(final=step.finish_reason is not None)
            if text.stopped:
                finish = "stop"
                steps.close()
            if chunk.text or step.tokens:
                yield TextChunk(chunk.text, chunk.pieces, step.tokens, step.drafted, step.accepted)
            if text.stopped or step.finish_reason is not None:
                break
        suffix = self.drafters["suffix"]
        if isinstance(suffix, SuffixDrafter) and not cold:
            suffix.add_document(detok.ids)
        new_ids = tuple(detok.ids[len(answer_prefix):])
        if len(self.slots) > 1 and not cold:
            runner.start_over(0)  # into the shared pool, for whichever slot is asked next
        self._learn(method, kind, seen, len(prompt) - recorder.cached_tokens, policy,
                    timed=not crowded)
        yield Completion(text.text, finish, new_ids, recorder.finish())
