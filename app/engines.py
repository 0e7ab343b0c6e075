"""Which server the app talks to, and its speculation figures in our panel's terms. No Qt.

Contract:

* :func:`detect` names the engine behind a URL from what its routes answered
  (:class:`Probes`): our worker (``/health`` with ``protocol_version``), vLLM
  (``vllm:`` series on ``/metrics``, or ``owned_by: vllm`` models), llama.cpp's
  ``llama-server`` (``/props`` with ``default_generation_settings``, or ``owned_by:
  llamacpp``), or an unknown OpenAI-compatible server (``/v1/models`` lists models).
  A refused token or a server that is not OpenAI-compatible is a :class:`Problem`.
* vLLM publishes speculation only as Prometheus counters for the whole server
  (``vllm:spec_decode_num_drafts``, ``_num_draft_tokens``, ``_num_accepted_tokens``,
  ``_num_accepted_tokens_per_pos{position}``, exposed with the ``_total`` suffix).
  :meth:`VllmCounters.read` takes one ``/metrics`` text; :func:`vllm_figures` turns a
  before/after pair around one answer into figures: acceptance = accepted / drafted,
  tokens per pass = 1 + accepted / drafts, per position = accepted_i / drafts (vLLM's
  own definitions, ``vllm/v1/spec_decode/metrics.py``). Other requests in between are
  flagged (:data:`SHARED_NOTE`); a counter that went down or a new ``_created`` time
  means the server restarted, and no figure is given rather than a negative one.
* llama.cpp reports per response ``timings.draft_n`` and ``timings.draft_n_accepted``
  (:func:`llama_cpp_figures`): the acceptance rate only; tokens per pass and the
  per-position split cannot be derived from those two numbers.
* :func:`foreign_stats` maps any of these onto :class:`app.answer.AnswerStats`, with
  ``unreported`` naming each panel figure the server does not report (never a zero).
"""

import math
import re
import unicodedata
from dataclasses import dataclass, field, replace
from typing import Any

from app.answer import AnswerStats, AnswerStream

ANVE, VLLM, LLAMA_CPP, OPENAI = "anve", "vllm", "llama.cpp", "openai"
ENGINE_NAMES = {
    ANVE: "ANVE worker", VLLM: "vLLM", LLAMA_CPP: "llama.cpp server",
    OPENAI: "OpenAI-compatible server",
}

# The panel's figures, by the names it shows.
ACCEPTANCE, TOKENS_PER_PASS, PER_POSITION = (
    "acceptance rate", "tokens per pass", "acceptance by draft position",
)
SPECULATION_FIGURES = (ACCEPTANCE, TOKENS_PER_PASS, PER_POSITION)

SHARED_NOTE = "shared server: figures include other users' requests"
RESET_NOTE = ("the server's counters were reset during this answer (a restart?): no "
              "speculation figures for it")
NO_COUNTERS_NOTE = "vLLM publishes no speculation counters: it runs without speculation"
METRICS_FAILED_NOTE = "could not read the server's /metrics"
LLAMA_CPP_NOTE = ("llama.cpp reports drafted and accepted tokens only; tokens per pass and the "
                  "per-position split cannot be derived from them")

CONFIGURED_WHERE = {
    VLLM: ("vLLM's speculation is set where the server is started: vllm serve … "
           "--speculative-config '{\"model\": …, \"num_speculative_tokens\": k}' (or "
           "\"method\": \"ngram\"). Change it there and restart vLLM; see "
           "installer/office-gpu-server.md."),
    LLAMA_CPP: ("llama.cpp's speculation is set where llama-server is started: -md "
                "DRAFT.gguf --draft-max N --draft-min M. Change it there and restart the "
                "server; see installer/office-gpu-server.md."),
    OPENAI: ("This server is not one ANVE knows: its speculation, if any, is configured on "
             "the server itself."),
}


# --- detection ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """One route's answer: HTTP status and its body (parsed JSON, or text for /metrics)."""

    status: int
    body: Any = None


@dataclass(frozen=True)
class Probes:
    """What the routes of one server answered (None: not asked, or no answer)."""

    health: Reply | None = None
    models: Reply | None = None
    props: Reply | None = None
    metrics: Reply | None = None
    version: Reply | None = None
    openapi: Reply | None = None


