"""Versions and the last-writer-wins rule.

Every artifact carries ``version_ms``, the writer's wall-clock time in integer milliseconds. An
incoming copy is applied only if it is newer than what is stored and strictly newer than the
namespace tombstone; an older copy is ignored (Kura's apply rule,
shared/reference/kura-behaviour.md §2.6). Version 0 is never applied over a tombstone.

Ties: two nodes can write the same key in the same millisecond. Upstream ignores an equal
version, so each node keeps its own bytes and the mesh never converges. Here an equal version
is broken by the content digest (the larger SHA-256 hex wins), which every node decides the
same way; identical copies are ignored.
"""

from __future__ import annotations

import enum


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


def next_version_ms(now_ms: int, last_issued_ms: int) -> int:
    """A local write's version: wall-clock ms, but strictly above the last one this node issued.

    Two writes in the same millisecond (or a clock step backwards) would otherwise get equal
    versions and the second would be dropped by peers as stale.
    """
    return max(now_ms, last_issued_ms + 1)
