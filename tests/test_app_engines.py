"""Foreign engines: detection, vLLM's /metrics counters and llama.cpp's timings mapped
onto the panel's figures (no Qt, no network).

The vLLM texts are Prometheus exposition as vLLM serves it: its counters registered
with ``prometheus_client`` as vLLM registers them (:class:`tests.foreign_support.
VllmMetrics`) and rendered by the same library vLLM uses, plus one sample as served.
The llama.cpp bodies follow ``llama-server``'s documented ``/props`` and a streamed
answer's final chunk with ``timings``.
"""

import pytest

from app.answer import AnswerStats, AnswerStream, footer_text
from app.client import AnswerRequest, Health, error_message, normalise_url
from app.engines import (
    ACCEPTANCE,
    ANVE,
    LLAMA_CPP,
    NO_COUNTERS_NOTE,
    OPENAI,
    PER_POSITION,
    RESET_NOTE,
    SHARED_NOTE,
    SPECULATION_FIGURES,
    TOKENS_PER_PASS,
    VLLM,
    EngineInfo,
    Measured,
    Probes,
    Problem,
    Reply,
    VllmCounters,
    detect,
    foreign_live,
    foreign_stats,
    llama_cpp_figures,
    measure,
    parse_prometheus,
    unknown_figures,
    vllm_figures,
)
from tests.foreign_support import LLAMA_PROPS
from tests.foreign_support import VLLM_MODEL as MODEL
from tests.foreign_support import VllmMetrics as FakeVllmMetrics

# A /metrics excerpt in vLLM's format, as served (other families trimmed).
VLLM_SAMPLE = f"""\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 0.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{engine="0",model_name="{MODEL}"}} 5120.0
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="{MODEL}"}} 2000.0
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="{MODEL}"}} 6000.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="{MODEL}"}} 3120.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="{MODEL}",position="0"}} 1460.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="{MODEL}",position="1"}} 1000.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="{MODEL}",position="2"}} 660.0
"""  # noqa: E501


def test_prometheus_text_is_parsed_with_labels_comments_and_timestamps() -> None:
    text = ('# HELP x_total A counter.\n# TYPE x_total counter\n'
            'x_total{a="1",b="say \\"hi\\""} 3.0 1712345678000\n'
            'y 2\nnot a sample line\nz{a="q"} NaN\n\n')
    series = parse_prometheus(text)
    assert series["x_total"] == [({"a": "1", "b": 'say "hi"'}, 3.0)]
    assert series["y"] == [({}, 2.0)]
    assert "not" not in series
    assert VllmCounters.read(text) is None  # no speculation counters


def test_vllm_sample_is_read_as_served() -> None:
    counters = VllmCounters.read(VLLM_SAMPLE)
    assert counters is not None
    assert (counters.drafts, counters.draft_tokens, counters.accepted) == (2000, 6000, 3120)
    assert counters.per_position == (1460, 1000, 660)
    assert counters.generation_tokens == 5120 and counters.running == 0


def test_vllm_before_and_after_one_answer_give_its_figures() -> None:
    server = FakeVllmMetrics(k=3)
    server.answer(drafts=50, accepted_per_draft=[3, 1, 0, 2, 3] * 10, tokens=480,
                  requests=20)  # earlier traffic
    before = VllmCounters.read(server.text())
    server.answer(drafts=10, accepted_per_draft=[3, 3, 2, 0, 1, 3, 2, 2, 1, 1], tokens=28)
    after = VllmCounters.read(server.text())
    figures = vllm_figures(before, after, own_tokens=28)
    assert (figures.drafts, figures.drafted, figures.accepted) == (10, 30, 18)
    assert figures.acceptance_rate == pytest.approx(18 / 30)
    assert figures.mean_accepted_length == pytest.approx(1 + 18 / 10)
    assert figures.per_position == (9, 6, 3)  # drafts whose 1st/2nd/3rd token was accepted
    assert figures.unreported == () and figures.notes == ()
    stats = foreign_stats(EngineInfo(VLLM), Measured(28, tokens_per_second=42.0), figures)
    assert stats.position_rates == pytest.approx([0.9, 0.6, 0.3])
    assert stats.enabled and stats.engine == VLLM and stats.tokens_per_second == 42.0
    assert footer_text(stats) == ("28 tokens · 42.0 tok/s · vLLM speculation · 60% accepted · "
                                  "2.80 tokens/pass")


