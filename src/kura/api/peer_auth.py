"""Peer credentials on the internal listener (``/_internal/``).

Every request to a peer route must carry ``Authorization: Bearer <token>`` with one of
``KURA_INTERNAL_TOKENS`` when that setting is non-empty; nodes send the first token, and accept
any, so a rotation can run with ``old,new`` everywhere before ``old`` is dropped. With internal
mTLS the TLS handshake has already refused clients without a certificate from the peers' CA;
with both configured, both are required. With neither, the listener is open, which
``validate_settings`` allows only on a loopback host.

The check is an aiohttp middleware, so it runs before any handler: a refused request has had no
byte of its body read and nothing changed. A refusal answers 401 JSON ``{"message"}``, closes a
connection whose body is still unread, counts ``kura_internal_auth_failures_total{reason}``
(reason ``missing`` or ``invalid``) and logs one WARNING with the remote address, at most once
per ``LOG_INTERVAL_SECONDS`` for each (address, reason).
"""

from __future__ import annotations

import hmac
import logging
import time

from aiohttp import web
from aiohttp.typedefs import Handler

from kura.api.errors import error_response
from kura.core.errors import Unauthenticated

log = logging.getLogger(__name__)

LOG_INTERVAL_SECONDS = 60.0
REASONS = ("missing", "invalid")


class PeerAuth:
    """Checks the peer token of internal requests; ``failures_total`` by reason (metrics)."""

    def __init__(self, tokens: tuple[str, ...]) -> None:
        self._tokens = tuple(t.encode() for t in tokens)
        self.failures_total: dict[str, int] = dict.fromkeys(REASONS, 0)
        self._logged_at: dict[tuple[str, str], float] = {}

    @property
    def enabled(self) -> bool:
        return bool(self._tokens)

    def reason_refused(self, authorization: str | None) -> str | None:
        """None when allowed, else the closed-set reason (``missing`` or ``invalid``)."""
        if not self._tokens:
            return None
        scheme, _, value = (authorization or "").strip().partition(" ")
        value = value.strip()
        if scheme.lower() != "bearer" or not value:
            return "missing"
        offered = value.encode("utf-8", "surrogateescape")
        found = False
        for token in self._tokens:  # compare against all, each in constant time
            found |= hmac.compare_digest(offered, token)
        return None if found else "invalid"

    def refusal(self, request: web.Request) -> web.Response | None:
        """The 401 for a request without valid peer credentials (counted, logged at most every
        ``LOG_INTERVAL_SECONDS`` per address and reason), or None when it may proceed. Used by
        the middleware and by the internal listener's ``Expect: 100-continue`` handler, which
        aiohttp runs before any middleware: no 100 is sent to a peer that would be refused."""
        reason = self.reason_refused(request.headers.get("Authorization"))
        if reason is None:
            return None
        self.failures_total[reason] += 1
        self._log(request.remote or "unknown", reason, request)
        message = (
            "missing peer credentials: send Authorization: Bearer <one of KURA_INTERNAL_TOKENS>"
            if reason == "missing"
            else "invalid peer token"
        )
        response = error_response(Unauthenticated(message))
        if request.body_exists:
            response.force_close()  # the unread body is never consumed
        return response

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        refused = self.refusal(request)
        return await handler(request) if refused is None else refused

    def _log(self, remote: str, reason: str, request: web.Request) -> None:
        now = time.monotonic()
        key = (remote, reason)
        last = self._logged_at.get(key)
        if last is not None and now - last < LOG_INTERVAL_SECONDS:
            return
        if len(self._logged_at) > 1024:  # bound the memory a scan of many addresses can take
            self._logged_at.clear()
        self._logged_at[key] = now
        log.warning(
            "refused peer request from %s (%s credentials): %s %s; further refusals from this "
            "address are counted in kura_internal_auth_failures_total and logged at most every "
            "%.0f s",
            remote,
            reason,
            request.method,
            request.path,
            LOG_INTERVAL_SECONDS,
        )
