"""The node's version clock: the largest version issued or learned, and the next one.

The rules are pure and live in ``kura.core.version`` (``next_version_ms``, the hybrid-logical-clock
floor); this is the one stateful holder, shared by the storage writer thread and whichever
thread learns a peer's version, so it takes a lock (and the core stays free of threading).
"""

from __future__ import annotations

import threading

from kura.core.version import next_version_ms


class VersionClock:
    """The node's version clock: the largest version issued or learned, and the next one.

    ``observe`` (any thread) advances it with a version learned from the index or a peer;
    ``issue`` (the storage writer thread) returns the next local version by
    ``next_version_ms``. Both take one lock, so a concurrent ``observe`` is never lost.
    """

    def __init__(self, last_ms: int = 0) -> None:
        self._last_ms = last_ms
        self._lock = threading.Lock()

    @property
    def last_ms(self) -> int:
        return self._last_ms

    def observe(self, version_ms: int) -> None:
        with self._lock:
            if version_ms > self._last_ms:
                self._last_ms = version_ms

    def issue(
        self,
        now_ms: int,
        stored_version_ms: int | None = None,
        tombstone_version_ms: int | None = None,
    ) -> int:
        with self._lock:
            self._last_ms = next_version_ms(
                now_ms, self._last_ms, stored_version_ms, tombstone_version_ms
            )
            return self._last_ms
