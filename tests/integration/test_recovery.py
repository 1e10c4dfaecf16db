"""Start-up under faults, against real node processes (storage.recovery, storage.reconcile):
a layout-1 data dir is migrated, what a crash leaves beside a blob is reconciled, a node on a
REAL full filesystem (a tmpfs filled to 100 %) starts read-only and serves its data, a node
whose disk fills is not ready until space is freed, and a node whose index is damaged in any of several ways sets it aside and starts instead of crash-looping
(issue 10).
"""

from __future__ import annotations

import errno
import hashlib
import os
import select
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import NodeProcess, node_env, spawn_node
from tests.e2e.mesh import wait_for
from tests.integration import rawhttp

pytestmark = pytest.mark.in_process

KiB = 1024
MiB = 1024 * KiB
SCOPE = "tenant_id=acme&namespace_id=rec"


def store_some(c: httpx.Client, n: int = 4) -> dict[str, bytes]:
    """Small, large (> 64 KiB) and inline artifacts; returns {GET path: body}."""
    stored: dict[str, bytes] = {}
    for i in range(n):
        small, large = os.urandom(3 * KiB + i), os.urandom(100 * KiB + i)
        assert c.put(f"/cache/rec/s{i}", content=small).status_code == 201
        assert c.put(f"/v8/artifacts/l{i}?slug=rec", content=large).status_code == 202
        value = os.urandom(200).hex()
        doc = {"cas_id": f"kv{i}", "entries": [{"value": value}]}
        assert c.put(f"/api/cache/keyvalue?{SCOPE}", json=doc).status_code == 204
        stored[f"/cache/rec/s{i}"] = small
        stored[f"/v8/artifacts/l{i}?slug=rec"] = large
        stored[f"/api/cache/keyvalue/kv{i}?{SCOPE}"] = (
            b'{"entries":[{"value":"' + value.encode() + b'"}]}'
        )
    return stored


def assert_served(node: NodeProcess, stored: dict[str, bytes]) -> None:
    with node.client() as c:
        for path, body in stored.items():
            r = c.get(path)
            assert r.status_code == 200, (path, r.status_code, r.text)
            assert hashlib.sha256(r.content).digest() == hashlib.sha256(body).digest(), path


def restart(node: NodeProcess, sig: int = signal.SIGTERM) -> NodeProcess:
    node.stop(sig)
    return spawn_node(node.log_path.parent, node.env)


# -- layout migration and reconciliation ------------------------------------------------------


