"""deploy/ renders, validates offline against the Kubernetes 1.30 schemas, and says what the
code expects: probes on the routes kura serves, settings kura and kured accept, a lock the RBAC
allows and nothing more, and kured's metrics scraped by default.

Rendering is ``tests/deploy/kustomize.py`` (``resources:`` only; it produced exactly what
``kubectl kustomize deploy/`` produces when checked by hand). Schemas: ``tests/deploy/schema.py``
(kubernetes-validate, strict, for built-in kinds; a hand-written subset of the CRDs for
ServiceMonitor and PrometheusRule). Each check of our own returns a list of problems, and each
is also run on a deliberately broken copy to show that it fails.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kit.settings import load, options_of
from kura.cli import build_parser
from kura.settings import Settings as KuraSettings
from kura.settings import load_settings as load_kura_settings
from kura.settings import validate_settings as validate_kura_settings
from kured.settings import add_arguments, load_settings
from tests.deploy.conftest import DEPLOY
from tests.deploy.kustomize import KustomizeError, Manifest, render
from tests.deploy.schema import schema_problems

CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
GiB = 1024**3

# Everything kured may do, and nothing else (rbac.yaml says what each is for). Widening it is a
# decision: change this table in the same change.
KURED_CLUSTER_PERMISSIONS = {
    ("", "nodes"): {"get", "patch"},
    ("", "pods"): {"list", "get"},
    ("", "pods/eviction"): {"create"},
    ("policy", "poddisruptionbudgets"): {"list"},
}
KURED_LOCK_PERMISSIONS = {("apps", "daemonsets"): {"get", "update"}}


# ------------------------------------------------------------------------- helpers


def find(
    manifests: list[Manifest], kind: str, name: str, namespace: str | None = None
) -> dict[str, Any]:
    hits = [
        m.obj
        for m in manifests
        if m.kind == kind and m.name == name and (namespace is None or m.namespace == namespace)
    ]
    assert len(hits) == 1, f"expected one {kind} {name}, found {len(hits)}"
    return hits[0]


def only(manifests: list[Manifest], kind: str) -> list[dict[str, Any]]:
    return [m.obj for m in manifests if m.kind == kind]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    hits = [c for c in pod_spec(workload)["containers"] if c["name"] == name]
    assert len(hits) == 1
    return hits[0]


def container_port(c: dict[str, Any], port: int | str) -> int | None:
    """The container port a probe or Service port refers to (by name or number)."""
    for p in c.get("ports", []):
        if port in (p.get("name"), p["containerPort"]):
            return int(p["containerPort"])
    return None


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


_QUANTITY = re.compile(r"^(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_QUANTITY_UNITS = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_QUANTITY_UNITS.update({"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12})


def quantity_bytes(text: str) -> int:
    m = _QUANTITY.match(text)
    assert m, f"unsupported quantity {text!r}"
    return int(m.group(1)) * _QUANTITY_UNITS[m.group(2)]


def container_env(
    c: dict[str, Any], fields: dict[str, str], secrets: dict[str, str]
) -> dict[str, str]:
    """The container's environment as the kubelet builds it: fieldRefs from ``fields``,
    secretKeyRefs from ``secrets`` (``name/key``; a missing optional key is left out), and
    ``$(VAR)`` expanded from variables defined earlier in the list."""
    env: dict[str, str] = {}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = re.sub(
                r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                lambda m: env.get(m.group(1), m.group(0)),
                str(e["value"]),
            )
        elif "fieldRef" in (source := e["valueFrom"]):
            env[e["name"]] = fields[source["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            key = f"{ref['name']}/{ref['key']}"
            if key in secrets:
                env[e["name"]] = secrets[key]
            else:
                assert ref.get("optional"), f"{e['name']}: required secret key {key} not given"
        else:
            raise AssertionError(f"{e['name']}: unexpected env source {source}")
    return env


KURA_SECRETS = {
    "kura-tokens/read-write-tokens": "a-token",
    "kura-peer-tokens/internal-tokens": "a-peer-token",
}


def kura_env(manifests: list[Manifest], pod_name: str = "kura-0") -> dict[str, str]:
    sts = find(manifests, "StatefulSet", "kura", "kura")
    return container_env(container(sts, "kura"), {"metadata.name": pod_name}, KURA_SECRETS)


def kura_settings(
    manifests: list[Manifest], pod_name: str = "kura-0", links: dict[str, str] | None = None
) -> Any:
    """The settings ``kura serve`` loads in the pod (``links``: service-link variables the
    kubelet would add, which the pod's own env overrides)."""
    return load_kura_settings(
        build_parser().parse_args(["serve"]), {**(links or {}), **kura_env(manifests, pod_name)}
    )


def service_links(manifests: list[Manifest], namespace: str) -> dict[str, str]:
    """The variables the kubelet gives a pod with service links on, for every Service with a
    cluster IP in ``namespace`` (a headless one gives none), as the Kubernetes docs describe
    them (services-networking/service/#environment-variables); 10.96.0.N as the IPs."""
    env: dict[str, str] = {}
    services = [m.obj for m in manifests if m.kind == "Service" and m.namespace == namespace]
    for n, svc in enumerate(services, start=10):
        if svc["spec"].get("clusterIP") == "None":
            continue
        name, ip = svc["metadata"]["name"].upper().replace("-", "_"), f"10.96.0.{n}"
        ports = svc["spec"]["ports"]
        env[f"{name}_SERVICE_HOST"] = ip
        env[f"{name}_SERVICE_PORT"] = str(ports[0]["port"])
        env[f"{name}_PORT"] = f"{ports[0].get('protocol', 'TCP').lower()}://{ip}:{ports[0]['port']}"
        for p in ports:
            proto, port = p.get("protocol", "TCP"), p["port"]
            if "name" in p:
                env[f"{name}_SERVICE_PORT_{p['name'].upper().replace('-', '_')}"] = str(port)
            link = f"{name}_PORT_{port}_{proto}"
            env[link] = f"{proto.lower()}://{ip}:{port}"
            env[f"{link}_PROTO"], env[f"{link}_PORT"], env[f"{link}_ADDR"] = (
                proto.lower(),
                str(port),
                ip,
            )
    return env


def kured_settings(manifests: list[Manifest], links: dict[str, str] | None = None) -> Any:
    ds = find(manifests, "DaemonSet", "kured", "kured")
    c = container(ds, "kured")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args, unknown = parser.parse_known_args(c.get("args", []))
    assert unknown == [], f"flags kured does not have: {unknown}"
    env = container_env(c, {"spec.nodeName": "node-a"}, {})
    return load_settings(args, {**(links or {}), **env})


def service_job(manifests: list[Manifest], service_monitor: dict[str, Any]) -> str:
    """The ``job`` label prometheus-operator gives the monitor's targets: the value of the
    Service label named by ``jobLabel``, else the Service's name."""
    (service,) = selected_services(manifests, service_monitor)
    label = service_monitor["spec"].get("jobLabel")
    return str(service["metadata"]["labels"][label]) if label else str(service["metadata"]["name"])


def selected_services(
    manifests: list[Manifest], service_monitor: dict[str, Any]
) -> list[dict[str, Any]]:
    namespaces = service_monitor["spec"].get("namespaceSelector", {}).get("matchNames") or [
        service_monitor["metadata"]["namespace"]
    ]
    selector = service_monitor["spec"]["selector"]["matchLabels"]
    return [
        s
        for s in only(manifests, "Service")
        if s["metadata"]["namespace"] in namespaces
        and selects(selector, s["metadata"].get("labels", {}))
    ]


# ------------------------------------------------------------------------- checks of our own


def probe_problems(manifests: list[Manifest]) -> list[str]:
    """kura's probes: liveness and startup on /up, readiness on /ready, on KURA_PORT."""
    sts = find(manifests, "StatefulSet", "kura", "kura")
    c = container(sts, "kura")
    public_port = int(kura_env(manifests)["KURA_PORT"])
    problems = []
    for probe, path in (
        ("livenessProbe", "/up"),
        ("startupProbe", "/up"),
        ("readinessProbe", "/ready"),
    ):
        get = (c.get(probe) or {}).get("httpGet")
        if get is None:
            problems.append(f"{probe}: missing or not an httpGet")
            continue
        if get.get("path") != path:
            problems.append(f"{probe}: path {get.get('path')!r}, kura serves it on {path}")
        if container_port(c, get["port"]) != public_port:
            problems.append(f"{probe}: port {get['port']!r} is not KURA_PORT {public_port}")
    return problems


def rbac_problems(manifests: list[Manifest]) -> list[str]:
    """No wildcards; kured gets exactly the permissions in the tables above; the lock Role is
    limited to kured's own DaemonSet; bindings point at what exists."""
    problems = []
    for kind in ("ClusterRole", "Role"):
        for role in only(manifests, kind):
            for rule in role.get("rules", []):
                for field in ("verbs", "resources", "apiGroups", "resourceNames"):
                    if any("*" in str(v) for v in rule.get(field, [])):
                        problems.append(f"{kind} {role['metadata']['name']}: wildcard in {field}")

    def permissions(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
        out: dict[tuple[str, str], set[str]] = {}
        for rule in role.get("rules", []):
            for group in rule.get("apiGroups", []):
                for resource in rule.get("resources", []):
                    out.setdefault((group, resource), set()).update(rule.get("verbs", []))
        return out

    cluster_role = find(manifests, "ClusterRole", "kured")
    if permissions(cluster_role) != KURED_CLUSTER_PERMISSIONS:
        problems.append(f"ClusterRole kured grants {permissions(cluster_role)}")
    ds = find(manifests, "DaemonSet", "kured", "kured")
    role = find(manifests, "Role", "kured", "kured")
    if permissions(role) != KURED_LOCK_PERMISSIONS:
        problems.append(f"Role kured grants {permissions(role)}")
    if role["metadata"]["namespace"] != ds["metadata"]["namespace"]:
        problems.append("Role kured is not in the DaemonSet's namespace")
    for rule in role.get("rules", []):
        if rule.get("resourceNames") != [ds["metadata"]["name"]]:
            problems.append(
                f"Role kured: resourceNames {rule.get('resourceNames')} must be exactly the "
                f"DaemonSet [{ds['metadata']['name']!r}]"
            )
    account = pod_spec(ds).get("serviceAccountName")
    if not any(
        m.kind == "ServiceAccount" and m.name == account and m.namespace == "kured"
        for m in manifests
    ):
        problems.append(f"DaemonSet kured runs as ServiceAccount {account!r}, which is not defined")
    for kind, role_kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        for binding in only(manifests, kind):
            ref = binding["roleRef"]
            ns = binding["metadata"].get("namespace")
            if ref["kind"] != role_kind or not any(
                m.kind == role_kind and m.name == ref["name"] and m.namespace == ns
                for m in manifests
            ):
                problems.append(f"{kind} {binding['metadata']['name']} binds a missing {ref}")
            subjects = binding.get("subjects", [])
            if subjects != [{"kind": "ServiceAccount", "name": account, "namespace": "kured"}]:
                problems.append(f"{kind} {binding['metadata']['name']} binds {subjects}")
    return problems


def namespace_problems(manifests: list[Manifest]) -> list[str]:
    namespaces = {m.name for m in manifests if m.kind == "Namespace"}
    problems = []
    for m in manifests:
        if m.kind in CLUSTER_SCOPED and m.namespace is not None:
            problems.append(f"{m.ref()}: cluster-scoped object with a namespace")
        if m.kind not in CLUSTER_SCOPED and m.namespace not in namespaces:
            problems.append(f"{m.ref()}: namespace {m.namespace!r} is not created by deploy/")
    return problems


def selector_problems(manifests: list[Manifest]) -> list[str]:
    """Every Service, PodDisruptionBudget and NetworkPolicy selects the pods of a workload in its
    namespace, and every Service targetPort names a port of those pods."""
    workloads = [m.obj for m in manifests if m.kind in ("StatefulSet", "DaemonSet")]
    problems = []
    for m in manifests:
        if m.kind == "Service":
            selector = m.obj["spec"].get("selector", {})
        elif m.kind in ("PodDisruptionBudget",):
            selector = m.obj["spec"]["selector"]["matchLabels"]
        elif m.kind == "NetworkPolicy":
            selector = m.obj["spec"]["podSelector"]["matchLabels"]
        else:
            continue
        pods = [
            w
            for w in workloads
            if w["metadata"]["namespace"] == m.namespace
            and selects(selector, w["spec"]["template"]["metadata"]["labels"])
        ]
        if not pods:
            problems.append(f"{m.ref()}: selects no pods")
        for w in pods:
            for port in m.obj["spec"].get("ports", []) if m.kind == "Service" else []:
                if not any(
                    container_port(c, port["targetPort"]) for c in pod_spec(w)["containers"]
                ):
                    problems.append(
                        f"{m.ref()}: targetPort {port['targetPort']!r} is not a pod port"
                    )
    return problems


# ------------------------------------------------------------------------- rendering and schemas


def test_deploy_renders_kura_kured_and_their_alerts(manifests: list[Manifest]) -> None:
    kinds = {(m.kind, m.namespace, m.name) for m in manifests}
    assert {
        ("StatefulSet", "kura", "kura"),
        ("Service", "kura", "kura"),
        ("Service", "kura", "kura-peers"),
        ("PodDisruptionBudget", "kura", "kura"),
        ("ServiceMonitor", "kura", "kura"),
        ("DaemonSet", "kured", "kured"),
        ("Service", "kured", "kured"),
        ("ServiceMonitor", "kured", "kured"),
        ("ClusterRole", None, "kured"),
        ("Role", "kured", "kured"),
        ("PrometheusRule", "kured", "kured"),
        ("PrometheusRule", "kura", "kura"),
    } <= kinds


@pytest.mark.parametrize("component", ["kura", "kured", "alerts"])
def test_each_component_renders_on_its_own(component: str) -> None:
    assert render(DEPLOY / component)


def test_every_object_validates_against_the_kubernetes_schemas(manifests: list[Manifest]) -> None:
    assert schema_problems(manifests) == []


def test_every_object_is_in_a_namespace_deploy_creates(manifests: list[Manifest]) -> None:
    assert namespace_problems(manifests) == []


def test_every_selector_selects_pods_and_every_target_port_exists(
    manifests: list[Manifest],
) -> None:
    assert selector_problems(manifests) == []


# ------------------------------------------------------------------------- kura


def test_kura_probes_use_up_and_ready_on_the_public_port(manifests: list[Manifest]) -> None:
    assert probe_problems(manifests) == []


def test_kura_environment_is_settings_kura_accepts(manifests: list[Manifest]) -> None:
    known = {o.env for _f, o in options_of(KuraSettings)}
    unknown = sorted(k for k in kura_env(manifests) if k.startswith("KURA_") and k not in known)
    assert unknown == [], "kura ignores these variables"
    settings = kura_settings(manifests, "kura-1")
    assert settings.host == "0.0.0.0"
    assert settings.internal_port != settings.port
    assert settings.node_url == "http://kura-1.kura-peers.kura.svc.cluster.local:4100"
    assert settings.read_write_tokens == ("a-token",)


def test_no_pod_gets_service_links_and_both_would_ignore_them(manifests: list[Manifest]) -> None:
    # The Services kura and kured would put KURA_PORT=tcp://IP:4000, KURED_PORT=... and more
    # into every pod of their namespace (issue 26): turned off, and ignored when left on.
    templates = [m for m in manifests if "template" in m.obj.get("spec", {})]
    assert {(m.kind, m.name) for m in templates} == {
        ("StatefulSet", "kura"),
        ("DaemonSet", "kured"),
    }
    on = [m.name for m in templates if pod_spec(m.obj).get("enableServiceLinks") is not False]
    assert on == [], "these pods get service-link variables"
    kura_links = service_links(manifests, "kura")
    assert kura_links["KURA_PORT"] == "tcp://10.96.0.10:4000"
    assert kura_settings(manifests, links=kura_links).port == 4000
    kured_links = service_links(manifests, "kured")
    assert kured_links["KURED_PORT_8080_TCP_ADDR"] == "10.96.0.10"
    assert kured_settings(manifests, links=kured_links).node_id == "node-a"


def test_kura_peers_authenticate_with_a_required_secret_token(manifests: list[Manifest]) -> None:
    settings = kura_settings(manifests)
    assert settings.internal_tokens == ("a-peer-token",)
    sts = find(manifests, "StatefulSet", "kura", "kura")
    (entry,) = [e for e in container(sts, "kura")["env"] if e["name"] == "KURA_INTERNAL_TOKENS"]
    ref = entry["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref.get("optional", False)) == ("kura-peer-tokens", False)
    # Without it the pods would not start: the peer listener binds beyond loopback.
    env = {k: v for k, v in kura_env(manifests).items() if k != "KURA_INTERNAL_TOKENS"}
    without = load(KuraSettings, argparse.Namespace(), env)
    assert any("KURA_INTERNAL_TOKENS" in p for p in validate_kura_settings(without))


def test_the_readme_creates_both_secrets_with_random_values() -> None:
    readme = (DEPLOY.parent / "README.md").read_text()
    for secret, key in (
        ("kura-tokens", "read-write-tokens"),
        ("kura-peer-tokens", "internal-tokens"),
    ):
        pattern = rf'create secret generic {secret} \\\s+--from-literal={key}="\$\(openssl rand -hex 32\)"'
        assert re.search(pattern, readme), f"README does not create {secret}/{key}"


def test_kura_peers_find_each_other_through_the_headless_service(manifests: list[Manifest]) -> None:
    sts = find(manifests, "StatefulSet", "kura", "kura")
    headless = find(manifests, "Service", sts["spec"]["serviceName"], "kura")
    assert headless["spec"]["clusterIP"] == "None"
    # A joining pod is unready until bootstrapped: its peers must find it before that.
    assert headless["spec"]["publishNotReadyAddresses"] is True
    settings = kura_settings(manifests)
    fqdn = f"{headless['metadata']['name']}.{headless['metadata']['namespace']}.svc.cluster.local"
    assert settings.discovery_dns_name == fqdn
    assert settings.node_url == f"http://kura-0.{fqdn}:{settings.internal_port}"
    internal = {p["name"]: p for p in headless["spec"]["ports"]}["internal"]
    assert container_port(container(sts, "kura"), internal["targetPort"]) == settings.internal_port
    # The client Service carries the public port only: /_internal/ is for peers.
    client = find(manifests, "Service", "kura", "kura")
    assert [p["port"] for p in client["spec"]["ports"]] == [settings.port]


def test_kura_data_and_tmp_live_on_the_volume_and_the_budgets_fit_it(
    manifests: list[Manifest],
) -> None:
    sts = find(manifests, "StatefulSet", "kura", "kura")
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    mounts = {v["name"]: v["mountPath"] for v in container(sts, "kura")["volumeMounts"]}
    volume = Path(mounts[claim["metadata"]["name"]])
    s = kura_settings(manifests)
    assert Path(s.data_dir).is_relative_to(volume)
    assert Path(s.tmp_dir).is_relative_to(volume)
    size = quantity_bytes(claim["spec"]["resources"]["requests"]["storage"])
    # The rest (index, WAL, filesystem overhead, root-reserved blocks) needs room too.
    assert s.max_disk_bytes + s.tmp_dir_max_bytes + s.min_free_disk_bytes <= 0.85 * size
    assert s.tmp_dir_max_bytes < size
    # The largest body kura accepts must fit in the tmp budget, or it can never be stored.
    assert s.max_artifact_bytes <= s.tmp_dir_max_bytes


def test_kura_allows_one_pod_away_at_a_time(manifests: list[Manifest]) -> None:
    pdb = find(manifests, "PodDisruptionBudget", "kura", "kura")
    assert pdb["spec"]["maxUnavailable"] == 1


def test_kura_updates_wait_for_the_rollout_script_and_its_gate(manifests: list[Manifest]) -> None:
    """A changed template waits at the partition until deploy/kura/rollout.sh lowers it; the
    script is POSIX sh (dash, Debian's /bin/sh, parses it), and what it assumes of the
    manifests and of ``kura admin rollout-gate`` holds."""
    sts = find(manifests, "StatefulSet", "kura", "kura")
    strategy = sts["spec"]["updateStrategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"]["partition"] == sts["spec"]["replicas"]
    assert rollout_problems(sts, ROLLOUT.read_text()) == []


ROLLOUT = DEPLOY / "kura" / "rollout.sh"


def rollout_problems(sts: dict[str, Any], script: str) -> list[str]:
    problems = []
    if not os.access(ROLLOUT, os.X_OK):
        problems.append("rollout.sh is not executable")
    parsed = subprocess.run(
        ["dash", "-n"], input=script, capture_output=True, text=True, check=False
    )
    if parsed.returncode != 0:
        problems.append(f"dash -n: {parsed.stderr.strip()}")
    defaults = dict(re.findall(r"^([A-Z_]+)=\$\{[A-Z_]+:-([^}]*)\}$", script, re.MULTILINE))
    expected = {
        "NAMESPACE": sts["metadata"]["namespace"],
        "STATEFULSET": sts["metadata"]["name"],
        "PEERS_SERVICE": sts["spec"]["serviceName"],
        "PORT": str(container_port(container(sts, "kura"), "http")),
    }
    for name, value in expected.items():
        if defaults.get(name) != value:
            problems.append(
                f"{name} defaults to {defaults.get(name)!r}, the manifests say {value!r}"
            )
    # The gate runs where the script runs: a pod of kura 0.1.0 has no rollout-gate command, and
    # the script must gate pods of either version (the first upgrade, a roll back).
    if re.search(r"\bexec\b[^\n]*rollout-gate|rollout-gate[^\n]*\bexec\b", script):
        problems.append("the gate runs inside a pod (kubectl exec)")
    if defaults.get("GATE") != "kura admin rollout-gate":
        problems.append(f"GATE defaults to {defaults.get('GATE')!r}, not a local kura")
    if "{.spec.updateStrategy.rollingUpdate.partition}" not in script:
        problems.append("a resumed run does not start from the partition")
    gate = re.search(r"\$GATE (--url .*?)\n(.*?)\n", script, re.DOTALL)
    if gate is None:
        return [*problems, "rollout.sh does not run $GATE"]
    flags = re.findall(r"(--[a-z-]+) ", " ".join(gate.groups()))
    argv = ["admin", "rollout-gate"]
    for flag in flags:
        argv += [flag, "1"]
    try:
        build_parser().parse_args(argv)
    except SystemExit:
        problems.append(f"kura admin rollout-gate does not take {flags}")
    return problems


def test_the_rollout_check_fails_a_wrong_port_and_an_unknown_flag(
    manifests: list[Manifest],
) -> None:
    sts = find(manifests, "StatefulSet", "kura", "kura")
    script = ROLLOUT.read_text()
    assert rollout_problems(sts, script.replace("PORT:-4000", "PORT:-8080")) == [
        "PORT defaults to '8080', the manifests say '4000'"
    ]
    wrong = rollout_problems(sts, script.replace("--max-queued", "--max-depth"))
    assert len(wrong) == 1
    assert "does not take" in wrong[0]
    assert rollout_problems(sts, script + "\nif then\n")[0].startswith("dash -n:")
    inside = script.replace(
        "$GATE --url", 'kubectl exec "$STATEFULSET-$1" -c kura -- kura admin rollout-gate --url'
    )
    assert "the gate runs inside a pod (kubectl exec)" in rollout_problems(sts, inside)
    raised = script.replace("{.spec.updateStrategy.rollingUpdate.partition}", "{.spec.replicas}")
    assert rollout_problems(sts, raised) == ["a resumed run does not start from the partition"]


def test_kura_runs_unprivileged_with_resources(manifests: list[Manifest]) -> None:
    sts = find(manifests, "StatefulSet", "kura", "kura")
    assert pod_spec(sts)["securityContext"]["runAsNonRoot"] is True
    assert pod_spec(sts)["automountServiceAccountToken"] is False
    c = container(sts, "kura")
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert c["resources"]["requests"]
    assert c["resources"]["limits"]["memory"]


def test_kura_is_scraped_including_pods_that_are_not_ready(manifests: list[Manifest]) -> None:
    monitor = find(manifests, "ServiceMonitor", "kura", "kura")
    (service,) = selected_services(manifests, monitor)
    assert service["spec"].get("publishNotReadyAddresses") is True
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {
        p["name"] for p in service["spec"]["ports"]
    }
    assert service_job(manifests, monitor) == "kura"


# ------------------------------------------------------------------------- kured


def test_kured_flags_are_settings_kured_accepts(manifests: list[Manifest]) -> None:
    s = kured_settings(manifests)
    ds = find(manifests, "DaemonSet", "kured", "kured")
    assert s.node_id == "node-a"  # from spec.nodeName
    assert s.lock_backend == "kubernetes"
    assert (s.ds_namespace, s.ds_name) == (ds["metadata"]["namespace"], ds["metadata"]["name"])


def test_kured_node_id_comes_from_the_node_name(manifests: list[Manifest]) -> None:
    c = container(find(manifests, "DaemonSet", "kured", "kured"), "kured")
    (node_id,) = [e for e in c["env"] if e["name"] == "KURED_NODE_ID"]
    assert node_id["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_kured_reads_the_host_sentinel_read_only(manifests: list[Manifest]) -> None:
    ds = find(manifests, "DaemonSet", "kured", "kured")
    assert pod_spec(ds)["hostPID"] is True
    c = container(ds, "kured")
    (mount,) = [v for v in c["volumeMounts"] if v["mountPath"] == "/sentinel"]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod_spec(ds)["volumes"] if v["name"] == mount["name"]]
    assert volume["hostPath"]["path"] == "/var/run"
    assert str(kured_settings(manifests).reboot_sentinel) == "/sentinel/reboot-required"
    # The circuit breaker's state must outlive the pod and the reboot.
    state_dir = str(kured_settings(manifests).state_dir)
    (state,) = [v for v in c["volumeMounts"] if v["mountPath"] == state_dir]
    (state_volume,) = [v for v in pod_spec(ds)["volumes"] if v["name"] == state["name"]]
    assert "hostPath" in state_volume


def test_kured_gates_on_every_kura_pod_by_its_stable_name(manifests: list[Manifest]) -> None:
    sts = find(manifests, "StatefulSet", "kura", "kura")
    kura = kura_settings(manifests)
    fqdn = f"{sts['spec']['serviceName']}.{sts['metadata']['namespace']}.svc.cluster.local"
    expected = tuple(
        f"http://{sts['metadata']['name']}-{i}.{fqdn}:{kura.port}/ready"
        for i in range(sts["spec"]["replicas"])
    )
    assert kured_settings(manifests).gate_url == expected


def test_kured_service_and_servicemonitor_are_on_by_default(manifests: list[Manifest]) -> None:
    # The chart's default (both off) left kured_reboot_required unscraped: a dashboard and alerts over it stayed silent.
    ds = find(manifests, "DaemonSet", "kured", "kured")
    metrics_port = kured_settings(manifests).metrics_port
    c = container(ds, "kured")
    assert container_port(c, "metrics") == metrics_port
    assert c["livenessProbe"]["httpGet"]["port"] == "metrics"
    monitor = find(manifests, "ServiceMonitor", "kured", "kured")
    (service,) = selected_services(manifests, monitor)
    assert selects(service["spec"]["selector"], ds["spec"]["template"]["metadata"]["labels"])
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert container_port(c, ports[endpoint["port"]]["targetPort"]) == metrics_port
    assert endpoint.get("path", "/metrics") == "/metrics"
    # kured's own `node` label must survive the scrape: the alerts join on it.
    assert endpoint["honorLabels"] is True
    # The job the alerts select.
    assert service_job(manifests, monitor) == "kured"
    assert 'up{job="kured"}' in (DEPLOY / "alerts" / "kured.rules.yml").read_text()


def test_rbac_is_least_privilege_without_wildcards(manifests: list[Manifest]) -> None:
    assert rbac_problems(manifests) == []


# ------------------------------------------------------------------------- tests of the tests


def _mutated(manifests: list[Manifest], kind: str, name: str, change: Any) -> list[Manifest]:
    out = []
    for m in manifests:
        if m.kind == kind and m.name == name:
            obj = copy.deepcopy(m.obj)
            change(obj)
            m = Manifest(m.source, obj)
        out.append(m)
    return out


def _kura_container(obj: dict[str, Any]) -> dict[str, Any]:
    return container(obj, "kura")


BROKEN_OBJECTS = {
    "port number as a string": (
        "StatefulSet",
        "kura",
        lambda o: _kura_container(o)["ports"][0].__setitem__("containerPort", "4000"),
    ),
    "misspelled probe field": (
        "StatefulSet",
        "kura",
        lambda o: _kura_container(o)["readinessProbe"].__setitem__(
            "httpGett", _kura_container(o)["readinessProbe"].pop("httpGet")
        ),
    ),
    "hostPID as a string": (
        "DaemonSet",
        "kured",
        lambda o: o["spec"]["template"]["spec"].__setitem__("hostPID", "yes"),
    ),
    "Service port without a number": (
        "Service",
        "kured",
        lambda o: o["spec"]["ports"][0].pop("port"),
    ),
    "ServiceMonitor endpoint instead of endpoints": (
        "ServiceMonitor",
        "kured",
        lambda o: o["spec"].__setitem__("endpoint", o["spec"].pop("endpoints")),
    ),
    "PrometheusRule rule without expr": (
        "PrometheusRule",
        "kured",
        lambda o: o["spec"]["groups"][0]["rules"][0].pop("expr"),
    ),
    "kind with no schema": (
        "PodDisruptionBudget",
        "kura",
        lambda o: o.__setitem__("kind", "PodDisruptionBudgett"),
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN_OBJECTS))
def test_the_schema_check_fails_a_broken_object(manifests: list[Manifest], case: str) -> None:
    kind, name, change = BROKEN_OBJECTS[case]
    problems = schema_problems(_mutated(manifests, kind, name, change))
    assert len(problems) >= 1
    assert all(f" {name}" in p for p in problems), problems


def test_a_broken_manifest_file_fails_render_or_validation(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [app.yaml]\n"
    )
    (tmp_path / "app.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "app", "namespace": "default"},
                "spec": {
                    "replicas": "three",
                    "selector": {"matchLabels": {"app": "x"}},
                    "template": {
                        "metadata": {"labels": {"app": "x"}},
                        "spec": {"containers": [{"name": "c", "image": "i"}]},
                    },
                },
            }
        )
    )
    problems = schema_problems(render(tmp_path))
    assert len(problems) == 1
    assert "app.yaml: Deployment default/app: spec.replicas:" in problems[0]

    (tmp_path / "kustomization.yaml").write_text("kind: Kustomization\nresources: [missing.yaml]\n")
    with pytest.raises(KustomizeError, match="does not exist"):
        render(tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "kind: Kustomization\nnamePrefix: x-\nresources: [app.yaml]\n"
    )
    with pytest.raises(KustomizeError, match="namePrefix not supported"):
        render(tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "kind: Kustomization\nresources: [app.yaml, app.yaml]\n"
    )
    with pytest.raises(KustomizeError, match="defined twice"):
        render(tmp_path)


def test_the_probe_check_fails_readiness_on_up(manifests: list[Manifest]) -> None:
    def readiness_on_up(o: dict[str, Any]) -> None:
        _kura_container(o)["readinessProbe"]["httpGet"]["path"] = "/up"

    def liveness_on_internal_port(o: dict[str, Any]) -> None:
        _kura_container(o)["livenessProbe"]["httpGet"]["port"] = "internal"

    assert probe_problems(_mutated(manifests, "StatefulSet", "kura", readiness_on_up)) == [
        "readinessProbe: path '/up', kura serves it on /ready"
    ]
    assert probe_problems(
        _mutated(manifests, "StatefulSet", "kura", liveness_on_internal_port)
    ) == ["livenessProbe: port 'internal' is not KURA_PORT 4000"]


@pytest.mark.parametrize(
    ("case", "kind", "change", "expected"),
    [
        (
            "wildcard verb",
            "ClusterRole",
            lambda o: o["rules"][0].__setitem__("verbs", ["*"]),
            "ClusterRole kured: wildcard in verbs",
        ),
        (
            "wildcard resource",
            "Role",
            lambda o: o["rules"][0].__setitem__("resources", ["*"]),
            "Role kured: wildcard in resources",
        ),
        (
            "one permission more",
            "ClusterRole",
            lambda o: o["rules"].append(
                {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}
            ),
            "ClusterRole kured grants",
        ),
        (
            "lock Role not limited to the DaemonSet",
            "Role",
            lambda o: o["rules"][0].pop("resourceNames"),
            "Role kured: resourceNames None must be exactly the DaemonSet ['kured']",
        ),
    ],
)
def test_the_rbac_check_fails_wider_permissions(
    manifests: list[Manifest], case: str, kind: str, change: Any, expected: str
) -> None:
    problems = rbac_problems(_mutated(manifests, kind, "kured", change))
    assert any(p.startswith(expected) for p in problems), (case, problems)


def test_the_selector_and_namespace_checks_fail_strays(manifests: list[Manifest]) -> None:
    def wrong_selector(o: dict[str, Any]) -> None:
        o["spec"]["selector"] = {"app.kubernetes.io/name": "kured-typo"}

    def wrong_namespace(o: dict[str, Any]) -> None:
        o["metadata"]["namespace"] = "kube-system"

    assert selector_problems(_mutated(manifests, "Service", "kured", wrong_selector)) == [
        "Service kured/kured: selects no pods"
    ]
    assert namespace_problems(_mutated(manifests, "Service", "kured", wrong_namespace)) == [
        "Service kube-system/kured: namespace 'kube-system' is not created by deploy/"
    ]
