"""The replication outbox's public vocabulary: message kinds and one pending delivery.

The rows live in the metadata index (table ``outbox``, written in the same transaction as the
data change: ``storage.index``; read by ``storage.outbox_queries``, deleted by ``storage.peer_queue``). This module is
the one the mesh imports (``mesh.shipper``): it holds no SQL, so the SQLite modules stay private
to ``kura.storage`` (an import-linter contract in ``pyproject.toml``).
"""

from __future__ import annotations

from dataclasses import dataclass

UPSERT = "upsert_artifact"
DELETE_NAMESPACE = "delete_namespace"


@dataclass(frozen=True)
class OutboxMessage:
    """One pending delivery to one peer. ``kind`` is UPSERT or DELETE_NAMESPACE."""

    id: int
    peer: str
    kind: str
    artifact_id: str
    namespace_id: str
    version_ms: int
    enqueued_at_ms: int
