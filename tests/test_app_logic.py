"""The app's Qt-free logic: answer accounting, SSE, Markdown split, demo, passphrase, export."""

import asyncio
import json
import time

import pytest

from app.answer import AnswerStats, AnswerStream, footer_text, merge_pieces
from app.client import AnswerRequest, Health, error_message, parse_sse_line
from app.demo import compare, duration, first_difference, speedup, text_at
from app.export import render, to_json, to_markdown
from app.lag import LagMeter
from app.markdown import draft_html, extend_blocks, highlighted_blocks, split_blocks
from app.passphrase import hash_passphrase, verify, weakness
from app.store import COMPLETE, INTERRUPTED, ChatSettings, Conversation, Message

FINAL = {
    "model": "t", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
    "usage": {"prompt_tokens": 9, "completion_tokens": 7, "total_tokens": 16},
    "speculation": {
        "method": "draft", "enabled": True, "disabled_reason": None, "num_draft_tokens": 4,
        "passes": 3, "drafted": 8, "accepted": 4, "acceptance_rate": 0.5,
        "mean_accepted_length": 2.33, "accepted_per_position": [2, 1, 1],
        "tokens_per_second": 41.5, "time_to_first_token_s": 0.12,
    },
}


def chunk(text: str, pieces: list[list[object]], tokens: int) -> dict[str, object]:
    return {"model": "t", "choices": [{"index": 0, "delta": {"content": text}}],
            "anve": {"pieces": pieces, "tokens": tokens}}


def test_answer_stream_counts_passes_and_takes_the_final_stats() -> None:
    answer = AnswerStream(started=10.0)
    answer.add({"choices": [{"delta": {"role": "assistant", "content": ""}}]}, 10.05)
    answer.add(chunk("Hello", [["Hello", False]], 1), 10.1)
    answer.add(chunk(" big world", [[" big", True], [" world", False]], 3), 10.2)
    answer.add(chunk("!", [["!", True]], 2), 10.3)
    live = answer.live_stats(10.3)
    assert (live.completion_tokens, live.passes) == (6, 3)
    assert live.accepted_per_position == (2, 1)
    assert live.time_to_first_token_s == pytest.approx(0.1)
    assert live.tokens_per_second == pytest.approx(5 / 0.2)
    assert live.estimated and answer.final is None
    assert answer.text == "Hello big world!"
    assert answer.pieces == [["Hello", False], [" big", True], [" world", False], ["!", True]]
    assert [t for t, _ in answer.timeline] == pytest.approx([0.1, 0.2, 0.3])
    answer.add(FINAL, 10.4)
    stats = answer.stats(10.4)
    assert stats.method == "draft" and stats.completion_tokens == 7
    assert stats.position_rates == pytest.approx([2 / 3, 1 / 3, 1 / 3])
    assert stats.finish_reason == "length" and not stats.estimated


def test_live_acceptance_comes_from_the_workers_pass_counts() -> None:
    answer = AnswerStream(started=0.0)
    for text, drafted, accepted in (("a", 4, 3), ("b", 4, 0), ("c", 2, 2)):
        payload = chunk(text, [[text, accepted > 0]], accepted + 1)
        payload["anve"].update(drafted=drafted, accepted=accepted)  # type: ignore[attr-defined]
        answer.add(payload, 1.0)
    live = answer.live_stats(1.0)
    assert (live.drafted, live.accepted) == (10, 5)
    assert live.acceptance_rate == pytest.approx(0.5)
    assert live.accepted_per_position == (2, 2, 1)


def progress(read: object, total: object) -> dict[str, object]:
    return {"choices": [{"index": 0, "delta": {}}],
            "anve": {"prompt_progress": {"read": read, "total": total}}}


def test_the_footer_says_how_much_of_a_long_prompt_was_read_until_the_first_token() -> None:
    answer = AnswerStream(started=0.0)
    answer.add({"choices": [{"delta": {"role": "assistant", "content": ""}}]}, 0.1)
    assert footer_text(answer.live_stats(0.1)) == "Answering…"
    answer.add(progress(0, 1117), 0.2)
    answer.add(progress(512, 1117), 5.0)
    assert footer_text(answer.live_stats(5.0)) == "Reading the prompt… 46% of 1,117 tokens"
    for bad in (progress(2000, 1117), progress("all", 1117), progress(-1, 5)):
        answer.add(bad, 5.5)  # out of range or not counts: the last good figures stay
    assert answer.live_stats(5.5).prompt_read == 512
    assert footer_text(answer.stats(6.0)) == "≈ 0 tokens · plain decoding"  # stopped there
    assert answer.text == "" and answer.first_token_at is None
    answer.add(progress(1117, 1117), 9.0)
    answer.add(chunk("Hi", [["Hi", False]], 1), 9.5)
    assert footer_text(answer.live_stats(9.5)).startswith("≈ 1 token · ")
    assert answer.live_stats(9.5).time_to_first_token_s == pytest.approx(9.5)


