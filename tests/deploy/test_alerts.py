"""The alert rules in deploy/alerts: promtool accepts them, their unit tests pass, every alert
is pinned both firing and not firing, and the PrometheusRule objects carry them unchanged.

promtool is Debian's (package ``prometheus``, installed by ``scripts/install-deps``). These
tests fail, never skip, without it: a skipped proof looks like a passed one.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy import prometheusrule
from tests.deploy.conftest import DEPLOY

ALERTS = DEPLOY / "alerts"
RULE_FILES = sorted(ALERTS.glob("*.rules.yml"))
SUITES = sorted((ALERTS / "tests").glob("*.test.yml"))
SEVERITIES = {"warning", "critical"}
# The alerts the issues asked for, and those added since.
EXPECTED_ALERTS = {
    "KuredNotReporting",
    "KuredNodeCoverageGap",
    "KuredRebootPending",
    "KuredLockHeldTooLong",
    "KuredRebootLoopTripped",
    "KuredNodeCordonedTooLong",
    "KuraBootstrapNotFinished",
    "KuraReadinessFlapping",
    "KuraOutboxGrowing",
    "KuraTmpBudgetSaturated",
    "KuraDiskBudgetNearlyFull",
    "KuraStorageDegraded",
    "KuraObjectStoreUploadsStalled",
    "KuraStorageSyncFailing",
    "KuraRetentionFloorBroken",
    "KuraShedAgeUnderMinAge",
}


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is not installed: scripts/install-deps installs Debian's prometheus")
    return path


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def alerts() -> dict[str, dict[str, object]]:
    out = {}
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    out[rule["alert"]] = rule
    return out


def test_the_rule_files_hold_the_expected_alerts() -> None:
    assert set(alerts()) == EXPECTED_ALERTS


def test_promtool_check_rules_accepts_every_rule_file(promtool: str) -> None:
    result = run(promtool, "check", "rules", *map(str, RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("suite", SUITES, ids=lambda p: p.name)
def test_promtool_unit_tests_pass(promtool: str, suite: Path) -> None:
    result = run(promtool, "test", "rules", str(suite))
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_failing_promtool_suite_fails(promtool: str, tmp_path: Path) -> None:
    # Test of the test: a suite expecting KuredRebootPending where it cannot fire makes promtool
    # exit non-zero, so the runner above does report broken pins.
    suite = {
        "rule_files": [str(ALERTS / "kured.rules.yml")],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": 'kured_reboot_required{node="n1"}', "values": "0x60"}],
                "alert_rule_test": [
                    {
                        "eval_time": "60m",
                        "alertname": "KuredRebootPending",
                        "exp_alerts": [{"exp_labels": {"severity": "warning", "node": "n1"}}],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "broken.test.yml"
    path.write_text(yaml.safe_dump(suite))
    result = run(promtool, "test", "rules", str(path))
    assert result.returncode != 0
    assert "KuredRebootPending" in result.stdout + result.stderr


def test_every_rule_file_has_a_suite_and_every_suite_loads_one() -> None:
    loaded = set()
    for suite in SUITES:
        files = yaml.safe_load(suite.read_text())["rule_files"]
        loaded |= {(suite.parent / f).resolve() for f in files}
    assert loaded == {p.resolve() for p in RULE_FILES}


def test_every_alert_is_pinned_firing_and_not_firing() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    for suite in SUITES:
        for test in yaml.safe_load(suite.read_text())["tests"]:
            for check in test.get("alert_rule_test") or []:
                (firing if check.get("exp_alerts") else silent).add(check["alertname"])
    names = set(alerts())
    assert {
        "not pinned firing": sorted(names - firing),
        "not pinned silent": sorted(names - silent),
    } == {
        "not pinned firing": [],
        "not pinned silent": [],
    }


@pytest.mark.parametrize("name", sorted(EXPECTED_ALERTS))
def test_every_alert_has_for_severity_summary_description_and_runbook(name: str) -> None:
    rule = alerts()[name]
    assert rule.get("for"), "no for: a single bad scrape would page"
    labels = rule.get("labels") or {}
    assert isinstance(labels, dict)
    assert labels.get("severity") in SEVERITIES
    annotations = rule.get("annotations") or {}
    assert isinstance(annotations, dict)
    assert annotations.get("summary")
    assert annotations.get("description")
    assert str(annotations.get("runbook_url", "")).startswith("https://")


@pytest.mark.parametrize("component", sorted(prometheusrule.COMPONENTS))
def test_the_prometheusrule_object_carries_the_rule_file_unchanged(component: str) -> None:
    committed = prometheusrule.object_file(component).read_text()
    assert yaml.safe_load(committed) == prometheusrule.prometheus_rule(component), (
        f"{prometheusrule.object_file(component).name} is out of date: run "
        "`.venv/bin/python -m tests.deploy.prometheusrule`"
    )
    assert committed == prometheusrule.render_text(component)
