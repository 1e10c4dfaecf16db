"""What a node's index and blob dir say about one stored body: inline in its row, or a file.

Read through a read-only SQLite connection (WAL lets it run beside the node), looked up by the
body's SHA-256, so a test needs no knowledge of how a protocol names its keys."""

from __future__ import annotations

import hashlib
import sqlite3

from tests.conftest import NodeProcess


def stored_as(node: NodeProcess, body: bytes) -> str:
    """``"inline"`` (the row holds the body and no blob file of the artifact exists), ``"file"``
    (no body in the row, exactly one blob file), or ``"absent"``. Raises AssertionError for
    anything else (an inline row with a leftover file, a file row with several files)."""
    db = node.data_dir / "index.sqlite3"
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT artifact_id, inline_body FROM artifacts WHERE sha256 = ?",
            (hashlib.sha256(body).hexdigest(),),
        ).fetchall()
    finally:
        conn.close()
    if not rows:
        return "absent"
    assert len(rows) == 1, rows
    aid, inline_body = rows[0]
    files = [p for p in node.blob_files() if p.name.startswith(aid)]
    if inline_body is not None:
        assert bytes(inline_body) == body, "the row's inline body is not the body"
        assert files == [], f"inline row with leftover files {files}"
        return "inline"
    assert len(files) == 1, f"file row with files {files}"
    assert files[0].read_bytes() == body
    return "file"
