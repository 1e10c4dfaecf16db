"""Alertmanager silences for the node being rebooted (``--alertmanager-url``; kured #499).

Through Alertmanager's API v2 (https://prometheus.io/docs/alerting/latest/alertmanager/,
``api/v2/openapi.yaml``): ``POST /api/v2/silences`` creates a silence, or with the ``id`` of an
active one updates it in place (Alertmanager may instead expire it and answer a new id: the
answer's id is the one kept); ``GET /api/v2/silences`` lists them; ``DELETE
/api/v2/silence/{id}`` expires one.

A silence of ours is recognised by its ``createdBy`` (``kured``) and the start of its
``comment`` (``kured: reboot of node <node> ``), not only by an id kept somewhere: an agent
killed between the POST and writing its state file still finds (and expires) its silence at the
next start. ``expire_ours`` expires every active or pending one of this node's.

The matchers (``--alertmanager-silence-matcher``) are ``name=value``, ``name!=value``,
``name=~regex`` or ``name!~regex`` (Alertmanager's ``amtool`` spelling), each templated with
the node name like the notification templates (``%s``). Every call is bounded by the timeout
and raises ``SilenceError`` for anything but a 2xx answer.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import aiohttp

from kured.client_errors import read_at_most, unreachable
from kured.core.errors import KuredError, printable
from kured.core.notify_urls import endpoint
from kured.core.silence_matchers import Matcher

CREATED_BY = "kured"
ANSWER_LIMIT_BYTES = 16 << 20  # an answer read whole (the list of silences) is at most this
ERROR_READ_BYTES = 4096  # of a refusal, this much is read
ERROR_SHOWN_CHARS = 200  # and this much shown (control characters escaped)


class SilenceError(KuredError):
    """Alertmanager could not be reached or refused a request."""


def _iso(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


class Silencer:
    """This node's silences in the Alertmanager at ``url``."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        matchers: Sequence[Matcher],
        node: str,
        timeout_seconds: float,
    ) -> None:
        self.session = session
        self.url = url.rstrip("/")
        self.shown_url = endpoint(url)  # what messages show: no user info, path or query
        self.matchers = tuple(matchers)
        self.node = node
        self.seconds = timeout_seconds
        self.timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self.marker = f"kured: reboot of node {node} "

    def comment(self, since: datetime) -> str:
        return (
            f"{self.marker}(drained since {_iso(since)}); kured expires it once the node is "
            "back and its gates pass"
        )

    async def _call(self, method: str, path: str, body: object | None = None) -> Any:
        try:
            async with self.session.request(
                method, self.url + path, json=body, timeout=self.timeout
            ) as response:
                # Bounded reads: at most ANSWER_LIMIT_BYTES of an answer, a little of a refusal.
                if response.status // 100 != 2:
                    text = (await read_at_most(response, ERROR_READ_BYTES)).decode(errors="replace")
                    raise SilenceError(
                        f"alertmanager {self.shown_url} answered {response.status} to {method} "
                        f"{path}: {printable(text.strip()[:ERROR_SHOWN_CHARS])}"
                    )
                raw = await read_at_most(response, ANSWER_LIMIT_BYTES + 1)
                if len(raw) > ANSWER_LIMIT_BYTES:
                    raise SilenceError(
                        f"alertmanager {self.shown_url} ({method} {path}): the answer is larger "
                        f"than {ANSWER_LIMIT_BYTES} bytes"
                    )
                return json.loads(raw) if raw.strip() else None
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise SilenceError(
                unreachable(f"alertmanager {self.shown_url} ({method} {path})", exc, self.seconds)
            ) from None

    async def ours(self) -> list[dict[str, Any]]:
        """This node's active or pending silences made by kured (each with a string ``id``).
        ``SilenceError`` when the answer is not API v2's shape: not a list, or a silence of ours
        without an ``id`` or a ``status`` object."""
        answer = await self._call("GET", "/api/v2/silences")
        if not isinstance(answer, list):
            raise SilenceError(f"alertmanager {self.shown_url}: GET /api/v2/silences is not a list")
        found = []
        for s in answer:
            if not (
                isinstance(s, dict)
                and s.get("createdBy") == CREATED_BY
                and str(s.get("comment", "")).startswith(self.marker)
            ):
                continue  # not ours: its shape is not our business
            status, silence_id = s.get("status"), s.get("id")
            if not isinstance(status, dict) or not isinstance(silence_id, str) or not silence_id:
                raise SilenceError(
                    f"alertmanager {self.shown_url}: GET /api/v2/silences: a silence of ours without "
                    "an id or a status object (not Alertmanager's API v2)"
                )
            if status.get("state") in ("active", "pending"):
                found.append(s)
        return found

    async def ensure(self, now: datetime, ends_at: datetime, since: datetime) -> str:
        """Create this node's silence, or move the end of the active one to ``ends_at``.
        Returns its id."""
        current = await self.ours()
        body: dict[str, Any] = {
            "matchers": [m.for_node(self.node) for m in self.matchers],
            "startsAt": _iso(now),
            "endsAt": _iso(ends_at),
            "createdBy": CREATED_BY,
            "comment": self.comment(since),
        }
        if current:
            body["id"] = current[0]["id"]
            body["startsAt"] = current[0].get("startsAt", body["startsAt"])
        answer = await self._call("POST", "/api/v2/silences", body)
        silence_id = answer.get("silenceID") if isinstance(answer, dict) else None
        if not isinstance(silence_id, str) or not silence_id:
            raise SilenceError(
                f"alertmanager {self.shown_url}: POST /api/v2/silences answered no silenceID "
                "(not Alertmanager's API v2)"
            )
        for extra in current[1:]:  # two of ours (a race of restarts): one is enough
            await self.expire(extra["id"])
        return silence_id

    async def expire(self, silence_id: str) -> None:
        await self._call("DELETE", f"/api/v2/silence/{silence_id}")

    async def expire_ours(self) -> list[str]:
        """Expire every active or pending silence of this node's; their ids."""
        ids = [s["id"] for s in await self.ours()]
        for silence_id in ids:
            await self.expire(silence_id)
        return ids


def ends_at(now: datetime, duration_seconds: float) -> datetime:
    return now + timedelta(seconds=duration_seconds)
