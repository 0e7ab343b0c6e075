"""ChatEngine on a tiny model: messages, streaming text, stops, cancellation, cache reuse,
continuing an answer, and the rolling context window."""

import threading
from pathlib import Path

import pytest

from engine.errors import BadRequestError, PromptTooLongError
from engine.heads.files import save_head
from engine.models.loading import LoadedModel
from engine.protocol import ROLLING_WINDOW, Completion, ContextWindow, PromptProgress, TextChunk
from engine.spec.drafters.draft_model import DraftModelDrafter
from engine.spec.drafters.eagle import EagleDrafter
from engine.spec.drafters.suffix import SuffixDrafter
from engine.spec.policy import PartPolicies
from engine.spec.sampling import SamplingParams
from engine.spec.session import READ_CHUNK, ROLL_TURNS, ChatEngine, TextAssembler, split_turns
from tests.test_eagle import head_info, random_head
from tests.tiny import tiny_loaded

ASK = [{"role": "user", "content": "def add(a, b): please explain"}]


@pytest.fixture(scope="module")
def engine() -> ChatEngine:
    target = tiny_loaded("tiny-target", seed=1, scale=4.0)
    draft = tiny_loaded("tiny-draft", seed=2, scale=4.0)
    return ChatEngine(target, draft, corpus=["def add(a, b):\n    return a + b\n"])


def answer(engine: ChatEngine, messages=ASK, **kwargs) -> tuple[list[TextChunk], Completion]:  # type: ignore[no-untyped-def]
    events = list(engine.generate(messages, **kwargs))
    done = events[-1]
    assert isinstance(done, Completion)
    chunks = [e for e in events[:-1] if isinstance(e, TextChunk)]
    assert "".join(c.text for c in chunks) == done.text
    return chunks, done


def test_methods_give_identical_greedy_answers_with_stats(engine: ChatEngine) -> None:
    _, plain = answer(engine, method="off", max_tokens=30)
    assert plain.stats.enabled is False and plain.stats.drafted == 0
    assert plain.stats.mean_accepted_length == 1.0
    for method in ("draft", "ngram", "suffix", "hybrid"):
        _, spec = answer(engine, method=method, max_tokens=30)
        assert spec.token_ids == plain.token_ids, method
        assert spec.text == plain.text
        s = spec.stats
        assert s.method == method and s.enabled
        assert s.completion_tokens == len(spec.token_ids) and s.passes >= 1
        assert s.accepted <= s.drafted
        assert s.accepted_per_position == tuple(sorted(s.accepted_per_position, reverse=True))
        assert s.mean_accepted_length == pytest.approx(1 + s.accepted / s.passes)
        assert s.time_to_first_token_s is not None and s.tokens_per_second


def test_engines_start_on_auto_which_runs_ngram_before_any_calibration(
        engine: ChatEngine) -> None:
    assert engine.method == "auto" and "draft" in engine.methods
    assert engine.calibration is None
    _, done = answer(engine, max_tokens=8)
    assert done.stats.method == "ngram"
    assert engine.last_choice is not None and "not measured" in engine.last_choice.reason
    chosen = ChatEngine(engine.target, engine.draft, method="draft")
    assert chosen.method == "draft"


def test_pieces_mark_text_from_accepted_drafts(engine: ChatEngine) -> None:
    chunks, done = answer(engine, method="draft", max_tokens=30)
    pieces = [p for c in chunks for p in c.pieces]
    assert "".join(text for text, _ in pieces) == done.text
    if done.stats.accepted:
        assert any(flag for _, flag in pieces)


def test_stop_string_cuts_the_answer(engine: ChatEngine) -> None:
    _, full = answer(engine, method="off", max_tokens=40)
    stop = full.text[10:14]
    expected = full.text[: full.text.index(stop)]
    for method in ("off", "ngram", "draft"):
        _, cut = answer(engine, method=method, max_tokens=40, stop=[stop, "never-appears"])
        assert cut.text == expected and cut.finish_reason == "stop", method