def test_the_footer_says_how_many_answers_come_before_a_waiting_one() -> None:
    answer = AnswerStream(started=0.0)
    for ahead, footer in ((2, "Waiting for the appliance: 2 answers ahead of this one"),
                          (1, "Waiting for the appliance: 1 answer ahead of this one"),
                          (0, "Answering…")):
        answer.add({"choices": [{"index": 0, "delta": {}}], "anve": {"queue": {"ahead": ahead}}},
                   1.0)
        assert footer_text(answer.live_stats(1.0)) == footer
    answer.add({"choices": [{"delta": {}}], "anve": {"queue": {"ahead": "soon"}}}, 1.5)
    answer.add({"choices": [{"delta": {}}], "anve": {"queue": [3]}}, 1.5)
    assert answer.live_stats(1.5).queue_ahead == 0  # ill-formed places are ignored
    answer.add(progress(128, 300), 2.0)
    assert footer_text(answer.live_stats(2.0)) == "Reading the prompt… 43% of 300 tokens"


def test_the_footer_names_the_method_from_the_first_chunk_and_never_unknown() -> None:
    answer = AnswerStream(started=0.0)
    answer.add({"choices": [{"delta": {"role": "assistant", "content": ""}}],
                "anve": {"method": "suffix"}}, 0.0)
    answer.add(chunk("Hi", [["Hi", False]], 1), 0.5)  # no draft accepted yet
    assert footer_text(answer.live_stats(0.5)).endswith("· suffix lookup · 1.00 tokens/pass")
    plain = AnswerStream(started=0.0)
    plain.add({"choices": [{"delta": {}}], "anve": {"method": "off"}}, 0.0)
    plain.add(chunk("Hi", [["Hi", False]], 1), 0.5)
    assert "plain decoding" in footer_text(plain.live_stats(0.5))
    older = AnswerStream(started=0.0)  # a worker that does not name it: drafts show it is on
    older.add(chunk("Hi there", [["Hi", False], [" there", True]], 2), 0.5)
    assert "unknown" not in footer_text(older.live_stats(0.5))
    assert "speculative decoding" in footer_text(older.live_stats(0.5))


def test_the_answer_keeps_how_many_messages_a_rolling_window_left_out() -> None:
    answer = AnswerStream(started=0.0)
    for bad in ({"dropped_messages": "many"}, {"dropped_messages": -3}, [4], None):
        answer.add({"choices": [{"delta": {}}], "anve": {"context_window": bad}}, 0.0)
    assert answer.live_stats(0.0).dropped_messages == 0
    window = {"dropped_messages": 8, "prompt_tokens": 7000}
    answer.add({"choices": [{"delta": {}}], "anve": {"context_window": window}}, 0.1)
    answer.add(chunk("Hi", [["Hi", False]], 1), 0.2)
    assert answer.live_stats(0.2).dropped_messages == 8
    answer.add({**FINAL, "anve": {"context_window": window}}, 0.3)
    stats = answer.stats(0.3)
    assert stats.dropped_messages == 8 and AnswerStats.from_dict(stats.to_dict()) == stats


def test_requests_continue_an_answer_and_choose_the_context_overflow() -> None:
    partial = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    body = AnswerRequest(partial, 0.0, 16, continue_answer=True,
                         context_overflow="rolling_window").body()
    assert (body["continue_final_message"], body["add_generation_prompt"]) == (True, False)
    assert body["anve"] == {"context_overflow": "rolling_window"}
    plain = AnswerRequest(partial[:1]).body()
    assert not {"continue_final_message", "add_generation_prompt", "anve"} & set(plain)
    assert ChatSettings().context_overflow == "rolling_window"
    for stored, expected in (('{"context_overflow": "stop"}', "stop"),
                             ('{"context_overflow": "truncate_middle"}', "rolling_window"),
                             ('{"context_overflow": 3}', "rolling_window"),
                             ("{}", "rolling_window")):
        assert ChatSettings.from_json(stored).context_overflow == expected


