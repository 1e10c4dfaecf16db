"""``kured doctor``'s Prometheus checks against a real Prometheus (Debian ``prometheus``, as the
agent and rolling-reboot tests launch it) scraping real ``kured`` agents: 3 agents, then 2
(count mismatch: FAIL); ``for:`` against the retention read from the API; the alerts that block
now under the agent's filter, and the gate loop on kured's own alerts (deploy/alerts); the
cordon alert (``KuredNodeCordonedTooLong``) loaded or not, blind or not (a real HTTP target
serving kube-state-metrics' ``kube_node_spec_unschedulable``), and its ``for:`` against the
agent's drain and reboot flags."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from kit.wait import wait_until
from tests import oneshot
from tests.kured.agents import Host
from tests.kured.doctor_host import good_apt, in_process, release
from tests.kured.k8s_double import KubeDouble
from tests.kured.prom import ALWAYS_FIRING, Prometheus

__all__ = ["good_apt", "release"]
pytestmark = [pytest.mark.usefixtures("good_apt"), pytest.mark.timeout(240)]

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KURED_RULES = DEPLOY / "alerts" / "kured.rules.yml"
KURED_DASHBOARD = DEPLOY / "grafana" / "kured.json"
HOSTS = ("host0", "host1", "host2")


def wait_for(predicate: Any, timeout: float) -> bool:
    return wait_until(predicate, timeout, interval=0.2)


def scraped(prom: Prometheus) -> int:
    answer = oneshot.get(
        prom.url + "/api/v1/query", params={"query": "kured_reboot_required"}, timeout=5
    ).json()
    return len(answer["data"]["result"])


def findings(report: dict[str, Any], check: str) -> list[tuple[str, str]]:
    return [(f["level"], f["message"]) for f in report["findings"] if f["check"] == check]


@pytest.fixture
def fleet(tmp_path: Path, etcd: str, lock_key: str) -> Iterator[tuple[list[Host], Prometheus]]:
    events = tmp_path / "events.log"
    hosts = [
        Host(tmp_path / "hosts", name, etcd, events, lock_key=lock_key).start() for name in HOSTS
    ]
    rules = KURED_RULES.read_text() + ALWAYS_FIRING.split("groups:\n", 1)[1]
    targets = [h.url.removeprefix("http://") for h in hosts]
    prom = Prometheus(tmp_path / "prom", rules, scrape_targets=targets)
    try:
        assert wait_for(lambda: scraped(prom) == 3, 60), "Prometheus never scraped 3 agents"
        assert wait_for(lambda: "NodeDiskPressure" in prom.firing(), 60)
        yield hosts, prom
    finally:
        prom.stop()
        for h in hosts:
            h.stop()


def test_three_agents_then_two_and_the_missing_node_is_named(
    fleet: tuple[list[Host], Prometheus],
    kube: KubeDouble,
    kubeconfig: Path,
    capsys: pytest.CaptureFixture[str],
    release: str,
    etcd: str,
) -> None:
    hosts, prom = fleet
    ignore = ["--alert-filter-regexp", "^(Kured|NodeDiskPressure)"]
    args = ["--prometheus-url", prom.url, *ignore]
    code, report = in_process(capsys, release, *args, "--node-count", "3", etcd=etcd)
    assert findings(report, "scrape") == [("OK", f"Prometheus at {prom.url} scrapes 3 of 3 agents")]
    assert [level for level, _ in findings(report, "retention")] == ["OK"], report
    assert code == 0, report

    hosts[2].kill()  # host2's agent is gone: its target fails, its series goes stale
    assert wait_for(lambda: scraped(prom) == 2, 60), "the series of host2 never went stale"
    code, report = in_process(capsys, release, *args, "--node-count", "3", etcd=etcd)
    [(level, message)] = findings(report, "scrape")
    assert level == "FAIL"
    assert message.startswith(
        f"count(kured_reboot_required) at {prom.url} is 2, but the cluster has 3 nodes"
    ), message
    assert code == 1

    # With the Kubernetes API instead of --node-count: the node without a series is named.
    for name in HOSTS:
        kube.add_node(name)
    code, report = in_process(capsys, release, *args, "--kubeconfig", str(kubeconfig), etcd=etcd)
    [(level, message)] = findings(report, "scrape")
    assert level == "FAIL"
    assert "is 2, but the cluster has 3 nodes; no series for node host2:" in message, message
    assert code == 1


@pytest.fixture
def alerting(tmp_path: Path) -> Iterator[Prometheus]:
    """kured's real rules and one always-firing alert; no agents (KuredNotReporting pends)."""
    rules = KURED_RULES.read_text() + ALWAYS_FIRING.split("groups:\n", 1)[1]
    prom = Prometheus(tmp_path / "prom", rules)
    try:
        assert wait_for(lambda: "NodeDiskPressure" in prom.firing(), 60)
        yield prom
    finally:
        prom.stop()