def test_a_layout_1_data_dir_is_migrated_and_serves_every_artifact(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node()
    with node.client() as c:
        stored = store_some(c)
    node.stop()
    # Rewrite the dir as layout 1 kept it: one file per artifact, named by its id alone.
    files = node.blob_files()
    for path in files:
        path.rename(path.with_name(path.name[:64]))
    (node.data_dir / "layout").write_text("1\n")
    conn = sqlite3.connect(node.data_dir / "index.sqlite3", isolation_level=None)
    conn.execute("DELETE FROM meta WHERE k = 'layout'")  # layout 1's kura recorded none
    conn.close()
    node = spawn_node(node.log_path.parent, node.env)
    try:
        assert_served(node, stored)
        assert node.blob_files() == files  # each renamed to its layout-2 name
        assert (node.data_dir / "layout").read_text() == "2\n"
        assert f"migrated {len(files)} blob files from layout 1" in node.log()
        assert node.metric('kura_storage_reconciled_total{kind="file"}') == 0
    finally:
        node.stop()


def test_start_up_removes_versions_a_crash_left_beside_the_committed_one(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node(inline_max_bytes=0, process=True)  # files to leave beside; killed below
    body = os.urandom(10 * KiB)
    with node.client() as c:
        assert c.put("/cache/rec/gone", content=b"its file will vanish").status_code == 201
        (vanishing,) = node.blob_files()
        assert c.put("/cache/rec/key", content=body).status_code == 201
    (live,) = [p for p in node.blob_files() if p != vanishing]
    aid, version = live.name.split(".")[0], int(live.name.split(".")[1].split("-")[0])
    node.stop(signal.SIGKILL)
    uncommitted = live.with_name(f"{aid}.{version + 5}-{'a' * 16}")  # killed before its commit
    superseded = live.with_name(f"{aid}.{version - 5}-{'b' * 16}")  # killed before its unlink
    for path in (uncommitted, superseded):
        path.write_bytes(os.urandom(10 * KiB))
    vanishing.unlink()  # a row whose file is gone
    node = spawn_node(node.log_path.parent, node.env)
    try:
        assert_served(node, {"/cache/rec/key": body})
        assert node.blob_files() == [live]
        assert node.index_rows() == 1
        assert node.metric('kura_storage_reconciled_total{kind="file"}') == 2
        assert node.metric('kura_storage_reconciled_total{kind="row"}') == 1
        assert "dropping 1 index rows whose blob file is missing" in node.log()
        with node.client() as c:
            assert c.get("/cache/rec/gone").status_code == 404
    finally:
        node.stop()


# -- full disk --------------------------------------------------------------------------------


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 32 MiB tmpfs mounted for the test (needs root, as in CI); unmounted after."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def on_disk(disk: Path, **settings: object) -> dict[str, str]:
    """A node's environment with its data and tmp dirs on ``disk`` (its log beside it)."""
    return node_env(disk, data_dir=disk / "data", tmp_dir=disk / "tmp", **settings)


def fill(directory: Path) -> None:
    """Fill the filesystem of ``directory`` to 100 % with one filler file."""
    with (directory / "filler").open("wb", buffering=0) as f:
        for chunk in (1024 * KiB, 4 * KiB, 1):
            with pytest.raises(OSError, match="No space left") as raised:  # noqa: PT012
                while True:
                    f.write(b"\0" * chunk)
            assert raised.value.errno == errno.ENOSPC
    assert os.statvfs(directory).f_bavail == 0


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGKILL])
def test_a_node_on_a_full_disk_starts_serves_reads_and_refuses_writes(
    full_disk: Path, stop_signal: signal.Signals
) -> None:
    env = on_disk(full_disk)
    node = spawn_node(full_disk.parent / "logs", env)
    try:
        with node.client() as c:
            stored = store_some(c)
        node.stop(stop_signal)
        fill(full_disk)
        node = spawn_node(full_disk.parent / "logs", env)
        with node.client() as c:
            assert c.get("/up").status_code == 200
            assert_served(node, stored)
            r = c.put("/cache/rec/new", content=b"x" * 1000)
            assert r.status_code == 503, r.text
            assert "disk" in r.text
            assert c.get("/cache/rec/new").status_code == 404
            ready = c.get("/ready")
        assert ready.status_code == 503, ready.text  # writes are refused: not ready
        assert any("disk full" in r for r in ready.json()["reasons"]), ready.text
        assert node.metric("kura_disk_free_bytes") == 0
        assert "disk full" in node.log()
        if stop_signal == signal.SIGTERM:  # no -shm left: SQLite cannot size one, read-only
            assert node.metric("kura_storage_read_only") == 1
            assert "disk full at start-up" in node.log()
        assert node.proc.poll() is None
        assert "Traceback" not in node.log()
    finally:
        node.stop()


def test_a_full_disk_while_start_up_rebuilds_the_range_digests_leaves_the_node_serving(
    full_disk: Path,
) -> None:
    # The digests' back-fill runs in the background check (storage.startup_work): a full disk
    # there is a WARNING and unbuilt digests, never an exit (nor a crash loop).
    env = on_disk(full_disk)
    node = spawn_node(full_disk.parent / "logs", env)
    try:
        with node.client() as c:
            stored = store_some(c)
        db = sqlite3.connect(node.data_dir / "index.sqlite3")  # WAL: beside the node's own
        with db:
            db.execute("DELETE FROM meta WHERE k = 'ae_ranges_built'")  # to be rebuilt
        db.close()
        node.stop(signal.SIGKILL)  # its -shm stays: the next open needs no block
        fill(full_disk)
        node = spawn_node(full_disk.parent / "logs", env)
        with node.client() as c:
            assert_served(node, stored)
            assert wait_for(lambda: "range digests not built" in node.log(), 30), node.log()
            digests = httpx.get(
                f"{node.internal_url}/_internal/anti_entropy/digests?prefix=&depth=2"
            )
            assert digests.status_code == 503, digests.text
            assert "range digests not built" in digests.text
            assert_served(node, stored)
        assert node.proc.poll() is None, node.log()[-3000:]
        assert "Traceback" not in node.log()
        (full_disk / "filler").unlink()
        assert wait_for(  # maintenance builds them once there is room
            lambda: (
                httpx.get(
                    f"{node.internal_url}/_internal/anti_entropy/digests?prefix=&depth=2"
                ).status_code
                == 200
            ),
            30,
        ), node.log()[-3000:]
    finally:
        node.stop()


