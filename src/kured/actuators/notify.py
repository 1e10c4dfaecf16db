"""Notifications (``--notify-url``): one templated message per drain, reboot and uncordon,
delivered by apprise (https://appriseit.com/) to every URL, off the agent's critical path.

``Notifier.send(event)`` returns at once: each URL gets its own background task, which runs
apprise's (blocking) delivery in a thread under ``timeout_seconds`` (also passed to apprise as
its connect and read timeouts, ``cto``/``rto``, so the thread itself ends in about that time).
A delivery that fails or times out is logged (the URL shown as ``scheme://host`` only) and
counted; it never raises into the agent and never stops a reboot. Counts are
``counts[(event, result)]`` with ``result`` in ``RESULTS`` (``kured_notifications_total``).

The agent waits for the messages in flight for at most ``timeout_seconds`` right before it
triggers the reboot (``flush``), as kured sends its reboot message before rebooting, so the
reboot message is not lost with the machine; a receiver that is down fails at once and a
receiver that hangs costs at most that bound. ``close`` does the same on shutdown.

URLs are kured's shoutrrr URLs or apprise URLs (``kured.core.notify_urls``); ``check_url``
refuses, at start, a scheme apprise does not know.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from kured.core.notify_urls import EVENTS, redact, render

log = logging.getLogger(__name__)

RESULTS = ("sent", "failed", "timeout")
DEFAULT_TIMEOUT_SECONDS = 10.0
TITLE = "kured"


def _apprise() -> Any:
    import apprise  # heavy (loads ~190 plugins): only when a --notify-url is given

    return apprise


def check_url(apprise_url: str) -> str:
    """``apprise_url`` if apprise can build a notifier from it; else ``ValueError``."""
    if _apprise().Apprise.instantiate(apprise_url) is None:
        scheme = urlsplit(apprise_url).scheme
        raise ValueError(
            f"{redact(apprise_url)}: apprise cannot use this URL ({scheme}:// is an unknown "
            "scheme, or a part such as a token or an address is invalid); see "
            "https://appriseit.com/services/ for the URL of each service"
        )
    return apprise_url


def _with_timeouts(url: str, seconds: float) -> str:
    query = urlsplit(url).query.lower()
    extra = [f"{key}={seconds:g}" for key in ("cto", "rto") if f"{key}=" not in query]
    if not extra:
        return url
    return url + ("&" if "?" in url else "?") + "&".join(extra)


class Notifier:
    """Delivers ``templates[event]`` (``%s`` = ``node``) to every apprise URL in ``urls``.
    Use from one event loop; see the module docstring."""

    def __init__(
        self,
        urls: Sequence[str],
        templates: Mapping[str, str],
        node: str,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        self._timeout = timeout_seconds
        # apprise logs each recipient at INFO; ours say scheme://host only.
        logging.getLogger("apprise").setLevel(logging.WARNING)
        self._targets = [(redact(u), _with_timeouts(u, timeout_seconds)) for u in urls]
        self._templates = dict(templates)
        self._node = node
        self._tasks: set[asyncio.Task[None]] = set()
        # One delivery at a time per URL, in the order sent (asyncio.Lock wakes waiters FIFO):
        # a receiver gets drain, reboot and uncordon in that order, never crossed.
        self._in_order: dict[str, asyncio.Lock] = {}
        self.counts: dict[tuple[str, str], int] = {(e, r): 0 for e in EVENTS for r in RESULTS}

    @property
    def enabled(self) -> bool:
        return bool(self._targets)

    def sends(self, event: str) -> bool:
        """Whether ``event`` has a message (the "back" message is off with an empty template)."""
        return bool(self._templates.get(event))

    def send(self, event: str) -> None:
        """Start delivering the ``event`` message (drain, reboot, uncordon) to every URL."""
        if event not in self._templates:
            raise ValueError(f"unknown notification event {event!r}")
        message = render(self._templates[event], self._node)
        for shown, url in self._targets:
            task = asyncio.get_running_loop().create_task(
                self._deliver(event, shown, url, message), name=f"notify-{event}"
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _deliver(self, event: str, shown: str, url: str, message: str) -> None:
        def blocking() -> bool:
            notifier = _apprise().Apprise()
            if not notifier.add(url):
                return False
            return bool(notifier.notify(body=message, title=TITLE))

        try:
            async with self._in_order.setdefault(url, asyncio.Lock()):
                async with asyncio.timeout(self._timeout):
                    ok = await asyncio.to_thread(blocking)
            result = "sent" if ok else "failed"
        except TimeoutError:
            result = "timeout"
        except Exception as exc:  # a boundary: apprise's plugins raise anything
            log.warning(
                "notification %s to %s raised %s: %s", event, shown, type(exc).__name__, exc
            )
            result = "failed"
        self.counts[(event, result)] += 1
        if result == "sent":
            log.info("notification %s sent to %s", event, shown)
        else:
            log.warning(
                "notification %s to %s %s (the reboot goes on regardless)",
                event,
                shown,
                "timed out" if result == "timeout" else "failed",
            )

    async def flush(self) -> None:
        """Wait for the deliveries in flight, at most the delivery timeout."""
        pending = list(self._tasks)
        if pending:
            await asyncio.wait(pending, timeout=self._timeout)

    async def close(self) -> None:
        await self.flush()
        for task in list(self._tasks):
            task.cancel()