def test_the_alerts_that_block_now_follow_the_agents_filter(
    alerting: Prometheus, capsys: pytest.CaptureFixture[str], release: str, etcd: str
) -> None:
    prom = alerting
    base = ["--prometheus-url", prom.url]
    # kured's own alerts ignored, NodeDiskPressure (firing) blocks: a WARN naming it.
    code, report = in_process(capsys, release, *base, "--alert-filter-regexp", "^Kured", etcd=etcd)
    [(level, message)] = findings(report, "alerts")
    assert level == "WARN"
    assert message.startswith("alerts that block a reboot now under --alert-filter-regexp='^Kured'")
    assert message.endswith(": NodeDiskPressure; ignored by the filter: KuredNotReporting.")
    assert code == 0
    # Match-only: only NodeDiskPressure may block, and it does; kured's alerts cannot.
    code, report = in_process(
        capsys, release, *base, "--alert-filter-regexp", "^NodeDisk", "--alert-filter-match-only"
    )
    assert [level for level, _ in findings(report, "alerts")] == ["WARN"]
    # Both ignored: OK, and the ignored one is named.
    _code, report = in_process(
        capsys, release, *base, "--alert-filter-regexp", "^(Kured|NodeDiskPressure)"
    )
    [(level, message)] = findings(report, "alerts")
    assert level == "OK"
    assert "; ignored by the filter: " in message, message
    assert "NodeDiskPressure" in message.split("; ignored by the filter: ")[1], message
    # No filter: kured's own alerts would block the reboot that clears them.
    code, report = in_process(capsys, release, *base, etcd=etcd)
    levels = [level for level, _ in findings(report, "alerts")]
    assert levels == ["FAIL", "WARN"], report
    loop = findings(report, "alerts")[0][1]
    assert "KuredRebootPending" in loop
    assert "KuredNotReporting" in loop
    assert "the reboot that clears them can never happen" in loop
    assert code == 1


WEEKLY_RULES = """groups:
  - name: weekly
    rules:
      - alert: KuredRebootPendingWeekly
        expr: max by (node) (kured_reboot_required) == 1
        for: 8d
      - alert: KuredRebootPendingDaily
        expr: max by (node) (kured_reboot_required) == 1
        for: 36h
"""


def test_for_durations_longer_than_the_retention_fail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], release: str
) -> None:
    prom = Prometheus(
        tmp_path / "prom", WEEKLY_RULES, extra_args=["--storage.tsdb.retention.time=7d"]
    )
    try:
        weekly = ["--reboot-days", "su", "--start-time", "02:00", "--end-time", "04:00"]
        args = ["--prometheus-url", prom.url, "--alert-filter-regexp", "^Kured", *weekly]
        code, report = in_process(capsys, release, *args)
    finally:
        prom.stop()
    retention = findings(report, "retention")
    assert (
        "FAIL",
        "alert KuredRebootPendingWeekly has for: 8d, longer than Prometheus' retention of 7d.",
    ) in retention, retention
    [daily] = [m for level, m in retention if level == "WARN"]
    assert daily.startswith(
        "alert KuredRebootPendingDaily reads kured_reboot_required with for: 1d12h, shorter "
        "than the 6d22h the window stays closed"
    ), daily
    assert code == 1
    # The scrape count needs a node count or the API: not checked, and said so.
    assert {
        "check": "scrape",
        "reason": "no --node-count and no Kubernetes API to count the nodes",
    } in report["skipped"]


# ------------------------------------------------------------------------- the cordon alert

CORDON = "KuredNodeCordonedTooLong"
KSM_CORDONED = """# HELP kube_node_spec_unschedulable Whether a node can schedule new pods.
# TYPE kube_node_spec_unschedulable gauge
kube_node_spec_unschedulable{node="n1"} 1
kube_node_spec_unschedulable{node="n2"} 0
"""


@pytest.fixture
def ksm() -> Iterator[dict[str, str]]:
    """A real HTTP target standing in for kube-state-metrics: it serves ``state["body"]`` as
    its exposition (empty at first: kube-state-metrics is scraped but reports no node)."""
    state = {"body": ""}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = state["body"].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state["target"] = f"127.0.0.1:{server.server_address[1]}"
    yield state
    server.shutdown()
    server.server_close()


def rules_without(name: str) -> str:
    doc = yaml.safe_load(KURED_RULES.read_text())
    for group in doc["groups"]:
        group["rules"] = [r for r in group["rules"] if r.get("alert") != name]
    return yaml.safe_dump(doc, sort_keys=False)


