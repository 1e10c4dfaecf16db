"""Cleaning a namespace on the Bazel, ccache, Gradle ``HttpBuildCache`` and WebDAV routes.

Two real nodes with tokens. For each route family: entries written through its own HTTP routes
under ``/ns/<namespace>/``, a ``DELETE`` on the route root (or Kura's ``/api/cache/clean``)
with the read-write token, then a miss on both nodes (the tombstone replicates), while other
namespaces and the legacy namespace ``""`` keep their data and their artifact ids; a read-only
token gets 403 and cleans nothing; a write after the clean is stored and replicated again.
Overlays (issue 29 item 2) are namespaces like any other: a pull request's write through its
credential alone replicates, and its clean empties its own namespace on both nodes, not main.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest

from kura.core.keys import artifact_id
from tests import reapi
from tests.conftest import NodeProcess
from tests.e2e.mesh import Mesh, manifests, wait_for

RW, RO = "rw-token", "ro-token"
MAIN, PR = "main-token-0123456789", "pr-123-token-0123456789"  # KURA_TOKENS_FILE: overlays


@pytest.fixture(scope="module")
def mesh2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    root = tmp_path_factory.mktemp("cleans")
    credentials = root / "credentials"
    credentials.write_text(
        f"{MAIN} rights=read,write,clean write=main\n"
        f"{PR} rights=read,write,clean read=pr-123,main write=pr-123\n"
    )
    m = Mesh(
        root,
        2,
        in_process=True,
        read_write_tokens=RW,
        read_only_tokens=RO,
        tokens_file=credentials,
        read_through="never",  # a miss on the peer must be its own, not a fetch from node 0
    )
    try:
        m.wait_ready()
        yield m
    finally:
        m.stop_all()


def _wait_drained(mesh: Mesh) -> None:
    """Every node's outbox is empty (``Mesh.wait_drained``, with a token: /status needs one)."""
    for node in mesh.nodes:
        with _client(node) as c:
            assert wait_for(lambda c=c: c.get("/status").json()["outbox_messages"] == 0, 60)


def _client(node: NodeProcess, token: str = RW) -> httpx.Client:
    return node.client(headers={"Authorization": f"Bearer {token}"})


@dataclass
class Family:
    """One route family: how to write its entries under a base path, and where to clean."""

    name: str
    root: str  # the route root below the namespace prefix
    write: Callable[[httpx.Client, str], list[str]]  # (client, base) -> paths written


def _write_bazel(c: httpx.Client, base: str) -> list[str]:
    blob = os.urandom(2000)
    cas = hashlib.sha256(blob).hexdigest()
    ac_body = reapi.action_result({"out/a.o": blob})
    ac = hashlib.sha256(os.urandom(16)).hexdigest()
    assert c.put(f"{base}/cache/cas/{cas}", content=blob).status_code == 200
    assert c.put(f"{base}/cache/ac/{ac}", content=ac_body).status_code == 200
    return [f"{base}/cache/cas/{cas}", f"{base}/cache/ac/{ac}"]


def _write_ccache(c: httpx.Client, base: str) -> list[str]:
    key = os.urandom(10).hex()
    path = f"{base}/cache/{key[:2]}/{key[2:]}"  # layout=subdirs
    assert c.put(path, content=os.urandom(3000)).status_code == 201
    return [path]


def _write_gradle(c: httpx.Client, base: str) -> list[str]:
    path = f"{base}/cache/{os.urandom(16).hex()}"  # HttpBuildCache: 32 hex digits
    assert c.put(path, content=os.urandom(70_000)).status_code == 201
    return [path]


def _write_webdav(c: httpx.Client, base: str) -> list[str]:
    assert c.request("MKCOL", f"{base}/dav/a/").status_code == 201
    path = f"{base}/dav/a/b/{os.urandom(8).hex()}"
    assert c.put(path, content=os.urandom(1500)).status_code == 201
    assert c.request("PROPFIND", path).status_code == 207
    return [path]


FAMILIES = [
    Family("bazel", "/cache", _write_bazel),
    Family("ccache", "/cache", _write_ccache),
    Family("gradle", "/cache", _write_gradle),
    Family("webdav", "/dav", _write_webdav),
]