def test_vllm_counters_sum_over_data_parallel_engines() -> None:
    server = FakeVllmMetrics(k=2, engines=("0", "1"))
    server.answer(drafts=4, accepted_per_draft=[2, 2, 1, 0], tokens=9, engine="0")
    server.answer(drafts=2, accepted_per_draft=[1, 1], tokens=4, engine="1")
    before = VllmCounters.read(server.text())
    assert before is not None and (before.drafts, before.per_position) == (6, (5, 2))
    server.answer(drafts=3, accepted_per_draft=[2, 0, 1], tokens=6, engine="1")  # ours
    figures = vllm_figures(before, VllmCounters.read(server.text()), own_tokens=6)
    assert (figures.drafts, figures.accepted, figures.per_position) == (3, 3, (2, 1))
    assert figures.notes == ()


def test_vllm_figures_say_when_other_requests_ran_meanwhile() -> None:
    server = FakeVllmMetrics()
    before = VllmCounters.read(server.text())
    server.answer(drafts=10, accepted_per_draft=[1] * 10, tokens=20)  # ours
    server.answer(drafts=30, accepted_per_draft=[2] * 30, tokens=90)  # a colleague's
    figures = vllm_figures(before, VllmCounters.read(server.text()), own_tokens=20)
    assert figures.notes == (SHARED_NOTE,)
    assert figures.acceptance_rate == pytest.approx(70 / 120)  # the server's, not ours alone
    stats = foreign_stats(EngineInfo(VLLM), Measured(20), figures)
    assert footer_text(stats).endswith("58% accepted · 2.75 tokens/pass · shared server")
    # a request running when we started is another user's, even if it finished later
    busy = FakeVllmMetrics()
    busy.running.labels(MODEL, "0").set(1)
    before = VllmCounters.read(busy.text())
    busy.answer(drafts=5, accepted_per_draft=[1] * 5, tokens=10)
    assert SHARED_NOTE in vllm_figures(before, VllmCounters.read(busy.text()), 10).notes
    # or more than one request finished
    more = FakeVllmMetrics()
    before = VllmCounters.read(more.text())
    more.answer(drafts=5, accepted_per_draft=[1] * 5, tokens=10, requests=2)
    assert SHARED_NOTE in vllm_figures(before, VllmCounters.read(more.text()), 10).notes


def test_a_counter_reset_between_the_reads_is_reported_never_a_negative_rate() -> None:
    old = FakeVllmMetrics()
    old.answer(drafts=500, accepted_per_draft=[2] * 500, tokens=1600)
    before = VllmCounters.read(old.text())
    restarted = FakeVllmMetrics()  # the server restarted: counters from zero
    restarted.answer(drafts=10, accepted_per_draft=[1] * 10, tokens=20)
    after = VllmCounters.read(restarted.text())
    figures = vllm_figures(before, after, own_tokens=20)
    assert figures.notes == (RESET_NOTE,)
    assert figures.acceptance_rate is None and figures.mean_accepted_length is None
    assert figures.drafts is None and figures.per_position is None
    assert figures.unreported == SPECULATION_FIGURES
    stats = foreign_stats(EngineInfo(VLLM), Measured(20), figures)
    assert stats.acceptance_rate is None and stats.position_rates == []
    assert stats.drafted == 0 and stats.accepted == 0 and not stats.enabled
    # a restart that already passed the old totals shows in the _created timestamps
    busy_restart = FakeVllmMetrics()
    busy_restart.answer(drafts=900, accepted_per_draft=[3] * 900, tokens=3000)
    after = VllmCounters.read(busy_restart.text())
    assert before is not None and after is not None and after.drafts > before.drafts
    assert before.created and after.created != before.created
    assert vllm_figures(before, after, own_tokens=20).notes == (RESET_NOTE,)


