"""``kured status --all``: every agent's status, each node reached through the first address
type it has (InternalIP, ExternalIP, Hostname), through the real client against the API double.

Two real agents listen on the same metrics port on different loopback addresses, like a
DaemonSet's pods on different machines. Node n1 has no ExternalIP and an unresolvable Hostname
(as on a cloud node whose name is not in DNS): it must still answer, through its InternalIP.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.kured.agents import Host
from tests.kured.k8s_double import KubeDouble
from tests.kured.prom import free_port

COMMON = ("--period", "1s", "--start-time", "0:00", "--end-time", "23:59:59")


def run_status(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kured.cli", "status", "--all", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_status_all_reaches_every_agent_by_the_preferred_address_type(
    etcd: str, lock_key: str, tmp_path: Path
) -> None:
    port = free_port()
    events = tmp_path / "events.log"
    hosts = [
        Host(
            tmp_path,
            name,
            etcd,
            events,
            *COMMON,
            "--metrics-host",
            ip,
            "--metrics-port",
            str(port),
            lock_key=lock_key,
        )
        for name, ip in (("n1", "127.0.0.2"), ("n2", "127.0.0.3"))
    ]
    with KubeDouble() as kube:
        kube.add_node(
            "n1", addresses=[("Hostname", "n1.unresolvable.invalid"), ("InternalIP", "127.0.0.2")]
        )
        kube.add_node(
            "n2", addresses=[("ExternalIP", "127.0.0.3"), ("Hostname", "n2.unresolvable.invalid")]
        )
        kube.add_node("gone", addresses=[("Hostname", "gone.unresolvable.invalid")])
        kubeconfig = kube.kubeconfig(tmp_path / "kubeconfig")
        try:
            for h in hosts:
                h.start()
            out = run_status("--kubeconfig", str(kubeconfig), "--metrics-port", str(port), "--json")
            rows = {r["node"]: r for r in json.loads(out.stdout)}
            assert rows["n1"]["address"] == "127.0.0.2"  # InternalIP preferred
            assert rows["n1"]["status"]["node"] == "n1"
            assert rows["n2"]["address"] == "127.0.0.3"  # no InternalIP: ExternalIP
            assert rows["n2"]["status"]["node"] == "n2"
            # A node reachable only by an unresolvable hostname is reported, not fatal.
            assert rows["gone"]["status"] is None
            assert "unreachable" in rows["gone"]["summary"]
            # With Hostname preferred, n1 is unreachable: the preference list matters.
            out = run_status(
                "--kubeconfig",
                str(kubeconfig),
                "--metrics-port",
                str(port),
                "--address-types",
                "Hostname,InternalIP",
                "--json",
            )
            rows = {r["node"]: r for r in json.loads(out.stdout)}
            assert rows["n1"]["status"] is None
            text = run_status("--kubeconfig", str(kubeconfig), "--metrics-port", str(port))
            assert "n1" in text.stdout
            assert "127.0.0.3" in text.stdout
        finally:
            for h in hosts:
                h.stop()
