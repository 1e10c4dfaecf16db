"""Property: random writes, cleans, peer outages and dropped outbox queues across a 3-node
mesh converge.

A hypothesis state machine drives real node processes. Writes go to random nodes (Xcode CAS
routes, two namespaces, a few keys), cleans to random nodes, and nodes are killed (SIGKILL) and
restarted, or paused (SIGSTOP: unreachable but never restarted, so it never bootstraps again)
and resumed, at random. A killed node's outbox can be deleted behind its back
(``drop_queues``, and ``write_then_lose_its_queue``: write, kill, delete, restart): the messages
it held for a paused peer are then lost for good, and only anti-entropy (``KURA_ANTI_ENTROPY_INTERVAL=1s``, issue 11 deliverable 3) can bring them. After
healing every node and draining every outbox, each node must come to hold exactly the same
artifacts, each at the newest acknowledged version, and nothing a later clean covered.
"""

from __future__ import annotations

import hashlib
import signal
import sqlite3
import tempfile
from pathlib import Path

import httpx
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests import oneshot
from tests.conftest import NodeProcess
from tests.e2e.mesh import Mesh, manifests, status, wait_for

NAMESPACES = ("p1", "p2")
KEYS = ("k1", "k2", "k3")


class MeshConvergence(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory(prefix="kura-mesh-prop-")
        try:
            self.mesh = Mesh(
                Path(self.tmp.name),
                3,
                discovery_settle_ms=0,
                replication_backoff_max_ms=2000,
                anti_entropy_interval="1s",
                bootstrap_timeout_ms=10_000,
            )
        except BaseException:
            self.tmp.cleanup()  # teardown never runs for a machine that was not built
            raise
        self.down: set[int] = set()  # killed
        self.paused: set[int] = set()  # SIGSTOPped
        # (namespace, key) -> (version_ms, sha256) of the newest acknowledged write
        self.latest: dict[tuple[str, str], tuple[int, str]] = {}
        self.tombstones: dict[str, int] = {}

    def _up(self) -> list[int]:
        return [i for i in range(3) if i not in self.down and i not in self.paused]

    @rule(
        pick=st.integers(0, 2),
        ns=st.sampled_from(NAMESPACES),
        key=st.sampled_from(KEYS),
        body=st.binary(min_size=1, max_size=2048),
    )
    def write(self, pick: int, ns: str, key: str, body: bytes) -> None:
        up = self._up()
        node = self.mesh.nodes[up[pick % len(up)]]
        q = f"tenant_id=t&namespace_id={ns}"
        # CAS POST does not overwrite an existing id; use the key-value route for overwrites.
        entry = {"cas_id": key, "entries": [{"value": body.hex()}]}
        r = oneshot.put(f"{node.url}/api/cache/keyvalue?{q}", json=entry, timeout=30)
        assert r.status_code == 204, r.text
        stored = oneshot.get(f"{node.url}/api/cache/keyvalue/{key}?{q}", timeout=30)
        assert stored.status_code == 200
        view = manifests(node)
        mine = [
            m
            for m in view.values()
            if m["namespace_id"] == ns and m["key"] == f"action_cache/{key}"
        ]
        assert len(mine) == 1
        version = int(mine[0]["version_ms"])  # type: ignore[call-overload]
        digest = hashlib.sha256(stored.content).hexdigest()
        assert digest == mine[0]["sha256"]
        prev = self.latest.get((ns, key))
        if prev is None or (version, digest) > prev:
            self.latest[(ns, key)] = (version, digest)

    @rule(pick=st.integers(0, 2), ns=st.sampled_from(NAMESPACES))
    def clean(self, pick: int, ns: str) -> None:
        up = self._up()
        node = self.mesh.nodes[up[pick % len(up)]]
        r = oneshot.delete(f"{node.url}/api/cache/clean?tenant_id=t&namespace_id={ns}", timeout=30)
        assert r.status_code == 204
        page = oneshot.get(
            f"{node.internal_url}/_internal/bootstrap/namespace_tombstones", timeout=30
        ).json()
        version = {t["namespace_id"]: t["version_ms"] for t in page["tombstones"]}[ns]
        self.tombstones[ns] = max(self.tombstones.get(ns, 0), int(version))

    @precondition(lambda self: len(self.down | self.paused) < 2)
    @rule(pick=st.integers(0, 2))
    def pause(self, pick: int) -> None:
        up = self._up()
        i = up[pick % len(up)]
        self.mesh.nodes[i].proc.send_signal(signal.SIGSTOP)
        self.paused.add(i)

    @precondition(lambda self: bool(self.paused))
    @rule(pick=st.integers(0, 2))
    def resume(self, pick: int) -> None:
        paused = sorted(self.paused)
        i = paused[pick % len(paused)]
        self.mesh.nodes[i].proc.send_signal(signal.SIGCONT)
        self.paused.discard(i)

    @precondition(lambda self: bool(self.down))
    @rule(pick=st.integers(0, 2))
    def drop_queues(self, pick: int) -> None:
        """Delete a killed node's whole outbox in its SQLite: those messages are lost."""
        down = sorted(self.down)
        self._drop_outbox(down[pick % len(down)])

    @precondition(lambda self: bool(self.paused) and bool(self._up()))
    @rule(
        pick=st.integers(0, 2),
        ns=st.sampled_from(NAMESPACES),
        key=st.sampled_from(KEYS),
        body=st.binary(min_size=1, max_size=2048),
    )
    def write_then_lose_its_queue(self, pick: int, ns: str, key: str, body: bytes) -> None:
        """A write queued for a paused peer, then its node killed, its outbox deleted and the
        node restarted: the paused peer, which never restarts, can only get it by
        anti-entropy."""
        up = self._up()
        i = up[pick % len(up)]
        self.write(pick, ns, key, body)
        self.mesh.nodes[i].stop(signal.SIGKILL)
        self._drop_outbox(i)
        self.mesh.restart(i)

    def _drop_outbox(self, i: int) -> None:
        conn = sqlite3.connect(self.mesh.nodes[i].data_dir / "index.sqlite3")
        with conn:
            dropped = conn.execute("DELETE FROM outbox").rowcount
        conn.close()
        event(f"outbox messages dropped: {'none' if dropped == 0 else 'some'}")

    @precondition(lambda self: len(self.down | self.paused) < 2)
    @rule(pick=st.integers(0, 2))
    def kill(self, pick: int) -> None:
        up = self._up()
        i = up[pick % len(up)]
        self.mesh.nodes[i].stop(signal.SIGKILL)
        self.down.add(i)

    @precondition(lambda self: bool(self.down))
    @rule(pick=st.integers(0, 2))
    def restart(self, pick: int) -> None:
        down = sorted(self.down)
        i = down[pick % len(down)]
        self.mesh.restart(i)
        self.down.discard(i)

    @invariant()
    def writes_never_fail_on_live_nodes(self) -> None:
        for i in self._up():
            assert self.mesh.nodes[i].proc.poll() is None, self.mesh.nodes[i].log()[-2000:]

    def expected(self) -> dict[tuple[str, str], tuple[int, str]]:
        return {
            (ns, key): v
            for (ns, key), v in self.latest.items()
            if v[0] > self.tombstones.get(ns, 0)
        }

    @staticmethod
    def view(node: NodeProcess) -> dict[tuple[str, str], tuple[int, str]]:
        return {
            (str(m["namespace_id"]), str(m["key"]).removeprefix("action_cache/")): (
                int(m["version_ms"]),  # type: ignore[call-overload]
                str(m["sha256"]),
            )
            for m in manifests(node).values()
        }

    def teardown(self) -> None:
        try:
            for i in sorted(self.paused):
                self.mesh.nodes[i].proc.send_signal(signal.SIGCONT)
            self.paused.clear()
            for i in sorted(self.down):
                self.mesh.restart(i)
            self.down.clear()
            for node in self.mesh.nodes:
                assert wait_for(lambda n=node: status(n)["outbox_messages"] == 0, 90), described(
                    node
                )
            want = self.expected()
            for node in self.mesh.nodes:
                # What no outbox holds any more arrives by anti-entropy, a round or two later.
                assert wait_for(lambda n=node: self.view(n) == want, 60), (
                    node.url,
                    self.view(node),
                    want,
                    described(node),
                )
        finally:
            for node in self.mesh.nodes:
                if node.proc.poll() is None:
                    node.proc.send_signal(signal.SIGCONT)
            self.mesh.stop_all()
            self.tmp.cleanup()


def described(node: NodeProcess) -> object:
    """``node``'s ``/status``, or, when it does not answer, why, its exit code and its log."""
    try:
        return status(node)
    except httpx.HTTPError as exc:
        return f"{exc!r}; exit code {node.proc.poll()}; log:\n{node.log()[-3000:]}"


MeshConvergence.TestCase.settings = settings(
    max_examples=5,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    database=None,
)
test_mesh_converges_after_random_writes_cleans_and_outages = MeshConvergence.TestCase
