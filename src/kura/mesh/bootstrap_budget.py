"""Bootstrap within the disk budget: newest first, stop at the budget, never evict its own fetches.

Upstream Kura's two-peer bootstrap of a node whose peers held more than its disk budget evicted
what it had just fetched and thrashed (issue 11, "Eviction knows nothing of bootstrap"). The
full pass of ``mesh.bootstrap`` therefore follows three rules, owned here:

* **Newest first.** A pass walks its peer's manifests by (version_ms descending, artifact_id)
  (``GET /_internal/bootstrap/manifests?order=newest``, a compound cursor, an index on the peer).
  A peer that predates the ordering answers in artifact_id order; its pass still completes, in
  that order, and this is logged once per pass. *Several peers:* each pass walks its own peer
  newest first and passes run concurrently; ``VersionGate`` merges them by version: while the
  budget may bind (some running pass is still counting, or the stored bytes plus what the
  running passes still need exceed the allowance), a pass admits its next artifact only when no
  other running pass is at a newer one. So the union is admitted newest first across peers
  (equal keys, the same artifact on converged peers, go together and single flight downloads
  it once); a pass that waits is held at the pace of the others. With room for everything the
  gate is open and passes run at their own pace.
* **Stop at the budget.** ``DiskAllowance`` admits an artifact only while the stored bytes, plus
  the bytes of admitted downloads not yet committed, plus this artifact stay within
  ``limit_bytes``: ``KURA_BOOTSTRAP_DISK_PERCENT`` of ``KURA_MAX_DISK_BYTES`` (default 90 %,
  leaving the rest for live writes, so the eviction that a live write triggers has room before it
  reaches the bootstrap's data). Bootstrap never evicts to make room: bytes the node already held
  count against the allowance. At the first artifact that does not fit, the pass stops fetching;
  it walks the rest of its peer's list only to count what it skipped (result ``skipped_budget``),
  then completes, so the node becomes ready and the rest is served by read-through.
* **Never evict what it fetched.** While bootstrap is active (a pass runs, or a peer still gates
  readiness), ``Bootstrapper.eviction_floor_ms`` (which storage reads: the store's
  ``eviction_floor_ms`` argument) is the wall-clock ms at which it became active:
  eviction then only picks artifacts last used before it. Everything fetched, written or read
  since is kept; a live write may still evict older data that nobody used since.

``budget_report`` turns the per-peer counts of the last passes into the ``/ready`` warning and
``/status`` fields: held = the most any peer listed that was already here + everything the passes
applied (single flight: each artifact is applied by one pass); skipped = the largest count one
pass skipped; the peers' data = max(the largest listing, held + skipped). Exact for a converged
mesh and for disjoint peers, a lower bound of the union in between. Event-loop confined.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from kura.core.manifest import Manifest
from kura.mesh.client import PeerClient
from kura.mesh.wire import PAGE_LIMIT_MAX

log = logging.getLogger(__name__)

SKIPPED_BUDGET = "skipped_budget"


class BudgetedPeer(Protocol):
    """What ``budget_report`` reads of a peer's bootstrap progress (``PeerProgress``)."""

    peer: str
    listed_artifacts: int
    listed_bytes: int
    artifacts_total: int  # needed: listed and not held at the start of the pass
    bytes_total: int
    applied_artifacts: int
    applied_bytes: int
    skipped_artifacts: int
    skipped_bytes: int
    budget_stopped: bool


class DiskAllowance:
    """The bytes bootstrap may fill: ``limit_bytes`` of stored artifacts (see module docstring).

    ``used_bytes()`` is the store's current total (``StorageStats.used_bytes``). Claims are per
    artifact_id, so two passes admitting the same artifact count it once; the owner of a claim
    releases it once the artifact is committed or abandoned."""

    def __init__(self, limit_bytes: int, used_bytes: Callable[[], int]) -> None:
        self.limit_bytes = limit_bytes
        self._used_bytes = used_bytes
        self._claims: dict[str, int] = {}

    @property
    def claimed_bytes(self) -> int:
        return sum(self._claims.values())

    def claim(self, artifact_id: str, size_bytes: int) -> bool | None:
        """True: claimed now (the caller must ``release`` it); None: already claimed by another
        pass (nothing to release); False: it does not fit, nothing claimed."""
        if artifact_id in self._claims:
            return None
        if self._used_bytes() + self.claimed_bytes + size_bytes > self.limit_bytes:
            return False
        self._claims[artifact_id] = size_bytes
        return True

    def release(self, artifact_id: str) -> None:
        self._claims.pop(artifact_id, None)


class EvictionGuard:
    """Holds the eviction floor while bootstrap is active (module docstring).

    ``set_floor(ms | None)`` writes the floor storage reads (the store's ``eviction_floor_ms``);
    ``now_ms()`` is the wall clock the index stamps ``last_access_ms`` with, so every row
    bootstrap commits is at or after the floor."""

    def __init__(self, set_floor: Callable[[int | None], None], now_ms: Callable[[], int]) -> None:
        self._set_floor = set_floor
        self._now_ms = now_ms
        self.floor_ms: int | None = None

    def update(self, active: bool) -> None:
        if active and self.floor_ms is None:
            self.floor_ms = self._now_ms()
            self._set_floor(self.floor_ms)
            log.info("bootstrap active: eviction keeps everything used from now on")
        elif not active and self.floor_ms is not None:
            self.floor_ms = None
            self._set_floor(None)
            log.info("bootstrap finished: eviction is plain least-recently-used again")


