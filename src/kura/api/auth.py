"""Bearer-token access control.

Tokens come from configuration, each read-write or read-only. With no tokens configured the
node is open (the zero-configuration default). Credentials are accepted as
``Authorization: Bearer <token>`` (Nx, Turborepo, ccache, sccache) or as the password of HTTP
Basic auth (Gradle sends Basic preemptively; sccache can use a username and password).

Rules (clients.md): no credentials → 401; unknown token → 401; a read-only token writing →
403, which Nx treats as "read-only, skip the upload" rather than an error.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hmac

from kura.core.errors import Forbidden, Unauthenticated


class Access(enum.Enum):
    READ = "read"
    WRITE = "write"


class TokenAuth:
    """Checks a request's ``Authorization`` header against configured tokens."""

    def __init__(self, read_write: tuple[str, ...], read_only: tuple[str, ...]) -> None:
        self._read_write = read_write
        self._read_only = read_only
        self.enabled = bool(read_write or read_only)

    def check(self, authorization: str | None, access: Access) -> None:
        """Return if allowed; raise ``Unauthenticated`` (401) or ``Forbidden`` (403)."""
        if not self.enabled:
            return
        token = _token_from(authorization)
        if token is None:
            raise Unauthenticated("missing credentials: send Authorization: Bearer <token>")
        if _member(token, self._read_write):
            return
        if _member(token, self._read_only):
            if access is Access.WRITE:
                raise Forbidden("this token is read-only")
            return
        raise Unauthenticated("invalid token")


def _member(token: str, tokens: tuple[str, ...]) -> bool:
    found = False
    for candidate in tokens:  # compare against all, in constant time each
        # surrogateescape: a header with non-UTF-8 bytes compares unequal instead of raising.
        found |= hmac.compare_digest(
            token.encode("utf-8", "surrogateescape"), candidate.encode("utf-8", "surrogateescape")
        )
    return found


def _token_from(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer" and value:
        return value
    if scheme.lower() == "basic" and value:
        try:
            decoded = base64.b64decode(value, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
        _user, sep, password = decoded.partition(":")
        return password if sep and password else None
    return None
