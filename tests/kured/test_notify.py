"""Notifications end to end: a real ``kured`` agent process (``--lock-backend=lease`` against the
Kubernetes API double, tests/kured/k8s_double.py; its reboot command records the reboot and
kills the agent, which ``Host`` restarts as a boot would) with two ``--notify-url``s:

* a real HTTP webhook receiver (an aiohttp server in this test), through kured's shoutrrr
  spelling ``generic+http://``;
* a real SMTP server (aiosmtpd), through ``smtp://…?encryption=None``.

A drain → reboot → uncordon cycle must deliver the three templated messages, in order, to both.
With the receivers down (nothing listening) or hanging (accepting, never answering) the reboot
still happens, the lock is still released, and every failed delivery is counted in
``kured_notifications_total``.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from aiohttp import web
from aiosmtpd.controller import Controller

from kit.wait import wait_until_async
from tests import oneshot
from tests.kured.agents import Host, lease_host, read_events
from tests.kured.k8s_double import KubeDouble

NS = "kube-system"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Mailbox:
    """aiosmtpd handler: every message received, as (from, to, text of the body)."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, list[str], str]] = []

    async def handle_DATA(self, _server: object, _session: object, envelope: object) -> str:
        content = envelope.content  # type: ignore[attr-defined]
        text = content.decode() if isinstance(content, bytes) else str(content)
        self.messages.append((envelope.mail_from, list(envelope.rcpt_tos), text))  # type: ignore[attr-defined]
        return "250 OK"


