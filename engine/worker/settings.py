"""The global speculation setting, per-request overrides, and the load switch-off.

Contract:

* :class:`SpeculationSettings` is shared by the event loop (reads, ``PUT``) and the
  engine thread (adaptive observations); all its methods are thread-safe.
* Invalid values raise :class:`BadRequestError` with a message saying what is allowed.
* Each request gets one :class:`Decision` when it is admitted. A request's own
  ``speculation.method`` wins; otherwise speculation is off when the global setting
  disables it (reason ``"setting"``) or when the worker is loaded beyond
  ``load_threshold`` (reason ``"load"``); otherwise the global method applies.
* ``method`` may be ``"auto"`` (the default of our engine): the engine then runs, per
  answer, the method its calibration predicts fastest for the question's kind
  (:mod:`engine.spec.calibration`); an explicit method, global or per request, wins.
* ``num_draft_tokens`` is an integer from 1 to 16, or ``"adaptive"`` when the engine
  offers it (it then picks the draft length per pass, :mod:`engine.spec.policy`). The
  worker only passes the choice through; it keeps no draft-length policy of its own.
"""

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from engine.errors import BadRequestError
from engine.protocol import METHODS
from engine.spec.session import ADAPTIVE, AUTO, MAX_DRAFT_TOKENS, DraftLength

log = logging.getLogger(__name__)

MAX_LOAD_THRESHOLD = 1024
SETTING_FIELDS = ("enabled", "method", "num_draft_tokens", "load_threshold")
OVERRIDE_FIELDS = ("method", "num_draft_tokens")



@dataclass(frozen=True)
class SpeculationConfig:
    """The global setting. ``None`` fields take the engine's defaults once it has loaded."""

    enabled: bool = True
    method: str | None = None
    num_draft_tokens: DraftLength | None = None
    load_threshold: int = 2

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Override:
    """A request's own ``speculation`` object; ``None`` fields defer to the setting."""

    method: str | None = None
    num_draft_tokens: DraftLength | None = None


@dataclass(frozen=True)
class Decision:
    """How one request runs: ``method == "off"`` means plain decoding."""

    method: str
    num_draft_tokens: DraftLength | None
    disabled_reason: str | None = None  # "request", "setting" or "load" when off

    @property
    def enabled(self) -> bool:
        return self.method != "off"


# --- validation -------------------------------------------------------------------


def check_method(value: Any, available: Sequence[str], where: str = "method") -> str:
    """Return ``value`` if it names a method the loaded models offer (or ``auto``)."""
    if not isinstance(value, str) or value not in (AUTO, *METHODS):
        raise BadRequestError(
            f"{where} must be one of {', '.join((AUTO, *METHODS))}, got {value!r}")
    if value not in available:
        raise BadRequestError(
            f"{where} {value!r} needs a model that is not loaded; "
            f"available: {', '.join(available)}"
        )
    return value


def check_draft_length(
    value: Any, adaptive: bool = True, where: str = "num_draft_tokens"
) -> DraftLength:
    """Return ``value`` if it is 1..16 or, when the engine offers it, ``"adaptive"``."""
    if value == ADAPTIVE and adaptive:
        return ADAPTIVE
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DRAFT_TOKENS:
        allowed = f" or {ADAPTIVE!r}" if adaptive else " (this engine has no adaptive mode)"
        raise BadRequestError(
            f"{where} must be an integer from 1 to {MAX_DRAFT_TOKENS}{allowed}, got {value!r}"
        )
    return value