@dataclass(frozen=True)
class EngineInfo:
    """The server the app is attached to, as the admin page and the panel describe it."""

    kind: str
    version: str | None = None
    models: tuple[str, ...] = ()
    speculation: str = ""  # what is known of its speculation set-up, in words
    name_hint: str = ""  # e.g. the title an unknown server gives itself
    speculative: bool | None = None  # whether it drafts at all (None: it does not say)

    @property
    def name(self) -> str:
        base = ENGINE_NAMES[self.kind]
        if self.name_hint:
            base = f"{base} ({self.name_hint})"
        return f"{base} {self.version}" if self.version else base

    @property
    def foreign(self) -> bool:
        return self.kind != ANVE

    @property
    def configured_where(self) -> str:
        return CONFIGURED_WHERE.get(self.kind, "")

    @property
    def reported(self) -> tuple[str, ...]:
        """The speculation figures this kind of server reports."""
        return {ANVE: SPECULATION_FIGURES, VLLM: SPECULATION_FIGURES,
                LLAMA_CPP: (ACCEPTANCE,)}.get(self.kind, ())


@dataclass(frozen=True)
class Problem:
    """Why the app cannot use a server: ``refused`` (token) or ``incompatible``."""

    state: str
    message: str


def _is_dict(reply: Reply | None, status: int = 200) -> bool:
    return reply is not None and reply.status == status and isinstance(reply.body, dict)


def is_anve_health(reply: Reply | None) -> bool:
    """Our worker's ``/health``: ``protocol_version``, or ``status`` with ``progress``."""
    if not _is_dict(reply):
        return False
    body = reply.body  # type: ignore[union-attr]
    return "protocol_version" in body or {"status", "progress"} <= body.keys()


def refusal(reply: Reply | None) -> Problem | None:
    """A 401/403 answer as the message the window shows."""
    if reply is None or reply.status not in (401, 403):
        return None
    detail = ""
    if isinstance(reply.body, dict):  # OpenAI's, vLLM's and FastAPI's error shapes
        error = reply.body.get("error") or reply.body.get("detail") or ""
        detail = str(error.get("message", "")) if isinstance(error, dict) else str(error)
    why = "wrong or missing access token" if reply.status == 401 else "access denied"
    text = f"the server refused the access token (HTTP {reply.status}: {detail or why})"
    return Problem("refused", text)


def model_ids(reply: Reply | None) -> tuple[str, ...] | None:
    """The ids of an OpenAI ``/v1/models`` list; None when it is not one."""
    if not _is_dict(reply):
        return None
    data = reply.body.get("data")  # type: ignore[union-attr]
    if not isinstance(data, list):
        return None
    return tuple(str(m.get("id")) for m in data if isinstance(m, dict) and m.get("id"))


def not_openai(reply: Reply | None) -> Problem:
    what = "no answer" if reply is None else f"HTTP {reply.status}"
    if reply is not None and reply.status == 200:
        what = "an answer that is not a model list"
    return Problem("incompatible", f"this is not an OpenAI-compatible server: GET /v1/models "
                                   f"gave {what}")


def detect(probes: Probes) -> EngineInfo | Problem:
    """The engine behind one URL, or why it cannot be used."""
    if is_anve_health(probes.health):
        body = probes.health.body  # type: ignore[union-attr]
        return EngineInfo(ANVE, models=tuple(body.get("models") or ()))
    problem = refusal(probes.health) or refusal(probes.models)
    if problem is not None:
        return problem
    ids = model_ids(probes.models)
    if ids is None:
        return not_openai(probes.models)
    owners = {str(m.get("owned_by")) for m in probes.models.body["data"]  # type: ignore[union-attr]
              if isinstance(m, dict)}
    props = probes.props.body if _is_dict(probes.props) else {}  # type: ignore[union-attr]
    if "default_generation_settings" in props or "llamacpp" in owners:
        return llama_cpp_info(ids, probes.props)
    metrics = probes.metrics.body if probes.metrics and probes.metrics.status == 200 else ""
    if "vllm" in owners or (isinstance(metrics, str) and "\nvllm:" in f"\n{metrics}"):
        return vllm_info(ids, metrics if isinstance(metrics, str) else "", probes.version)
    openapi = probes.openapi.body if _is_dict(probes.openapi) else {}  # type: ignore[union-attr]
    info = openapi.get("info")
    title = str(info.get("title") or "") if isinstance(info, dict) else ""
    hint = "".join(c for c in title if unicodedata.category(c) != "So").strip()  # no emoji
    return EngineInfo(OPENAI, models=ids, name_hint=hint,
                      speculation="unknown (this server reports no speculation figures)")