@pytest.fixture
def smtp() -> Iterator[tuple[Mailbox, int]]:
    box = Mailbox()
    port = _free_port()
    controller = Controller(box, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield box, port
    finally:
        controller.stop()


@pytest.fixture
async def webhook() -> AsyncIterator[tuple[list[dict[str, object]], int]]:
    received: list[dict[str, object]] = []

    async def hook(request: web.Request) -> web.Response:
        received.append(json.loads(await request.read()))
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/hooks/kured", hook)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield received, runner.addresses[0][1]
    await runner.cleanup()


async def _until(predicate: Callable[[], object], within: float) -> bool:
    return await wait_until_async(predicate, within, interval=0.1)


def _lease_holder(kube: KubeDouble) -> str | None:
    lease = kube.lease(NS, "kured")
    return None if lease is None else lease["spec"].get("holderIdentity")


def _metric(url: str, name: str, **labels: str) -> float:
    text = oneshot.get(url + "/metrics", timeout=10).text
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{{{want}}} not in /metrics:\n{text}")


def _host(tmp_path: Path, kubeconfig: Path, *flags: str) -> Host:
    return lease_host(tmp_path, kubeconfig, "--period", "1h", *flags)


async def test_a_reboot_cycle_delivers_three_templated_messages_to_a_webhook_and_smtp(
    tmp_path: Path,
    kube: KubeDouble,
    kubeconfig: Path,
    webhook: tuple[list[dict[str, object]], int],
    smtp: tuple[Mailbox, int],
) -> None:
    received, http_port = webhook
    box, smtp_port = smtp
    kube.add_node("n1")
    host = _host(
        tmp_path,
        kubeconfig,
        "--notify-url",
        f"generic+http://127.0.0.1:{http_port}/hooks/kured",
        "--notify-url",
        f"smtp://127.0.0.1:{smtp_port}/?from=kured@example.com&to=ops@example.com&encryption=None",
        "--message-template-drain",
        "draining %s for patches",
        "--message-template-uncordon",
        "%s is back (100%% done)",
    )
    host.sentinel.touch()
    host.start()
    try:
        assert await _until(lambda: len(received) >= 3 and len(box.messages) >= 3, 60), (
            received,
            box.messages,
            host.log(),
        )
        assert await _until(lambda: _lease_holder(kube) is None, 30)
        await asyncio.sleep(0.5)  # nothing else arrives: exactly one message per event
        expected = ["draining n1 for patches", "Rebooting node n1", "n1 is back (100% done)"]
        assert [m["message"] for m in received] == expected
        assert all(m["title"] == "kured" for m in received)
        assert [(f, to) for f, to, _ in box.messages] == [
            ("kured@example.com", ["ops@example.com"])
        ] * 3
        for (_, _, text), message in zip(box.messages, expected, strict=True):
            assert message in text.replace("=\r\n", ""), text
        events = [what for _, _, what in read_events(tmp_path / "events")]
        assert events == ["boot", "reboot", "boot"]
        assert not kube.node("n1")["spec"].get("unschedulable")
        for event in ("drain", "reboot", "uncordon"):
            # The reboot message was counted by the agent that rebooted; this one (after the
            # boot) counts only the uncordon.
            want = 2.0 if event == "uncordon" else 0.0
            got = _metric(host.url, "kured_notifications_total", event=event, result="sent")
            assert got == want, (event, got)
        assert "smtp://127.0.0.1" in host.log()  # the start-up log shows scheme://host only
        assert "ops@example.com" not in host.log()
    finally:
        host.stop()


def _hanging_server() -> tuple[socket.socket, threading.Event]:
    """Accepts connections and never answers (a receiver stuck behind a dead proxy)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except (TimeoutError, OSError):
                continue
            held.append(conn)
        for conn in held:
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return server, stop


async def test_receivers_that_are_down_or_hang_neither_block_nor_fail_the_reboot(
    tmp_path: Path, kube: KubeDouble, kubeconfig: Path
) -> None:
    kube.add_node("n1")
    down = _free_port()  # nothing listens there
    hanging, stop = _hanging_server()
    host = _host(
        tmp_path,
        kubeconfig,
        "--notify-url",
        f"generic+http://127.0.0.1:{down}/hook",
        "--notify-url",
        f"smtp://127.0.0.1:{down}/?from=kured@example.com&to=ops@example.com&encryption=None",
        "--notify-url",
        f"generic+http://127.0.0.1:{hanging.getsockname()[1]}/hook",
        "--notify-timeout",
        "2s",
    )
    host.sentinel.touch()
    started = time.monotonic()
    host.start()
    try:
        assert await _until(lambda: host.boots >= 2 and _lease_holder(kube) is None, 60), host.log()
        took = time.monotonic() - started
        events = [what for _, _, what in read_events(tmp_path / "events")]
        assert events == ["boot", "reboot", "boot"]
        assert not kube.node("n1")["spec"].get("unschedulable")
        # The hanging receiver costs at most the 2 s bound before the reboot; the agent after
        # the boot counts its uncordon deliveries: two refused at once, one timed out.
        assert await _until(
            lambda: (
                _metric(host.url, "kured_notifications_total", event="uncordon", result="timeout")
                == 1
            ),
            10,
        )
        assert (
            _metric(host.url, "kured_notifications_total", event="uncordon", result="failed") == 2
        )
        assert _metric(host.url, "kured_notifications_total", event="uncordon", result="sent") == 0
        (booted, _, _), (rebooted, _, _) = read_events(tmp_path / "events")[:2]
        # From the start to the reboot: the drain, and at most the 2 s wait for the messages.
        assert rebooted - booted < 20, rebooted - booted
        assert "timed out (the reboot goes on regardless)" in host.log()
        assert took < 45, took
    finally:
        host.stop()
        stop.set()
        hanging.close()


async def test_a_node_left_cordoned_on_purpose_gets_no_uncordon_message(
    tmp_path: Path,
    kube: KubeDouble,
    kubeconfig: Path,
    webhook: tuple[list[dict[str, object]], int],
) -> None:
    received, http_port = webhook
    kube.add_node("n1", unschedulable=True)  # an operator cordoned it before the lock
    host = _host(
        tmp_path, kubeconfig, "--notify-url", f"generic+http://127.0.0.1:{http_port}/hooks/kured"
    )
    host.sentinel.touch()
    host.start()
    try:
        assert await _until(lambda: host.boots >= 2 and _lease_holder(kube) is None, 60), host.log()
        assert await _until(lambda: len(received) >= 2, 10)
        assert await _until(
            lambda: "leaving it cordoned" in host.log(), 10
        )  # the post-reboot release ran
        await asyncio.sleep(0.5)
        assert [m["message"] for m in received] == ["Draining node n1", "Rebooting node n1"]
        assert kube.node("n1")["spec"].get("unschedulable") is True
    finally:
        host.stop()