def test_max_tokens_ends_with_length(engine: ChatEngine) -> None:
    _, done = answer(engine, max_tokens=7)
    assert done.finish_reason == "length" and len(done.token_ids) == 7


def test_cancellation_between_passes_keeps_the_partial_answer(engine: ChatEngine) -> None:
    cancel = threading.Event()
    events = []
    for event in engine.generate(ASK, max_tokens=60, method="off", cancel=cancel):
        events.append(event)
        cancel.set()
    done = events[-1]
    assert isinstance(done, Completion) and done.finish_reason == "cancelled"
    assert 1 <= len(done.token_ids) < 60
    cancel_early = threading.Event()
    cancel_early.set()
    _, nothing = answer(engine, cancel=cancel_early)
    assert nothing.finish_reason == "cancelled" and nothing.text == ""


def test_follow_up_reuses_the_cached_conversation(engine: ChatEngine) -> None:
    _, first = answer(engine, method="off", max_tokens=12)
    follow = [*ASK, {"role": "assistant", "content": first.text},
              {"role": "user", "content": "and subtraction?"}]
    prompt = engine.encode(follow)
    reused = engine.runner.common_prefix(prompt)
    assert reused >= len(engine.encode(ASK))
    _, second = answer(engine, follow, method="off", max_tokens=5)
    assert second.stats.prompt_tokens == len(prompt)


@pytest.mark.parametrize(
    "messages",
    [
        [],
        "hello",
        [{"role": "user"}],
        [{"role": "robot", "content": "hi"}],
        [{"role": "user", "content": 5}],
        [{"role": "user", "content": "   "}],
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        ["just a string"],
    ],
)
def test_bad_messages_get_a_clear_error(engine: ChatEngine, messages: object) -> None:
    with pytest.raises(BadRequestError):
        engine.generate(messages)


def test_bad_parameters_get_a_clear_error(engine: ChatEngine) -> None:
    with pytest.raises(BadRequestError, match="method"):
        engine.generate(ASK, method="medusa")
    with pytest.raises(BadRequestError, match="eagle"):
        engine.generate(ASK, method="eagle")
    with pytest.raises(BadRequestError, match="num_draft_tokens"):
        engine.generate(ASK, num_draft_tokens=0)
    with pytest.raises(BadRequestError, match="max_tokens"):
        engine.generate(ASK, max_tokens=0)
    for bad in ({"temperature": -1}, {"top_p": 0}, {"top_k": -2}):
        with pytest.raises(BadRequestError):
            SamplingParams(**bad)  # type: ignore[arg-type]


def test_over_long_prompt_is_refused_before_any_work(engine: ChatEngine) -> None:
    cached = list(engine.runner.ids)
    long = [{"role": "user", "content": "def add " * 400}]
    with pytest.raises(PromptTooLongError, match="holds at most"):
        engine.generate(long)
    assert engine.runner.ids == cached


def test_sampled_answers_repeat_with_a_seed(engine: ChatEngine) -> None:
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=7)
    _, a = answer(engine, params=params, method="draft", max_tokens=20)
    _, b = answer(engine, params=params, method="draft", max_tokens=20)
    assert a.token_ids == b.token_ids


def test_text_assembler_holds_back_possible_stop_prefixes() -> None:
    asm = TextAssembler(["STOP"])
    asm.add("hello ST", False)
    assert asm.take().text == "hello"
    asm.add("ILL", True)
    chunk = asm.take()
    assert chunk.text == " ST" and chunk.pieces == ((" ST", False),)
    asm.add(" STOP more", False)
    assert asm.take(final=True).text == "ILL " and asm.stopped
    assert asm.text == "hello STILL "


def test_loaded_model_reports_its_memory() -> None:
    model: LoadedModel = tiny_loaded()
    assert model.memory_bytes > 0 and model.vocab_size == 320


