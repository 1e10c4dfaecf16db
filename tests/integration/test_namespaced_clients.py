"""Real clients against ``/ns/<namespace>/`` (the namespaced Bazel/HTTP-cache and WebDAV routes).

ccache and sccache: a remote hit, stored under that namespace; a ``DELETE`` of the route root
cleans exactly it, and the same client stores there again and hits. Bazel: a remote hit whose
action result and CAS blobs are all in that namespace."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

import pytest

from tests import oneshot
from tests.conftest import NodeProcess
from tests.integration.test_clients import CCACHE, Client, assert_remote_hit, run_client

pytestmark = [pytest.mark.clients, pytest.mark.in_process]
TOKEN = "ns-rw"

CLIENTS = (
    Client(
        "ccache", CCACHE, "", "http_cache", 2, {"PREFIX": "/ns/team1/cache", "LAYOUT": "subdirs"}
    ),
    Client("sccache", "sccache.sh", "/ns/team1/dav", "webdav", 2),
)
ROOTS = {"ccache": "/ns/team1/cache", "sccache": "/ns/team1/dav"}


def _namespaces(node: NodeProcess) -> dict[str, int]:
    conn = sqlite3.connect(f"file:{node.data_dir / 'index.sqlite3'}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT namespace_id, COUNT(*) FROM artifacts GROUP BY namespace_id")
        return {str(ns): int(n) for ns, n in rows}
    finally:
        conn.close()


@pytest.mark.parametrize("client", CLIENTS, ids=lambda c: c.name)
def test_a_real_client_on_a_namespaced_url_hits_and_a_root_delete_cleans_only_that_namespace(
    client: Client, start_node: Callable[..., NodeProcess]
) -> None:
    node = start_node(read_write_tokens=TOKEN)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    other = oneshot.put(node.url + "/cache/ab/outside", content=b"namespace ''", headers=auth)
    assert other.status_code == 201
    run = run_client(client, node, token=TOKEN)
    assert_remote_hit(client, node, run)
    held = _namespaces(node)
    # ccache's 100 ms default connect timeout may skip one PUT on a loaded machine; the hit
    # proves what it read was stored in team1.
    assert held.get("team1", 0) >= 1, held
    assert held[""] == 1, held

    r = oneshot.delete(node.url + ROOTS[client.name], headers=auth)
    assert r.status_code == 204, r.text
    assert _namespaces(node) == {"": 1}
    assert oneshot.get(node.url + "/cache/ab/outside", headers=auth).content == b"namespace ''"
    # The same client stores into the cleaned namespace again and hits.
    again = run_client(client, node, token=TOKEN)
    assert again.returncode == 0, again.describe()
    assert again.hit, again.describe()
    assert _namespaces(node).get("team1", 0) >= 1, f"{again.describe()}\n{node.log()[-4000:]}"


def test_real_bazel_gets_a_remote_hit_in_a_namespace_with_its_references_checked_there(
    start_node: Callable[..., NodeProcess],
) -> None:
    """Bazel's action results are hits only while their CAS blobs are stored, looked up in the
    namespace of the path (``kura.api.bazel_http``): a hit here proves both are in team1."""
    client = Client("bazel", "bazel.sh", "/ns/team1/cache", "bazel", 2)
    node = start_node(read_write_tokens=TOKEN)
    run = run_client(client, node, token=TOKEN)
    assert_remote_hit(client, node, run)
    assert set(_namespaces(node)) == {"team1"}