def test_a_prometheus_without_the_cordon_alert_is_warned_about_loudly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], release: str, etcd: str
) -> None:
    prom = Prometheus(tmp_path / "prom", rules_without(CORDON))
    try:
        names = [r["name"] for r in prom.rules()]
        assert "KuredLockHeldTooLong" in names  # kured's other rules are loaded
        assert CORDON not in names
        args = ["--prometheus-url", prom.url, "--alert-filter-regexp", "^Kured"]
        code, report = in_process(capsys, release, *args, etcd=etcd)
    finally:
        prom.stop()
    [(level, message)] = findings(report, "cordon")
    assert level == "WARN"
    assert message.startswith(f"alert {CORDON} is NOT loaded in Prometheus at {prom.url}: "), (
        message
    )
    [fix] = [f["fix"] for f in report["findings"] if f["check"] == "cordon"]
    assert "deploy/alerts/kured.rules.yml" in fix
    assert code == 0, report  # a WARN: kured still reboots correctly without the alert


def test_the_cordon_alert_must_see_nodes_and_outlast_a_reboot_cycle(
    tmp_path: Path,
    ksm: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    release: str,
    etcd: str,
) -> None:
    prom = Prometheus(tmp_path / "prom", KURED_RULES.read_text(), scrape_targets=[ksm["target"]])
    try:
        assert wait_for(lambda: prom.query(f'up{{instance="{ksm["target"]}"}} == 1'), 60)
        base = ["--prometheus-url", prom.url, "--alert-filter-regexp", "^Kured"]

        # Scraped, but no node series: the alert is loaded and blind.
        _code, report = in_process(capsys, release, *base, "--drain-timeout", "30m", etcd=etcd)
        assert findings(report, "cordon") == [
            (
                "WARN",
                f"alert {CORDON} is loaded but Prometheus at {prom.url} has no "
                "kube_node_spec_unschedulable series: it can never fire.",
            )
        ]

        ksm["body"] = KSM_CORDONED
        assert wait_for(lambda: len(prom.query("kube_node_spec_unschedulable")) == 2, 60)
        # deploy/kured's --drain-timeout 30m and a 10m boot: the 1h for: outlasts them.
        code, report = in_process(capsys, release, *base, "--drain-timeout", "30m", etcd=etcd)
        assert findings(report, "cordon") == [
            (
                "OK",
                f"alert {CORDON} is loaded, sees 2 nodes, and its for: 1h outlasts one reboot's "
                "cordon (--drain-timeout 30m + --reboot-delay 0 + --reboot-duration 10m = 40m)",
            )
        ]
        assert code == 0, report

        # A drain allowed 1h: a normal reboot outlasts the for:, the alert would page.
        _code, report = in_process(
            capsys, release, *base, "--drain-timeout", "1h", "--reboot-delay", "5m", etcd=etcd
        )
        [(level, message)] = findings(report, "cordon")
        assert level == "WARN"
        assert message == (
            f"alert {CORDON} has for: 1h, not longer than one reboot keeps a node cordoned "
            "(--drain-timeout 1h + --reboot-delay 5m + --reboot-duration 10m = 1h15m): it "
            "fires during normal reboots whose drain runs to its timeout."
        )

        # No filter: the alert (pending from the first minute of any cordon) blocks reboots.
        _code, report = in_process(
            capsys, release, "--prometheus-url", prom.url, "--drain-timeout", "30m", etcd=etcd
        )
        [(level, message)] = findings(report, "cordon")
        assert level == "WARN"
        assert message.startswith(f"alert {CORDON} would block reboots while only pending"), message
        # ... and --alert-firing-only lets pending ones through: gating on it is then deliberate.
        _code, report = in_process(
            capsys,
            release,
            *["--prometheus-url", prom.url, "--drain-timeout", "30m", "--alert-firing-only"],
            etcd=etcd,
        )
        assert [level for level, _ in findings(report, "cordon")] == ["OK"], report

        # The cordoned node's alert is pending (n2 is schedulable), and the dashboard's
        # "Time cordoned" query reads its clock from this Prometheus.
        pending = prom.query(f'ALERTS{{alertname="{CORDON}"}}')
        assert [(a["metric"]["node"], a["metric"]["alertstate"]) for a in pending] == [
            ("n1", "pending")
        ]
        dashboard = json.loads(KURED_DASHBOARD.read_text())
        [expr] = [
            t["expr"]
            for p in dashboard["panels"]
            if p["title"].startswith("Time cordoned")
            for t in p["targets"]
        ]
        [series] = prom.query(expr.replace("$node", ".*"))
        assert series["metric"] == {"node": "n1"}
        assert 0 <= float(series["value"][1]) < 240, series
    finally:
        prom.stop()
