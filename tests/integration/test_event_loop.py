"""KURA_EVENT_LOOP (kit.event_loop, kura.cli): a node started with each value runs the loop it
reports, in its start-up log line and in /status, and serves a PUT and a GET on it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import NodeProcess, node_env, serve_refused

pytestmark = pytest.mark.in_process

MiB = 1024 * 1024


@pytest.mark.parametrize(
    ("setting", "expected"),
    [(None, "asyncio"), ("asyncio", "asyncio"), ("uvloop", "uvloop"), ("auto", "uvloop")],
)
def test_a_node_runs_and_reports_the_event_loop_it_was_given(
    start_node: Callable[..., NodeProcess], setting: str | None, expected: str
) -> None:
    # Unset is asyncio (the default). auto is uvloop: the dev extra installs kura-cache[uvloop]
    # (pyproject.toml), so it is importable here.
    node = start_node(**({} if setting is None else {"event_loop": setting}))
    small, large = os.urandom(1024), os.urandom(3 * MiB)
    with node.client() as c:
        assert c.put("/cache/loop-check", content=small).status_code == 201
        assert c.get("/cache/loop-check").content == small
        # Served from its file (loop.sendfile; uvloop has none, kura.api.file_response).
        assert c.put("/cache/loop-check-large", content=large).status_code == 201
        assert c.get("/cache/loop-check-large").content == large
        r = c.get("/cache/loop-check-large", headers={"Range": "bytes=1000-2999999"})
        assert r.status_code == 206
        assert r.content == large[1000:3000000]
        assert c.get("/status").json()["event_loop"] == expected
    assert f"event_loop={expected}" in node.log()


def test_an_unknown_event_loop_is_a_configuration_error(tmp_path: Path) -> None:
    stderr = serve_refused(node_env(tmp_path, event_loop="trio"))
    assert "KURA_EVENT_LOOP" in stderr
    assert "'trio'" in stderr