Key = tuple[int, str]  # (-version_ms, artifact_id): smaller is admitted first


class VersionGate:
    """Merges the running passes' newest-first walks by version (module docstring).

    ``join`` when a pass starts (its position unknown until its first ``turn``, which holds the
    others back while it counts), ``turn`` before admitting each artifact, ``leave`` when it
    admits no more (idempotent). ``engaged()`` says whether the budget may bind; while it does
    not, ``turn`` never waits. ``progressed()`` is called on every wake-up: the others moved."""

    def __init__(self, engaged: Callable[[], bool]) -> None:
        self._engaged = engaged
        self._heads: dict[str, Key | None] = {}
        self._moved = asyncio.Event()

    @property
    def counting(self) -> bool:
        return any(head is None for head in self._heads.values())

    @property
    def peers(self) -> list[str]:
        return list(self._heads)

    def join(self, peer: str) -> None:
        self._heads[peer] = None
        self._wake()

    def leave(self, peer: str) -> None:
        if self._heads.pop(peer, 0) != 0:
            self._wake()

    async def turn(self, peer: str, manifest: Manifest, progressed: Callable[[], None]) -> None:
        key = (-manifest.version_ms, manifest.artifact_id)
        self._heads[peer] = key
        self._wake()
        while self._engaged() and not self._first(peer, key):
            moved = self._moved
            await moved.wait()
            progressed()

    def _first(self, peer: str, key: Key) -> bool:
        return all(h is not None and key <= h for p, h in self._heads.items() if p != peer)

    def _wake(self) -> None:
        self._moved.set()
        self._moved = asyncio.Event()


async def newest_pages(
    client: PeerClient, peer: str, progressed: Callable[[], None]
) -> AsyncIterator[list[Manifest]]:
    """Every manifest ``peer`` lists, in pages of up to ``PAGE_LIMIT_MAX``, newest first
    (artifact_id order from an older peer)."""
    after: str | None = None  # the first page
    warned = False
    while True:
        page, next_after, newest = await client.manifests_newest_page(peer, after, PAGE_LIMIT_MAX)
        progressed()
        if not newest and not warned:
            warned = True
            log.warning(
                "bootstrap: %s predates newest-first paging; its manifests come in artifact_id "
                "order, so a stop at the disk budget keeps an arbitrary share of them",
                peer,
            )
        yield page
        if next_after is None:
            return
        after = next_after


@dataclass(frozen=True)
class BudgetReport:
    """The share of the peers' data held when bootstrap stopped at the budget (``stopped``)."""

    stopped: bool
    limit_bytes: int
    peer_artifacts: int  # the largest peer listing
    peer_bytes: int
    held_artifacts: int  # of that listing, not skipped
    held_bytes: int
    skipped_artifacts: int
    skipped_bytes: int

    @property
    def held_percent(self) -> int:
        return 100 if self.peer_bytes == 0 else int(100 * self.held_bytes / self.peer_bytes)

    def as_json(self) -> dict[str, object]:
        return {
            "budget_stopped": self.stopped,
            "budget_limit_bytes": self.limit_bytes,
            "peer_data_artifacts": self.peer_artifacts,
            "peer_data_bytes": self.peer_bytes,
            "held_artifacts": self.held_artifacts,
            "held_bytes": self.held_bytes,
            "held_percent": self.held_percent,
            "skipped_artifacts": self.skipped_artifacts,
            "skipped_bytes": self.skipped_bytes,
        }

    def warning(self, rest: str) -> str:
        """The ``/ready`` warning; ``rest`` says where the skipped artifacts are served from."""
        return (
            f"bootstrap stopped at the disk budget ({self.limit_bytes} bytes): holding "
            f"{self.held_percent}% of the peers' data ({self.held_artifacts} of "
            f"{self.peer_artifacts} artifacts, {self.held_bytes} of {self.peer_bytes} bytes); "
            f"{rest}"
        )


def budget_report(peers: Iterable[BudgetedPeer], limit_bytes: int) -> BudgetReport:
    """Summarise the last passes' counts (module docstring: held, skipped, the peers' data)."""
    known = list(peers)
    if not known:
        return BudgetReport(False, limit_bytes, 0, 0, 0, 0, 0, 0)
    held_artifacts = max(p.listed_artifacts - p.artifacts_total for p in known) + sum(
        p.applied_artifacts for p in known
    )
    held_bytes = max(p.listed_bytes - p.bytes_total for p in known) + sum(
        p.applied_bytes for p in known
    )
    skipped_artifacts = max(p.skipped_artifacts for p in known)
    skipped_bytes = max(p.skipped_bytes for p in known)
    return BudgetReport(
        stopped=any(p.budget_stopped for p in known),
        limit_bytes=limit_bytes,
        peer_artifacts=max(
            max(p.listed_artifacts for p in known), held_artifacts + skipped_artifacts
        ),
        peer_bytes=max(max(p.listed_bytes for p in known), held_bytes + skipped_bytes),
        held_artifacts=held_artifacts,
        held_bytes=held_bytes,
        skipped_artifacts=skipped_artifacts,
        skipped_bytes=skipped_bytes,
    )
