"""Protocol details that real clients depend on, pinned over real HTTP without the client.

Each test names the client behaviour that revealed the bug (tests/integration/test_clients.py
runs the clients themselves; these are the fast, exact checks of the same rules):

* sccache 0.16 (opendal WebDAV) parses every PROPFIND answer into a struct whose
  ``getlastmodified`` is required; a collection without it failed every write with
  "deserialize xml", so sccache never stored anything.
* Nx 24 accepts a 401 as "Unauthorized" only when Content-Type is exactly ``text/plain`` (byte
  comparison); ``text/plain; charset=utf-8`` made it report "Misconfigured remote cache endpoint:
  Requests should respond with text/plain on 401s".
* turbo 2.11 parses a 403 body as the Vercel API's ``{"error": {"code", "message"}}``; kura's
  ``{"message"}`` alone made a read-only token's refused upload show as "failed to contact
  remote cache: unable to parse ... missing field `error`".
* ccache 4.7 (``layout=subdirs``) stores a key that begins with "ac" at ``/cache/ac/<31
  characters>``, which Bazel's action-cache route took and refused with 400: about one compile in
  500 lost its remote write (ccache then skips the remote for the rest of that run).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from email.utils import parsedate_to_datetime

import pytest

from tests.conftest import NodeProcess

pytestmark = pytest.mark.in_process

DAV = "{DAV:}"
# What opendal sends (Depth 0, allprop).
PROPFIND_BODY = (
    b'<?xml version="1.0" encoding="utf-8" ?><D:propfind xmlns:D="DAV:"><D:allprop/></D:propfind>'
)
STORED_KEY = "a/b/c/" + "d" * 64


def propfind(node: NodeProcess, path: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Depth": "0", "Content-Type": "application/xml"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    with node.client() as c:
        r = c.request("PROPFIND", path, headers=headers, content=PROPFIND_BODY)
    return r.status_code, r.text


@pytest.mark.parametrize(
    "path",
    ["/dav", "/dav/", "/dav/a/", "/dav/a/b/c/", f"/dav/{STORED_KEY}"],
    ids=["root", "root-slash", "collection", "nested-collection", "stored-key"],
)
def test_every_propfind_answer_has_the_properties_opendal_requires(
    node: NodeProcess, path: str
) -> None:
    body = b"x" * 1234
    with node.client() as c:
        assert c.put(f"/dav/{STORED_KEY}", content=body).status_code in (200, 201, 204)
    status, text = propfind(node, path)
    assert status == 207, text
    responses = ET.fromstring(text).findall(f"{DAV}response")
    assert len(responses) == 1, text
    response = responses[0]
    assert response.findtext(f"{DAV}href"), text
    propstat = response.find(f"{DAV}propstat")
    assert propstat is not None, text
    assert (propstat.findtext(f"{DAV}status") or "").split()[1] == "200", text
    prop = propstat.find(f"{DAV}prop")
    assert prop is not None, text
    # Required by opendal's Prop: getlastmodified (an RFC 2822 date) and resourcetype.
    modified = prop.findtext(f"{DAV}getlastmodified")
    assert modified, text
    assert parsedate_to_datetime(modified).tzinfo is not None, text
    resourcetype = prop.find(f"{DAV}resourcetype")
    assert resourcetype is not None, text
    is_collection = resourcetype.find(f"{DAV}collection") is not None
    if path.endswith(STORED_KEY):
        assert not is_collection, text
        assert prop.findtext(f"{DAV}getcontentlength") == str(len(body)), text
    else:
        assert is_collection, text


def test_propfind_on_a_missing_key_is_404(node: NodeProcess) -> None:
    status, _ = propfind(node, "/dav/a/b/c/" + "e" * 64)
    assert status == 404


@pytest.fixture
def auth_node(start_node: Callable[..., NodeProcess]) -> NodeProcess:
    return start_node(read_write_tokens="tok-rw", read_only_tokens="tok-ro")


@pytest.mark.parametrize(
    ("method", "path", "token", "status"),
    [
        ("GET", "/v1/cache/123", None, 401),
        ("PUT", "/v1/cache/123", None, 401),
        ("GET", "/v1/cache/123", "unknown-token", 401),
        ("PUT", "/v1/cache/123", "unknown-token", 401),
        ("PUT", "/v1/cache/123", "tok-ro", 403),
        ("PUT", "/v1/cache/has.dot", "tok-rw", 400),
    ],
    ids=["get-no-token", "put-no-token", "get-bad-token", "put-bad-token", "put-ro", "bad-hash"],
)
def test_nx_errors_are_exactly_text_plain(
    auth_node: NodeProcess, method: str, path: str, token: str | None, status: int
) -> None:
    headers = {"Content-Type": "application/octet-stream", "Accept": "application/octet-stream"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    with auth_node.client() as c:
        r = c.request(method, path, headers=headers, content=b"x" if method == "PUT" else None)
    assert r.status_code == status, r.text
    assert r.headers["Content-Type"] == "text/plain", r.headers
    assert r.text, "Nx shows the body after 'Unauthorized: '"
    assert auth_node.index_rows() == 0


@pytest.mark.parametrize(
    ("method", "path", "token", "status"),
    [
        ("PUT", "/v8/artifacts/abc123?slug=team1", "tok-ro", 403),
        ("GET", "/v8/artifacts/abc123?slug=team1", None, 401),
        ("PUT", "/v8/artifacts/abc123?slug=team1", "unknown-token", 401),
        ("GET", "/v8/artifacts/abc123", "tok-rw", 400),
        ("GET", "/v8/artifacts/abc123?slug=team1", "tok-rw", 404),
    ],
    ids=["put-ro", "get-no-token", "put-bad-token", "no-team", "miss"],
)
def test_turbo_errors_have_the_vercel_error_shape(
    auth_node: NodeProcess, method: str, path: str, token: str | None, status: int
) -> None:
    headers = {"Content-Type": "application/octet-stream"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    with auth_node.client() as c:
        r = c.request(method, path, headers=headers, content=b"x" if method == "PUT" else None)
    assert r.status_code == status, r.text
    doc = r.json()
    assert isinstance(doc["message"], str), doc  # kura's own error body stays as it was
    error = doc["error"]
    assert isinstance(error["code"], str), doc
    assert error["message"] == doc["message"], doc
    # remote_caching_* codes mean "caching is off" to turbo; an error must never say that.
    assert not error["code"].startswith("remote_caching_"), doc
    if status == 403:
        assert error["code"] == "forbidden", doc
    assert auth_node.index_rows() == 0


CCACHE_AC_KEY = "ac/b0thatct7i59mn3ha75gnmmvcn2dngs"  # a real key's shape (33 base32hex chars)


@pytest.mark.parametrize("prefix", ["", "/ns/team1"])
def test_a_ccache_subdirs_key_under_ac_is_a_plain_cache_entry_not_bazels(
    start_node: Callable[..., NodeProcess], prefix: str
) -> None:
    node = start_node()
    path = f"{prefix}/cache/{CCACHE_AC_KEY}"
    body = b"ccache result " * 50
    with node.client() as c:
        assert c.get(path).status_code == 404
        put = c.put(path, content=body, headers={"Content-Type": "application/octet-stream"})
        assert put.status_code == 201, put.text
        got = c.get(path)
        assert got.status_code == 200
        assert got.content == body
        assert c.head(path).status_code == 200
        # A 64-character name under ac/ is still Bazel's: an ActionResult is required.
        bazel = c.put(
            f"{prefix}/cache/ac/" + "0123456789abcdef" * 4, content=b"not an ActionResult"
        )
        assert bazel.status_code == 400, bazel.text
    assert (
        node.metrics().get('kura_cache_lookups_total{protocol="http_cache",result="hit"}', 0) >= 1
    )