def test_a_conversation_that_comes_back_reuses_its_parked_cache(engine: ChatEngine) -> None:
    engine.runner.reset()
    first = [{"role": "user", "content": "def add(a, b): please explain"}]
    other = [{"role": "user", "content": "what is a tuple?"}]
    _, a = answer(engine, first, method="off", max_tokens=6)
    answer(engine, other, method="off", max_tokens=6)
    back = [*first, {"role": "assistant", "content": a.text},
            {"role": "user", "content": "and sub?"}]
    prompt = engine.encode(back)
    assert engine.runner.resume(prompt[:-1]) >= len(engine.encode(first))  # its cache is back
    fresh = ChatEngine(engine.target, engine.draft)
    _, expected = answer(fresh, back, method="off", max_tokens=8)
    _, again = answer(engine, back, method="off", max_tokens=8)
    assert again.token_ids == expected.token_ids
    assert again.stats.cached_tokens >= len(engine.encode(first))
    assert expected.stats.cached_tokens == 0
    assert any(p.ids[: len(engine.encode(other)) - 1] == engine.encode(other)[:-1]
               for p in engine.runner.parked)  # the other chat waits parked


def long_question(engine: ChatEngine, tokens: int) -> list[dict[str, str]]:
    """A question whose prompt is about ``tokens`` long (within the tiny model's context)."""
    words = ("def add(a, b): return a + b and explain why the sum is what it is " * 40).split()
    for n in range(1, len(words)):
        messages = [{"role": "user", "content": " ".join(words[:n])}]
        if len(engine.encode(messages)) >= tokens:
            return messages
    raise AssertionError("the text is too short")


def test_a_long_prompt_reports_how_much_of_it_was_read(engine: ChatEngine) -> None:
    engine.runner.reset()
    ask = long_question(engine, 200)
    prompt = engine.encode(ask)
    events = list(engine.generate(ask, method="off", max_tokens=5))
    progress = [e for e in events if isinstance(e, PromptProgress)]
    first_text = next(i for i, e in enumerate(events) if isinstance(e, TextChunk))
    assert all(isinstance(e, PromptProgress) for e in events[:first_text])
    total = len(prompt) - 1  # the last prompt token is fed with the first pass
    assert [(p.read, p.total) for p in progress] == [(0, total), (READ_CHUNK, total),
                                                      (total, total)]
    short = list(engine.generate(ASK, method="off", max_tokens=5))
    assert not any(isinstance(e, PromptProgress) for e in short)  # one chunk: nothing to say


def test_a_long_prompt_counts_only_what_is_not_cached(engine: ChatEngine) -> None:
    ask = long_question(engine, 200)
    engine.runner.reset()
    engine.runner.sync(engine.encode(ask)[:50])
    events = list(engine.generate(ask, method="off", max_tokens=3))
    progress = [(e.read, e.total) for e in events if isinstance(e, PromptProgress)]
    total = len(engine.encode(ask)) - 1 - 50
    assert progress == [(0, total), (READ_CHUNK, total), (total, total)]


def test_cancelling_while_a_long_prompt_is_read_stops_before_the_answer(
    engine: ChatEngine,
) -> None:
    engine.runner.reset()
    ask = long_question(engine, 200)
    cancel = threading.Event()
    events = []
    for event in engine.generate(ask, method="draft", max_tokens=20, cancel=cancel):
        events.append(event)
        if isinstance(event, PromptProgress) and event.read:
            cancel.set()  # as the worker does when the client goes away
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["PromptProgress", "PromptProgress", "Completion"]
    done = events[-1]
    assert isinstance(done, Completion)
    assert done.finish_reason == "cancelled" and done.text == "" and not done.token_ids
    assert done.stats.completion_tokens == 0 and done.stats.time_to_first_token_s is None
    assert len(engine.runner) == READ_CHUNK  # the rest of the prompt was never read
    _, again = answer(engine, ask, method="off", max_tokens=5)  # the next answer reads it all
    _, fresh = answer(ChatEngine(engine.target), ask, method="off", max_tokens=5)
    assert again.token_ids == fresh.token_ids


# --- continuing an answer -------------------------------------------------------------------