def test_vllm_without_speculation_and_with_it_switched_on_by_a_restart() -> None:
    plain = ("# TYPE vllm:generation_tokens_total counter\n"
             f'vllm:generation_tokens_total{{engine="0",model_name="{MODEL}"}} 10.0\n')
    assert VllmCounters.read(plain) is None
    figures = vllm_figures(None, None, own_tokens=5)
    assert figures.notes == (NO_COUNTERS_NOTE,) and figures.unreported == SPECULATION_FIGURES
    assert vllm_figures(None, VllmCounters.read(VLLM_SAMPLE), 5).notes == (RESET_NOTE,)


# --- llama.cpp --------------------------------------------------------------------------

# llama-server's last streamed chunk (stream_options.include_usage), as it sends it.
LLAMA_FINAL_CHUNK = {
    "choices": [], "created": 1779349198, "id": "chatcmpl-nFCxRKKHfmmnVXEHbeKtPcEqHXBZvQCr",
    "model": "qwen2.5-coder-7b-instruct-q4_k_m.gguf", "system_fingerprint": "b9251-e2b129e1b",
    "object": "chat.completion.chunk",
    "usage": {"completion_tokens": 665, "prompt_tokens": 808, "total_tokens": 1473,
              "prompt_tokens_details": {"cached_tokens": 804}},
    "timings": {"cache_n": 804, "prompt_n": 4, "prompt_ms": 128.301,
                "prompt_per_token_ms": 32.07525, "prompt_per_second": 31.17668607415375,
                "predicted_n": 665, "predicted_ms": 20629.211,
                "predicted_per_token_ms": 31.021369924812028,
                "predicted_per_second": 32.235842660196745,
                "draft_n": 604, "draft_n_accepted": 515},
}
LLAMA_PLAIN_TIMINGS = {"prompt_n": 12, "prompt_ms": 90.2, "prompt_per_token_ms": 7.5,
                       "prompt_per_second": 133.0, "predicted_n": 40, "predicted_ms": 800.0,
                       "predicted_per_token_ms": 20.0, "predicted_per_second": 50.0}
LLAMA_MODELS = {"object": "list", "data": [
    {"id": "qwen2.5-coder-7b-instruct-q4_k_m.gguf", "object": "model", "created": 1735142223,
     "owned_by": "llamacpp", "meta": {"n_ctx_train": 32768, "size": 4683073952}}]}


def test_llama_cpp_timings_give_the_acceptance_rate_only() -> None:
    figures = llama_cpp_figures(LLAMA_FINAL_CHUNK["timings"], speculative=True)  # type: ignore[arg-type]
    assert (figures.drafted, figures.accepted) == (604, 515)
    assert figures.acceptance_rate == pytest.approx(515 / 604)
    assert figures.mean_accepted_length is None and figures.per_position is None
    assert figures.unreported == (TOKENS_PER_PASS, PER_POSITION)
    assert figures.tokens_per_second == pytest.approx(32.2358, rel=1e-4)
    plain = llama_cpp_figures(LLAMA_PLAIN_TIMINGS, speculative=False)
    assert plain.acceptance_rate is None and plain.unreported == SPECULATION_FIGURES
    assert "without a draft model" in plain.notes[0]
    none_tested = llama_cpp_figures({**LLAMA_PLAIN_TIMINGS, "draft_n": 0,
                                     "draft_n_accepted": 0})
    assert none_tested.acceptance_rate is None and ACCEPTANCE in none_tested.unreported