def check_threshold(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequestError(f"load_threshold must be an integer, got {value!r}")
    if not 0 <= value <= MAX_LOAD_THRESHOLD:
        raise BadRequestError(
            f"load_threshold must be from 0 to {MAX_LOAD_THRESHOLD} waiting requests, got {value}"
        )
    return value


def check_fields(body: Any, allowed: Sequence[str], what: str) -> Mapping[str, Any]:
    """Return ``body`` if it is an object whose keys are all in ``allowed``."""
    if not isinstance(body, Mapping):
        raise BadRequestError(f"{what} must be a JSON object with any of: {', '.join(allowed)}")
    unknown = sorted(str(k) for k in body if k not in allowed)
    if unknown:
        raise BadRequestError(
            f"{what} has unknown field(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}"
        )
    return body


def parse_override(
    value: Any, available: Sequence[str], adaptive: bool = True
) -> Override | None:
    """Validate a request's ``speculation`` object (``None`` when absent)."""
    if value is None:
        return None
    body = check_fields(value, OVERRIDE_FIELDS, "speculation")
    method = body.get("method")
    k = body.get("num_draft_tokens")
    return Override(
        None if method is None else check_method(method, available, "speculation.method"),
        None if k is None else check_draft_length(k, adaptive, "speculation.num_draft_tokens"),
    )


# --- the shared setting ---------------------------------------------------------------


class SpeculationSettings:
    """The worker's global speculation setting; changes apply to the next request."""

    def __init__(self, config: SpeculationConfig | None = None) -> None:
        self._lock = threading.Lock()
        self._config = config or SpeculationConfig()
        self._methods: tuple[str, ...] = ()
        self._adaptive = False

    @property
    def config(self) -> SpeculationConfig:
        with self._lock:
            return self._config

    @property
    def methods(self) -> tuple[str, ...]:
        """Methods the loaded models offer (empty while loading)."""
        with self._lock:
            return self._methods

    @property
    def adaptive(self) -> bool:
        """Whether the engine offers ``num_draft_tokens="adaptive"``."""
        with self._lock:
            return self._adaptive

    def bind(
        self, methods: Sequence[str], method: str, num_draft_tokens: DraftLength, adaptive: bool
    ) -> None:
        """Record what the loaded engine offers and fill in its defaults where unset."""
        with self._lock:
            self._methods, self._adaptive = tuple(methods), adaptive
            k = self._config.num_draft_tokens
            if k == ADAPTIVE and not adaptive:
                log.warning("this engine has no adaptive draft length; using %s", num_draft_tokens)
                k = None
            self._config = replace(
                self._config,
                method=self._config.method or method,
                num_draft_tokens=k or num_draft_tokens,
            )

    def update(self, body: Any) -> SpeculationConfig:
        """Apply a ``PUT`` body (any subset of the fields); all or nothing."""
        fields = check_fields(body, SETTING_FIELDS, "the speculation setting")
        changes: dict[str, Any] = {}
        if "enabled" in fields:
            if not isinstance(fields["enabled"], bool):
                raise BadRequestError(f"enabled must be true or false, got {fields['enabled']!r}")
            changes["enabled"] = fields["enabled"]
        if "method" in fields:
            changes["method"] = check_method(fields["method"], self.methods)
        if "num_draft_tokens" in fields:
            changes["num_draft_tokens"] = check_draft_length(
                fields["num_draft_tokens"], self.adaptive
            )
        if "load_threshold" in fields:
            changes["load_threshold"] = check_threshold(fields["load_threshold"])
        with self._lock:
            self._config = replace(self._config, **changes)
            return self._config

    def decide(self, override: Override | None, load: int) -> Decision:
        """How a request admitted now runs; ``load`` counts requests that would wait."""
        config = self.config
        override = override or Override()
        k = override.num_draft_tokens or config.num_draft_tokens
        if override.method == "off":
            return Decision("off", None, "request")
        if override.method is not None:
            return Decision(override.method, k)
        if not config.enabled or config.method in (None, "off"):
            return Decision("off", None, "setting")
        if load > config.load_threshold:
            return Decision("off", None, "load")
        return Decision(config.method, k)

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.config.to_dict(),
            "available_methods": list(self.methods),
            "max_num_draft_tokens": MAX_DRAFT_TOKENS,
            "adaptive_available": self.adaptive,
        }