def test_a_continued_answer_goes_on_exactly_where_the_limit_stopped_it(engine: ChatEngine) -> None:
    _, whole = answer(engine, method="off", max_tokens=30)
    _, first = answer(engine, method="off", max_tokens=12)
    assert first.finish_reason == "length"
    prompt = engine.encode(ASK)
    for method in ("off", "ngram", "draft"):
        *_, rest = engine.generate_ids([*prompt, *first.token_ids], method=method,
                                       max_tokens=18, answer_prefix=first.token_ids)
        assert isinstance(rest, Completion)
        assert first.token_ids + rest.token_ids == whole.token_ids, method
        assert rest.stats.cached_tokens >= len(prompt) - 1  # the first part's cache is reused


def test_continue_final_prompts_with_the_answer_so_far(engine: ChatEngine) -> None:
    tok = engine.target.tokenizer
    partial = "The quick brown fox jumps over"
    messages = [*ASK, {"role": "assistant", "content": partial}]
    fitted = engine.fit(messages, continue_final=True)
    answer_ids = tok.encode(partial, add_special_tokens=False)
    assert fitted.ids == engine.encode(ASK) + answer_ids  # no end-of-turn after the answer
    assert fitted.answer_ids == tuple(answer_ids)
    events = list(engine.generate(messages, method="off", max_tokens=6, continue_final=True))
    done = events[-1]
    assert isinstance(done, Completion) and len(done.token_ids) == 6  # only the new tokens
    assert "".join(e.text for e in events if isinstance(e, TextChunk)) == done.text
    with pytest.raises(BadRequestError, match="assistant's answer so far"):
        engine.generate(ASK, continue_final=True)
    with pytest.raises(BadRequestError, match="last message must be a non-empty user"):
        engine.generate(messages)


# --- the rolling context window ---------------------------------------------------------------


SYSTEM = {"role": "system", "content": "Be brief."}


def chat_of(turns: int) -> list[dict[str, str]]:
    """A conversation of ``turns`` questions and answers, then one more question."""
    messages = [SYSTEM]
    for i in range(turns):
        messages += [{"role": "user", "content": f"question {i}: def add(a, b)"},
                     {"role": "assistant", "content": f"answer {i}: return a + b"}]
    return [*messages, {"role": "user", "content": "and the last question?"}]


def raw_length(engine: ChatEngine, messages: list[dict[str, str]]) -> int:
    tok = engine.target.tokenizer
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return len(tok.encode(text, add_special_tokens=False))


def test_turns_split_after_the_system_prompt() -> None:
    head, turns = split_turns([SYSTEM, {"role": "assistant", "content": "Hi!"},
                               *chat_of(1)[1:]])
    assert head == [SYSTEM]
    assert [[m["role"] for m in t] for t in turns] == [["assistant"], ["user", "assistant"],
                                                        ["user"]]


def test_a_rolling_window_keeps_the_system_prompt_and_the_latest_turns(
    engine: ChatEngine,
) -> None:
    limit = engine.target.max_context
    long = chat_of(40)
    assert len(engine.encode(long[:1] + long[-1:])) < limit < raw_length(engine, long)
    with pytest.raises(PromptTooLongError, match="holds at most"):
        engine.generate(long, max_tokens=40)  # the default: stop, as before
    fitted = engine.fit(long, overflow=ROLLING_WINDOW, reserve=40)
    assert len(fitted.ids) + 40 <= limit
    assert fitted.dropped_messages % (2 * ROLL_TURNS) == 0 and fitted.dropped_messages > 0
    kept = [long[0], *long[1 + fitted.dropped_messages:]]
    assert fitted.ids == engine.encode(kept)
    fewer = [long[0], *long[1 + fitted.dropped_messages - 2 * ROLL_TURNS:]]
    assert raw_length(engine, fewer) + 40 > limit  # no more left out than needed
    events = list(engine.generate(long, method="off", max_tokens=40, overflow=ROLLING_WINDOW))
    assert events[0] == ContextWindow(fitted.dropped_messages, len(fitted.ids))
    done = events[-1]
    assert isinstance(done, Completion) and done.stats.prompt_tokens == len(fitted.ids)
    follow = [*long, {"role": "assistant", "content": done.text},
              {"role": "user", "content": "ok"}]
    assert engine.fit(follow, overflow=ROLLING_WINDOW,
                      reserve=40).dropped_messages == fitted.dropped_messages  # same start
    short = engine.fit(chat_of(1), overflow=ROLLING_WINDOW, reserve=40)
    assert short.dropped_messages == 0 and short.ids == engine.encode(chat_of(1))
    huge = [SYSTEM, {"role": "user", "content": "def add " * 400}]
    with pytest.raises(PromptTooLongError):
        engine.generate(huge, overflow=ROLLING_WINDOW)
    with pytest.raises(BadRequestError, match="context_overflow"):
        engine.generate(ASK, overflow="truncate_middle")