def test_a_llama_server_stream_maps_onto_the_panel() -> None:
    answer = AnswerStream(started=0.0)
    for i, text in enumerate(["def", " add", "(a, b):"]):
        answer.add({"choices": [{"index": 0, "delta": {"content": text},
                                 "finish_reason": None}], "object": "chat.completion.chunk"},
                   1.0 + i * 0.5)
    answer.add({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}, 2.1)
    answer.add(LLAMA_FINAL_CHUNK, 2.2)
    engine = detect(Probes(health=Reply(200, {"status": "ok"}), models=Reply(200, LLAMA_MODELS),
                           props=Reply(200, LLAMA_PROPS)))
    assert isinstance(engine, EngineInfo) and engine.kind == LLAMA_CPP
    measured = measure(answer, 2.2)
    assert measured.completion_tokens == 665 and measured.prompt_tokens == 808
    assert measured.time_to_first_token_s == pytest.approx(1.0)
    assert measured.finish_reason == "stop"
    stats = foreign_stats(engine, measured, llama_cpp_figures(answer.timings, True))
    assert stats.acceptance_rate == pytest.approx(515 / 604)
    assert stats.mean_accepted_length is None and stats.position_rates == []
    assert stats.tokens_per_second == pytest.approx(32.2358, rel=1e-4)  # the server's
    assert stats.unreported == (TOKENS_PER_PASS, PER_POSITION)
    assert AnswerStats.from_dict(stats.to_dict()) == stats
    assert footer_text(stats).endswith("llama.cpp speculation · 85% accepted")


def test_an_unknown_server_reports_no_speculation_figures() -> None:
    answer = AnswerStream(started=0.0)
    answer.add({"choices": [{"delta": {"content": "Hi"}}]}, 0.5)
    answer.add({"choices": [{"delta": {"content": " there"}, "finish_reason": "stop"}]}, 0.7)
    engine = EngineInfo(OPENAI, models=("m",))
    stats = foreign_stats(engine, measure(answer, 0.8), unknown_figures())
    assert stats.unreported == SPECULATION_FIGURES
    assert stats.acceptance_rate is None and stats.mean_accepted_length is None
    assert stats.completion_tokens == 2 and stats.tokens_per_second == pytest.approx(1 / 0.2)
    live = foreign_live(engine, answer.live_stats(0.8))
    assert live.mean_accepted_length is None and live.passes == 0  # not "1.00 per pass"


# --- detection ------------------------------------------------------------------------


def test_detection_names_each_engine() -> None:
    ours = detect(Probes(health=Reply(200, {"status": "ready", "progress": 1.0,
                                            "protocol_version": 1, "models": ["a", "b"]})))
    assert isinstance(ours, EngineInfo) and ours.kind == ANVE and not ours.foreign
    vllm_models = {"object": "list", "data": [
        {"id": MODEL, "object": "model", "owned_by": "vllm", "max_model_len": 32768}]}
    vllm = detect(Probes(health=Reply(200, None), models=Reply(200, vllm_models),
                         props=Reply(404, {"detail": "Not Found"}),
                         metrics=Reply(200, VLLM_SAMPLE),
                         version=Reply(200, {"version": "0.11.0"})))
    assert isinstance(vllm, EngineInfo) and vllm.kind == VLLM
    assert vllm.name == "vLLM 0.11.0" and vllm.speculation == "on, 3 draft tokens per pass"
    assert vllm.speculative and vllm.models == (MODEL,)
    by_metrics = detect(Probes(models=Reply(200, {"data": [{"id": "x"}]}),
                               metrics=Reply(200, VLLM_SAMPLE)))
    assert isinstance(by_metrics, EngineInfo) and by_metrics.kind == VLLM
    llama = detect(Probes(health=Reply(200, {"status": "ok"}), models=Reply(200, LLAMA_MODELS),
                          props=Reply(200, LLAMA_PROPS)))
    assert isinstance(llama, EngineInfo) and llama.kind == LLAMA_CPP
    assert llama.version == "b9251-e2b129e1b" and llama.speculative is True
    assert llama.speculation == "draft model (-md), 5–16 draft tokens per pass"
    assert "-md" in llama.configured_where and "--speculative-config" in vllm.configured_where
    other = detect(Probes(health=Reply(404, {"detail": "Not Found"}),
                          models=Reply(200, {"object": "list", "data": [{"id": "m"}]}),
                          openapi=Reply(200, {"info": {"title": "🦙 llama.cpp Python API"}})))
    assert isinstance(other, EngineInfo) and other.kind == OPENAI
    assert other.name == "OpenAI-compatible server (llama.cpp Python API)"  # emoji dropped
    assert other.reported == () and other.configured_where


