"""Status that tells the truth (issue 15, deliver 2), with real ``kured`` processes and a real
etcd: ``kured status`` and the lock metrics follow the lock store (not the last tick), mark the
last-known holders stale with their age while etcd is unreachable, say when the first check
runs, log a blocking reason once per change, and word gate errors as sentences.
"""

from __future__ import annotations

import base64
import re
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from kura_harness.launch.etcd import Etcd
from kura_harness.launch.process import free_ports
from tests import oneshot
from tests.kured.agents import Host, released_at
from tests.kured.test_agents import wait_for

KEY = "/kured/lock"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def etcd_value(url: str) -> str | None:
    answer = oneshot.post(f"{url}/v3/kv/range", json={"key": _b64(KEY)}, timeout=5).json()
    kvs = answer.get("kvs") or []
    return base64.b64decode(kvs[0]["value"]).decode() if kvs else None


def etcd_put(url: str, value: str) -> None:
    oneshot.post(f"{url}/v3/kv/put", json={"key": _b64(KEY), "value": _b64(value)}, timeout=5)


def etcd_delete(url: str) -> None:
    oneshot.post(f"{url}/v3/kv/deleterange", json={"key": _b64(KEY)}, timeout=5)


def foreign_record(node: str) -> str:
    created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return (
        f'{{"nodeID":"{node}","metadata":{{"unschedulable":false}},"created":"{created}","TTL":0}}'
    )


def holders(host: Host) -> list[str]:
    return [h["node"] for h in host.status()["lock_holders"]]  # type: ignore[union-attr]


def metric(host: Host, name: str, labels: str = "") -> float | None:
    text = oneshot.get(host.url + "/metrics", timeout=10).text
    labels = labels or f'node="{host.node}"'
    pattern = "^" + re.escape(name + "{" + labels + "}") + r" (\S+)$"
    m = re.search(pattern, text, re.MULTILINE)
    return float(m.group(1)) if m else None


def lag_until(predicate, since: float, timeout: float = 10.0) -> float:  # type: ignore[no-untyped-def]
    """Seconds from ``since`` until ``predicate()`` first held (polled every 50 ms)."""
    assert wait_for(predicate, timeout, interval=0.05)
    return time.monotonic() - since


