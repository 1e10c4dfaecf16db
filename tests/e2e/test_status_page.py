"""The status page (``/ui``) in a real headless browser: Debian's ``chromium`` (scripts/install-deps)
driven by Playwright, against real node processes.

The browser is never downloaded (no ``playwright install``): ``executable_path`` names Debian's
binary, and a missing one fails the test. Set ``STATUS_PAGE_SCREENSHOT=docs/status-page.png`` to
refresh the screenshot in the docs from this run.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, sync_playwright
from playwright.sync_api import Error as PlaywrightError

from kura import __version__
from tests import oneshot
from tests.conftest import NodeProcess
from tests.e2e.mesh import Mesh, wait_for

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
KiB = 1024
MiB = 1024 * KiB


@pytest.fixture
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} missing: apt-get install chromium"
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def watch_console(page: Page) -> list[str]:
    """Console errors and uncaught page errors, appended as they happen."""
    problems: list[str] = []

    def on_console(msg: ConsoleMessage) -> None:
        if msg.type == "error":
            problems.append(f"console: {msg.text}")

    page.on("console", on_console)
    page.on("pageerror", lambda exc: problems.append(f"pageerror: {exc}"))
    return problems


def fill(node: NodeProcess, count: int, size: int) -> list[str]:
    keys = []
    with node.client() as c:
        for i in range(count):
            key = f"page/{i:03d}"
            assert c.put(f"/cache/{key}", content=os.urandom(size)).status_code == 201
            keys.append(key)
    return keys


def test_page_shows_a_mesh_node_bootstrapping_then_ready_without_console_errors(
    tmp_path: Path, browser: Browser
) -> None:
    # Peers serve bootstrap downloads at 128 KiB/s each, so 2 MiB take the fresh node seconds.
    mesh = Mesh(
        tmp_path / "mesh",
        3,
        in_process=True,
        discovery_settle_ms=0,
        replication_bandwidth_limit_bytes_per_second=128 * KiB,
    )
    try:
        mesh.wait_ready()
        keys = fill(mesh.nodes[0], 16, 128 * KiB)
        mesh.wait_drained()  # pushed (not throttled) to both peers
        fresh = mesh.nodes[2]
        fresh.stop()
        shutil.rmtree(tmp_path / "mesh" / "n2" / "data")
        fresh = mesh.restart(2)
        with fresh.client() as c:  # two hits (or read-through) and a miss for the ratio table
            for key in [*keys[:2], "page/absent"]:
                c.get(f"/cache/{key}")

        page = browser.new_page(viewport={"width": 1200, "height": 900})
        problems = watch_console(page)
        response = page.goto(fresh.url + "/")  # redirects to /ui
        assert response is not None
        assert response.status == 200
        assert page.url == fresh.url + "/ui"
        assert response.headers["content-type"].startswith("text/html")

        def bootstrapping() -> bool:
            page.reload()
            reasons = page.locator("#reasons li").all_inner_texts()
            return any(r.startswith("bootstrap in progress") for r in reasons)

        assert wait_for(bootstrapping, 60, interval=0.2), page.locator("#reasons").inner_text()
        assert page.locator("#readiness").get_attribute("data-ready") == "false"
        assert page.locator("#readiness").inner_text() == "not ready"
        fraction = float(page.locator("#bootstrap-progress").get_attribute("data-fraction") or 1)
        assert fraction < 1.0
        assert page.locator("#version").inner_text() == __version__
        identity = page.locator("#identity").inner_text()
        assert mesh.internal_urls[2] in identity
        assert fresh.url in identity
        peer_rows = page.locator("#peers tbody tr").all_inner_texts()
        assert len(peer_rows) == 2
        assert {u for u in mesh.internal_urls[:2] if any(u in r for r in peer_rows)} == set(
            mesh.internal_urls[:2]
        )
        assert "http_cache" in page.locator("#cache").inner_text()
        shot = tmp_path / "status-page.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        if target := os.environ.get("STATUS_PAGE_SCREENSHOT"):
            shutil.copyfile(shot, target)

        # No reload from here on: the page's own meta refresh must bring the ready state.
        page.wait_for_selector('#readiness[data-ready="true"]', timeout=90_000)
        assert page.locator("#readiness").inner_text() == "ready"
        assert page.locator("#reasons li").count() == 0
        assert page.locator("#bootstrap-progress").get_attribute("data-fraction") == "1.0000"
        assert oneshot.get(fresh.url + "/ready").status_code == 200
        assert problems == []
    finally:
        mesh.stop_all()


def test_page_needs_a_read_token_when_tokens_are_set(
    start_node: Callable[..., NodeProcess], browser: Browser
) -> None:
    node = start_node(
        read_write_tokens="rw-secret", read_only_tokens="ro-secret", internal_tokens="peer-secret"
    )
    url = node.url + "/ui"
    # A real fault for the "recent errors" section: a peer request without credentials, on a
    # path with markup in it (logged at WARNING; the page must show it escaped).
    refused_peer = oneshot.get(node.internal_url + "/_internal/%3Cb%3Eprobe%3C/b%3E")
    assert refused_peer.status_code == 401

    # Without credentials Chromium gets the 401 with both challenges and, having no password
    # to answer Basic with (headless: no prompt), ends the navigation.
    anonymous = browser.new_context().new_page()
    seen: list[tuple[int, str]] = []
    anonymous.on("response", lambda r: seen.append((r.status, r.headers["www-authenticate"])))
    with pytest.raises(PlaywrightError, match="ERR_INVALID_AUTH_CREDENTIALS"):
        anonymous.goto(url)
    assert len(seen) == 1
    status, challenges = seen[0]
    assert status == 401
    assert challenges.split("\n") == [
        'Bearer realm="kura"',
        'Basic realm="kura status", charset="UTF-8"',
    ]

    # A wrong token as the password: Chromium answers the challenge, is refused, shows the 401.
    wrong = browser.new_context(http_credentials={"username": "ops", "password": "nope"})
    wrong_page = wrong.new_page()
    denied = wrong_page.goto(url)
    assert denied is not None
    assert denied.status == 401
    assert "read token" in wrong_page.locator("body").inner_text()
    assert "nope" not in wrong_page.content()

    # A browser answers the Basic challenge with the token as the password.
    basic = browser.new_context(http_credentials={"username": "ops", "password": "ro-secret"})
    page = basic.new_page()
    problems = watch_console(page)
    shown = page.goto(url)
    assert shown is not None
    assert shown.status == 200
    assert page.locator("#readiness").inner_text() in ("ready", "not ready")
    errors = page.locator("#errors tbody tr").all_inner_texts()
    assert len(errors) == 1, errors
    assert "WARNING" in errors[0]
    assert "refused peer request" in errors[0]
    assert "<b>probe</b>" in errors[0]  # shown as text, not markup
    assert page.locator("#errors b").count() == 0
    assert problems == []

    bearer = browser.new_context(extra_http_headers={"Authorization": "Bearer ro-secret"})
    with_header = bearer.new_page().goto(url)
    assert with_header is not None
    assert with_header.status == 200

    # The same rule as /status, and no token in the URL (RFC 6750 §5.3).
    assert oneshot.get(node.url + "/status").status_code == 401
    assert oneshot.get(url, params={"token": "ro-secret"}).status_code == 401
    assert oneshot.get(url, headers={"Authorization": "Bearer ro-secret"}).status_code == 200
    redirect = oneshot.get(node.url + "/")
    assert redirect.status_code == 302
    assert redirect.headers["location"] == "/ui"
