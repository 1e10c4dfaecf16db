"""HTTP readiness gates (``--gate-url``, repeatable): every URL must answer 2xx.

Pointed at every kura node's ``/ready``, this makes the next node wait until the cache has
refilled the previous one — not merely until its process runs. A non-2xx answer blocks, with
the ``reasons`` kura puts in its JSON when there are any; an unreachable URL or a timeout is
"unknown", which blocks too (fail-closed).
"""

from __future__ import annotations

import asyncio
import json

import aiohttp

from kured.client_errors import unreachable
from kured.core.policy import GateResult


class HttpGate:
    def __init__(self, session: aiohttp.ClientSession, url: str, timeout_seconds: float) -> None:
        self._session = session
        self.url = url
        self.timeout_seconds = timeout_seconds
        self.name = f"gate {url}"

    async def check(self) -> GateResult:
        try:
            async with asyncio.timeout(self.timeout_seconds):
                async with self._session.get(self.url) as resp:
                    body = await resp.read()
                    status = resp.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            detail = unreachable(f"gate {self.url}", exc, self.timeout_seconds)
            return GateResult(self.name, None, detail)
        if 200 <= status < 300:
            return GateResult(self.name, False, f"gate {self.url} answered {status}")
        detail = f"gate {self.url} answered {status}"
        try:
            reasons = json.loads(body).get("reasons")
            if reasons:
                detail += ": " + "; ".join(str(r) for r in reasons)
        except (ValueError, AttributeError):
            pass
        return GateResult(self.name, True, detail)