def test_a_disk_under_the_floor_is_not_ready_and_ready_again_by_itself_once_freed(
    full_disk: Path,
) -> None:
    """Issue 26: "/ready turns 503 while writes are refused", and a full disk never latches.
    A file beside the node takes a real 32 MiB tmpfs under ``KURA_MIN_FREE_DISK_BYTES``:
    writes answer 503 and ``/ready`` is 503 naming the disk (on main it said 200, with a
    warning). Deleting the file makes ``/ready`` 200 again with no write arriving (a node
    that is not ready may get none), and writes are taken again."""
    floor = 8 * MiB
    node = spawn_node(full_disk.parent / "logs", on_disk(full_disk, min_free_disk_bytes=floor))
    try:
        with node.client() as c:
            assert wait_for(lambda: c.get("/ready").status_code == 200, 30)
            assert c.put("/cache/rec/before", content=b"before").status_code == 201
            filler = full_disk / "filler"
            filler.write_bytes(b"\0" * (shutil.disk_usage(full_disk).free - floor // 2))
            assert shutil.disk_usage(full_disk).free < floor
            r = c.put("/cache/rec/during", content=b"during")
            assert r.status_code == 503, r.text
            ready = c.get("/ready")
            assert ready.status_code == 503, ready.text
            (reason,) = ready.json()["reasons"]
            assert reason.startswith("disk full: "), reason
            assert f"KURA_MIN_FREE_DISK_BYTES={floor}" in reason, reason
            assert not any("disk full" in w for w in ready.json()["warnings"]), ready.text
            assert c.get("/cache/rec/before").content == b"before"  # reads are still served

            filler.unlink()  # space comes back; no write reaches the node until it is ready
            assert wait_for(lambda: c.get("/ready").status_code == 200, 10), c.get("/ready").text
            assert c.put("/cache/rec/after", content=b"after").status_code == 201
            assert c.get("/cache/rec/after").content == b"after"
        assert node.index_rows() == 2
        assert "Traceback" not in node.log()
    finally:
        node.stop()


def test_the_workers_change_counter_is_bumped_on_a_disk_filled_after_it_was_created(
    full_disk: Path,
) -> None:
    """The primary bumps ``storage.hot_generation``'s counter when eviction frees space on a
    full disk; a store through its mapping to a block never written would be SIGBUS. Run in a
    second process, as the primary, so a SIGBUS fails the test instead of killing pytest."""
    code = (
        "import sys; from pathlib import Path;"
        "from kura.storage.hot_generation import SharedGeneration;"
        "g = SharedGeneration.create(Path(sys.argv[1])); print('created', flush=True);"
        "sys.stdin.readline(); g.bump(); print(g.value)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(full_disk)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "created\n"
        fill(full_disk)
        out, _ = proc.communicate("go\n", timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, proc.returncode  # -7: SIGBUS
    assert int(out) >= 1


# -- damaged index ----------------------------------------------------------------------------


def _garbage_header(db: Path) -> None:
    with db.open("r+b") as f:
        f.write(os.urandom(100))


def _truncated(db: Path) -> None:
    os.truncate(db, db.stat().st_size // 2 + 100)


def _zeroed_pages(db: Path) -> None:
    with db.open("r+b") as f:
        f.seek(db.stat().st_size // 3 // 4096 * 4096)
        f.write(b"\0" * 4 * 4096)


def _garbage_wal(db: Path) -> None:
    db.with_name(db.name + "-wal").write_bytes(os.urandom(8 * KiB))


def _zero_length(db: Path) -> None:
    os.truncate(db, 0)


def _directory(db: Path) -> None:
    db.unlink()
    db.mkdir()
    (db / "junk").write_bytes(b"junk")


DAMAGE = {
    "garbage header": _garbage_header,
    "truncated": _truncated,
    "zeroed pages": _zeroed_pages,
    "garbage wal": _garbage_wal,
    "zero length": _zero_length,
    "a directory": _directory,
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_node_with_a_damaged_index_sets_it_aside_and_starts(
    start_node: Callable[..., NodeProcess], damage: str
) -> None:
    node = start_node(inline_max_bytes=0)  # files, so the orphans of the lost rows can be counted
    with node.client() as c:
        stored = store_some(c, n=40)  # enough rows for many index pages
    node.stop()
    db = node.data_dir / "index.sqlite3"
    DAMAGE[damage](db)
    node = spawn_node(node.log_path.parent, node.env)
    try:
        with node.client() as c:
            assert c.get("/up").status_code == 200
            ready = c.get("/ready")
            assert ready.status_code == 200  # warnings, not reasons: the node serves
            warnings = ready.json()["warnings"]
            assert any("damaged" in w for w in warnings), warnings
            assert c.put("/cache/rec/after", content=b"after the damage").status_code == 201
            assert c.get("/cache/rec/after").content == b"after the damage"
        logged = [line for line in node.log().splitlines() if "ERROR kura.storage.recovery" in line]
        assert any("damaged" in line for line in logged), node.log()[-2000:]
        aside = sorted(p.name for p in node.data_dir.glob("index.sqlite3.damaged-*"))
        assert aside, list(node.data_dir.iterdir())
        if damage == "garbage wal":  # the main file was intact: everything is still there
            assert_served(node, stored)
        else:
            assert node.metric("kura_storage_index_damaged") == 1
            with node.client() as c:
                assert c.get("/cache/rec/s0").status_code == 404
            assert node.index_rows() == 1
            assert len(node.blob_files()) == 1
            # The acknowledged blobs are moved aside for an operator, never deleted.
            (kept,) = node.data_dir.glob("blobs.damaged-*")
            file_backed = [p for p in stored if "keyvalue" not in p]
            assert sum(1 for p in kept.rglob("*") if p.is_file()) == len(file_backed)
            assert any(kept.name in w for w in warnings), warnings
    finally:
        node.stop()
    node = spawn_node(node.log_path.parent, node.env)  # and the next start is a normal one
    try:
        with node.client() as c:
            assert c.get("/cache/rec/after").content == b"after the damage"
            assert not any("damaged" in w for w in c.get("/ready").json()["warnings"])
    finally:
        node.stop()


def test_concurrent_writes_are_refused_before_free_space_falls_below_the_floor(
    full_disk: Path,
) -> None:
    """Issue 26: each upload was admitted if free space minus its own length kept the floor,
    so uploads in flight together took a real 32 MiB filesystem to 5.3 MB free under an 8 MiB
    floor. Nine 3 MiB PUTs are admitted one by one (each holds its reservation, having sent
    one byte), then all send their bodies: the ones admitted all store, and free space stays
    at or above the floor."""
    floor, size = 8 * MiB, 3 * MiB
    node = spawn_node(full_disk.parent / "logs", on_disk(full_disk, min_free_disk_bytes=floor))
    try:
        admitted: list[socket.socket] = []
        refused: list[tuple[int, bytes]] = []
        for i in range(9):
            s = rawhttp.connect(node.url, timeout=30)
            rawhttp.send_head(s, "PUT", f"/cache/floor/{i}", {"Content-Length": str(size)})
            s.sendall(b"x")
            want = (len(admitted) + 1) * size

            def settled(s: socket.socket = s, want: int = want) -> bool:
                readable = select.select([s], [], [], 0)[0]
                return bool(readable) or node.metric("kura_tmp_reserved_bytes") == want

            assert rawhttp.wait_until(settled, timeout=20)
            if select.select([s], [], [], 0.2)[0]:
                status, _headers, body = rawhttp.read_response(s)
                refused.append((status, body))
                s.close()
            else:
                admitted.append(s)
        for s in admitted:
            s.sendall(b"x" * (size - 1))
        answers = [rawhttp.read_response(s) for s in admitted]
        stored = [status for status, _h, _b in answers]
        for s in admitted:
            s.close()
        free = shutil.disk_usage(full_disk).free
        assert free >= floor, (free, len(admitted), refused)
        assert stored == [201] * len(admitted), [b[:300] for _s, _h, b in answers]
        assert refused, "the filesystem cannot take all nine above the floor"
        assert all(status == 503 and b"must stay free" in body for status, body in refused)
        assert node.staging_files() == []
        assert node.metric("kura_tmp_reserved_bytes") == 0
        assert node.index_rows() == len(admitted)
    finally:
        node.stop()
