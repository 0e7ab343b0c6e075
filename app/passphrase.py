"""The admin passphrase: a salted scrypt hash, checked in constant time. No Qt here.

Contract: :func:`hash_passphrase` returns ``scrypt$N$r$p$salt$hash`` (base64 parts,
16-byte random salt); :func:`verify` returns False for a wrong passphrase or a
malformed record, never raises. Both take tens of milliseconds on purpose: call them
off the event loop.
"""

import base64
import hashlib
import hmac
import secrets

N, R, P = 2**14, 8, 1
DKLEN = 32
MIN_LENGTH = 8


def _scrypt(passphrase: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        passphrase.encode("utf-8"), salt=salt, n=n, r=r, p=p, dklen=DKLEN, maxmem=2**26
    )


def hash_passphrase(passphrase: str) -> str:
    salt = secrets.token_bytes(16)
    digest = _scrypt(passphrase, salt, N, R, P)
    encode = base64.b64encode
    return f"scrypt${N}${R}${P}${encode(salt).decode()}${encode(digest).decode()}"


def verify(passphrase: str, record: str) -> bool:
    try:
        kind, n, r, p, salt, digest = record.split("$")
        if kind != "scrypt":
            return False
        expected = base64.b64decode(digest)
        actual = _scrypt(passphrase, base64.b64decode(salt), int(n), int(r), int(p))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(actual, expected)


def weakness(passphrase: str, confirmation: str) -> str | None:
    """Why a new passphrase cannot be used, or None."""
    if len(passphrase) < MIN_LENGTH:
        return f"Use at least {MIN_LENGTH} characters."
    if passphrase != confirmation:
        return "The two passphrases differ."
    return None
