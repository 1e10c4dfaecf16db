"""A stored body never runs as a page of the node's origin: every public answer carries
``X-Content-Type-Options: nosniff`` and a sandboxing Content-Security-Policy, whatever
Content-Type its client stored (found by a newcomer's check: a ``text/html`` upload came back as
an active page on the origin of ``/ui``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.conftest import NodeProcess

pytestmark = pytest.mark.in_process

PAGE = b"<script>fetch('/status')</script>"


def test_a_stored_html_body_is_served_inert(start_node: Callable[..., NodeProcess]) -> None:
    node = start_node("node")
    with node.client() as c:
        put = c.put("/cache/xss", content=PAGE, headers={"Content-Type": "text/html"})
        assert put.status_code == 201, put.text
        for path, headers in (("/cache/xss", {}), ("/cache/xss", {"Range": "bytes=0-7"})):
            r = c.get(path, headers=headers)
            assert r.status_code in (200, 206)
            assert r.headers["X-Content-Type-Options"] == "nosniff"
            assert "sandbox" in r.headers["Content-Security-Policy"]
        miss = c.get("/cache/absent")
        assert miss.status_code == 404
        assert miss.headers["X-Content-Type-Options"] == "nosniff"
        ui = c.get("/ui")
        assert ui.status_code == 200
        assert "style-src" in ui.headers["Content-Security-Policy"]  # the page's own policy
