"""``KURA_METRICS_REQUIRE_TOKEN`` in the manifests: off as shipped (the ServiceMonitor scrapes
without credentials and the probes need none), and the ServiceMonitor's commented
``authorization`` block, once uncommented as its comment says, is a valid endpoint that sends a
bearer token from a Secret (docs/security.md, "Prometheus with KURA_METRICS_REQUIRE_TOKEN")."""

from __future__ import annotations

import yaml

from tests.deploy.conftest import DEPLOY
from tests.deploy.kustomize import Manifest, render
from tests.deploy.schema import schema_problems

MONITOR = DEPLOY / "kura" / "servicemonitor.yaml"
MARKER = "      # authorization:"


def uncommented(text: str) -> str:
    """The file with the block from ``MARKER`` on uncommented (``# `` removed)."""
    head, marker, tail = text.partition(MARKER)
    assert marker, f"{MONITOR.name} has no commented authorization block"
    block = (marker + tail).splitlines()
    return head + "\n".join(line.replace("# ", "", 1) for line in block) + "\n"


def test_as_shipped_metrics_need_no_token_and_the_monitor_sends_none() -> None:
    manifests = render(DEPLOY)
    (monitor,) = [m for m in manifests if m.kind == "ServiceMonitor" and m.name == "kura"]
    assert all("authorization" not in e for e in monitor.obj["spec"]["endpoints"])
    (sts,) = [m for m in manifests if m.kind == "StatefulSet" and m.name == "kura"]
    env = {e["name"] for c in sts.obj["spec"]["template"]["spec"]["containers"] for e in c["env"]}
    assert "KURA_METRICS_REQUIRE_TOKEN" not in env


def test_the_commented_authorization_block_is_a_valid_bearer_endpoint() -> None:
    obj = yaml.safe_load(uncommented(MONITOR.read_text()))
    (endpoint,) = obj["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["authorization"]["type"] == "Bearer"
    assert endpoint["authorization"]["credentials"]["key"]
    assert schema_problems([Manifest(MONITOR, obj)]) == []
    broken = yaml.safe_load(uncommented(MONITOR.read_text()))
    broken["spec"]["endpoints"][0]["authorization"]["credentials"] = {"name": "x"}
    assert schema_problems([Manifest(MONITOR, broken)]) != []  # the schema does check it