def llama_cpp_info(ids: tuple[str, ...], props: Reply | None) -> EngineInfo:
    body = props.body if _is_dict(props) else {}  # type: ignore[union-attr]
    settings = body.get("default_generation_settings") or {}
    params = settings.get("params") or {}
    if settings.get("speculative") is True:
        n_max, n_min = params.get("speculative.n_max"), params.get("speculative.n_min")
        bounds = f", {n_min}–{n_max} draft tokens per pass" if n_max is not None else ""
        speculation = f"draft model (-md){bounds}"
    elif settings.get("speculative") is False:
        speculation = "off (started without a draft model)"
    else:
        speculation = "unknown (/props does not say)"
    return EngineInfo(LLAMA_CPP, version=body.get("build_info"), models=ids,
                      speculation=speculation, speculative=settings.get("speculative"))


def vllm_info(ids: tuple[str, ...], metrics: str, version: Reply | None) -> EngineInfo:
    counters = VllmCounters.read(metrics) if metrics else None
    if counters is None:
        speculation = "off (no speculation counters on /metrics)"
    elif counters.per_position:
        speculation = f"on, {len(counters.per_position)} draft tokens per pass"
    else:
        speculation = "on"
    number = None
    if _is_dict(version):
        number = version.body.get("version")  # type: ignore[union-attr]
    return EngineInfo(VLLM, version=str(number) if number else None, models=ids,
                      speculation=speculation, speculative=counters is not None)


# --- Prometheus text ---------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\S+)?\s*$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')

Sample = tuple[dict[str, str], float]


