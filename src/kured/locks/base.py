"""The ``Lock`` protocol every backend implements (etcd, the Kubernetes DaemonSet annotation).

Semantics (kured's, docs/reference/kured-behaviour.md §2.5), with our fixes noted:

* At most ``max_holders`` (``--concurrency``) holders at once, enforced by the store's
  compare-and-swap, never by timing.
* A holder record carries the node id, the acquisition time, its own TTL and whether the node
  was already cordoned (``unschedulable``) when it took the lock.
* A record expires when its TTL > 0 and ``now - created >= TTL``. TTL 0 never expires: a hung
  node holds the lock forever and nothing cascades.
* Acquiring a lock this node already holds succeeds and does not refresh ``created``.
* ``release`` removes only this node's record; releasing a lock not held is not an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from kured.core.lockrecord import LockEntry

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MIN_UTC = datetime.min.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Holder:
    """One lock holder. ``created_at`` is timezone-aware UTC; ``ttl_seconds`` 0 = never
    expires. ``created_raw`` keeps the record's original RFC 3339 text (nanoseconds)."""

    node_id: str
    created_at: datetime
    ttl_seconds: float
    unschedulable: bool
    created_raw: str = ""

    def expired(self, now: datetime) -> bool:
        return self.ttl_seconds > 0 and (now - self.created_at).total_seconds() >= self.ttl_seconds

    @classmethod
    def from_entry(cls, entry: LockEntry) -> Holder:
        """The holder a stored kured lock entry describes. ``created_at`` is truncated to
        microseconds (clamped to ``datetime.min`` for Go times before year 1); the exact text
        stays in ``created_raw``. Decisions about expiry are made on the entry itself, in
        nanoseconds (``kured.core.lockrecord``)."""
        try:
            created_at = _EPOCH + timedelta(microseconds=entry.created_ns // 1000)
        except OverflowError:
            created_at = _MIN_UTC
        return cls(
            node_id=entry.node_id,
            created_at=created_at,
            ttl_seconds=entry.ttl_ns / 1e9,
            unschedulable=entry.unschedulable,
            created_raw=entry.created_raw or entry.created_text,
        )


@dataclass(frozen=True)
class Attempt:
    """An acquire's answer with the holders it was decided on (record order, expired entries
    included): the record after our write if we wrote, else the record as read."""

    acquired: bool
    holders: list[Holder]


class Lock(Protocol):
    """A cluster-wide semaphore of reboot slots. Every method may raise ``LockError``."""

    async def acquire(self, node_id: str, unschedulable: bool, ttl_seconds: float) -> bool:
        """Take a slot for ``node_id``; True if it holds one now (already held counts)."""
        ...

    async def release(self, node_id: str) -> None:
        """Give up ``node_id``'s slot (a no-op if it holds none)."""
        ...

    async def holders(self) -> list[Holder]:
        """Current unexpired and expired holders, in record order."""
        ...
