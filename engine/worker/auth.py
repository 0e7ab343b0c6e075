"""Access tokens: a user token for every request, a separate admin token for changes.

Contract:

* A worker bound to a non-loopback address must have a user token
  (:func:`check_bind` raises :class:`ConfigError` otherwise, before anything binds).
* With a user token, every request needs ``Authorization: Bearer <user or admin token>``
  (401 otherwise). Admin routes need the admin token: the user token gets 403, and
  with a user token but no admin token they are closed to everyone (403). With no
  tokens at all (loopback only) everything is open.
* Tokens are compared in constant time (``hmac.compare_digest``) and never logged.
"""

import hmac
import ipaddress
from dataclasses import dataclass, field
from pathlib import Path


class ConfigError(Exception):
    """The worker cannot start with these options; the message says why."""


@dataclass(frozen=True)
class Denied:
    """Why a request was refused: HTTP status, message and OpenAI error code."""

    status: int
    message: str
    code: str


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def read_token(path: str, what: str) -> str:
    """Read a token file (surrounding whitespace dropped); refuse a missing or empty one."""
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the {what} file {path}: {exc}") from None
    if not token or any(c.isspace() for c in token):
        raise ConfigError(f"the {what} file {path} must hold one token without spaces")
    return token


def check_bind(host: str, user_token: str | None) -> None:
    if user_token is None and not is_loopback(host):
        raise ConfigError(
            f"refusing to listen on {host}: binding to a non-loopback address needs an "
            "access token; pass --token-file FILE (and --admin-token-file FILE to allow "
            "remote setting changes), or use --host 127.0.0.1"
        )


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer ...`` header, if there is one."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def _same(given: str | None, expected: str | None) -> bool:
    if given is None or expected is None:
        return False
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


@dataclass(frozen=True)
class Auth:
    """The configured tokens and the access rule."""

    user_token: str | None = field(default=None, repr=False)
    admin_token: str | None = field(default=None, repr=False)

    def check(self, header: str | None, admin_route: bool) -> Denied | None:
        """``None`` when the request may proceed, else why it may not."""
        token = bearer(header)
        is_admin = _same(token, self.admin_token)
        is_user = _same(token, self.user_token)
        if admin_route and self.admin_token is not None:
            if is_admin:
                return None
            if is_user:
                return Denied(403, "this endpoint needs the admin token", "permission_denied")
            return Denied(401, "missing or wrong admin token", "invalid_api_key")
        if admin_route and self.user_token is not None:
            return Denied(
                403, "setting changes are disabled: start the worker with --admin-token-file",
                "permission_denied",
            )
        if self.user_token is None or is_user or is_admin:
            return None
        return Denied(401, "missing or wrong access token (Authorization: Bearer ...)",
                      "invalid_api_key")
