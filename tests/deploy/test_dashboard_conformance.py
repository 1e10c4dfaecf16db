"""Every PromQL query in the Grafana dashboards (``deploy/grafana/*.json``) names only metrics
that a real ``kura serve`` or ``kured`` agent exports (the same scrapes as the alert
conformance test, ``conftest.py``), and the dashboards cover what operators asked for.

A panel over a metric nobody exports draws "No data", which reads like an idle system; so a
misspelled name fails here, and ``test_a_misspelled_dashboard_metric_fails`` shows it does.
Template variables are checked too: ``label_values(<selector>, <label>)`` names the selector's
metric. Grafana's ``$__rate_interval`` and ``$var`` appear only inside ``[...]`` and label
strings, which the tokenizer skips.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kured.doctor.prometheus import parse_prometheus_duration
from tests.deploy.conftest import DEPLOY
from tests.deploy.promql import metric_names

DASHBOARDS = sorted((DEPLOY / "grafana").glob("*.json"))
LABEL_VALUES = re.compile(r"^\s*label_values\((?P<selector>.*),\s*\w+\s*\)\s*$", re.DOTALL)

# Metrics the dashboards may use although neither program exports them (as EXTERNAL_METRICS in
# test_alert_conformance.py): who writes each and which panel needs it.
EXTERNAL_METRICS = {
    "kube_node_spec_unschedulable": "kube-state-metrics, one series per Node: kured.json's "
    "'Unschedulable nodes'",
    "ALERTS_FOR_STATE": "Prometheus' rule manager, when each pending or firing alert became "
    "active: kured.json's time cordoned, by KuredNodeCordonedTooLong's own clock",
}

# What each dashboard must show (issue: request rate, hit ratio and latency per protocol; disk
# and tmp; outbox and replication lag; bootstrap; kured's blocking reasons, lock holders and
# reboots), as the metrics that carry it.
REQUIRED = {
    "kura.json": {
        "kura_http_requests_total",
        "kura_cache_lookups_total",
        "kura_http_request_duration_seconds_bucket",
        "kura_disk_used_bytes",
        "kura_namespace_used_bytes",
        "kura_namespace_evictions_total",
        "kura_namespace_shed_age_seconds_bucket",
        "kura_tmp_reserved_bytes",
        "kura_outbox_messages",
        "kura_outbox_oldest_message_age_seconds",
        "kura_bootstrap_peer_phase",
        "kura_bootstrap_bytes",
    },
    "kured.json": {
        "kured_blocking_reason",
        "kured_lock_holder_info",
        "kured_last_reboot_timestamp_seconds",
        "kured_reboot_required",
        "kube_node_spec_unschedulable",
        "ALERTS_FOR_STATE",
    },
}


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """``(where, PromQL)`` for every panel target and every query variable."""
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r}", str(target["expr"])
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = LABEL_VALUES.match(query)
        yield f"variable {var['name']!r}", m["selector"] if m else query


def dashboard_problems(path: Path, dashboard: dict[str, Any], exported: set[str]) -> list[str]:
    problems = []
    for where, expr in queries(dashboard):
        unknown = sorted(metric_names(expr) - exported - set(EXTERNAL_METRICS))
        if unknown:
            problems.append(f"{path.name}: {where} uses {', '.join(unknown)}: not exported")
    return problems


def used_metrics(dashboard: dict[str, Any]) -> set[str]:
    return set().union(*(metric_names(expr) for _w, expr in queries(dashboard)))


def load(path: Path) -> dict[str, Any]:
    doc = json.loads(path.read_text())
    assert isinstance(doc, dict)
    return doc


def test_there_is_a_dashboard_for_kura_and_one_for_kured() -> None:
    assert [p.name for p in DASHBOARDS] == ["kura.json", "kured.json"]
    uids = [load(p)["uid"] for p in DASHBOARDS]
    assert len(set(uids)) == len(uids)


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_dashboard_query_uses_only_exported_metrics(
    path: Path, exported_metrics: set[str]
) -> None:
    dashboard = load(path)
    assert sum(1 for _ in queries(dashboard)) >= 10  # not vacuous
    assert dashboard_problems(path, dashboard, exported_metrics) == []


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_dashboard_shows_what_operators_need(path: Path) -> None:
    dashboard = load(path)
    assert sorted(REQUIRED[path.name] - used_metrics(dashboard)) == []
    for panel in panels(dashboard):
        if panel["type"] != "row":
            assert panel.get("targets"), f"panel {panel['title']!r} has no query"
            assert panel["datasource"]["uid"] == "${datasource}"


def test_a_misspelled_dashboard_metric_fails(exported_metrics: set[str]) -> None:
    path = DEPLOY / "grafana" / "kured.json"
    bad = copy.deepcopy(load(path))
    target = next(
        t
        for p in panels(bad)
        for t in p.get("targets", [])
        if "kured_lock_holder_info" in t["expr"]
    )
    target["expr"] = target["expr"].replace("kured_lock_holder_info", "kured_lock_holders_info")
    problems = dashboard_problems(path, bad, exported_metrics)
    assert problems == [
        "kured.json: panel 'Lock holders' uses kured_lock_holders_info: not exported"
    ]
    bad = copy.deepcopy(load(path))
    bad["templating"]["list"][1]["query"]["query"] = "label_values(kured_reboot_requierd, node)"
    assert dashboard_problems(path, bad, exported_metrics) == [
        "kured.json: variable 'node' uses kured_reboot_requierd: not exported"
    ]


def test_the_external_allow_list_is_needed_and_is_not_our_own(exported_metrics: set[str]) -> None:
    used = set().union(*(used_metrics(load(p)) for p in DASHBOARDS))
    assert sorted(set(EXTERNAL_METRICS) - used) == [], "allow-listed but no panel uses it"
    assert sorted(set(EXTERNAL_METRICS) & exported_metrics) == [], "exported by us after all"


def alert_rule(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((DEPLOY / "alerts" / "kured.rules.yml").read_text())
    [rule] = [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == name]
    return dict(rule)


def test_the_time_cordoned_panel_marks_the_alerts_for_duration() -> None:
    # The red line is where KuredNodeCordonedTooLong fires: change the for: and the line moves
    # with it, or this fails.
    [panel] = [
        p for p in panels(load(DEPLOY / "grafana" / "kured.json")) if "Time cordoned" in p["title"]
    ]
    [target] = panel["targets"]
    assert 'ALERTS_FOR_STATE{alertname="KuredNodeCordonedTooLong"' in target["expr"]
    defaults = panel["fieldConfig"]["defaults"]
    assert defaults["unit"] == "s"
    assert defaults["custom"]["thresholdsStyle"]["mode"] == "line"
    steps = [s["value"] for s in defaults["thresholds"]["steps"] if s["value"] is not None]
    for_seconds = parse_prometheus_duration(str(alert_rule("KuredNodeCordonedTooLong")["for"]))
    assert steps == [for_seconds]