def test_stats_round_trip_and_footer() -> None:
    stats = AnswerStats.from_final_chunk(FINAL)
    assert AnswerStats.from_dict(stats.to_dict()) == stats
    assert AnswerStats.from_dict(None) is None
    assert footer_text(stats) == (
        "7 tokens · 41.5 tok/s · first token 0.12 s · draft model · 50% accepted · "
        "2.33 tokens/pass"
    )
    cached = AnswerStats.from_final_chunk(
        {**FINAL, "usage": {**FINAL["usage"], "prompt_tokens_details": {"cached_tokens": 8}}})
    assert cached.cached_tokens == 8 and stats.cached_tokens == 0
    assert "first token 0.12 s · prompt 89% cached · draft model" in footer_text(cached)
    header_only = AnswerStats.from_final_chunk(
        {**FINAL, "usage": {**FINAL["usage"], "prompt_tokens_details": {"cached_tokens": 4}}})
    assert "cached" not in footer_text(header_only)
    off = AnswerStats(method="off", completion_tokens=3, disabled_reason="load")
    assert "speculation off: high load" in footer_text(off)
    assert footer_text(AnswerStats(completion_tokens=2, estimated=True)).startswith("≈ 2 tokens")


def test_merge_pieces_joins_neighbours() -> None:
    pieces: list[list[object]] = [["a", True]]
    merge_pieces(pieces, [["b", True], ["", False], ["c", False], ["d", False]])
    assert pieces == [["ab", True], ["cd", False]]


def test_sse_lines_and_errors() -> None:
    assert parse_sse_line(b'data: {"a": 1}\n') == {"a": 1}
    assert parse_sse_line(b"data: [DONE]\n") == "[DONE]"
    assert parse_sse_line(b"\n") is None
    assert parse_sse_line(b": keep-alive\n") is None
    assert error_message({"error": {"message": "too long"}}, 400) == "too long"
    assert error_message(None, 502) == "the worker answered HTTP 502"


def test_health_says_why_input_is_blocked() -> None:
    assert Health("ready").blocked_reason() is None
    assert "Loading the models (40%): converting" in str(
        Health("loading", 0.4, "converting").blocked_reason()
    )
    assert "not answering" in str(Health("unreachable", message="refused").blocked_reason())
    assert "restarting" in str(Health("stopped", message="killed").blocked_reason())
    body = AnswerRequest([{"role": "user", "content": "hi"}], 0.0, 16, {"method": "off"}).body()
    assert body["stream"] is True and body["speculation"] == {"method": "off"}


def test_markdown_blocks_round_trip_and_open_fences() -> None:
    text = "Intro **bold**\n\n```python\ndef f():\n    return 1\n```\nAfter.\n~~~\nraw\n"
    blocks = split_blocks(text)
    assert [(b.kind, b.language, b.closed) for b in blocks] == [
        ("text", "", True), ("code", "python", True), ("text", "", True), ("code", "", False),
    ]
    assert blocks[1].text == "def f():\n    return 1"
    assert "".join(b.source for b in blocks) == text
    assert split_blocks("```\na\n````\nb") [0].text == "a"
    assert split_blocks("") == []


def test_draft_html_escapes_and_highlights() -> None:
    html = draft_html([["<a>", False], ["b\nc", True]], "#abc")
    assert "&lt;a&gt;" in html
    assert '<span style="background-color:#abc;">b<br>c</span>' in html


def test_demo_comparison_replay_and_speedup() -> None:
    assert first_difference("abc", "abc") is None
    assert first_difference("abc", "abd") == 2
    assert first_difference("ab", "abc") == 2
    assert compare("same", "same", 3, 3).identical
    assert not compare("same", "same", 3, 4).identical
    assert compare("same", "same", 3, 3, [5, 6, 7], [5, 6, 7]).identical
    by_ids = compare("same", "same", 3, 3, [5, 6, 7], [5, 61, 7])  # same text, other tokens
    assert (by_ids.identical, by_ids.index) == (False, 4)
    diff = compare("the cat sat", "the cab sat")
    assert (diff.identical, diff.index) == (False, 6)
    assert "character 6" in diff.describe()
    timeline = [(0.1, "a"), (0.2, "b"), (0.4, "c")]
    assert [text_at(timeline, t) for t in (0.0, 0.1, 0.3, 9)] == ["", "a", "ab", "abc"]
    assert duration(timeline) == 0.4
    assert speedup(10.0, 25.0) == 2.5
    assert speedup(None, 25.0) is None


