"""A damaged artifact is repaired from a peer's copy (mesh.repair, storage.quarantine), between
real node processes. The damage is silent: bytes flipped in node 0's ext4 image while it was
unmounted, so the file's stat signature is what node 0 recorded (tests/integration/ext4.py)."""

from __future__ import annotations

import os
import signal
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.e2e.mesh import Mesh, wait_for
from tests.e2e.test_incremental_catch_up import bootstrap_peer, cursor_at_head
from tests.integration.ext4 import Ext4Image
from tests.integration.test_integrity import corrupt, outcome, quarantined

MiB = 1024 * 1024


def test_a_peer_copy_repairs_damage_found_by_a_read_and_by_the_scrub(tmp_path: Path) -> None:
    ext4 = Ext4Image(tmp_path / "fs.img", tmp_path / "n0")  # node 0 lives on the image
    mesh = Mesh(
        tmp_path,
        2,
        in_process=True,
        discovery_settle_ms=200,
        scrub_interval_seconds=6,
        changes_poll_interval=1,
    )
    try:
        mesh.wait_ready()
        a, b = mesh.nodes
        bodies = {"read": os.urandom(2 * MiB), "scrub": os.urandom(2 * MiB)}
        paths = {}
        for name, body in bodies.items():
            before = a.blob_files()
            with a.client() as c:
                assert c.put(f"/cache/repair/{name}", content=body).status_code == 201
            (paths[name],) = [p for p in a.blob_files() if p not in before]
            assert wait_for(
                lambda n=name, v=body: outcome(b.url + f"/cache/repair/{n}", v) == "ok", 30
            )
        # A's cursor into B's change feed is past both writes (B holds them as replicas):
        # restarted, A pulls nothing, so no catch-up reads the second one before the scrub.
        assert wait_for(lambda: cursor_at_head(a, b), 30), bootstrap_peer(a, b.internal_url)
        assert a.stop() == 0
        for path in paths.values():
            ext4.flip_byte_below(path, MiB + 7)
        a = mesh.restart(0)
        # Read the first at once, many times concurrently: never a 200 with wrong bytes.
        url = a.url + "/cache/repair/read"
        with ThreadPoolExecutor(8) as pool:
            seen = Counter(pool.map(lambda _i: outcome(url, bodies["read"]), range(24)))
        assert seen["wrong"] == 0, seen
        assert seen["hung"] == 0, seen
        assert wait_for(lambda: outcome(url, bodies["read"]) == "ok", 30)
        # Nobody reads the second: the scrub finds it within its period, the peer repairs it.
        assert wait_for(lambda: a.metric(corrupt("scrub")) >= 1, 6 + 30)
        assert wait_for(lambda: a.metric('kura_repair_results_total{result="repaired"}') >= 2, 30)
        assert outcome(a.url + "/cache/repair/scrub", bodies["scrub"]) == "ok"
        assert a.metric(corrupt("read")) + a.metric(corrupt("scrub")) == 2
        assert len(quarantined(a)) == 2
        assert a.index_rows() == 2
    finally:
        rcs = mesh.stop_all()
        ext4.unmount()
        assert all(rc in (0, -signal.SIGKILL) for rc in rcs), rcs
