"""Offline schema validation of rendered manifests.

Built-in kinds are validated with ``kubernetes-validate`` against the Kubernetes
``KUBERNETES_VERSION`` OpenAPI schemas it bundles, in its *strict* mode: an unknown field (a typo
such as ``readinessProbe.httpGett``) is an error, as ``kubectl apply --validate=strict`` would
make it.

Custom resources (prometheus-operator's ServiceMonitor and PrometheusRule) have no schema in
that package, so they are validated against ``CRD_SCHEMAS`` below: a hand-written subset of the
``monitoring.coreos.com/v1`` CRDs covering the fields ``deploy/`` uses, equally strict about
unknown fields, and stricter than the CRD where an omission would silently scrape or alert on
nothing (``endpoints`` must be non-empty, each rule needs ``expr`` and a name). A field the CRD
has but the subset lacks fails with "Additional properties are not allowed": add it to the
subset (with the CRD's type) when ``deploy/`` starts using it.

Any other kind fails: no object passes unvalidated.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jsonschema
import kubernetes_validate

from tests.deploy.kustomize import Manifest

KUBERNETES_VERSION = "1.30"

_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
# monitoring.coreos.com's Duration pattern.
_DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
}
_OBJECT_META = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "namespace": {"type": "string", "minLength": 1},
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
    },
}
_LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": _STRING_MAP,
        "matchExpressions": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["key", "operator"],
                "additionalProperties": False,
                "properties": {
                    "key": {"type": "string"},
                    "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                    "values": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
}
_ENDPOINT = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "port": {"type": "string", "minLength": 1},
        "targetPort": {"type": ["string", "integer"]},
        "path": {"type": "string"},
        "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
        "interval": _DURATION,
        "scrapeTimeout": _DURATION,
        "honorLabels": {"type": "boolean"},
        "honorTimestamps": {"type": "boolean"},
        # prometheus-operator SafeAuthorization: credentials from a Secret key.
        "authorization": {
            "type": "object",
            "additionalProperties": False,
            "required": ["credentials"],
            "properties": {
                "type": {"type": "string", "minLength": 1},
                "credentials": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["key"],
                    "properties": {
                        "name": {"type": "string", "minLength": 1},
                        "key": {"type": "string", "minLength": 1},
                        "optional": {"type": "boolean"},
                    },
                },
            },
        },
    },
    "anyOf": [{"required": ["port"]}, {"required": ["targetPort"]}],
}
_RULE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["expr"],
    "properties": {
        "alert": {"type": "string", "minLength": 1},
        "record": {"type": "string", "minLength": 1},
        "expr": {"type": ["string", "integer"]},
        "for": _DURATION,
        "keep_firing_for": _DURATION,
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
    },
    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
}


def _custom_resource(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": kind},
            "metadata": _OBJECT_META,
            "spec": spec,
        },
    }


CRD_SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): _custom_resource(
        "ServiceMonitor",
        {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "jobLabel": {"type": "string"},
                "selector": _LABEL_SELECTOR,
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "endpoints": {"type": "array", "minItems": 1, "items": _ENDPOINT},
            },
        },
    ),
    ("monitoring.coreos.com/v1", "PrometheusRule"): _custom_resource(
        "PrometheusRule",
        {
            "type": "object",
            "required": ["groups"],
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name", "rules"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": _DURATION,
                            "rules": {"type": "array", "minItems": 1, "items": _RULE},
                        },
                    },
                },
            },
        },
    ),
}


def schema_problems(manifests: Iterable[Manifest]) -> list[str]:
    """One line per object that does not validate (empty: all valid), naming file and field.

    Built-in kinds report their first error (kubernetes-validate stops there); custom
    resources report every error.
    """
    problems: list[str] = []
    for m in manifests:
        where = f"{m.source}: {m.ref()}"
        crd = CRD_SCHEMAS.get((str(m.obj["apiVersion"]), m.kind))
        if crd is not None:
            validator = jsonschema.Draft202012Validator(crd)
            for error in sorted(validator.iter_errors(m.obj), key=lambda e: list(e.path)):
                path = ".".join(str(p) for p in error.path) or "(object)"
                problems.append(f"{where}: {path}: {error.message}")
            continue
        try:
            kubernetes_validate.validate(m.obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path) or "(object)"
            problems.append(f"{where}: {path}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError:
            problems.append(
                f"{where}: no schema for {m.obj['apiVersion']} {m.kind} in Kubernetes "
                f"{KUBERNETES_VERSION} nor in tests/deploy/schema.py CRD_SCHEMAS"
            )
    return problems
