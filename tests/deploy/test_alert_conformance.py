"""Every metric an alert (or a promtool suite) names is one the code exports, or is on the
explicit allow-list of metrics that come from elsewhere.

"Exported" is read from running processes (``conftest.py``): a real ``kura serve`` and a real
``kured`` agent, scraped over HTTP. An alert over a metric nobody exports never fires and
looks exactly like a healthy system, which is how the home-lab kured alerts could have stayed
silent, so a misspelled name must fail here, and
``test_a_misspelled_metric_fails_the_check`` shows that it does.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import DEPLOY
from tests.deploy.promql import exposition_names, metric_names

ALERTS = DEPLOY / "alerts"
RULE_FILES = sorted(ALERTS.glob("*.rules.yml"))
SUITES = sorted((ALERTS / "tests").glob("*.test.yml"))

# Metrics the alerts may use although neither program exports them: who writes each and why we
# need it. Keep it short; every entry is a dependency outside this repository.
EXTERNAL_METRICS = {
    "up": "Prometheus itself, one series per scrape target: KuredNotReporting (a kured target "
    "that fails its scrape)",
    "kube_node_info": "kube-state-metrics, one series per Node: KuredNodeCoverageGap (nodes "
    "without a kured agent; absent() cannot see one missing node)",
    "kube_node_spec_unschedulable": "kube-state-metrics, one series per Node, 1 while it is "
    "cordoned: KuredNodeCordonedTooLong (a node out of service longer than a reboot cycle; "
    "kured's own cordon state is not a metric of ours, and an operator's cordon counts too)",
}


def rule_metrics(rule_file: Path) -> dict[str, set[str]]:
    """``{rule name: metric names its expr selects}`` for every rule in ``rule_file``."""
    doc = yaml.safe_load(rule_file.read_text())
    out: dict[str, set[str]] = {}
    for group in doc["groups"]:
        for rule in group["rules"]:
            name = rule.get("alert") or rule["record"]
            out[name] = metric_names(str(rule["expr"]))
    return out


def recorded_names(rule_files: Iterable[Path]) -> set[str]:
    """Names written by recording rules: other rules may use them."""
    names = set()
    for path in rule_files:
        for group in yaml.safe_load(path.read_text())["groups"]:
            names.update(r["record"] for r in group["rules"] if "record" in r)
    return names


def conformance_problems(rule_files: list[Path], exported: set[str]) -> list[str]:
    """One line per rule that names a metric neither exported, recorded, nor allowed."""
    allowed = exported | set(EXTERNAL_METRICS) | recorded_names(rule_files)
    problems = []
    for path in rule_files:
        for rule, names in rule_metrics(path).items():
            unknown = sorted(names - allowed)
            if unknown:
                problems.append(
                    f"{path.name}: {rule} uses {', '.join(unknown)}: exported by neither kura nor "
                    "kured, and not in EXTERNAL_METRICS"
                )
    return problems


def suite_series_names(suite: Path) -> set[str]:
    names: set[str] = set()
    for test in yaml.safe_load(suite.read_text())["tests"]:
        for series in test.get("input_series") or []:
            names |= metric_names(series["series"])
    return names


# ------------------------------------------------------------------------- the checks


def test_the_scrapes_see_what_the_alerts_are_built_on(
    kura_exposition: str, kured_exposition: str
) -> None:
    # Guards against a vacuous pass: both scrapes answered, with families of every type.
    kura = exposition_names(kura_exposition)
    kured = exposition_names(kured_exposition)
    assert {
        "kura_http_requests_total",
        "kura_http_request_duration_seconds_bucket",
        "kura_outbox_messages",
        "kura_bootstrap_peer_phase",
        "kura_storage_evicted_bytes_total",
        "kura_disk_limit_bytes",
    } <= kura
    assert {
        "kured_reboot_required",
        "kured_lock_holder_info",
        "kured_failures_total",
        "kured_circuit_breaker_open",
    } <= kured


def test_every_alert_uses_only_exported_or_allowed_metrics(exported_metrics: set[str]) -> None:
    assert RULE_FILES, "no rule files in deploy/alerts"
    assert conformance_problems(RULE_FILES, exported_metrics) == []


def test_every_promtool_suite_feeds_only_exported_or_allowed_metrics(
    exported_metrics: set[str],
) -> None:
    # A suite fed a misspelled series would pin an alert on data no Prometheus will ever have.
    allowed = exported_metrics | set(EXTERNAL_METRICS)
    unknown = {suite.name: sorted(suite_series_names(suite) - allowed) for suite in SUITES}
    assert {k: v for k, v in unknown.items() if v} == {}


def test_the_external_allow_list_is_needed_and_is_not_our_own(
    exported_metrics: set[str],
) -> None:
    used = set().union(*(set().union(*rule_metrics(p).values()) for p in RULE_FILES))
    assert sorted(set(EXTERNAL_METRICS) - used) == [], "allow-listed but no alert uses it"
    assert sorted(set(EXTERNAL_METRICS) & exported_metrics) == [], "exported by us after all"


# ------------------------------------------------------------------------- test of the test


def test_a_misspelled_metric_fails_the_check(tmp_path: Path, exported_metrics: set[str]) -> None:
    good = yaml.safe_load((ALERTS / "kured.rules.yml").read_text())
    bad = yaml.safe_load((ALERTS / "kured.rules.yml").read_text())
    rule = next(r for r in bad["groups"][0]["rules"] if r["alert"] == "KuredRebootPending")
    rule["expr"] = rule["expr"].replace("kured_reboot_required", "kured_reboot_requried")
    (tmp_path / "good.rules.yml").write_text(yaml.safe_dump(good))
    (tmp_path / "bad.rules.yml").write_text(yaml.safe_dump(bad))

    assert conformance_problems([tmp_path / "good.rules.yml"], exported_metrics) == []
    problems = conformance_problems([tmp_path / "bad.rules.yml"], exported_metrics)
    assert problems == [
        "bad.rules.yml: KuredRebootPending uses kured_reboot_requried: exported by neither kura "
        "nor kured, and not in EXTERNAL_METRICS"
    ]


def test_a_metric_of_the_other_program_with_a_wrong_suffix_fails(
    tmp_path: Path, exported_metrics: set[str]
) -> None:
    # Counters are exported as *_total, histograms as _bucket/_sum/_count: the bare family name
    # selects nothing in Prometheus.
    rules = {
        "groups": [
            {
                "name": "g",
                "rules": [
                    {"alert": "A", "expr": "rate(kura_http_requests[5m]) > 0"},
                    {"alert": "B", "expr": "kura_http_request_duration_seconds > 1"},
                    {"alert": "C", "expr": "rate(kura_http_request_duration_seconds_count[5m])"},
                ],
            }
        ]
    }
    (tmp_path / "x.rules.yml").write_text(yaml.safe_dump(rules))
    problems = conformance_problems([tmp_path / "x.rules.yml"], exported_metrics)
    assert [p.split(" uses ")[0] for p in problems] == ["x.rules.yml: A", "x.rules.yml: B"]


# ------------------------------------------------------------------------- the tokenizer


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('absent(kured_reboot_required) or up{job="kured"} == 0', {"kured_reboot_required", "up"}),
        (
            "sum by (node, le) (rate(foo_total{job='x', le=\"0.5\"}[5m])) "
            "> on (node) group_left (reason) bar",
            {"foo_total", "bar"},
        ),
        ('{__name__="baz", a="b"} + qux{}', {"baz", "qux"}),
        ("changes((rate(x[2m]) > bool 0)[1h:1m]) >= 6", {"x"}),
        ('max without (phase) (m{phase!="done", peer=~"a.*"}) == 1', {"m"}),
        ("histogram_quantile(0.9, sum(rate(h_bucket[5m])) by (le))", {"h_bucket"}),
        ("foo offset 1h30m and bar @ 1609746000 unless baz @ start()", {"foo", "bar", "baz"}),
        ("topk(3, baz) # a comment naming not_a_metric", {"baz"}),
        ('label_replace(up, "dst", "$1", "src", "(.*)")', {"up"}),
        ('count_values("version", build_info)', {"build_info"}),
        ("x unless on () y", {"x", "y"}),
        ("a * on (n) group_left b", {"a", "b"}),
        ("1e3 * Inf + NaN - 0x1F + .5", set()),
        ("job:requests:rate5m > 10", {"job:requests:rate5m"}),
        ('quantile by (le) (0.5, `raw "quoted" sum`) or s{x="\\"by (q)"}', {"s"}),
    ],
)
def test_metric_names_finds_exactly_the_metrics(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


@pytest.mark.parametrize(
    "expr", ['{__name__=~"kura_.*"}', '{__name__!="x"}', 'x{a="b"', "x[5m", 'x{a="b}']
)
def test_metric_names_refuses_what_it_cannot_check(expr: str) -> None:
    with pytest.raises(ValueError, match=r"."):
        metric_names(expr)
