"""Opt-in release of a lock held by a node that no longer exists
(``--release-lock-of-deleted-nodes``; kured #137 https://github.com/kubereboot/kured/issues/137
and #847 https://github.com/kubereboot/kured/issues/847).

A node that takes the lock and is then deleted (scaled away by an autoscaler, replaced by a
node pool upgrade) never gives it back: with TTL 0, kured's default, every other node waits for
ever. With this option, at each check the agent looks up every other holder's Node: a holder
whose Node the API answers **404** for, on every check for longer than ``grace_seconds``
(``--deleted-node-grace``), has its entries released - loudly: an ERROR log line naming the
holder and how long it was absent, and ``kured_lock_releases_of_deleted_nodes_total``.

Never released:

* kured's pause record, holder ``manual`` (https://kured.dev/docs/operation/ "manually lock");
  it is no node and is never looked up;
* a holder whose lookup fails otherwise (API down, 403, timeout): unknown is not absent, and the
  clock of its absence starts again;
* a holder seen again (200) - a node that came back resets its clock.

Absence is measured on this agent's clock between its own checks, in memory: a restarted agent
starts counting again, so a release needs ``grace`` seen by one process. Every agent with the
option may release the same holder; a release of entries already gone writes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable

from kit.clock import Clock
from kured.apiserver import ApiServer
from kured.core.errors import ApiError, LockError

log = logging.getLogger(__name__)

PAUSE_HOLDER = "manual"


class DeletedHolders:
    """Tracks how long each lock holder's Node has been absent and releases the lock of those
    absent longer than ``grace_seconds`` (see the module docstring) through ``release`` (the
    lock's ``release``, which may raise ``LockError``). One agent task uses it."""

    def __init__(
        self,
        api: ApiServer,
        release: Callable[[str], Awaitable[None]],
        own_node: str,
        grace_seconds: float,
        clock: Clock,
    ) -> None:
        self._api = api
        self._release = release
        self._own = own_node
        self._grace = grace_seconds
        self._clock = clock
        self._absent_since: dict[str, float] = {}
        self.released_total = 0

    def _now(self) -> float:
        return self._clock.now_ms() / 1000

    async def check(self, holders: Iterable[str]) -> list[str]:
        """Look up every holder (node id) but this node and ``manual``; release those absent
        past the grace period. Returns the holders released. Never raises: failures are
        logged."""
        now = self._now()
        names = set(holders) - {self._own, PAUSE_HOLDER}
        for gone in set(self._absent_since) - names:
            del self._absent_since[gone]  # released by someone, or no longer a holder
        released = []
        for name in sorted(names):
            try:
                await self._api.get_node(name)
            except ApiError as exc:
                if not exc.not_found:
                    log.warning(
                        "cannot tell whether lock holder %s still exists: %s", name, exc.message
                    )
                    self._absent_since.pop(name, None)
                    continue
            else:
                self._absent_since.pop(name, None)
                continue
            since = self._absent_since.setdefault(name, now)
            absent = now - since
            if absent < self._grace:
                log.warning(
                    "lock holder %s has no Node object (404) for %.0fs; releasing its lock after "
                    "%.0fs (--deleted-node-grace)",
                    name,
                    absent,
                    self._grace,
                )
                continue
            try:
                await self._release(name)
            except LockError as exc:
                log.error("cannot release the lock of deleted node %s: %s", name, exc.message)
                continue
            del self._absent_since[name]
            self.released_total += 1
            released.append(name)
            log.error(
                "released the reboot lock held by node %s: its Node object has been absent "
                "(404) for %.0fs, longer than --deleted-node-grace %.0fs "
                "(--release-lock-of-deleted-nodes)",
                name,
                absent,
                self._grace,
            )
        return released