def parse_prometheus(text: str) -> dict[str, list[Sample]]:
    """Samples by series name from Prometheus' text format (comments and bad lines skipped).

    Example: ``'a_total{engine="0",position="1"} 3.0'`` gives
    ``{"a_total": [({"engine": "0", "position": "1"}, 3.0)]}``.
    """
    out: dict[str, list[Sample]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, raw = match.groups()
        try:
            value = float(raw)
        except ValueError:
            continue
        pairs = {k: v.replace('\\"', '"').replace("\\\\", "\\")
                 for k, v in _LABEL.findall(labels or "")}
        out.setdefault(name, []).append((pairs, value))
    return out


def _total(series: dict[str, list[Sample]], name: str) -> float | None:
    """Sum over every label set (several engines, data-parallel ranks) of a counter."""
    samples = series.get(f"{name}_total", series.get(name))
    if samples is None:
        return None
    return sum(value for _labels, value in samples if math.isfinite(value))


def _created(series: dict[str, list[Sample]], name: str) -> tuple[tuple[str, float], ...]:
    """When each series of a counter was created (by its labels), as the client library
    publishes it: a series created again means the server restarted."""
    return tuple(sorted((repr(sorted(labels.items())), v)
                        for labels, v in series.get(f"{name}_created", [])))


@dataclass(frozen=True)
class VllmCounters:
    """One reading of vLLM's speculation counters (summed over engines)."""

    drafts: float
    draft_tokens: float
    accepted: float
    per_position: tuple[float, ...] = ()
    generation_tokens: float | None = None
    finished_requests: float | None = None
    running: float | None = None
    created: tuple[tuple[str, float], ...] = ()  # (labels, creation time) of each series

    @classmethod
    def read(cls, text: str) -> "VllmCounters | None":
        """The counters in one ``/metrics`` text; None when it has no speculation counters."""
        series = parse_prometheus(text)
        drafts = _total(series, "vllm:spec_decode_num_drafts")
        draft_tokens = _total(series, "vllm:spec_decode_num_draft_tokens")
        accepted = _total(series, "vllm:spec_decode_num_accepted_tokens")
        if drafts is None or draft_tokens is None or accepted is None:
            return None
        by_position: dict[int, float] = {}
        per_pos = series.get("vllm:spec_decode_num_accepted_tokens_per_pos_total",
                             series.get("vllm:spec_decode_num_accepted_tokens_per_pos", []))
        for labels, value in per_pos:
            if labels.get("position", "").isdigit():
                position = int(labels["position"])
                by_position[position] = by_position.get(position, 0.0) + value
        positions = tuple(by_position.get(i, 0.0) for i in range(max(by_position, default=-1) + 1))
        running = series.get("vllm:num_requests_running")
        return cls(
            drafts=drafts, draft_tokens=draft_tokens, accepted=accepted,
            per_position=positions,
            generation_tokens=_total(series, "vllm:generation_tokens"),
            finished_requests=_total(series, "vllm:request_success"),
            running=None if running is None else sum(v for _l, v in running),
            created=_created(series, "vllm:spec_decode_num_drafts"),
        )


@dataclass(frozen=True)
class SpecFigures:
    """Speculation figures of one answer as a server reports them (None: not reported)."""

    drafts: int | None = None  # verification steps (target passes that checked drafts)
    drafted: int | None = None
    accepted: int | None = None
    per_position: tuple[int, ...] | None = None
    tokens_per_second: float | None = None
    unreported: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def acceptance_rate(self) -> float | None:
        if self.drafted is None or self.accepted is None or self.drafted <= 0:
            return None
        return self.accepted / self.drafted

    @property
    def mean_accepted_length(self) -> float | None:
        if self.drafts is None or self.accepted is None or self.drafts <= 0:
            return None
        return 1 + self.accepted / self.drafts


def vllm_figures(
    before: VllmCounters | None, after: VllmCounters | None, own_tokens: int
) -> SpecFigures:
    """One answer's figures from the counters read just before and just after it.

    ``own_tokens`` is the answer's completion tokens: when the server generated more
    meanwhile (or finished more than one request, or was busy when we started), the
    figures include other users' requests and say so.

    Example: drafts 100→110, draft tokens 300→330, accepted 150→168 give acceptance
    18/30 = 60 % and 1 + 18/10 = 2.8 tokens per pass.
    """
    if before is None or after is None:  # both: no speculation; one: a restart changed it
        note = NO_COUNTERS_NOTE if before is None and after is None else RESET_NOTE
        return SpecFigures(unreported=SPECULATION_FIGURES, notes=(note,))
    pairs = [(before.drafts, after.drafts), (before.draft_tokens, after.draft_tokens),
             (before.accepted, after.accepted),
             *zip(before.per_position, after.per_position, strict=False)]
    if (before.generation_tokens is not None and after.generation_tokens is not None):
        pairs.append((before.generation_tokens, after.generation_tokens))
    created = dict(before.created)
    restarted = any(created.get(labels, time) != time for labels, time in after.created)
    if restarted or any(b_value > a_value for b_value, a_value in pairs):
        return SpecFigures(unreported=SPECULATION_FIGURES, notes=(RESET_NOTE,))
    drafts = round(after.drafts - before.drafts)
    positions = tuple(
        round(a_value - (before.per_position[i] if i < len(before.per_position) else 0.0))
        for i, a_value in enumerate(after.per_position)
    )
    notes: list[str] = []
    if _shared(before, after, own_tokens):
        notes.append(SHARED_NOTE)
    return SpecFigures(
        drafts=drafts, drafted=round(after.draft_tokens - before.draft_tokens),
        accepted=round(after.accepted - before.accepted),
        per_position=positions if positions else None,
        unreported=() if positions else (PER_POSITION,), notes=tuple(notes),
    )


def _shared(before: VllmCounters, after: VllmCounters, own_tokens: int) -> bool:
    if before.running:
        return True
    if before.finished_requests is not None and after.finished_requests is not None and (
        after.finished_requests - before.finished_requests > 1
    ):
        return True
    if before.generation_tokens is None or after.generation_tokens is None:
        return False
    return after.generation_tokens - before.generation_tokens > own_tokens


def llama_cpp_figures(timings: dict[str, Any] | None, speculative: bool | None = None
                      ) -> SpecFigures:
    """One llama-server answer's ``timings``: drafted and accepted counts, decode speed.

    ``speculative`` is what ``/props`` says (None: unknown); it only words the note
    when the answer carries no draft counts.
    """
    timings = timings or {}
    speed = timings.get("predicted_per_second")
    speed = float(speed) if isinstance(speed, int | float) and speed > 0 else None
    not_derivable = (TOKENS_PER_PASS, PER_POSITION)
    if not isinstance(timings.get("draft_n"), int | float):
        why = ("the server drafted nothing for this answer" if speculative is not False
               else "the server runs without a draft model (-md)")
        return SpecFigures(tokens_per_second=speed, unreported=SPECULATION_FIGURES,
                           notes=(why,))
    drafted = int(timings["draft_n"])
    accepted = int(timings.get("draft_n_accepted") or 0)
    notes: tuple[str, ...] = (LLAMA_CPP_NOTE,)
    if drafted == 0:
        notes = ("no draft was tested in this answer", *notes)
    return SpecFigures(drafted=drafted, accepted=accepted, tokens_per_second=speed,
                       unreported=not_derivable if drafted else SPECULATION_FIGURES,
                       notes=notes)


def unknown_figures() -> SpecFigures:
    return SpecFigures(unreported=SPECULATION_FIGURES,
                       notes=("this server reports no speculation figures",))


@dataclass(frozen=True)
class Measured:
    """What the app measured itself of one foreign answer."""

    completion_tokens: int
    prompt_tokens: int = 0
    tokens_per_second: float | None = None
    time_to_first_token_s: float | None = None
    finish_reason: str | None = None
    extra_notes: tuple[str, ...] = field(default_factory=tuple)


def foreign_stats(engine: EngineInfo, measured: Measured, figures: SpecFigures) -> AnswerStats:
    """A foreign engine's answer in the panel's terms."""
    passes = figures.drafts or 0
    per_position = figures.per_position or ()
    stats = AnswerStats(
        method="unknown", enabled=bool(figures.drafted),
        prompt_tokens=measured.prompt_tokens, completion_tokens=measured.completion_tokens,
        passes=passes, drafted=figures.drafted or 0, accepted=figures.accepted or 0,
        acceptance_rate=figures.acceptance_rate,
        mean_accepted_length=figures.mean_accepted_length,
        accepted_per_position=per_position if passes else (),
        tokens_per_second=figures.tokens_per_second or measured.tokens_per_second,
        time_to_first_token_s=measured.time_to_first_token_s,
        finish_reason=measured.finish_reason,
    )
    return replace(stats, engine=engine.kind, unreported=figures.unreported,
                   notes=figures.notes + measured.extra_notes)


def measure(answer: AnswerStream, now: float) -> Measured:
    """The app's own figures of a foreign answer: tokens from ``usage`` (else llama.cpp's
    ``predicted_n``, else the chunks counted), speed between the first and last text."""
    usage, timings = answer.usage or {}, answer.timings or {}
    tokens = usage.get("completion_tokens", timings.get("predicted_n"))
    tokens = int(tokens) if isinstance(tokens, int | float) else answer.tokens
    live = answer.live_stats(now)
    speed = live.tokens_per_second
    if answer.first_token_at is not None and answer.last_token_at is not None and tokens > 1:
        elapsed = answer.last_token_at - answer.first_token_at
        speed = (tokens - 1) / elapsed if elapsed > 0 else speed
    prompt = usage.get("prompt_tokens", timings.get("prompt_n", 0))
    return Measured(completion_tokens=tokens,
                    prompt_tokens=int(prompt) if isinstance(prompt, int | float) else 0,
                    tokens_per_second=speed, time_to_first_token_s=live.time_to_first_token_s,
                    finish_reason=answer.finish_reason)


def foreign_live(engine: EngineInfo, live: AnswerStats) -> AnswerStats:
    """Live numbers of a foreign answer: only what the app can count (tokens, speed)."""
    return replace(live, enabled=False, passes=0, drafted=0, accepted=0, acceptance_rate=None,
                   mean_accepted_length=None, accepted_per_position=(), engine=engine.kind)