def test_passphrase_hash_and_verify() -> None:
    record = hash_passphrase("correct horse")
    assert record.startswith("scrypt$") and "correct" not in record
    assert verify("correct horse", record)
    assert not verify("wrong horse", record)
    assert not verify("correct horse", "garbage")
    assert hash_passphrase("correct horse") != record  # salted
    assert weakness("short", "short") is not None
    assert weakness("long enough", "different!") == "The two passphrases differ."
    assert weakness("long enough", "long enough") is None


def test_export_markdown_and_json() -> None:
    conversation = Conversation(1, "Heating", 0.0, 0.0, ChatSettings("Be brief.", 0.3, 99))
    stats = {"measured": AnswerStats.from_final_chunk(FINAL).to_dict()}
    messages = [
        Message(1, 1, "user", "When?", 0.0),
        Message(2, 1, "assistant", "Tuesday.", 1.0, COMPLETE, stats),
        Message(3, 1, "assistant", "Part", 2.0, INTERRUPTED),
    ]
    md = to_markdown(conversation, messages)
    assert md.startswith("# Heating\n")
    assert "## You\n\nWhen?" in md and "## ANVE\n\nTuesday." in md
    assert "*7 tokens · 41.5 tok/s" in md and "*(interrupted)*" in md
    data = json.loads(to_json(conversation, messages))
    assert data["settings"]["max_tokens"] == 99
    assert [m["status"] for m in data["messages"]] == ["complete", "complete", "interrupted"]
    assert render("json", conversation, messages) == to_json(conversation, messages)
    with pytest.raises(ValueError):
        render("pdf", conversation, messages)


def test_lag_meter_sees_a_blocked_loop() -> None:
    async def scenario() -> tuple[float, float]:
        meter = LagMeter(interval=0.005)
        meter.start()
        await asyncio.sleep(0.05)
        calm = meter.summary().max_ms
        meter.reset()
        await asyncio.sleep(0.01)
        time.sleep(0.3)  # block the loop: the nap pending meanwhile wakes >= 295 ms late
        await asyncio.sleep(0.02)
        await meter.stop()
        return calm, meter.summary().max_ms

    calm, blocked = asyncio.run(scenario())
    assert blocked >= 290 > calm  # a calm loop that late: only a machine that stalls


def test_markdown_splits_paragraphs_and_long_text() -> None:
    text = "One.\n\nTwo\nstill two.\n\n\n- a\n- b\n"
    blocks = split_blocks(text)
    assert [b.text for b in blocks] == ["One.", "Two\nstill two.", "- a\n- b"]
    assert "".join(b.source for b in blocks) == text
    long = "word " * 1000
    pieces = split_blocks(long)
    assert len(pieces) > 3 and all(len(b.source) <= 1500 for b in pieces)
    assert "".join(b.source for b in pieces) == long
    assert all(len(b.source) <= 1500 for b in split_blocks("x" * 4000))


def test_extend_blocks_matches_a_full_split_while_text_grows() -> None:
    from tests.app_support import LONG_ANSWER_PARAGRAPH

    text = LONG_ANSWER_PARAGRAPH * 3 + "word " * 700 + "\n```\nopen"
    blocks: list = []
    for end in range(0, len(text) + 37, 37):
        blocks = extend_blocks(blocks, text[:end])
        assert blocks == split_blocks(text[:end]), end
    assert extend_blocks(blocks, "different") == split_blocks("different")


def test_highlighted_blocks_keep_flags_aligned_and_show_code_monospace() -> None:
    text = "Hi there.\n\n```py\nx = 1\n```\n"
    pieces = [["Hi ", True], ["there.\n\n```py\nx", False], [" = 1", True], ["\n```\n", False]]
    blocks = highlighted_blocks(text, pieces, "#0f0")
    assert len(blocks) == 2
    assert blocks[0].text.count("#0f0") == 1 and "Hi " in blocks[0].text
    assert "monospace" in blocks[1].text and "```" not in blocks[1].text
    assert '<span style="background-color:#0f0;"> = 1</span>' in blocks[1].text
    assert highlighted_blocks("other", pieces, "#0f0") == []