def test_status_and_metrics_follow_etcd_within_a_second_and_go_stale_without_it(
    etcd_server: Etcd, tmp_path: Path
) -> None:
    etcd = etcd_server.url
    events = tmp_path / "events.log"
    # --period 1h: no tick runs during the test after the reboot's release, so only reading
    # the store at each request can make status and metrics follow it.
    host = Host(tmp_path, "n0", etcd, events, "--period", "1h", "--lock-release-delay", "1s")
    host.sentinel.touch()
    try:
        host.start()
        assert wait_for(lambda: released_at(host.log()), 60), host.log()[-2000:]
        # After the post-reboot release: etcd is empty and status and metrics say so at once.
        assert etcd_value(etcd) is None
        t0 = time.monotonic()
        after_release = lag_until(
            lambda: holders(host) == [] and metric(host, "kured_lock_held") == 0.0, t0
        )
        assert after_release <= 1.0, after_release

        # Another holder appears in etcd: shown within a second, no tick needed.
        etcd_put(etcd, foreign_record("other"))
        t1 = time.monotonic()
        appeared = lag_until(lambda: holders(host) == ["other"], t1)
        assert appeared <= 1.0, appeared
        assert metric(host, "kured_lock_holders") == 1.0
        info = metric(host, "kured_lock_holder_info", 'holder="other",node="n0"')
        assert info == 1.0
        assert host.status()["lock"]["stale"] is False  # type: ignore[index]

        # ...and released: gone within a second.
        etcd_delete(etcd)
        t2 = time.monotonic()
        gone = lag_until(
            lambda: holders(host) == [] and metric(host, "kured_lock_holders") == 0, t2
        )
        assert gone <= 1.0, gone

        # etcd unreachable: the last-known holders stay, marked stale, with their age.
        etcd_put(etcd, foreign_record("other"))
        assert wait_for(lambda: holders(host) == ["other"], 5)
        etcd_server.stop()
        time.sleep(1.5)  # let the last successful read age measurably
        status = host.status()
        lock = status["lock"]
        assert lock["stale"] is True, lock  # type: ignore[index]
        assert lock["age_seconds"] >= 1.0, lock  # type: ignore[index]
        assert lock["error"], lock  # type: ignore[index]
        assert [h["stale"] for h in status["lock_holders"]] == [True]  # type: ignore[union-attr]
        condition = next(c for c in status["conditions"] if c["name"] == "lock")  # type: ignore[union-attr]
        assert "stale" in condition["value"], condition
        assert metric(host, "kured_lock_stale") == 1.0
        assert (metric(host, "kured_lock_read_age_seconds") or 0) >= 1.0
        shown = subprocess.run(
            [sys.executable, "-m", "kured.cli", "status", "--url", host.url],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout
        assert "lock holders are STALE" in shown, shown
        print(
            f"lag after release {after_release:.3f}s, after a put {appeared:.3f}s, "
            f"after a delete {gone:.3f}s; stale age {lock['age_seconds']}s"  # type: ignore[index]
        )
    finally:
        host.stop()


def test_first_check_at_start_reasons_logged_once_per_change_and_gate_errors_in_words(
    etcd: str, lock_key: str, tmp_path: Path
) -> None:
    events = tmp_path / "events.log"
    (closed,) = free_ports(1)  # nothing listens there: connection refused
    prometheus = f"http://127.0.0.1:{closed}"
    flags = ("--prometheus-url", prometheus)
    slow = Host(tmp_path, "slow", etcd, events, "--period", "1h", *flags, lock_key=lock_key)
    fast = Host(tmp_path, "fast", etcd, events, "--period", "1s", *flags, lock_key=lock_key)
    try:
        slow.start()
        fast.start()
        # The first check runs at start-up, not after a jittered period (1h here).
        assert wait_for(lambda: slow.status()["reason"] == "not_required", 10), slow.status()
        status = slow.status()
        next_at = datetime.fromisoformat(str(status["next_check_at"])).timestamp()
        assert 0.5 * 3600 - 60 <= next_at - time.time() <= 1.5 * 3600, status
        assert "first check now" in slow.log()
        assert "next check at" in slow.log()

        # Reasons are logged when they change, not every period.
        assert wait_for(
            lambda: (
                (metric(fast, "kured_decisions_total", 'action="nothing",node="fast"') or 0) >= 4
            ),
            30,
        )
        assert fast.log().count("no reboot required") == 1, fast.log()
        fast.sentinel.touch()
        assert wait_for(lambda: fast.status()["reason"] == "gate_unknown", 10), fast.status()
        blocked = str(fast.status()["blocked_by"])
        assert f"Prometheus at {prometheus} unreachable: connection refused" in blocked, blocked
        assert "Error" not in blocked, blocked  # no exception class name
        assert "errno" not in blocked.lower(), blocked
        before = metric(fast, "kured_decisions_total", 'action="nothing",node="fast"') or 0
        assert wait_for(
            lambda: (
                (metric(fast, "kured_decisions_total", 'action="nothing",node="fast"') or 0)
                >= before + 3
            ),
            30,
        )
        assert fast.log().count("unreachable: connection refused") == 1, fast.log()
    finally:
        slow.stop()
        fast.stop()


async def test_before_the_first_check_status_says_when_it_runs(
    kubeconfig: Path, tmp_path: Path
) -> None:
    from kured.console import render, status_of
    from tests.kured.kube_agent import KubeHost

    host = KubeHost(tmp_path, "n1", kubeconfig)
    try:
        agent = host.agent()
        assert status_of(agent, "always")["blocked_by"] == (
            "first check once start-up recovery is done"
        )
        agent.view.next_check_at = 1_800_000_000.0
        status = status_of(agent, "always")
        assert status["blocked_by"] == "first check at 2027-01-15T08:00:00+00:00"
        assert status["next_check_at"] == "2027-01-15T08:00:00+00:00"
        assert "no decision yet" not in render(status)
    finally:
        await host.close()