def _status(node: NodeProcess, path: str) -> int:
    with _client(node) as c:
        return c.get(path).status_code


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
@pytest.mark.parametrize("how", ["route_root", "clean_endpoint"])
def test_a_namespace_clean_on_the_family_route_misses_on_both_nodes_and_writes_work_again(
    mesh2: Mesh, family: Family, how: str
) -> None:
    a, b = mesh2.nodes
    ns = f"{family.name}-{how.replace('_', '-')}"
    base, other = f"/ns/{ns}", f"/ns/{ns}-other"
    with _client(a) as c:
        cleaned = family.write(c, base)
        kept = family.write(c, other) + family.write(c, "")
    _wait_drained(mesh2)
    for node in (a, b):
        for path in cleaned + kept:
            assert _status(node, path) == 200, (node.url, path)

    # A read-only token may not clean: 403, and nothing is gone on either node.
    with _client(a, RO) as c:
        assert c.delete(base + family.root).status_code == 403
        assert c.delete(f"/api/cache/clean?tenant_id=t&namespace_id={ns}").status_code == 403
    with a.client() as anonymous:
        assert anonymous.delete(base + family.root).status_code == 401
    for path in cleaned:
        assert _status(a, path) == 200

    with _client(a) as c:
        if how == "route_root":
            assert c.delete(base + family.root).status_code == 204
        else:
            assert c.delete(f"/api/cache/clean?tenant_id=t&namespace_id={ns}").status_code == 204
    for node in (a, b):
        for path in cleaned:
            assert wait_for(lambda n=node, p=path: _status(n, p) == 404, 30), (node.url, path)
        for path in kept:
            assert _status(node, path) == 200, (node.url, path)

    # The namespace takes writes again, on this node and through replication on the peer.
    with _client(a) as c:
        again = family.write(c, base)
    for node in (a, b):
        for path in again:
            assert wait_for(lambda n=node, p=path: _status(n, p) == 200, 30), (node.url, path)


def test_the_legacy_routes_keep_their_artifact_ids_and_a_root_delete_cleans_namespace_empty(
    mesh2: Mesh,
) -> None:
    a, b = mesh2.nodes
    key = "cd/" + os.urandom(8).hex()
    body = os.urandom(900)
    with _client(a) as c:
        assert c.put(f"/cache/{key}", content=body).status_code == 201
        assert c.put("/ns/survivor/cache/ab/kept", content=b"kept").status_code in (200, 201)
    _wait_drained(mesh2)
    # Namespace "" has the id it always had (producer, tenant, "", key): existing data reads.
    legacy_id = artifact_id("http", "default", "", key)
    for node in (a, b):
        held = manifests(node)
        assert held[legacy_id]["namespace_id"] == ""
        assert held[legacy_id]["key"] == key
    with _client(a) as c:
        assert c.delete("/dav/").status_code == 204  # the WebDAV root shares namespace ""
    for node in (a, b):
        assert wait_for(lambda n=node: _status(n, f"/cache/{key}") == 404, 30)
        assert _status(node, "/ns/survivor/cache/ab/kept") == 200


def test_a_bad_namespace_in_the_path_is_refused_and_leaves_nothing(mesh2: Mesh) -> None:
    a = mesh2.nodes[0]
    before = a.index_rows()
    with _client(a) as c:
        r = c.put("/ns/.hidden/cache/ab/cd", content=b"x")
        assert r.status_code == 400
        assert "namespace" in r.text
        assert c.delete("/ns/.hidden/cache").status_code == 400
    assert a.index_rows() == before


def test_an_overlay_write_replicates_and_its_clean_leaves_the_namespaces_it_reads(
    mesh2: Mesh,
) -> None:
    a, b = mesh2.nodes
    key = "ef/" + os.urandom(8).hex()
    with _client(a, MAIN) as c:  # main's job: /cache names no namespace, its credential main
        assert c.put(f"/cache/{key}", content=b"main's").status_code == 201
    with _client(a, PR) as c:  # the pull request's: the same key, into pr-123
        assert c.put(f"/cache/{key}", content=b"the PR's").status_code == 201
        assert c.put(f"/cache/{key}-own", content=b"the PR's own").status_code == 201
        assert c.delete("/ns/main/cache").status_code == 403  # a namespace it only reads
    _wait_drained(mesh2)
    for node in (a, b):  # replicated as the namespaces they are
        with _client(node) as c:
            assert c.get(f"/ns/main/cache/{key}").content == b"main's"
            assert c.get(f"/ns/pr-123/cache/{key}").content == b"the PR's"
    with _client(b, PR) as c:  # the overlay on the other node: its own first, then main's
        assert c.get(f"/cache/{key}").content == b"the PR's"
        assert c.delete("/cache").status_code == 204  # cleans pr-123, where it writes
        assert c.get(f"/cache/{key}").content == b"main's"  # falls through now
    for node in (a, b):
        assert wait_for(lambda n=node: _status(n, f"/ns/pr-123/cache/{key}-own") == 404, 30)
        assert _status(node, f"/ns/main/cache/{key}") == 200
