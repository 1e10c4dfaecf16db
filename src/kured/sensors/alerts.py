"""The Prometheus alert gate, with kured's exact filter semantics (kured-behaviour.md §2.7).

An instant query of ``ALERTS`` at now: a form-encoded POST to ``<url>/api/v1/query``, falling
back to GET on 405. Only a ``vector`` result counts; samples without ``alertname`` or with value 0
are skipped. An alert counts when both hold:

* regexp test: no regexp set, **or** ``bool(regexp.search(name)) == match_only`` — so with
  ``--alert-filter-match-only=false`` (the default) the regexp is an *ignore* list, and with
  ``true`` it is a *block* list (the inverted meaning users trip over);
* state test: ``firing_only`` is false, or ``alertstate == "firing"``.

Any error (unreachable, timeout, HTTP error, bad JSON, wrong result type) is "unknown", which
blocks (fail-closed), with the reason. Unlike kured we bound the query with a timeout, so a
Prometheus that accepts and hangs cannot stall the loop.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import aiohttp

from kured.client_errors import unreachable
from kured.core.errors import SensorError
from kured.core.policy import GateResult


def active_alerts(
    data: Any, regexp: re.Pattern[str] | None, match_only: bool, firing_only: bool
) -> list[str]:
    """Names of the alerts that block, from a Prometheus query response (sorted, unique).

    Raises ``SensorError`` when the response is not a successful vector result.
    """
    if not isinstance(data, dict) or data.get("status") != "success":
        if isinstance(data, dict) and data.get("error"):
            kind = f"{data.get('errorType')}: " if data.get("errorType") else ""
            raise SensorError(f"Prometheus answered an error: {kind}{str(data['error'])[:200]}")
        raise SensorError("Prometheus answered something that is not a query result")
    result = data.get("data", {})
    if result.get("resultType") != "vector":
        raise SensorError(f"prometheus answered a {result.get('resultType')!r}, not a vector")
    names: set[str] = set()
    for sample in result.get("result", []):
        metric = sample.get("metric", {})
        name = metric.get("alertname")
        try:
            value = float(sample.get("value", [0, "0"])[1])
        except (TypeError, ValueError, IndexError):
            continue
        if not name or value == 0:
            continue
        if regexp is not None and bool(regexp.search(name)) != match_only:
            continue
        if firing_only and metric.get("alertstate") != "firing":
            continue
        names.add(name)
    return sorted(names)


class PrometheusAlertGate:
    """Blocks while a matching alert is active. ``check()`` never raises."""

    name = "prometheus"

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        regexp: re.Pattern[str] | None,
        match_only: bool,
        firing_only: bool,
        timeout_seconds: float,
    ) -> None:
        self._session = session
        self.url = url.rstrip("/")
        self.regexp = regexp
        self.match_only = match_only
        self.firing_only = firing_only
        self.timeout_seconds = timeout_seconds

    async def query(self) -> Any:
        form = {"query": "ALERTS", "time": f"{time.time():.3f}"}
        endpoint = self.url + "/api/v1/query"
        try:
            async with asyncio.timeout(self.timeout_seconds):
                async with self._session.post(endpoint, data=form) as resp:
                    if resp.status == 405:
                        async with self._session.get(endpoint, params=form) as get:
                            return await get.json(content_type=None)
                    return await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            raise SensorError(
                unreachable(f"Prometheus at {self.url}", exc, self.timeout_seconds)
            ) from exc

    async def check(self) -> GateResult:
        try:
            names = active_alerts(
                await self.query(), self.regexp, self.match_only, self.firing_only
            )
        except SensorError as exc:
            return GateResult(self.name, None, exc.message)
        if not names:
            return GateResult(self.name, False, "no blocking alerts")
        shown = ", ".join(names[:10])
        return GateResult(self.name, True, f"alert{'s' if len(names) > 1 else ''} {shown} firing")
