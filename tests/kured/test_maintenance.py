"""The maintenance around a planned reboot (issue 31, item 3; kured #499, #501, #585), end to
end: real ``kured`` agent processes (``--lock-backend=lease`` against the Kubernetes API double;
the reboot command records the reboot and kills the agent, which ``Host`` restarts as a boot
would), a real Alertmanager (Debian's ``prometheus-alertmanager``) and a real HTTP receiver.

* The silence exists before the drain (seen by a pre-drain hook command) and when the reboot
  command runs (seen by the reboot command itself, after the drain); after the boot it is kept
  while a gate blocks, its end moved forward by the agent over two keeper periods, also across
  a SIGKILL of the agent then, and expired once the gate passes.
* An agent killed mid-reboot (SIGKILL during ``--reboot-delay``, after the drain) and restarted
  expires that silence at start, before anything else; the reboot then runs again and its own
  silence is expired once the node is back.
* An Alertmanager that cannot be reached blocks the reboot, loudly.
* The hooks and the "node is back" message reach one HTTP receiver in order, with the documents
  the hooks promise; a failing pre-drain hook keeps the node from rebooting, with the reason in
  ``kured status``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from kit.wait import wait_until_async
from kura_harness.launch.alertmanager import Alertmanager
from tests import oneshot
from tests.kured.agents import Host, lease_host, read_events
from tests.kured.k8s_double import KubeDouble

NS = "kube-system"
MATCHERS = ("--alertmanager-silence-matcher", "instance=~%s(:[0-9]+)?")
MATCHERS += ("--alertmanager-silence-matcher", "severity!=critical")

# Appends Alertmanager's silences (one JSON line) to a file: run as the pre-drain hook and
# before the test's reboot, it shows what Alertmanager holds at those instants.
SNAPSHOT = """import sys, urllib.request
with urllib.request.urlopen(sys.argv[1] + "/api/v2/silences", timeout=10) as r:
    body = r.read()
with open(sys.argv[2], "ab") as f:
    f.write(body.strip() + b"\\n")
"""


def _snapshot_script(tmp_path: Path) -> Path:
    path = tmp_path / "snapshot.py"
    path.write_text(SNAPSHOT)
    return path


def _snapshots(path: Path) -> list[list[dict[str, Any]]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _ours(silences: list[dict[str, Any]], node: str = "n1") -> list[dict[str, Any]]:
    return [
        s
        for s in silences
        if s["createdBy"] == "kured" and s["comment"].startswith(f"kured: reboot of node {node} ")
    ]


def _active(silences: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in _ours(silences) if s["status"]["state"] == "active"]


def _lease_holder(kube: KubeDouble) -> str | None:
    lease = kube.lease(NS, "kured")
    return None if lease is None else lease["spec"].get("holderIdentity")


async def _until(predicate: Callable[[], object], within: float) -> bool:
    return await wait_until_async(predicate, within, interval=0.1)


def _snapshot_before_reboot(host: Host, tmp_path: Path, am: Alertmanager, out: Path) -> None:
    """Make the host's reboot command take a snapshot of Alertmanager first."""
    i = host.argv.index("--reboot-command")
    wrapper = tmp_path / "reboot-with-snapshot.sh"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"{sys.executable} {_snapshot_script(tmp_path)} {am.url} {out}\n"
        f'exec {tmp_path / "reboot.sh"} "$@"\n'
    )
    wrapper.chmod(0o755)
    host.argv[i + 1] = f"{wrapper} {host.argv[i + 1].split(' ', 1)[1]}"


def _metric(url: str, name: str, text: str = "", **labels: str) -> float:
    """``name{labels}`` from ``url``'s /metrics (or from ``text``, one scrape read before)."""
    text = text or oneshot.get(url + "/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {labels} not in /metrics:\n{text}")


