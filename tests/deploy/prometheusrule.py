"""The PrometheusRule objects in ``deploy/alerts/``, generated from the plain rule files.

The rule files (``deploy/alerts/<component>.rules.yml``) are the source: promtool tests them
and any Prometheus can load them. prometheus-operator needs the same groups inside a
PrometheusRule object, and kustomize cannot embed one file in another, so the objects are
generated, committed, and checked to be in sync by ``tests/deploy/test_alerts.py``. After
editing a rule file, regenerate them:

    .venv/bin/python -m tests.deploy.prometheusrule
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ALERTS_DIR = Path(__file__).resolve().parents[2] / "deploy" / "alerts"
# component -> namespace its PrometheusRule lives in (next to what it watches)
COMPONENTS = {"kured": "kured", "kura": "kura"}


def rule_file(component: str) -> Path:
    return ALERTS_DIR / f"{component}.rules.yml"


def object_file(component: str) -> Path:
    return ALERTS_DIR / f"prometheusrule-{component}.yaml"


def prometheus_rule(component: str) -> dict[str, Any]:
    """The PrometheusRule object carrying ``component``'s rule groups unchanged."""
    groups = yaml.safe_load(rule_file(component).read_text())["groups"]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": component,
            "namespace": COMPONENTS[component],
            "labels": {"app.kubernetes.io/name": component, "app.kubernetes.io/part-of": "kura"},
        },
        "spec": {"groups": groups},
    }


def render_text(component: str) -> str:
    header = (
        f"# Generated from deploy/alerts/{component}.rules.yml: do not edit. Regenerate with\n"
        "#   .venv/bin/python -m tests.deploy.prometheusrule\n"
        "# If your Prometheus selects PrometheusRules by label, add that label in an overlay.\n"
    )
    body = yaml.safe_dump(prometheus_rule(component), sort_keys=False, width=100)
    return header + body


def main() -> None:
    for component in COMPONENTS:
        path = object_file(component)
        path.write_text(render_text(component))
        print(f"wrote {path.relative_to(ALERTS_DIR.parents[1])}")


if __name__ == "__main__":
    main()
