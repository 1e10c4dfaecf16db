"""A dead peer never blocks writes (issue 11, deliverable 1), on real node processes.

Node A replicates to a live peer B and to a URL nobody listens on, with a per-peer outbox cap of
20 and ``KURA_PEER_FORGET_AFTER=10s`` (counted from A's start: the writes must all be queued
before it passes, or the forget drops a shorter queue). Every one of 200 writes (10× the cap) answers 2xx, B holds
them all, the dead peer's queue is dropped after the forget time and the peer is marked for
catch-up; when a real node starts at that URL, A re-offers what it holds and the newcomer ends
with every artifact — without bootstrapping (it knows no peer), so only A's catch-up can have
given them to it.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.conftest import NodeProcess, node_env, spawn_node
from tests.e2e.mesh import free_port, manifests, status, wait_for

CAP = 20
WRITES = 10 * CAP


def _peer(node: NodeProcess, url: str) -> dict[str, object]:
    peers = status(node)["peers"]
    assert isinstance(peers, list)
    return next(p for p in peers if p["node_url"] == url)


def test_a_peer_that_never_answers_costs_no_write_and_catches_up_when_it_returns(
    tmp_path: Path,
) -> None:
    a_url, b_url, dead_url = (f"http://127.0.0.1:{free_port()}" for _ in range(3))
    common = {"discovery_settle_ms": 200, "discovery_initial_timeout_ms": 2000}

    def start(name: str, url: str, peers: list[str], **settings: object) -> NodeProcess:
        env = node_env(tmp_path / name, **common, **settings)
        env["KURA_INTERNAL_PORT"] = url.rsplit(":", 1)[1]
        env["KURA_NODE_URL"] = url
        env["KURA_PEERS"] = ",".join(peers)
        return spawn_node(tmp_path / name, env)

    nodes: list[NodeProcess] = []
    try:
        a = start(
            "a", a_url, [a_url, b_url, dead_url], outbox_max_depth=CAP, peer_forget_after="10s"
        )
        nodes.append(a)
        b = start("b", b_url, [a_url, b_url], outbox_max_depth=CAP)
        nodes.append(b)
        bodies = {f"/cache/eol/{i:03d}": f"artifact {i} ".encode() * 20 for i in range(WRITES)}
        statuses = []
        with a.client() as w:
            for path, body in bodies.items():
                statuses.append(w.put(path, content=body).status_code)
        assert statuses == [201] * WRITES  # none refused because of a peer
        # The live peer holds every write (delivered, or re-offered after its queue was full).
        assert wait_for(lambda: len(manifests(b)) == WRITES, 60), len(manifests(b))
        # The dead peer's queue is dropped after the forget time, and it is marked.
        assert wait_for(lambda: _peer(a, dead_url)["forgotten_at"] is not None, 30)
        dead = _peer(a, dead_url)
        assert dead["needs_catch_up"] is True
        assert dead["outbox_messages"] == 0
        assert dead["outbox_dropped_messages"] == CAP  # it had reached its cap
        label = dead_url.split("://", 1)[1]
        assert a.metric_sum("kura_outbox_dropped_queues_total") == 1
        assert a.metric_sum("kura_outbox_dropped_messages_total") == CAP
        # Past the cap each write skipped the dead peer; once it was forgotten (possibly before
        # the last write on a loaded machine) it was no longer a target at all. The counter is
        # the node's: on a loaded machine B's queue fills too, and its writes past B's cap
        # count as well (185 in one full run). Each peer skips at most the writes past its cap.
        assert 0 < a.metric_sum("kura_outbox_skipped_messages_total") <= 2 * (WRITES - CAP)
        assert "dropped its queue of 20 messages" in a.log()
        assert label in httpx.get(a.url + "/metrics").text
        # The outbox gauge stays exact: nothing is pending for anyone once B is drained.
        assert wait_for(lambda: status(a)["outbox_messages"] == 0, 60), status(a)
        # The peer returns: a real node at that URL, knowing no peer (so it cannot bootstrap).
        c = start("c", dead_url, [dead_url])
        nodes.append(c)
        assert wait_for(lambda: len(manifests(c)) == WRITES, 120), len(manifests(c))
        with c.client() as r:
            for path, body in bodies.items():
                got = r.get(path)
                assert (got.status_code, got.content) == (200, body), path
        assert wait_for(lambda: _peer(a, dead_url)["needs_catch_up"] is False, 30)
        assert a.metric_sum("kura_outbox_catch_ups_total") >= 1
        assert a.metric_sum("kura_outbox_catch_up_messages_total") >= WRITES
        assert c.metric_sum("kura_bootstrap_passes_total") == 0
        print(
            f"\n{WRITES} writes, cap {CAP}: all 201; dropped "
            f"{a.metric_sum('kura_outbox_dropped_messages_total'):.0f} messages with the dead "
            f"peer's queue; skipped {a.metric_sum('kura_outbox_skipped_messages_total'):.0f}; "
            f"re-offered {a.metric_sum('kura_outbox_catch_up_messages_total'):.0f}; "
            f"the returning node holds {len(manifests(c))}"
        )
    finally:
        rcs = [n.stop() for n in nodes]
        assert all(rc == 0 for rc in rcs), rcs