def _decisions(url: str) -> float:
    """How many checks the agent at ``url`` has decided (``kured_decisions_total``, all
    actions): its own tick counter."""
    text = oneshot.get(url + "/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("kured_decisions_total{")
    )


async def _after_checks(host: Host, n: int, within: float = 60) -> None:
    """Return once the agent ran ``n`` whole checks after this call (its decision counter
    advanced ``n + 1`` times: the check under way may have decided already). A negative
    assertion after it ("not run again", "never rebooted") has been tested by ``n`` checks,
    however slow the machine; a sleep would prove nothing on a loaded one."""
    start = await asyncio.to_thread(_decisions, host.url)

    async def advanced() -> bool:  # scraped off the loop: the receiver runs on it
        return await asyncio.to_thread(_decisions, host.url) >= start + n + 1

    assert await wait_until_async(advanced, within, interval=0.2), host.log()


@dataclass
class Receiver:
    """One HTTP receiver for hooks, notifications and a gate: every POST as (path, JSON), in
    the order they arrived; ``GET /gate`` answers 200 unless ``gate_blocks()`` says so."""

    port: int = 0
    received: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    gate_blocks: Callable[[], bool] = lambda: False
    fail: set[str] = field(default_factory=set)  # paths answered 500

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def paths(self) -> list[str]:
        return [p for p, _ in self.received]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    box = Receiver()

    async def post(request: web.Request) -> web.Response:
        box.received.append((request.path, json.loads(await request.read())))
        if request.path in box.fail:
            return web.Response(status=500, text="maintenance system says no")
        return web.Response(text="ok")

    async def gate(_request: web.Request) -> web.Response:
        if box.gate_blocks():
            return web.Response(status=503, text="node not healthy yet")
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/{tail:.*}", post)
    app.router.add_get("/gate", gate)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    box.port = runner.addresses[0][1]
    yield box
    await runner.cleanup()


def _ends_at(am: Alertmanager, silence_id: str) -> float:
    """The ``endsAt`` of an active silence (unix seconds); 0 when it is not active."""
    found = [s["endsAt"] for s in _active(am.silences()) if s["id"] == silence_id]
    return _unix(found[0]) if found else 0.0


def _rebooted(events: Path) -> bool:
    return any(what == "reboot" for _, _, what in read_events(events))


async def test_the_silence_covers_drain_and_reboot_outlives_its_duration_and_is_expired_once_back(
    tmp_path: Path,
    kube: KubeDouble,
    kubeconfig: Path,
    alertmanager: Alertmanager,
    receiver: Receiver,
) -> None:
    kube.add_node("n1")
    kube.add_pod("default", "web-1", "n1")
    events = tmp_path / "events"
    at_drain, at_reboot = tmp_path / "at-drain.jsonl", tmp_path / "at-reboot.jsonl"
    gate_open = asyncio.Event()
    # The gate passes before the reboot, blocks after it until the test opens it: the node is
    # "back" only then.
    receiver.gate_blocks = lambda: _rebooted(events) and not gate_open.is_set()
    host = lease_host(
        tmp_path,
        kubeconfig,
        "--period",
        "1s",
        "--alertmanager-url",
        alertmanager.url,
        *MATCHERS,
        "--alertmanager-silence-duration",
        "30s",  # extended every 10 s: a restart of the agent has 20 s before it could lapse
        "--gate-url",
        receiver.url("/gate"),
        "--pre-drain-hook-command",
        f"{sys.executable} {_snapshot_script(tmp_path)} {alertmanager.url} {at_drain}",
    )
    _snapshot_before_reboot(host, tmp_path, alertmanager, at_reboot)
    host.sentinel.touch()
    host.start()
    try:
        assert await _until(lambda: host.boots >= 2, 60), host.log()
        # Before the drain (the pod was still there) and when the reboot ran (after the drain),
        # one active silence of ours, with the matchers templated with the node name.
        (drain_view,) = _snapshots(at_drain)
        (reboot_view,) = _snapshots(at_reboot)
        (silence,) = _active(drain_view)
        assert [s["id"] for s in _active(reboot_view)] == [silence["id"]]
        assert sorted(
            (m["name"], m["value"], m["isRegex"], m["isEqual"]) for m in silence["matchers"]
        ) == [("instance", "n1(:[0-9]+)?", True, True), ("severity", "critical", False, False)]
        assert kube.pod("default", "web-1") is None  # the drain evicted it
        # Back from the reboot, the gate blocks: the silence stays active (the same one), its
        # end moved forward by the agent over two keeper periods, and kured status says what it
        # waits for.
        assert await _until(lambda: _lease_holder(kube) is None, 30), host.log()
        assert not kube.node("n1")["spec"].get("unschedulable")
        ends = [_ends_at(alertmanager, silence["id"])]
        for _ in range(2):
            assert await _until(lambda: _ends_at(alertmanager, silence["id"]) > ends[-1], 30), (
                ends,
                host.log(),
            )
            ends.append(_ends_at(alertmanager, silence["id"]))
        assert [s["id"] for s in _active(alertmanager.silences())] == [silence["id"]]
        status = host.status()
        assert status["maintenance"]["active"] is True, status
        assert "waiting for its gates" in status["maintenance"]["phase"], status
        assert f"gate {receiver.url('/gate')} answered 503" in status["maintenance"]["phase"]
        assert _metric(host.url, "kured_alertmanager_silence_active", node="n1") == 1
        # Killed (SIGKILL) while it waits for the gate and started again: the machine did
        # reboot within this maintenance (the state file says so), so the silence is kept.
        boots = host.boots
        assert host.proc is not None
        os.killpg(host.proc.pid, signal.SIGKILL)
        assert await _until(lambda: host.boots > boots, 30), host.log()
        assert await _until(
            lambda: "waiting for its gates" in host.status()["maintenance"]["phase"], 15
        )
        assert [s["id"] for s in _active(alertmanager.silences())] == [silence["id"]]
        # The gate passes: the silence is expired and the maintenance ends.
        gate_open.set()
        assert await _until(lambda: not _active(alertmanager.silences()), 15), host.log()
        ours = _ours(alertmanager.silences())
        assert [s["status"]["state"] for s in ours] == ["expired"], ours
        assert await _until(lambda: host.status()["maintenance"]["active"] is False, 10)
        assert _metric(host.url, "kured_maintenance_active", node="n1") == 0
        assert _metric(host.url, "kured_alertmanager_silence_active", node="n1") == 0
        assert [what for _, _, what in read_events(events)] == ["boot", "reboot", "boot", "boot"]
    finally:
        host.stop()


async def test_an_agent_killed_mid_reboot_expires_its_silence_when_restarted(
    tmp_path: Path, kube: KubeDouble, kubeconfig: Path, alertmanager: Alertmanager
) -> None:
    kube.add_node("n1")
    host = lease_host(
        tmp_path,
        kubeconfig,
        "--period",
        "1s",
        "--alertmanager-url",
        alertmanager.url,
        *MATCHERS,
        "--reboot-delay",
        "1h",  # after the drain, the agent waits here: it is killed meanwhile
    )
    host.sentinel.touch()
    host.start()
    try:
        assert await _until(lambda: "(--reboot-delay) before the reboot" in host.log(), 30), (
            host.log()
        )
        (first,) = _active(alertmanager.silences())
        assert kube.node("n1")["spec"].get("unschedulable") is True  # drained, cordoned
        # SIGKILL mid-reboot; the supervisor starts it again (a crash-looping pod), now with no
        # reboot delay so the reboot goes on.
        i = host.argv.index("--reboot-delay")
        host.argv[i + 1] = "0"
        assert host.proc is not None
        os.killpg(host.proc.pid, signal.SIGKILL)
        assert await _until(lambda: host.boots >= 2, 30), host.log()
        # At start the killed agent's silence is expired; the reboot then runs again (a new
        # silence) and that one is expired once the node is back.
        assert await _until(lambda: _rebooted(tmp_path / "events"), 60), host.log()
        assert await _until(lambda: host.boots >= 3 and _lease_holder(kube) is None, 60)
        assert await _until(lambda: not _active(alertmanager.silences()), 15), host.log()
        ours = {s["id"]: s for s in _ours(alertmanager.silences())}
        assert first["id"] in ours
        assert all(s["status"]["state"] == "expired" for s in ours.values()), ours
        assert len(ours) == 2, ours  # the killed agent's, and the one of the reboot that ran
        (second,) = [s for s in ours.values() if s["id"] != first["id"]]
        # The first ended (expired) before the second began.
        assert ours[first["id"]]["endsAt"] <= second["startsAt"], ours
        log = host.log()
        assert "maintenance abandoned (restarted with no reboot in progress)" in log
        assert f"alertmanager silence {first['id']} expired" in log
        assert not kube.node("n1")["spec"].get("unschedulable")
    finally:
        host.stop()


async def test_an_unreachable_alertmanager_blocks_the_reboot_loudly(
    tmp_path: Path, kube: KubeDouble, kubeconfig: Path
) -> None:
    kube.add_node("n1")
    host = lease_host(
        tmp_path,
        kubeconfig,
        "--period",
        "1s",
        "--alertmanager-url",
        "http://127.0.0.1:9",  # nothing listens there
        *MATCHERS,
        "--alertmanager-timeout",
        "2s",
    )
    host.sentinel.touch()
    host.start()
    try:
        assert await _until(lambda: host.status()["reason"] == "silence_failed", 30), host.log()
        status = host.status()
        assert "cannot silence this node's alerts before the drain" in status["blocked_by"]
        assert status["failures"].get("silence", 0) >= 1
        await _after_checks(host, 2)
        assert read_events(tmp_path / "events")[-1][2] == "boot"  # never rebooted
        assert not _rebooted(tmp_path / "events")
        assert not kube.node("n1")["spec"].get("unschedulable")  # never cordoned
        assert _lease_holder(kube) is None  # the lock is not sat on
    finally:
        host.stop()


async def test_hooks_and_the_back_message_reach_one_receiver_in_order(
    tmp_path: Path, kube: KubeDouble, kubeconfig: Path, receiver: Receiver
) -> None:
    kube.add_node("n1")
    host = lease_host(
        tmp_path,
        kubeconfig,
        "--period",
        "1s",
        "--pre-drain-hook-url",
        receiver.url("/hooks/pre-drain"),
        "--post-uncordon-hook-url",
        receiver.url("/hooks/post-uncordon"),
        "--notify-url",
        f"generic+http://127.0.0.1:{receiver.port}/notify",
        "--message-template-back",
        "%s is back in service",
    )
    started = time.time()
    host.sentinel.touch()
    host.start()
    try:
        assert await _until(lambda: len(receiver.received) >= 6, 60), (
            receiver.received,
            host.log(),
        )
        await _after_checks(host, 2)  # nothing else arrives
        said = [
            (path, body["message"] if path == "/notify" else body["event"])
            for path, body in receiver.received
        ]
        assert said == [
            ("/hooks/pre-drain", "pre-drain"),
            ("/notify", "Draining node n1"),
            ("/notify", "Rebooting node n1"),
            ("/notify", "Node n1 rebooted & uncordoned successfully!"),
            ("/hooks/post-uncordon", "post-uncordon"),
            ("/notify", "n1 is back in service"),
        ]
        for path, body in receiver.received:
            if path.startswith("/hooks/"):
                assert body["node"] == "n1", body
                assert body["lock_holder"] == "n1", body
                assert started - 1 <= _unix(body["time"]) <= time.time(), body
        assert [what for _, _, what in read_events(tmp_path / "events")] == [
            "boot",
            "reboot",
            "boot",
        ]
        assert _metric(host.url, "kured_hooks_total", event="post-uncordon", result="ok") == 1
        assert _metric(host.url, "kured_notifications_total", event="back", result="sent") == 1
    finally:
        host.stop()


def _unix(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


@pytest.mark.parametrize("kind", ["url", "command"])
async def test_a_failing_pre_drain_hook_keeps_the_node_from_rebooting_with_the_reason_in_status(
    tmp_path: Path, kube: KubeDouble, kubeconfig: Path, receiver: Receiver, kind: str
) -> None:
    kube.add_node("n1")
    receiver.fail.add("/hooks/pre-drain")
    hook = (
        ("--pre-drain-hook-url", receiver.url("/hooks/pre-drain"))
        if kind == "url"
        else ("--pre-drain-hook-command", "sh -c 'echo maintenance system says no; exit 3'")
    )
    host = lease_host(
        tmp_path,
        kubeconfig,
        "--period",
        "2s",
        *hook,
        "--notify-url",
        f"generic+http://127.0.0.1:{receiver.port}/notify",
    )
    host.sentinel.touch()
    host.start()
    try:
        assert await _until(lambda: host.status()["reason"] == "pre_drain_hook_failed", 30), (
            host.log()
        )
        await _after_checks(host, 2)  # more checks: each one blocked again
        said: list[subprocess.CompletedProcess[str]] = []

        async def status_says_why() -> bool:
            # Between two checks (not while one runs the hook again) status shows the block.
            out = await asyncio.to_thread(  # the receiver runs on this loop: keep it free
                subprocess.run,
                [sys.executable, "-m", "kured.cli", "status", "--url", host.url],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            said.append(out)
            return "pre-drain hook failed" in out.stdout

        for _ in range(10):
            if await status_says_why():
                break
        out = said[-1]
        assert "pre-drain hook failed" in out.stdout, out.stdout
        assert "maintenance system says no" in out.stdout, out.stdout
        assert "exited 3" in out.stdout if kind == "command" else "answered 500" in out.stdout
        assert out.returncode != 0, out
        assert not _rebooted(tmp_path / "events")
        assert not kube.node("n1")["spec"].get("unschedulable")
        assert _lease_holder(kube) is None

        # The hook runs again at later checks (a check that does not get the lock decides
        # without running it, so checks are not counted: the hook's own counter is).
        async def failed_thrice() -> bool:  # scraped off the loop: the receiver runs on it
            found = await asyncio.to_thread(
                _metric, host.url, "kured_hooks_total", event="pre-drain", result="failed"
            )
            return found >= 3

        assert await wait_until_async(failed_thrice, 60, interval=0.2), host.log()
        scrape = oneshot.get(host.url + "/metrics", timeout=10).text  # one scrape: both agree
        failed = _metric("", "kured_hooks_total", scrape, event="pre-drain", result="failed")
        assert _metric("", "kured_failures_total", scrape, kind="hook") == failed
        # No drain message: nothing was drained.
        assert [p for p in receiver.paths() if p == "/notify"] == []
    finally:
        host.stop()


async def test_at_start_a_silence_of_ours_that_no_state_recorded_is_expired_and_no_other(
    tmp_path: Path, kube: KubeDouble, kubeconfig: Path, alertmanager: Alertmanager
) -> None:
    """An agent killed between creating its silence and writing its state file left a silence
    that only its mark (createdBy, comment) names: the next start expires it, and leaves the
    silences of another node (n10: a name that starts like ours) and of people alone."""
    kube.add_node("n1")

    def create(created_by: str, comment: str) -> str:
        now = time.time()
        body = {
            "matchers": [{"name": "instance", "value": "x", "isRegex": False, "isEqual": True}],
            "startsAt": _iso(now),
            "endsAt": _iso(now + 3600),
            "createdBy": created_by,
            "comment": comment,
        }
        answer = oneshot.post(alertmanager.url + "/api/v2/silences", json=body, timeout=10)
        return str(answer.json()["silenceID"])

    orphan = create("kured", "kured: reboot of node n1 (drained since 2026-01-01T00:00:00Z)")
    others = [
        create("kured", "kured: reboot of node n10 (drained since 2026-01-01T00:00:00Z)"),
        create("alice", "kured: reboot of node n1 (copied by hand)"),
    ]
    host = lease_host(
        tmp_path, kubeconfig, "--period", "1h", "--alertmanager-url", alertmanager.url, *MATCHERS
    )
    host.start()  # no sentinel: nothing to reboot
    try:
        assert await _until(
            lambda: (
                {s["id"]: s["status"]["state"] for s in alertmanager.silences()}[orphan]
                == "expired"
            ),
            15,
        ), host.log()
        state = {s["id"]: s["status"]["state"] for s in alertmanager.silences()}
        assert [state[i] for i in others] == ["active", "active"]
        assert f"alertmanager silence {orphan} expired" in host.log()
        assert host.status()["maintenance"]["active"] is False
    finally:
        host.stop()


def _iso(unix: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(unix, tz=UTC).isoformat().replace("+00:00", "Z")


async def test_an_expiry_alertmanager_refuses_is_retried_until_it_succeeds(
    tmp_path: Path,
    kube: KubeDouble,
    kubeconfig: Path,
    alertmanager: Alertmanager,
    receiver: Receiver,
) -> None:
    """Alertmanager is down when the node is back and its gates pass: the silence cannot be
    expired; status says so and each check retries; once Alertmanager is up again (same data,
    so the silence is still active there) the agent expires it."""
    kube.add_node("n1")
    events = tmp_path / "events"
    gate_open = asyncio.Event()
    receiver.gate_blocks = lambda: _rebooted(events) and not gate_open.is_set()
    host = lease_host(
        tmp_path,
        kubeconfig,
        "--period",
        "1s",
        "--alertmanager-url",
        alertmanager.url,
        *MATCHERS,
        "--alertmanager-silence-duration",
        "10m",  # it must not end by itself during the test
        "--alertmanager-timeout",
        "2s",
        "--gate-url",
        receiver.url("/gate"),
    )
    host.sentinel.touch()
    host.start()
    try:
        assert await _until(lambda: host.boots >= 2 and _lease_holder(kube) is None, 60)
        assert await _until(
            lambda: "waiting for its gates" in host.status()["maintenance"]["phase"], 15
        ), host.log()
        (silence,) = _active(alertmanager.silences())
        alertmanager.stop()
        gate_open.set()
        assert await _until(lambda: host.status()["maintenance"]["silence_expiry_pending"], 15), (
            host.log()
        )
        status = host.status()
        assert status["maintenance"]["active"] is True  # not over until the silence is gone
        assert status["failures"].get("silence", 0) >= 1
        await _after_checks(host, 2)  # more checks, each failing again
        restarted = Alertmanager(alertmanager.dir, port=alertmanager.port).start()
        try:
            assert await _until(lambda: not _active(restarted.silences()), 20), host.log()
            ours = {s["id"]: s["status"]["state"] for s in _ours(restarted.silences())}
            assert ours == {silence["id"]: "expired"}, ours
            assert await _until(lambda: host.status()["maintenance"]["active"] is False, 10)
            assert host.status()["maintenance"]["silence_expiry_pending"] is False
        finally:
            restarted.stop()
    finally:
        host.stop()


async def test_a_failing_post_uncordon_hook_command_is_counted_and_the_node_is_back_all_the_same(
    tmp_path: Path, kube: KubeDouble, kubeconfig: Path, receiver: Receiver
) -> None:
    """A command hook gets the document on its stdin and KURED_NODE/KURED_HOOK_EVENT; a failed
    post-uncordon hook is logged and counted, not retried, and does not hold the rest up."""
    kube.add_node("n1")
    doc, env = tmp_path / "hook-stdin.json", tmp_path / "hook-env"
    script = f'cat > {doc}; echo "$KURED_NODE $KURED_HOOK_EVENT" >> {env}; echo ticket system down; exit 4'
    host = lease_host(
        tmp_path,
        kubeconfig,
        "--period",
        "1s",
        "--post-uncordon-hook-command",
        f"sh -c '{script}'",
        "--notify-url",
        f"generic+http://127.0.0.1:{receiver.port}/notify",
        "--message-template-back",
        "%s is back",
    )
    host.sentinel.touch()
    host.start()
    try:
        assert await _until(lambda: "n1 is back" in str(receiver.received), 60), host.log()
        assert await _until(lambda: host.status()["maintenance"]["active"] is False, 10)
        await _after_checks(host, 2)  # more checks: the hook is not run again
        body = json.loads(doc.read_text())
        assert (body["node"], body["event"], body["lock_holder"]) == ("n1", "post-uncordon", "n1")
        assert env.read_text() == "n1 post-uncordon\n"
        scrape = oneshot.get(host.url + "/metrics", timeout=10).text
        assert _metric("", "kured_hooks_total", scrape, event="post-uncordon", result="failed") == 1
        assert _metric("", "kured_failures_total", scrape, kind="hook") == 1
        failure = host.status()["maintenance"]["last_hook_failure"]
        assert "exited 4: ticket system down" in failure["message"], failure
        assert "post-uncordon hook failed (not retried)" in host.log()
        assert [what for _, _, what in read_events(tmp_path / "events")] == [
            "boot",
            "reboot",
            "boot",
        ]
    finally:
        host.stop()


async def test_an_operator_cordoned_node_gets_no_hook_and_no_back_message_across_a_restart(
    tmp_path: Path, kube: KubeDouble, kubeconfig: Path, receiver: Receiver
) -> None:
    """A node an operator cordoned before the lock stays cordoned after the reboot and gets
    neither the post-uncordon hook nor the "back" message, also when the agent is killed
    (SIGKILL) after the lock release, while the maintenance waits for its gates: the state file
    says the node was not uncordoned."""
    kube.add_node("n1", unschedulable=True)
    events = tmp_path / "events"
    gate_open = asyncio.Event()
    receiver.gate_blocks = lambda: _rebooted(events) and not gate_open.is_set()
    host = lease_host(
        tmp_path,
        kubeconfig,
        "--period",
        "1s",
        "--gate-url",
        receiver.url("/gate"),
        "--post-uncordon-hook-url",
        receiver.url("/hooks/post-uncordon"),
        "--notify-url",
        f"generic+http://127.0.0.1:{receiver.port}/notify",
        "--message-template-back",
        "%s is back in service",
    )
    host.sentinel.touch()
    host.start()
    try:
        assert await _until(lambda: host.boots >= 2 and _lease_holder(kube) is None, 60), host.log()
        assert await _until(
            lambda: "waiting for its gates" in host.status()["maintenance"]["phase"], 15
        ), host.log()
        boots = host.boots
        assert host.proc is not None
        os.killpg(host.proc.pid, signal.SIGKILL)
        assert await _until(lambda: host.boots > boots, 30), host.log()
        assert await _until(
            lambda: "waiting for its gates" in host.status()["maintenance"]["phase"], 15
        ), host.log()
        gate_open.set()
        assert await _until(lambda: host.status()["maintenance"]["active"] is False, 15), host.log()
        assert "stays cordoned (it was before the lock)" in host.log()
        assert "/hooks/post-uncordon" not in receiver.paths()
        assert "n1 is back in service" not in str(receiver.received)
        assert kube.node("n1")["spec"].get("unschedulable") is True
    finally:
        host.stop()


SECRETS = ("alice", "s3cr3t-pass", "PATH-TOKEN-42", "QUERY-TOKEN-43")


@pytest.mark.parametrize("where", ["alertmanager", "hook"])
async def test_secrets_in_the_hook_and_alertmanager_urls_reach_no_log_and_no_status(
    tmp_path: Path, kube: KubeDouble, kubeconfig: Path, receiver: Receiver, where: str
) -> None:
    """A URL with a user and password, a token in its path and one in its query: the start-up
    flag dump, the errors (the receiver answers 404 to Alertmanager's API and 500 to the hook)
    and ``kured status`` show ``scheme://host:port`` only."""
    kube.add_node("n1")
    receiver.fail.add("/PATH-TOKEN-42/hook")
    secret = f"http://alice:s3cr3t-pass@127.0.0.1:{receiver.port}/PATH-TOKEN-42"
    flags = (
        ("--alertmanager-url", f"{secret}/?token=QUERY-TOKEN-43", *MATCHERS)
        if where == "alertmanager"
        else (
            "--pre-drain-hook-url",
            f"{secret}/hook?token=QUERY-TOKEN-43",
            "--post-uncordon-hook-url",
            f"{secret}/hook?token=QUERY-TOKEN-43",
        )
    )
    host = lease_host(tmp_path, kubeconfig, "--period", "1s", *flags)
    host.sentinel.touch()
    host.start()
    reason = "silence_failed" if where == "alertmanager" else "pre_drain_hook_failed"
    try:
        assert await _until(lambda: host.status()["reason"] == reason, 30), host.log()
        shown = f"http://127.0.0.1:{receiver.port}"
        status = host.status()
        assert shown in status["blocked_by"], status
        out = await asyncio.to_thread(  # the receiver runs on this loop: keep it free
            subprocess.run,
            [sys.executable, "-m", "kured.cli", "status", "--url", host.url],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        everything = host.log() + json.dumps(status) + out.stdout + out.stderr
        assert f"={shown}" in host.log()  # the flag dump shows the endpoint
        for secret_part in SECRETS:
            assert secret_part not in everything, (secret_part, everything)
    finally:
        host.stop()
