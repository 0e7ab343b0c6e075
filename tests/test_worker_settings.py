"""Unit tests of the worker's pure parts: speculation setting, request parsing, auth rules."""

from pathlib import Path

import pytest

from engine.errors import BadRequestError
from engine.worker.auth import Auth, ConfigError, bearer, check_bind, is_loopback, read_token
from engine.worker.schema import FieldError, parse_chat_request
from engine.worker.settings import (
    Decision,
    Override,
    SpeculationConfig,
    SpeculationSettings,
    parse_override,
)

METHODS = ("off", "ngram", "suffix", "draft")
USER = [{"role": "user", "content": "hi"}]


def bound(adaptive: bool = True, **config: object) -> SpeculationSettings:
    settings = SpeculationSettings(SpeculationConfig(**config))  # type: ignore[arg-type]
    settings.bind(METHODS, "draft", 4, adaptive)
    return settings


# --- setting -------------------------------------------------------------------------


def test_bind_fills_the_engine_defaults_only_when_unset() -> None:
    assert (bound().config.method, bound().config.num_draft_tokens) == ("draft", 4)
    custom = bound(method="ngram", num_draft_tokens=6)
    assert (custom.config.method, custom.config.num_draft_tokens) == ("ngram", 6)
    assert bound(num_draft_tokens="adaptive").config.num_draft_tokens == "adaptive"
    assert bound(False, num_draft_tokens="adaptive").config.num_draft_tokens == 4


def test_adaptive_is_offered_only_when_the_engine_has_it() -> None:
    with pytest.raises(BadRequestError, match="this engine has no adaptive mode"):
        bound(False).update({"num_draft_tokens": "adaptive"})
    with pytest.raises(BadRequestError, match="no adaptive mode"):
        parse_override({"num_draft_tokens": "adaptive"}, METHODS, adaptive=False)
    assert bound(False).to_dict()["adaptive_available"] is False


def test_auto_is_a_method_where_the_engine_offers_it() -> None:
    settings = SpeculationSettings()
    settings.bind(("auto", *METHODS), "auto", 4, True)
    assert settings.config.method == "auto"
    assert settings.update({"method": "ngram"}).method == "ngram"
    assert settings.update({"method": "auto"}).method == "auto"
    assert settings.decide(None, 0) == Decision("auto", 4)
    assert settings.decide(Override("draft"), 0).method == "draft"  # a request's own wins
    with pytest.raises(BadRequestError, match="not loaded"):
        bound().update({"method": "auto"})


def test_update_applies_a_subset_and_reports_it() -> None:
    settings = bound()
    config = settings.update({"method": "suffix", "num_draft_tokens": "adaptive"})
    assert (config.method, config.num_draft_tokens, config.enabled) == ("suffix", "adaptive", True)
    assert settings.to_dict()["available_methods"] == list(METHODS)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"method": "magic"},
         "must be one of auto, draft, ngram, suffix, hybrid, eagle, hybrid-eagle, off"),
        ({"method": "eagle"}, "not loaded; available: off, ngram, suffix, draft"),
        ({"num_draft_tokens": 0}, "integer from 1 to 16 or 'adaptive'"),
        ({"num_draft_tokens": 17}, "integer from 1 to 16"),
        ({"num_draft_tokens": True}, "integer from 1 to 16"),
        ({"load_threshold": -1}, "from 0 to 1024"),
        ({"load_threshold": "2"}, "must be an integer"),
        ({"enabled": "yes"}, "true or false"),
        ({"speed": "max"}, "unknown field(s) speed; allowed: enabled, method"),
        ([1, 2], "must be a JSON object"),
    ],
)
def test_update_rejects_bad_values_with_what_is_allowed(body: object, says: str) -> None:
    settings = bound()
    with pytest.raises(BadRequestError) as info:
        settings.update(body)
    assert says in str(info.value)
    assert settings.config == bound().config  # all or nothing


