"""``If-None-Match`` on every public artifact route against a real node (kura.core.conditional,
RFC 9110 §13.1.2): a client holding the current bytes gets 304 with no body; any other tag, or a
later version, gets the full 200."""

from __future__ import annotations

import pytest

from tests.conftest import NodeProcess
from tests.integration.test_ranges import ROUTES, _stored

pytestmark = pytest.mark.in_process


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_a_matching_tag_gets_304_and_any_other_the_bytes(node: NodeProcess, route: str) -> None:
    body = route.encode() * 1000
    path = _stored(node, route, body)
    with node.client() as c:
        first = c.get(path)
        assert first.status_code == 200
        etag = first.headers["ETag"]
        for value in (etag, f"W/{etag}", "*", f'"other", {etag}', f'"a",,{etag}'):
            for method in ("GET", "HEAD"):
                r = c.request(method, path, headers={"If-None-Match": value})
                assert r.status_code == 304, (route, method, value, r.status_code)
                assert r.content == b""
                assert r.headers["ETag"] == etag
        # §13.2.2: If-None-Match before Range.
        r = c.get(path, headers={"If-None-Match": etag, "Range": "bytes=0-9"})
        assert r.status_code == 304
        for value in ('"other"', "not-a-tag", etag.replace('"', "")):
            r = c.get(path, headers={"If-None-Match": value})
            assert (r.status_code, r.content) == (200, body), (route, value)
        assert c.get(path, headers={"If-None-Match": etag}).status_code == 304


def test_an_overwritten_key_no_longer_matches_the_old_tag(node: NodeProcess) -> None:
    with node.client() as c:
        assert c.put("/cache/cond/k", content=b"old bytes").status_code == 201
        old = c.get("/cache/cond/k").headers["ETag"]
        assert c.put("/cache/cond/k", content=b"new bytes").status_code == 200
        r = c.get("/cache/cond/k", headers={"If-None-Match": old})
        assert (r.status_code, r.content) == (200, b"new bytes")
        assert r.headers["ETag"] != old