# --- cold answers (the speed demo) ---------------------------------------------------------

DEMO = [{"role": "user", "content": "for i in range(10): print the squares please"}]


def office_state(engine: ChatEngine) -> tuple[object, ...]:
    """What the engine keeps between answers: the target's and the draft model's cached
    ids (current and parked) and the suffix lookup's memory."""
    draft = engine.drafters["draft"]
    suffix = engine.drafters["suffix"]
    assert isinstance(draft, DraftModelDrafter) and isinstance(suffix, SuffixDrafter)
    runners = (engine.runner, draft.runner)
    return (*(list(r.ids) for r in runners), *([p.ids for p in r.parked] for r in runners),
            [list(d) for d in suffix.index.docs])


def test_cold_runs_start_from_equal_cache_states_and_leave_no_trace(engine: ChatEngine) -> None:
    _, warm = answer(engine, DEMO, method="off", max_tokens=16)
    _, again = answer(engine, DEMO, method="draft", max_tokens=16)
    prompt = len(engine.encode(DEMO))
    assert again.stats.cached_tokens == prompt - 1  # warm: the second run finds the prompt
    before = office_state(engine)
    runs = [answer(engine, DEMO, method=m, max_tokens=16, cache="cold")[1]
            for m in ("off", "draft", "hybrid", "suffix")]
    assert [r.stats.cached_tokens for r in runs] == [0, 0, 0, 0]
    assert all(r.stats.prompt_tokens == prompt for r in runs)
    assert all(r.token_ids == warm.token_ids for r in runs)
    assert office_state(engine) == before  # nothing cached or remembered, nothing dropped
    _, after = answer(engine, DEMO, method="draft", max_tokens=16)
    assert after.stats.cached_tokens == prompt - 1  # the office's cache is still there


def test_a_cold_speculative_run_does_not_draft_from_the_plain_runs_answer() -> None:
    target = tiny_loaded("tiny-target", seed=1, scale=4.0)
    question = [{"role": "user", "content": "The quick brown fox, please explain"}]
    # what the suffix lookup drafts after a warm plain run: it learnt the answer (a fixed
    # draft length throughout: the adaptive one follows measured times, not the text)
    learnt = ChatEngine(target)
    _, plain = answer(learnt, question, method="off", max_tokens=24)
    _, warm = answer(learnt, question, method="suffix", max_tokens=24, num_draft_tokens=4)
    # and after a cold one: it drafts as if the plain run had not happened
    fresh, demo = ChatEngine(target), ChatEngine(target)
    _, unseen = answer(fresh, question, method="suffix", max_tokens=24, num_draft_tokens=4)
    _, cold_plain = answer(demo, question, method="off", max_tokens=24, cache="cold")
    _, cold = answer(demo, question, method="suffix", max_tokens=24, num_draft_tokens=4,
                     cache="cold")
    assert warm.token_ids == plain.token_ids == cold_plain.token_ids == cold.token_ids \
        == unseen.token_ids
    assert warm.stats.accepted > unseen.stats.accepted  # learning the answer would show
    assert (cold.stats.drafted, cold.stats.accepted) == (unseen.stats.drafted,
                                                         unseen.stats.accepted)
    suffix = demo.drafters["suffix"]
    assert isinstance(suffix, SuffixDrafter) and suffix.index.docs == []