def test_decide_request_override_setting_and_load() -> None:
    settings = bound(load_threshold=1)
    assert settings.decide(None, load=0) == Decision("draft", 4)
    assert settings.decide(None, load=1) == Decision("draft", 4)
    assert settings.decide(None, load=2) == Decision("off", None, "load")
    assert settings.decide(Override("ngram", 3), load=9) == Decision("ngram", 3)
    assert settings.decide(Override("off"), load=0) == Decision("off", None, "request")
    settings.update({"enabled": False})
    assert settings.decide(None, load=0) == Decision("off", None, "setting")
    assert not settings.decide(None, load=0).enabled


def test_parse_override() -> None:
    assert parse_override(None, METHODS) is None
    assert parse_override({"method": "off"}, METHODS) == Override("off")
    assert parse_override({"num_draft_tokens": "adaptive"}, METHODS) == Override(None, "adaptive")
    with pytest.raises(BadRequestError, match=r"speculation\.method 'eagle' needs a model"):
        parse_override({"method": "eagle"}, METHODS)
    with pytest.raises(BadRequestError, match="unknown field"):
        parse_override({"enabled": False}, METHODS)


# --- request parsing ------------------------------------------------------------------------


def test_parse_chat_request_defaults_and_extensions() -> None:
    req = parse_chat_request(
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
         "temperature": 0, "stop": "\n", "max_completion_tokens": 7, "top_k": 5,
         "speculation": {"method": "off"}, "frequency_penalty": 0},
        METHODS,
    )
    assert req.messages == USER
    assert (req.params.temperature, req.params.top_k, req.max_tokens) == (0.0, 5, 7)
    assert req.stop == ("\n",) and not req.stream and req.speculation == Override("off")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ([1], "body"),
        ({}, "messages"),
        ({"messages": "hello"}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
        ({"messages": USER, "temperature": "hot"}, "temperature"),
        ({"messages": USER, "temperature": 9}, "temperature"),
        ({"messages": USER, "top_p": 0}, "top_p"),
        ({"messages": USER, "max_tokens": 0}, "max_tokens"),
        ({"messages": USER, "max_tokens": "10"}, "max_tokens"),
        ({"messages": USER, "stream": "yes"}, "stream"),
        ({"messages": USER, "stop": 5}, "stop"),
        ({"messages": USER, "seed": -1}, "seed"),
        ({"messages": USER, "n": 2}, "n"),
        ({"messages": USER, "speculation": {"num_draft_tokens": 99}}, "speculation"),
    ],
)
def test_parse_chat_request_names_the_bad_field(body: object, param: str) -> None:
    with pytest.raises(FieldError) as info:
        parse_chat_request(body, METHODS)
    assert info.value.param == param


# --- auth --------------------------------------------------------------------------------------


def test_loopback_and_bind_rule() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.org")
    check_bind("127.0.0.1", None)
    check_bind("0.0.0.0", "secret")
    with pytest.raises(ConfigError, match="--token-file"):
        check_bind("0.0.0.0", None)


def test_read_token(tmp_path: Path) -> None:
    path = tmp_path / "t"
    path.write_text("  s3cret\n")
    assert read_token(str(path), "token") == "s3cret"
    path.write_text("\n")
    with pytest.raises(ConfigError, match="one token"):
        read_token(str(path), "token")
    with pytest.raises(ConfigError, match="cannot read"):
        read_token(str(path) + ".missing", "token")


def test_auth_rules() -> None:
    both = Auth("user", "admin")
    assert bearer("Bearer  user ") == "user" and bearer("Basic x") is None and bearer(None) is None
    assert both.check("Bearer user", admin_route=False) is None
    assert both.check("Bearer admin", admin_route=False) is None
    assert both.check("Bearer admin", admin_route=True) is None
    assert both.check(None, admin_route=False).status == 401  # type: ignore[union-attr]
    assert both.check("Bearer wrong", admin_route=False).status == 401  # type: ignore[union-attr]
    assert both.check("Bearer user", admin_route=True).status == 403  # type: ignore[union-attr]
    assert Auth("user").check("Bearer user", admin_route=True).status == 403  # type: ignore[union-attr]
    assert Auth().check(None, admin_route=True) is None
    assert Auth(None, "admin").check(None, admin_route=False) is None
    assert Auth(None, "admin").check(None, admin_route=True).status == 401  # type: ignore[union-attr]
