"""Maintenance hooks around a reboot (kured #501): ``pre-drain`` (after the lock is taken and
the silence set, before the cordon and drain) and ``post-uncordon`` (once the node is back:
uncordoned and its gates pass again).

Each hook is an HTTP POST of a JSON document (``--pre-drain-hook-url``,
``--post-uncordon-hook-url``), a command (``--pre-drain-hook-command``,
``--post-uncordon-hook-command``: split like a shell, run without one, the same document on its
standard input, an environment of ``PATH``, ``HOME``, ``LANG``, ``LC_ALL``, ``TZ`` (those the
agent has) and ``KURED_NODE``/``KURED_HOOK_EVENT``; a timeout or a stopped agent kills its
whole process group), or both (the URL
first). The document::

    {"node": "n1", "event": "pre-drain", "time": "2026-12-07T03:00:00+00:00",
     "lock_holder": "n1", "kured": "kura"}

A hook succeeds when the URL answers 2xx and the command exits 0, both within
``--hook-timeout``; anything else is a ``HookError`` whose message says what happened. The
agent treats a failed pre-drain hook as a blocked reboot (the lock is given back, the reason is
shown by ``kured status``, ``kured_failures_total{kind="hook"}`` counts it, and the next check
tries again); a failed post-uncordon hook is logged and counted, and not retried.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import datetime

import aiohttp

from kit import command
from kured.client_errors import read_at_most, unreachable
from kured.core.errors import KuredError, printable
from kured.core.notify_urls import endpoint

EVENTS = ("pre-drain", "post-uncordon")
RESULTS = ("ok", "failed")
OUTPUT_SHOWN_CHARS = 300  # of a failed hook's answer or output (control characters escaped)
BODY_READ_BYTES = 4096  # of a failed hook URL's answer, this much is read
# The only variables of the agent's environment a hook command gets (plus KURED_NODE and
# KURED_HOOK_EVENT): not the agent's credentials or tokens.
# What a hook command gets of the agent's environment: the locale and path, and what in-cluster
# clients (kubectl, client-go) and proxies need, so that a hook that reaches the API server or
# another service through a proxy keeps working. Not the agent's own settings (KURED_*: a
# notify URL may hold a password).
HOOK_ENV_PASSED = frozenset(
    {
        "PATH",
        "HOME",
        "LANG",
        "LC_ALL",
        "TZ",
        "KUBERNETES_SERVICE_HOST",
        "KUBERNETES_SERVICE_PORT",
        "KUBECONFIG",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
    }
)


class HookError(KuredError):
    """A hook failed: no 2xx answer, a non-zero exit, or the timeout."""


def document(node: str, event: str, at: datetime, lock_holder: str) -> dict[str, str]:
    return {
        "node": node,
        "event": event,
        "time": at.isoformat(),
        "lock_holder": lock_holder,
        "kured": "kura",
    }


class Hook:
    """One event's hook: a URL, a command, or both."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        event: str,
        url: str,
        command: Sequence[str],
        timeout_seconds: float,
    ) -> None:
        self.session = session
        self.event = event
        self.url = url
        self.shown_url = endpoint(url) if url else ""  # what messages show: no secrets
        self.command = tuple(command)
        self.timeout = timeout_seconds

    @property
    def configured(self) -> bool:
        return bool(self.url or self.command)

    def describe(self) -> str:
        parts = ([f"POST {self.shown_url}"] if self.url else []) + (
            [f"command {self.command[0]}"] if self.command else []
        )
        return " and ".join(parts)

    async def run(self, doc: dict[str, str]) -> None:
        """Run the URL then the command; raises ``HookError`` at the first failure."""
        if self.url:
            await self._post(doc)
        if self.command:
            await self._exec(doc)

    async def _post(self, doc: dict[str, str]) -> None:
        who = f"{self.event} hook {self.shown_url}"
        try:
            async with self.session.post(
                self.url, json=doc, timeout=aiohttp.ClientTimeout(total=self.timeout)
            ) as response:
                if response.status // 100 != 2:
                    # Bounded: a hook answering megabytes costs BODY_READ_BYTES; control
                    # characters escaped: the answer cannot forge log lines.
                    body = (await read_at_most(response, BODY_READ_BYTES)).decode(errors="replace")
                    raise HookError(
                        f"{who} answered {response.status}: "
                        f"{printable(body.strip()[:OUTPUT_SHOWN_CHARS])}"
                    )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise HookError(unreachable(who, exc, self.timeout)) from None

    async def _exec(self, doc: dict[str, str]) -> None:
        # Through kit.command.run: a timeout or a cancelled agent (SIGTERM, stop) kills the
        # hook's whole process group and reaps it; the spawn is shielded.
        env = {k: v for k, v in os.environ.items() if k in HOOK_ENV_PASSED}
        env.update(KURED_NODE=doc["node"], KURED_HOOK_EVENT=self.event)
        try:
            done = await command.run(
                self.command,
                self.timeout,
                merge_stderr=True,
                input=json.dumps(doc).encode(),
                env=env,
                tail_bytes=4 * OUTPUT_SHOWN_CHARS,  # UTF-8: at most 4 bytes a character
            )
        except command.NotStarted as exc:
            raise HookError(f"{self.event} hook command: {exc}") from None
        except command.TimedOut:
            raise HookError(
                f"{self.event} hook command {self.command[0]} did not finish within "
                f"{self.timeout:g}s (killed)"
            ) from None
        if done.returncode != 0:
            shown = printable(done.stdout.strip()[-OUTPUT_SHOWN_CHARS:])
            raise HookError(
                f"{self.event} hook command {self.command[0]} exited {done.returncode}"
                + (f": {shown}" if shown else "")
            )
