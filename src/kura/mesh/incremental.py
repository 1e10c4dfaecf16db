"""Incremental catch-up: a bootstrap pass that pulls only what changed since this node's durable
cursor with a peer (issue 11, deliverable 2: catch-up costs what changed, not the dataset).

Each pass against one peer (``Bootstrapper`` runs them; readiness is gated the same way):

* **With a cursor** (``peer_cursors``: the peer's epoch and the change number applied up to)
  whose epoch is the peer's current one and which is not ahead of the peer's head: pull the
  peer's change feed (``GET /_internal/changes``) from the cursor, page by page. Each page is
  applied like bootstrap applies anything (``Bootstrapper.apply_changes``: its tombstones
  first, then its manifests through the same single-flight, reservation-before-staging body
  download), and only once the whole page is applied is the cursor advanced, durably. A crash
  mid-page re-applies that page after the restart (idempotent: last writer wins); nothing past
  the durable cursor is ever skipped. Mode ``incremental``.
* **Without one** (a fresh node), or with one from another epoch (the peer's index was rebuilt)
  or ahead of the peer's head (the peer was restored from an older copy): read the peer's head
  first, then run the full bootstrap walk, then store that head as the cursor and pull the feed
  from it to the end, so changes made during the walk are not lost in the gap. Mode ``full``.
  A peer answering 404 for the feed (an older kura, during a rolling upgrade) gets the full
  walk on every pass, and no cursor.

A cursor is advanced only after the page is applied, so "cursor = s" means: this node has
applied every change of that peer numbered up to ``s`` (or a newer version of it). The peer
relies on that to clear its catch-up mark for this node (``mesh.catch_up``).

Event-loop confined; cursor reads and writes go through the ``ChangeLog`` port
(``storage.ports``), on the storage writer thread.

A pass runs at start-up, when a peer joins and when a peer is seen healthy again after a partition
(``kura.app``); ``/status`` shows per peer, under ``bootstrap.peers``, its ``mode`` and ``cursor``.
Cost, measured in ``tests/e2e/test_incremental_catch_up.py`` (kind ``changes`` of
``kura_peer_metadata_bytes_total``, ``mesh.client``): a node restarted after 100 writes on its peer
holding 2,000 artifacts pulled them in 3 to 6 requests and about 38 KB, where a fresh node's full
bootstrap of the same 2,100 artifacts took 19 requests and 1,564,060 bytes (two walks): 4.8 to 4.9
% of one walk.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from kit.failpoint import failpoint
from kura.core.manifest import Manifest
from kura.mesh.client import PeerClient, PeerError
from kura.mesh.wire import PAGE_LIMIT_DEFAULT
from kura.storage.outbox import ChangesPage
from kura.storage.ports import ChangeLog

if TYPE_CHECKING:
    from kura.mesh.bootstrap import PeerProgress

log = logging.getLogger(__name__)

FULL = "full"
INCREMENTAL = "incremental"

Progressed = Callable[[], None]
FullPass = Callable[["PeerProgress", Progressed], Awaitable[None]]
ApplyChanges = Callable[
    ["PeerProgress", list[tuple[str, int]], list[Manifest], Progressed], Awaitable[None]
]


class EpochChanged(Exception):
    """The peer's epoch changed during a pass: the next pass starts over with a full walk."""


class CursorPass:
    """See module docstring. ``node_url()`` is this node's internal URL (sent as ``Kura-Node``)."""

    def __init__(
        self,
        replica_log: ChangeLog,
        client: PeerClient,
        node_url: Callable[[], str],
        page_limit: int = PAGE_LIMIT_DEFAULT,
    ) -> None:
        self._log = replica_log
        self._client = client
        self._node_url = node_url
        self._limit = page_limit

    async def run(
        self,
        state: PeerProgress,
        progressed: Progressed,
        full_pass: FullPass,
        apply_changes: ApplyChanges,
        *,
        background: bool = False,
    ) -> None:
        """One pass against ``state.peer``. Raises what ``full_pass``/``apply_changes`` raise,
        ``PeerError``, or ``EpochChanged``; the durable cursor then stays at the last page
        fully applied. A ``background`` pass (the poll) skips a peer without the feed instead
        of walking it whole every interval."""
        peer = state.peer
        cursor = await self._log.load_cursor(peer)
        state.cursor_seq = None if cursor is None else cursor.seq
        try:
            page = await self._page(peer, 0 if cursor is None else cursor.seq, cursor is None)
        except PeerError as exc:
            if exc.status != 404:
                raise
            # A peer without the feed (an older kura, mid rolling upgrade): the full walk.
            if background:
                return
            state.mode = FULL
            await full_pass(state, progressed)
            return
        if cursor is not None and cursor.epoch == page.epoch and cursor.seq <= page.head_seq:
            state.mode = INCREMENTAL
            log.info(
                "catch-up from %s: incremental from cursor %d (peer head %d)",
                peer,
                cursor.seq,
                page.head_seq,
            )
            state.bytes_total = state.bytes_done = 0
            state.artifacts_total = state.artifacts_done = 0
        else:
            if cursor is not None:
                log.warning(
                    "catch-up from %s: cursor %d of epoch %s does not fit the peer's feed "
                    "(epoch %s, head %d); running a full bootstrap",
                    peer,
                    cursor.seq,
                    cursor.epoch,
                    page.epoch,
                    page.head_seq,
                )
            state.mode = FULL
            epoch, head = page.epoch, page.head_seq
            await full_pass(state, progressed)
            state.cursor_seq = await self._store(peer, epoch, head)
            page = await self._page(peer, head, False)
            self._check_epoch(peer, epoch, page)
        while True:
            await apply_changes(state, page.tombstones, page.manifests, progressed)
            failpoint("bootstrap.changes_page_applied")  # tests: a crash before the cursor moves
            state.cursor_seq = await self._store(peer, page.epoch, page.next_since)
            progressed()
            if not page.more:
                return
            epoch = page.epoch
            page = await self._page(peer, page.next_since, False)
            self._check_epoch(peer, epoch, page)

    async def _page(self, peer: str, since: int, head_only: bool) -> ChangesPage:
        # Reading only the head costs one row; the page is thrown away.
        limit = 1 if head_only else self._limit
        return await self._client.changes_page(peer, since, limit, self._node_url())

    async def _store(self, peer: str, epoch: str, seq: int) -> int:
        await self._log.store_cursor(peer, epoch, seq)
        return seq

    @staticmethod
    def _check_epoch(peer: str, epoch: str, page: ChangesPage) -> None:
        if page.epoch != epoch:
            raise EpochChanged(f"{peer}: epoch changed from {epoch} to {page.epoch} mid-pass")