def test_an_unknown_cache_state_is_a_clear_error(engine: ChatEngine) -> None:
    with pytest.raises(BadRequestError, match="cache must be one of warm, cold"):
        answer(engine, DEMO, cache="frozen")
    with pytest.raises(BadRequestError, match="cache must be one of"):
        list(engine.generate_ids(engine.encode(DEMO), cache="icy"))


def test_a_cold_eagle_run_leaves_the_heads_cache_and_the_targets_features(
    tmp_path: Path,
) -> None:
    loaded = tiny_loaded("tiny-a", scale=4.0)
    path = save_head(random_head(loaded.model), head_info(loaded.model, "tiny-a"),
                     tmp_path / "h.safetensors")
    engine = ChatEngine(loaded, head=path)
    _, warm = answer(engine, DEMO, method="eagle", max_tokens=12)
    eagle = engine.drafters["eagle"]
    assert isinstance(eagle, EagleDrafter)
    kept = (list(engine.runner.ids), engine.runner.hidden, list(eagle.kv.ids), eagle.kv.cache)
    _, cold = answer(engine, DEMO, method="eagle", max_tokens=12, cache="cold")
    assert cold.stats.cached_tokens == 0 and cold.token_ids == warm.token_ids
    assert engine.runner.hidden is kept[1] and eagle.kv.cache is kept[3]
    assert (list(engine.runner.ids), list(eagle.kv.ids)) == (kept[0], kept[2])
    _, again = answer(engine, DEMO, method="eagle", max_tokens=12)
    assert again.stats.cached_tokens == len(engine.encode(DEMO)) - 1


def test_each_kind_of_question_keeps_its_own_adaptive_policies() -> None:
    target = tiny_loaded("tiny-target", seed=1, scale=4.0)
    engine = ChatEngine(target, tiny_loaded("tiny-draft", seed=2, scale=4.0))
    ids = engine.encode(ASK)
    for kind in ("summary", "code", "summary"):
        *_, done = engine.generate_ids(ids, max_tokens=12, method="hybrid", kind=kind)
        assert isinstance(done, Completion)
    *_, done = engine.generate_ids(ids, max_tokens=12, method="ngram")
    assert set(engine.policies) == {("hybrid", "summary"), ("hybrid", "code"), ("ngram", None)}
    summary, code = engine.policies["hybrid", "summary"], engine.policies["hybrid", "code"]
    assert isinstance(summary, PartPolicies) and summary is not code  # one per part, per kind
    assert set(summary.parts) == {"suffix", "draft"}


def test_auto_costs_what_each_drafter_would_read_of_the_question_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The target may have a prompt cached that the draft model has not read (another
    method answered it): ``auto`` is told what each drafter with a model of its own would
    read first, not the target's new tokens."""
    target = tiny_loaded("tiny-target", seed=1, scale=4.0)
    engine = ChatEngine(target, tiny_loaded("tiny-draft", seed=2, scale=4.0))
    told: list[dict[str, int]] = []
    choice = engine.choice
    monkeypatch.setattr(engine, "choice", lambda kind, others=0, rereads=None, reads=None: (
        told.append(dict(reads or {})) or choice(kind, others, rereads, reads)))
    ids = engine.encode(ASK)
    window = engine.drafters["draft"].window  # type: ignore[attr-defined]
    list(engine.generate_ids(ids, max_tokens=6, method="ngram"))  # the target reads it
    list(engine.generate_ids(ids, max_tokens=1))
    assert told[-1] == {"draft": min(len(ids), window), "hybrid": min(len(ids), window)}
    *_, done = engine.generate_ids(ids, max_tokens=6, method="draft")
    assert isinstance(done, Completion)
    list(engine.generate_ids(ids, max_tokens=1))
    assert told[-1] == {"draft": 1, "hybrid": 1}  # it caught up: only the last token is new
    list(engine.generate_ids(ids, max_tokens=1, cache="cold"))
    assert told[-1]["draft"] == min(len(ids), window)
