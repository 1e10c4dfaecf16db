"""A data directory across kura versions (issue 31, item 1; docs/upgrading.md).

A node records in its index which kura last opened it for writing (``meta['kura_version']``,
``kura.storage.schema``). A data directory a newer kura wrote, in a metadata schema or blob
layout past this kura's, is refused at start-up by ``kura serve`` (exit 1) with a message that
names both versions and what to do, and is left byte for byte as it was. The "newer kura" is
what the next release would leave: HEAD's own data directory, then changed directly with
sqlite3 (and the layout file) the way that release's migration would change it.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

from kura import __version__
from kura.storage.blobs import LAYOUT_VERSION
from kura.storage.schema import SCHEMA_VERSION
from tests.conftest import NodeProcess, serve_refused

FUTURE = "0.3.0"
KEPT = "/cache/kept"  # the plain HTTP cache
BODY = b"kept across versions " * 100


def snapshot(directory: Path) -> dict[str, str]:
    """Every entry under ``directory``: a file's SHA-256 and size, a directory as ``dir``. The
    index's ``-shm`` is left out: it is SQLite's shared-memory index of the WAL, which every
    reader of a WAL, a read-only one too, creates or updates
    (https://www.sqlite.org/walformat.html#shm); it holds no data and is rebuilt from the WAL."""
    out = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs:
            out[os.path.relpath(Path(root, name), directory)] = "dir"
        for name in files:
            if name.endswith("-shm"):
                continue
            data = Path(root, name).read_bytes()
            out[os.path.relpath(Path(root, name), directory)] = (
                f"{hashlib.sha256(data).hexdigest()} {len(data)}"
            )
    return out


def meta(data_dir: Path) -> dict[str, str]:
    conn = sqlite3.connect(data_dir / "index.sqlite3")
    try:
        return dict(conn.execute("SELECT k, v FROM meta").fetchall())
    finally:
        conn.close()


def written_by_head(start_node: Callable[..., NodeProcess]) -> NodeProcess:
    """A data directory HEAD wrote, with one artifact in it; the node stopped."""
    node = start_node(process=True)
    with node.client() as c:
        assert c.put(KEPT, content=BODY).status_code in (200, 201, 204)
    assert node.stop() == 0
    return node


def test_a_node_records_its_kura_version_in_the_index(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = written_by_head(start_node)
    recorded = meta(node.data_dir)
    assert recorded["kura_version"] == __version__
    assert recorded["schema_version"] == str(SCHEMA_VERSION)  # no schema bump for the record


def test_a_data_dir_without_the_record_opens_and_gets_it(
    start_node: Callable[..., NodeProcess],
) -> None:
    """kura 0.1.0 writes no ``kura_version`` row (and never removes one)."""
    node = written_by_head(start_node)
    conn = sqlite3.connect(node.data_dir / "index.sqlite3")
    with conn:
        conn.execute("DELETE FROM meta WHERE k = 'kura_version'")
    conn.close()
    again = start_node(process=True)
    assert again.data_dir == node.data_dir
    with again.client() as client:
        assert client.get(KEPT).content == BODY
    assert again.stop() == 0
    assert meta(node.data_dir)["kura_version"] == __version__


def test_a_metadata_schema_of_a_newer_kura_is_refused_and_left_untouched(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = written_by_head(start_node)
    conn = sqlite3.connect(node.data_dir / "index.sqlite3", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("BEGIN")  # what the next release's migration would commit
    conn.execute("ALTER TABLE artifacts ADD COLUMN next_release_column TEXT")
    conn.execute("DROP INDEX artifacts_by_version")  # which this kura's schema would re-create
    conn.execute("UPDATE meta SET v = ? WHERE k = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    conn.execute("UPDATE meta SET v = ? WHERE k = 'kura_version'", (FUTURE,))
    conn.execute("COMMIT")
    conn.close()
    before = snapshot(node.data_dir)
    stderr = serve_refused(node.env, exit_code=1)
    assert (
        f"this data directory was written by kura {FUTURE} (metadata schema "
        f"{SCHEMA_VERSION + 1}); kura {__version__} reads metadata schemas 1-{SCHEMA_VERSION}: "
        f"run kura {FUTURE} or later, or move the data directory aside and let the node "
        "bootstrap from its peers"
    ) in stderr, stderr
    assert snapshot(node.data_dir) == before


def test_a_blob_layout_of_a_newer_kura_is_refused_and_left_untouched(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = written_by_head(start_node)
    conn = sqlite3.connect(node.data_dir / "index.sqlite3", isolation_level=None)
    conn.execute("UPDATE meta SET v = ? WHERE k = 'kura_version'", (FUTURE,))
    conn.close()
    future_layout = str(int(LAYOUT_VERSION) + 1)
    (node.data_dir / "layout").write_text(future_layout + "\n")
    # The next layout keeps its files elsewhere: a refused start must not make ``blobs/``.
    (node.data_dir / "blobs").rename(node.data_dir / f"objects-{future_layout}")
    before = snapshot(node.data_dir)
    stderr = serve_refused(node.env, exit_code=1)
    assert (
        f"this data directory was written by kura {FUTURE} (blob layout {future_layout}); "
        f"kura {__version__} reads blob layouts 1-{LAYOUT_VERSION}: run kura {FUTURE} or later"
    ) in stderr, stderr
    assert snapshot(node.data_dir) == before
    # Without the index's record the message still says what to do.
    conn = sqlite3.connect(node.data_dir / "index.sqlite3", isolation_level=None)
    conn.execute("DELETE FROM meta WHERE k = 'kura_version'")
    conn.close()
    stderr = serve_refused(node.env, exit_code=1)
    assert (
        f"written by a newer kura (blob layout {future_layout}); kura {__version__} reads blob "
        f"layouts 1-{LAYOUT_VERSION}: run a kura that reads blob layout {future_layout}"
    ) in stderr, stderr


def future_schema(conn: sqlite3.Connection) -> None:
    """Commit on ``conn`` what the next release's migration would: a schema past this one's."""
    conn.execute("BEGIN")
    conn.execute("ALTER TABLE artifacts ADD COLUMN next_release_column TEXT")
    conn.execute("UPDATE meta SET v = ? WHERE k = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    conn.execute("UPDATE meta SET v = ? WHERE k = 'kura_version'", (FUTURE,))
    conn.execute("COMMIT")


def refusal_of_schema(found: str) -> str:
    return (
        f"this data directory was written by kura {FUTURE} (metadata schema {found}); kura "
        f"{__version__} reads metadata schemas 1-{SCHEMA_VERSION}: run kura {FUTURE} or later"
    )


def test_a_newer_kura_that_crashed_leaves_its_wal_which_a_refusal_keeps_byte_for_byte(
    start_node: Callable[..., NodeProcess],
) -> None:
    """A killed newer kura leaves commits only in the ``-wal``: the refusal reads them (so it
    refuses) without replaying them into the file nor removing the ``-wal``."""
    node = written_by_head(start_node)
    writer = sqlite3.connect(node.data_dir / "index.sqlite3", isolation_level=None)
    try:
        writer.execute("PRAGMA wal_autocheckpoint=0")  # the commit stays in the -wal
        future_schema(writer)
        wal = node.data_dir / "index.sqlite3-wal"
        assert wal.stat().st_size > 0
        before = snapshot(node.data_dir)
        stderr = serve_refused(node.env, exit_code=1)
        assert refusal_of_schema(str(SCHEMA_VERSION + 1)) in stderr, stderr
        assert snapshot(node.data_dir) == before
    finally:
        writer.close()


def test_a_newer_data_dir_with_a_damaged_wal_is_refused_before_the_wal_is_set_aside(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = written_by_head(start_node)
    conn = sqlite3.connect(node.data_dir / "index.sqlite3", isolation_level=None)
    future_schema(conn)
    conn.close()
    (node.data_dir / "index.sqlite3-wal").write_bytes(b"not a WAL header " * 8)
    before = snapshot(node.data_dir)
    stderr = serve_refused(node.env, exit_code=1)
    assert refusal_of_schema(str(SCHEMA_VERSION + 1)) in stderr, stderr
    assert snapshot(node.data_dir) == before


def test_the_index_records_the_layout_and_a_lost_layout_file_is_refused(
    start_node: Callable[..., NodeProcess],
) -> None:
    """Without the record a data dir whose ``layout`` file is gone (a full disk failed its
    write) would be taken for a fresh one: layout written over, files reconciled away."""
    node = written_by_head(start_node)
    assert meta(node.data_dir)["layout"] == LAYOUT_VERSION
    (node.data_dir / "layout").unlink()
    before = snapshot(node.data_dir)
    stderr = serve_refused(node.env, exit_code=1)
    assert (
        f"the data directory's index records blob layout '{LAYOUT_VERSION}' but its layout "
        f"file is missing ({node.data_dir / 'layout'}): restore the file"
    ) in stderr, stderr
    assert snapshot(node.data_dir) == before
    # A newer kura's layout, recorded in the index, is refused whatever the file says.
    future_layout = str(int(LAYOUT_VERSION) + 1)
    conn = sqlite3.connect(node.data_dir / "index.sqlite3", isolation_level=None)
    conn.execute("UPDATE meta SET v = ? WHERE k = 'layout'", (future_layout,))
    conn.execute("UPDATE meta SET v = ? WHERE k = 'kura_version'", (FUTURE,))
    conn.close()
    for layout_file in (None, LAYOUT_VERSION):
        if layout_file is not None:
            (node.data_dir / "layout").write_text(layout_file + "\n")
        before = snapshot(node.data_dir)
        stderr = serve_refused(node.env, exit_code=1)
        assert (
            f"this data directory was written by kura {FUTURE} (blob layout {future_layout})"
        ) in stderr, stderr
        assert snapshot(node.data_dir) == before


def test_a_metadata_schema_missing_or_unparseable_is_refused_not_initialised(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = written_by_head(start_node)
    conn = sqlite3.connect(node.data_dir / "index.sqlite3", isolation_level=None)
    conn.execute("UPDATE meta SET v = ? WHERE k = 'kura_version'", (FUTURE,))
    conn.execute("UPDATE meta SET v = '5.1' WHERE k = 'schema_version'")
    conn.close()
    before = snapshot(node.data_dir)
    stderr = serve_refused(node.env, exit_code=1)  # no traceback of int('5.1')
    assert refusal_of_schema("'5.1'") in stderr, stderr
    assert snapshot(node.data_dir) == before
    conn = sqlite3.connect(node.data_dir / "index.sqlite3", isolation_level=None)
    conn.execute("DELETE FROM meta WHERE k = 'schema_version'")
    conn.close()
    before = snapshot(node.data_dir)
    stderr = serve_refused(node.env, exit_code=1)
    assert refusal_of_schema("(none)") in stderr, stderr
    assert snapshot(node.data_dir) == before


def test_a_layout_file_that_is_empty_not_text_or_not_a_file_is_refused_in_one_line(
    start_node: Callable[..., NodeProcess],
) -> None:
    """Each is refused with exit 1, no traceback, a message naming what is wrong and what to
    do (the index records the layout: restore the file), and the data dir left as it was."""
    node = written_by_head(start_node)
    layout = node.data_dir / "layout"

    def directory() -> None:
        layout.unlink()
        layout.mkdir()

    cases: list[tuple[str, Callable[[], object]]] = [
        ("is not text", lambda: layout.write_bytes(b"zz\x00\xff")),
        ("is empty", lambda: layout.write_bytes(b"")),
        ("is not a regular file", directory),
    ]
    for problem, damage in cases:
        damage()
        before = snapshot(node.data_dir)
        stderr = serve_refused(node.env, exit_code=1)
        assert (
            f"the data directory's index records blob layout '{LAYOUT_VERSION}' but its layout "
            f"file {problem} ({layout}): restore the file (echo {LAYOUT_VERSION} > {layout})"
        ) in stderr, stderr
        assert "not supported" not in stderr, stderr
        assert "Errno" not in stderr, stderr
        assert snapshot(node.data_dir) == before
    # Without the index's record: no kura wrote such a file.
    layout.rmdir()
    layout.write_bytes(b"\x1b[2J")
    conn = sqlite3.connect(node.data_dir / "index.sqlite3", isolation_level=None)
    conn.execute("DELETE FROM meta WHERE k = 'layout'")
    conn.close()
    before = snapshot(node.data_dir)
    stderr = serve_refused(node.env, exit_code=1)
    assert (
        f"this data directory's layout file {layout} says '\\x1b[2J', which no kura writes"
    ) in stderr, stderr
    assert "\x1b" not in stderr, stderr
    assert snapshot(node.data_dir) == before


def test_a_metadata_schema_no_kura_writes_is_refused_as_damaged_not_migrated(
    start_node: Callable[..., NodeProcess],
) -> None:
    """0 and below, or garbled while this kura (not a newer one) is the recorded writer: not
    "run kura 0.2.0 or later" (this is kura 0.2.0), and never migrated (a migration from 0
    would renumber the change feed under a new epoch)."""
    node = written_by_head(start_node)
    for found, shown in (("0", "0"), ("-1", "'-1'"), ("abc", "'abc'")):
        conn = sqlite3.connect(node.data_dir / "index.sqlite3", isolation_level=None)
        conn.execute("UPDATE meta SET v = ? WHERE k = 'schema_version'", (found,))
        conn.close()
        before = snapshot(node.data_dir)
        stderr = serve_refused(node.env, exit_code=1)
        assert (
            f"this data directory's index records metadata schema {shown}, which no kura writes "
            f"(kura {__version__} reads schemas 1-{SCHEMA_VERSION}, last written by kura "
            f"{__version__}): it is damaged or not a kura data directory"
        ) in stderr, stderr
        assert "or later" not in stderr, stderr
        assert snapshot(node.data_dir) == before
        assert meta(node.data_dir)["schema_version"] == found


def test_a_recorded_kura_version_is_printed_escaped(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = written_by_head(start_node)
    hostile = "9.9.9\x1b[2J\nkura: fine"
    conn = sqlite3.connect(node.data_dir / "index.sqlite3", isolation_level=None)
    future_schema(conn)
    conn.execute("UPDATE meta SET v = ? WHERE k = 'kura_version'", (hostile,))
    conn.close()
    before = snapshot(node.data_dir)
    stderr = serve_refused(node.env, exit_code=1)
    assert f"this data directory was written by kura {hostile!a} (metadata schema" in stderr
    assert "\x1b" not in stderr, stderr
    assert "\nkura: fine" not in stderr, stderr
    assert snapshot(node.data_dir) == before


def test_a_recorded_layout_no_kura_writes_is_refused_as_damaged(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = written_by_head(start_node)
    conn = sqlite3.connect(node.data_dir / "index.sqlite3", isolation_level=None)
    conn.execute("UPDATE meta SET v = '\x1b[2J' WHERE k = 'layout'")
    conn.close()
    before = snapshot(node.data_dir)
    stderr = serve_refused(node.env, exit_code=1)
    assert (
        "this data directory's index records blob layout '\\x1b[2J', which no kura writes "
        f"(kura {__version__} reads blob layouts 1-{LAYOUT_VERSION}, last written by kura "
        f"{__version__}): it is damaged or not a kura data directory"
    ) in stderr, stderr
    assert "\x1b" not in stderr, stderr
    assert snapshot(node.data_dir) == before
