"""Helpers for multi-node tests: start a mesh of real node processes that know each other.

``free_port`` is re-exported from ``kura_harness.launch.process`` for the tests that import it here."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from kit.wait import wait_until
from kura_harness.launch.process import free_port
from tests import oneshot
from tests.conftest import NodeProcess, node_env, spawn_node

if TYPE_CHECKING:
    from kura.app import Node

__all__ = [
    "Mesh",
    "forget_behind_the_cursor",
    "free_port",
    "manifests",
    "peer_row",
    "status",
    "wait_for",
]


class Mesh:
    """N kura nodes on 127.0.0.1, each seeded with every node's internal URL.

    ``prefixes`` maps a node index to a command it runs under (``faketime_prefix("+60s")``);
    ``node_settings`` maps a node index to settings that override ``settings`` for it. With
    ``in_process`` the nodes run in this process (``tests.inprocess``), except those with a
    prefix or more than one process. When a node fails to start, the ones already started are
    stopped and the error propagates."""

    def __init__(
        self,
        root: Path,
        n: int,
        scheme: str = "http",
        prefixes: Mapping[int, Sequence[str]] | None = None,
        node_settings: Mapping[int, Mapping[str, object]] | None = None,
        in_process: bool = False,
        **settings: object,
    ) -> None:
        self.root = root
        self.in_process = in_process
        self.prefixes = dict(prefixes or {})
        self.node_settings = dict(node_settings or {})
        self.internal_ports = [free_port() for _ in range(n)]
        self.internal_urls = [f"{scheme}://127.0.0.1:{p}" for p in self.internal_ports]
        self.settings = settings
        self.nodes: list[NodeProcess] = []
        try:
            for i in range(n):
                self.nodes.append(self._spawn(i))
        except BaseException:
            self.stop_all()  # no caller holds the mesh yet: stop the nodes that did start
            raise

    def _env(self, i: int) -> dict[str, str]:
        env = node_env(self.root / f"n{i}", **{**self.settings, **self.node_settings.get(i, {})})
        env["KURA_INTERNAL_PORT"] = str(self.internal_ports[i])
        env["KURA_NODE_URL"] = self.internal_urls[i]
        env["KURA_PEERS"] = ",".join(self.internal_urls)
        env["KURA_REGION"] = f"r{i}"
        return env

    def _spawn(self, i: int, prepare: Callable[[Node], None] | None = None) -> NodeProcess:
        env, prefix = self._env(i), self.prefixes.get(i, ())
        if self.in_process and not prefix and env["KURA_WORKERS"] == "1":
            from tests.inprocess import start_in_process

            return start_in_process(self.root / f"n{i}", env, prepare)
        assert prepare is None, "prepare needs an in-process node"
        return spawn_node(self.root / f"n{i}", env, prefix)

    def restart(self, i: int, prepare: Callable[[Node], None] | None = None) -> NodeProcess:
        """Start node ``i`` again on its data dir (after it was stopped or killed); ``prepare``
        as ``start_in_process``'s (in-process nodes only)."""
        self.nodes[i] = self._spawn(i, prepare)
        return self.nodes[i]

    def stop_all(self) -> list[int]:
        return [n.stop() for n in self.nodes]

    def wait_ready(self, timeout: float = 60.0) -> None:
        for node in self.nodes:
            assert wait_for(
                lambda n=node: oneshot.get(n.url + "/ready").status_code == 200, timeout
            ), f"{node.url} not ready: {oneshot.get(node.url + '/ready').text}"

    def wait_drained(self, timeout: float = 60.0) -> None:
        """Every node's outbox is empty."""
        for node in self.nodes:
            assert wait_for(lambda n=node: status(n)["outbox_messages"] == 0, timeout), status(node)


def status(node: NodeProcess) -> dict[str, object]:
    return oneshot.get(node.url + "/status", timeout=10).json()  # type: ignore[no-any-return]


def peer_row(node: NodeProcess, url: str) -> dict[str, object]:
    """``node``'s ``/status`` row for its peer ``url`` (``peers[]``); ``{}`` while it lists no
    such peer (discovery has not seen it yet)."""
    peers = status(node)["peers"]
    assert isinstance(peers, list)
    return next((p for p in peers if p["node_url"] == url), {})


def wait_for(predicate: Callable[[], object], timeout: float, interval: float = 0.05) -> bool:
    """``kit.wait.wait_until``, a node that does not answer (``httpx.HTTPError``) counting as
    "not yet"."""
    return wait_until(predicate, timeout, interval=interval, ignoring=(httpx.HTTPError,))


def manifests(node: NodeProcess, peer_token: str = "") -> dict[str, dict[str, object]]:
    """Every manifest a node holds, by artifact_id (through its internal paging API, with
    ``peer_token`` when the node has KURA_INTERNAL_TOKENS)."""
    out: dict[str, dict[str, object]] = {}
    after = ""
    headers = {"Authorization": f"Bearer {peer_token}"} if peer_token else {}
    while True:
        r = oneshot.get(
            node.internal_url + "/_internal/bootstrap/manifests",
            params={"after": after, "limit": 500},
            headers=headers,
            timeout=30,
        )
        r.raise_for_status()
        page = r.json()
        for m in page["manifests"]:
            out[m["artifact_id"]] = m
        if page["next_after"] is None:
            return out
        after = page["next_after"]


def forget_behind_the_cursor(
    node: NodeProcess, peer: NodeProcess, *deletes: tuple[str, Sequence[object]]
) -> list[int]:
    """Lose data behind a stopped ``node``'s back, so only anti-entropy brings it back: in its
    index, move its change-feed cursor with ``peer`` to ``peer``'s head (so the change-feed
    pull brings nothing older), then run each ``(DELETE statement, parameters)`` of
    ``deletes``, all in one transaction. Returns the rows each statement deleted, in order."""
    src = sqlite3.connect(f"file:{peer.data_dir / 'index.sqlite3'}?mode=ro", uri=True)
    try:
        meta = dict(src.execute("SELECT k, v FROM meta WHERE k IN ('epoch', 'change_seq')"))
    finally:
        src.close()
    conn = sqlite3.connect(node.data_dir / "index.sqlite3")
    try:
        with conn:
            conn.execute(
                "INSERT OR REPLACE INTO peer_cursors (peer, epoch, seq, updated_at_ms) "
                "VALUES (?, ?, ?, 0)",
                (peer.internal_url, meta["epoch"], int(meta["change_seq"])),
            )
            return [int(conn.execute(sql, tuple(params)).rowcount) for sql, params in deletes]
    finally:
        conn.close()
