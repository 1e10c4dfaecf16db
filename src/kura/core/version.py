"""Versions and the last-writer-wins rule; the clock that issues local versions by these rules
is ``kura.storage.version_clock`` (it holds a lock, which the pure core does not).

Every artifact carries ``version_ms``, an integer millisecond stamp from the writer. An
incoming copy is applied only if it is newer than what is stored and strictly newer than the
namespace tombstone; an older copy is ignored (Kura's apply rule,
docs/reference/kura-behaviour.md §2.6). Version 0 is never applied over a tombstone.

Ties: two nodes can write the same key in the same millisecond. Upstream ignores an equal
version, so each node keeps its own bytes and the mesh never converges. Here an equal version
is broken by the content digest (the larger SHA-256 hex wins), which every node decides the
same way; identical copies are ignored.

Versions never go backwards (a hybrid-logical-clock rule in whole milliseconds; Kulkarni et al.,
"Logical Physical Clocks", 2014, https://cse.buffalo.edu/tech-reports/2014-04.pdf): a local
write's version is ``max(now, last issued + 1, stored + 1, tombstone + 1)``, and every version
learned from a peer advances the clock. Without it, a node whose clock runs behind a peer's
issues versions below the peer's copy: its write is answered 200 but loses everywhere.

A peer's version more than ``max_skew_ms`` ahead of this node's clock is refused
(``FutureVersion``): one such version, accepted, would pull every later local version up to it
and let a forged or broken peer shadow every write (a far-future tombstone cleans a namespace
for good).
"""

from __future__ import annotations

import enum

from kura.core.errors import InvalidRequest


class ApplyOutcome(enum.Enum):
    """What happened to one incoming artifact copy. Values are metric label values."""

    APPLIED = "applied"
    IGNORED_STALE = "ignored_stale"
    IGNORED_TOMBSTONE = "ignored_tombstone"


def decide_apply(
    incoming_version_ms: int,
    stored_version_ms: int | None,
    tombstone_version_ms: int | None,
    incoming_sha256: str = "",
    stored_sha256: str = "",
) -> ApplyOutcome:
    """Decide whether an incoming copy replaces the stored one.

    ``stored_version_ms`` is None when nothing readable is stored; ``tombstone_version_ms`` is
    None when the namespace has no tombstone. Equal versions are broken by the digests (see
    module docstring). Pure; safe to call from anywhere.
    """
    if tombstone_version_ms is not None and incoming_version_ms <= tombstone_version_ms:
        return ApplyOutcome.IGNORED_TOMBSTONE
    if stored_version_ms is not None:
        if incoming_version_ms < stored_version_ms:
            return ApplyOutcome.IGNORED_STALE
        if incoming_version_ms == stored_version_ms and incoming_sha256 <= stored_sha256:
            return ApplyOutcome.IGNORED_STALE
    return ApplyOutcome.APPLIED


def next_version_ms(
    now_ms: int,
    last_issued_ms: int,
    stored_version_ms: int | None = None,
    tombstone_version_ms: int | None = None,
) -> int:
    """A local write's version: wall-clock ms, but strictly above the last one this node issued
    (or learned from a peer), the stored copy's and the namespace tombstone's.

    Two writes in the same millisecond (or a clock step backwards) would otherwise get equal
    versions and the second would be dropped by peers as stale; a peer's newer copy or
    tombstone would make the local write lose (see module docstring). Pure.
    """
    floor = last_issued_ms
    if stored_version_ms is not None:
        floor = max(floor, stored_version_ms)
    if tombstone_version_ms is not None:
        floor = max(floor, tombstone_version_ms)
    return max(now_ms, floor + 1)


class FutureVersion(InvalidRequest):
    """A peer's version lies further ahead of this node's clock than the configured skew
    allows; it is not applied now (400 with ``Kura-Refusal: future_version``: a sender keeps
    the copy queued and retries it with backoff, and it applies once this node's clock is
    within the skew; bootstrap and read-through skip it)."""


def ahead_of_skew_ms(version_ms: int, now_ms: int, max_skew_ms: int) -> int:
    """How far ``version_ms`` lies beyond ``now_ms + max_skew_ms`` (0 when acceptable). Pure."""
    return max(0, version_ms - now_ms - max_skew_ms)
