"""The internal wire carries a version that peers check and report (issue 31, item 1;
``kura.core.versions``, ``kura.api.internal``, docs/upgrading.md).

Real nodes throughout. The "future" kura is this source tree copied and changed the way a
next release would change it (``WIRE_VERSION = 3``, ``MIN_WIRE_VERSION = 3``, version 0.3.0),
run as its own ``kura serve`` process: a peer of a wire this kura does not speak, which no
configuration of HEAD can play. The previous release itself (kura 0.1.0, wire 1, no header)
beside HEAD is tests/e2e/test_version_skew.py's; here a request without the header is sent as
0.1.0 sends it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from kura import __version__
from kura.core.keys import artifact_id
from kura.core.manifest import Manifest
from kura.core.versions import MIN_WIRE_VERSION, WIRE_VERSION
from kura.mesh.wire import encode_manifest
from tests import oneshot
from tests.conftest import NodeProcess, spawn_node
from tests.e2e.mesh import Mesh, peer_row, status, wait_for

if TYPE_CHECKING:
    from kura.app import Node

pytestmark = pytest.mark.in_process

SRC = Path(__file__).resolve().parents[2] / "src"
FUTURE = "0.3.0"


def future_kura(root: Path) -> Path:
    """A copy of ``src/`` that is kura ``FUTURE`` speaking only wire 3; its ``src`` dir."""
    src = root / "future-src"
    for package in ("kura", "kit"):
        shutil.copytree(SRC / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    versions = src / "kura" / "core" / "versions.py"
    text = versions.read_text()
    assert "WIRE_VERSION = 2\nMIN_WIRE_VERSION = 1\n" in text  # the lines a release would bump
    versions.write_text(
        text.replace(
            "WIRE_VERSION = 2\nMIN_WIRE_VERSION = 1\n", "WIRE_VERSION = 3\nMIN_WIRE_VERSION = 3\n"
        )
    )
    init = src / "kura" / "__init__.py"
    init.write_text(init.read_text().replace(f'"{__version__}"', f'"{FUTURE}"'))
    return src


class RollingMesh(Mesh):
    """A ``Mesh`` whose nodes listed in ``future`` run the future kura (a process each)."""

    def __init__(self, root: Path, n: int, future: set[int], **settings: object) -> None:
        self.future = future
        self.future_src = future_kura(root)
        super().__init__(root, n, in_process=True, **settings)

    def _spawn(self, i: int, prepare: Callable[[Node], None] | None = None) -> NodeProcess:
        if i not in self.future:
            return super()._spawn(i, prepare)
        assert prepare is None, "prepare needs an in-process node"
        env = self._env(i)
        env["PYTHONPATH"] = str(self.future_src)
        return spawn_node(self.root / f"n{i}", env)


def _nx(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:20]


def nx_put(node: NodeProcess, name: str, body: bytes) -> None:
    with node.client() as c:
        assert c.put(f"/v1/cache/{_nx(name)}", content=body).status_code == 200


def nx_get(node: NodeProcess, name: str) -> bytes | None:
    r = oneshot.get(f"{node.url}/v1/cache/{_nx(name)}", timeout=10)
    return r.content if r.status_code == 200 else None


def test_peers_report_each_others_versions_and_answer_with_theirs(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, 2, in_process=True, discovery_settle_ms=200)
    try:
        mesh.wait_ready()
        a, b = mesh.nodes
        doc = status(a)
        assert (doc["version"], doc["wire_version"]) == (__version__, WIRE_VERSION)
        assert doc["min_wire_version"] == MIN_WIRE_VERSION
        row = peer_row(a, b.internal_url)
        assert (row["wire_version"], row["kura_version"]) == (WIRE_VERSION, __version__)
        assert not [w for w in doc["warnings"] if "version" in w], doc["warnings"]
        answer = oneshot.get(b.internal_url + "/_internal/status", timeout=10)
        assert answer.headers["Kura-Wire-Version"] == str(WIRE_VERSION)
        assert answer.headers["Kura-Version"] == __version__
        assert answer.json()["wire_version"] == WIRE_VERSION
        assert answer.json()["kura_version"] == __version__
    finally:
        mesh.stop_all()


def _replica(key: str, body: bytes) -> tuple[dict[str, str], str]:
    now = time.time_ns() // 1_000_000
    m = Manifest(
        artifact_id=artifact_id("http", "default", "", key),
        producer="http",
        namespace_id="",
        key=key,
        content_type="application/octet-stream",
        size=len(body),
        sha256=hashlib.sha256(body).hexdigest(),
        version_ms=now,
        created_at_ms=now,
    )
    return {
        "Kura-Manifest": encode_manifest(m),
        "Content-Type": "application/octet-stream",
    }, m.artifact_id


def test_a_request_without_a_version_is_wire_1_and_served_one_of_an_unspoken_version_is_refused(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node()
    body = os.urandom(1000)
    url = node.internal_url + "/_internal/replicate/artifact"
    # As kura 0.1.0 sends it: no Kura-Wire-Version, no Kura-Version.
    headers, aid = _replica("from-0.1.0", body)
    applied = oneshot.put(url, content=body, headers=headers, timeout=10)
    assert applied.status_code == 204, applied.text
    assert applied.headers["Kura-Outcome"] == "applied"
    assert applied.headers["Kura-Wire-Version"] == str(WIRE_VERSION)
    stored = oneshot.get(f"{node.internal_url}/_internal/bootstrap/artifacts/{aid}", timeout=10)
    assert stored.content == body
    # A future kura's: refused before the body is read; nothing stored.
    headers, aid = _replica("from-0.3.0", body)
    future = {**headers, "Kura-Wire-Version": "3", "Kura-Version": FUTURE}
    refused = oneshot.put(url, content=body, headers=future, timeout=10)
    assert refused.status_code == 503
    assert refused.headers["Kura-Refusal"] == "wire_version"
    message = refused.json()["message"]
    assert f"kura {FUTURE} (wire 3)" in message
    assert f"kura {__version__} (wire {WIRE_VERSION}, speaks wire 1-{WIRE_VERSION})" in message
    pages = oneshot.get(node.internal_url + "/_internal/bootstrap/manifests", timeout=10).json()
    assert aid not in {m["artifact_id"] for m in pages["manifests"]}
    # Reads are refused alike; the status probe never is (the prober learns the versions).
    listed = oneshot.get(
        node.internal_url + "/_internal/bootstrap/manifests",
        headers={"Kura-Wire-Version": "3"},
        timeout=10,
    )
    assert listed.status_code == 503
    probe = oneshot.get(
        node.internal_url + "/_internal/status", headers={"Kura-Wire-Version": "3"}, timeout=10
    )
    assert probe.status_code == 200
    garbled = oneshot.get(
        node.internal_url + "/_internal/bootstrap/manifests",
        headers={"Kura-Wire-Version": "two"},
        timeout=10,
    )
    # A header that does not parse (a later release changed its format) is refused as unspoken,
    # a 5xx every sender retries, never a 400 that senders drop for good.
    assert garbled.status_code == 503
    assert garbled.headers["Kura-Refusal"] == "wire_version"
    assert "(unparseable wire version) and this node" in garbled.json()["message"]
    assert "refused a peer request from 127.0.0.1" in node.log()
    assert f"kura {FUTURE} (wire 3)" in node.log()


@pytest.mark.timeout(240)
def test_a_peer_of_an_unspoken_wire_is_reported_keeps_its_queue_and_catches_up_once_rolled_back(
    tmp_path: Path,
) -> None:
    mesh = RollingMesh(tmp_path, 2, future={1}, discovery_settle_ms=200, discovery_interval_ms=300)
    try:
        head, future = mesh.nodes
        assert wait_for(
            lambda: peer_row(head, future.internal_url).get("kura_version") == FUTURE, 30
        )
        row = peer_row(head, future.internal_url)
        assert row["wire_version"] == 3
        warnings = status(head)["warnings"]
        unspoken = [w for w in warnings if "cannot talk" in w]
        assert unspoken, warnings
        assert f"kura {FUTURE} (wire 3)" in unspoken[0]
        assert any("mixed versions in the mesh" in w for w in warnings), warnings
        # Writes on each side: each peer refuses the other's wire, and nothing is dropped.
        head_body, future_body = os.urandom(5000), os.urandom(7000)
        nx_put(head, "written-on-head", head_body)
        nx_put(future, "written-on-future", future_body)
        assert wait_for(
            lambda: "wire_version" in str(peer_row(head, future.internal_url).get("last_error")), 30
        ), peer_row(head, future.internal_url)
        assert peer_row(head, future.internal_url)["outbox_messages"] == 1
        assert head.metric_sum("kura_replication_dropped_total") == 0
        assert wait_for(lambda: peer_row(future, head.internal_url).get("outbox_messages") == 1, 30)
        assert nx_get(future, "written-on-head") is None  # not applied by a wire it refused
        assert "cannot talk" in head.log()
        # The receiver logs its refusals (at most one line a minute for all senders) and the
        # sender keeps the copy queued: its backoff and the log's limit are decided on an
        # injected clock in tests/integration/test_wire_refusal_clock.py, not by sleeping here.
        assert future.log().count("refused a peer request from") >= 1
        # Roll node 1 back to HEAD on the same data dir: both queues drain, both writes are
        # on both nodes, the warnings go.
        assert future.stop() == 0
        mesh.future.clear()
        back = mesh.restart(1)
        mesh.wait_ready()
        mesh.wait_drained()
        for node in (head, back):
            assert nx_get(node, "written-on-head") == head_body
            assert nx_get(node, "written-on-future") == future_body
        assert wait_for(
            lambda: peer_row(head, back.internal_url).get("kura_version") == __version__, 30
        )
        assert not [w for w in status(head)["warnings"] if "version" in w]
    finally:
        mesh.stop_all()