def test_detection_refuses_wrong_tokens_and_servers_that_are_not_openai() -> None:
    wrong = detect(Probes(health=Reply(401, {"error": {"message": "Invalid API Key"}})))
    assert isinstance(wrong, Problem) and wrong.state == "refused"
    assert "Invalid API Key" in wrong.message and "401" in wrong.message
    vllm_key = detect(Probes(health=Reply(200, None), models=Reply(401, {"error": "Unauthorized"})))
    assert isinstance(vllm_key, Problem) and vllm_key.state == "refused"
    assert "Unauthorized" in vllm_key.message
    fastapi = detect(Probes(health=Reply(404, {"detail": "Not Found"}),
                            models=Reply(401, {"detail": "Invalid API key"})))
    assert isinstance(fastapi, Problem) and "HTTP 401: Invalid API key" in fastapi.message
    html = detect(Probes(health=Reply(404, None), models=Reply(404, None)))
    assert isinstance(html, Problem) and html.state == "incompatible"
    assert "not an OpenAI-compatible server" in html.message and "HTTP 404" in html.message
    odd = detect(Probes(models=Reply(200, {"models": []})))
    assert isinstance(odd, Problem) and "not a model list" in odd.message


def test_requests_to_foreign_engines_are_plain_openai() -> None:
    request = AnswerRequest([{"role": "user", "content": "hi"}], 0.0, 16,
                            speculation={"method": "off"})
    assert request.body()["speculation"] == {"method": "off"}
    body = request.body(EngineInfo(VLLM, models=(MODEL,)))
    assert body["model"] == MODEL and "speculation" not in body
    assert body["stream_options"] == {"include_usage": True}
    assert error_message({"object": "error", "message": "model not found"}, 404) == (
        "model not found (HTTP 404)")
    assert error_message({"detail": "Not Found"}, 404) == "Not Found (HTTP 404)"


@pytest.mark.parametrize(("text", "url"), [
    ("http://gpu:8000", "http://gpu:8000"), (" http://gpu:8000/v1/ ", "http://gpu:8000"),
    ("https://llm.office.example/api/", "https://llm.office.example/api"),
])
def test_server_addresses_are_normalised(text: str, url: str) -> None:
    assert normalise_url(text) == url


@pytest.mark.parametrize("text", ["", "gpu:8000", "ftp://gpu", "http://", "http://gpu:99999"])
def test_bad_server_addresses_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"address|port"):
        normalise_url(text)


def test_health_says_why_a_server_cannot_be_used() -> None:
    url = "http://gpu:8000"
    refused = Health("refused", message="the server refused the access token (HTTP 401: x)",
                     url=url).blocked_reason()
    assert refused is not None and refused.startswith(f"{url} refused the connection")
    assert "Check the access token" in refused and "local worker in Admin" in refused
    odd = Health("incompatible", message="this is not an OpenAI-compatible server", url=url)
    assert f"{url} cannot be used: this is not an OpenAI-compatible server" in str(
        odd.blocked_reason())
    failing = Health("error", message="boom (HTTP 500)", url=url, engine=EngineInfo(VLLM))
    assert failing.blocked_reason() == f"vLLM at {url} answered with an error: boom (HTTP 500)"
    assert "models failed to load" in str(Health("error", message="x").blocked_reason())
