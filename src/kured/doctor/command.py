"""``kured doctor [agent flags] [doctor flags]``: run every check, print one line per finding.

It takes the agent's own flags and ``KURED_*`` environment (``kured.settings``, the environment
winning as for the agent), so it checks the configuration the agent really runs with, plus:

    --node-count N        nodes Prometheus must see (default: the Nodes of the Kubernetes API)
    --reboot-duration D   how long a reboot keeps a node down, boot included (default 10m;
                          the lock TTL and cordon-alert checks)
    --kernel-release R    the running kernel (default: uname -r)
    --host-root DIR       where the host's files are (default /; e.g. /host in a pod)
    --json                print the findings as JSON (``kured.doctor.finding``)

``--node-id`` defaults to this host's name. The Kubernetes checks run with ``--kubeconfig``,
or in-cluster with ``--lock-backend=kubernetes``; the Prometheus checks with
``--prometheus-url``. Exit codes: 0 no FAIL, 1 at least one FAIL, 2 invalid flags.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import aiohttp

from kit.settings import SettingsError, parse_duration
from kured.apiserver import ApiServer
from kured.core.errors import ApiError, ConfigurationError
from kured.doctor import host, kernel, kube, lock, prometheus, reach
from kured.doctor.finding import Report, fail, warn
from kured.settings import Settings, add_arguments, load_settings

DEFAULT_REBOOT_DURATION = "10m"


def _duration(text: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError("must be greater than 0")
    return seconds


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError("must be a whole number of nodes, at least 1")
    return int(text)


def parser() -> argparse.ArgumentParser:
    """The doctor's parser: every agent flag, then the doctor's own (the docs' table of
    doctor flags is checked against ``DOCTOR_FLAGS``)."""
    p = argparse.ArgumentParser(
        prog="kured doctor",
        description="Check this node and cluster for failures that leave kured silently "
        "rebooting nothing, or the wrong thing. One line per finding: OK, WARN or FAIL with "
        "the fix; exit 1 on any FAIL.",
    )
    add_arguments(p)
    for action in p._actions:  # the agent requires --node-id; the doctor defaults it
        if action.dest == "node_id":
            action.help = "this node's name (default: this host's name) (env KURED_NODE_ID)"
    doctor = p.add_argument_group("doctor")
    doctor.add_argument(
        "--node-count",
        type=_count,
        default=None,
        help="nodes Prometheus must see agents for (default: the Nodes of the Kubernetes API)",
    )
    doctor.add_argument(
        "--reboot-duration",
        type=_duration,
        default=_duration(DEFAULT_REBOOT_DURATION),
        help="how long one reboot keeps a node down, boot included, for the lock TTL and "
        f"cordon-alert checks (default {DEFAULT_REBOOT_DURATION})",
    )
    doctor.add_argument(
        "--kernel-release",
        default=None,
        help="the running kernel release to check (default: uname -r)",
    )
    doctor.add_argument(
        "--host-root",
        type=Path,
        default=Path("/"),
        help="where the host's files are mounted (default /; e.g. /host in a pod)",
    )
    doctor.add_argument("--json", action="store_true", help="print the findings as JSON")
    return p


DOCTOR_FLAGS = ("--node-count", "--reboot-duration", "--kernel-release", "--host-root", "--json")


def settings_of(args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    """The agent's settings; ``--node-id`` defaults to the host name. Raises SettingsError."""
    if args.node_id is None and not environ.get("KURED_NODE_ID"):
        args.node_id = socket.gethostname()
    return load_settings(args, environ)


async def diagnose(s: Settings, args: argparse.Namespace) -> Report:
    """Run every check whose input is given, in a fixed order, into one ``Report``."""
    report = Report()
    root: Path = args.host_root
    release = args.kernel_release or os.uname().release
    report.add(await host.check_sentinel(s, root, release))
    await kernel.check_apt(report, root, release)
    report.add(lock.check_lock(s, args.reboot_duration))
    names: list[str] | None = None
    if s.kubeconfig or s.lock_backend == "kubernetes":
        try:
            api = ApiServer.connect(
                s.kubeconfig or None, request_timeout_seconds=s.kubernetes_timeout
            )
        except ConfigurationError as exc:
            report.add([fail("pdb", "; ".join(exc.problems), "give a working --kubeconfig.")])
        else:
            try:
                report.add(await kube.check_pdbs(api, s))
                if s.prometheus_url and args.node_count is None:
                    try:
                        names = await kube.node_names(api)
                    except ApiError as exc:
                        report.add([warn("scrape", f"cannot count the nodes: {exc.message}",
                                         "give --node-count, or allow list on nodes.")])  # fmt: skip
            finally:
                await api.close()
    else:
        report.skip("pdb", "no --kubeconfig and --lock-backend is not kubernetes")
    if s.lock_backend == "etcd":
        report.add(await reach.check_etcd(s))
    else:
        report.skip("etcd", f"--lock-backend is {s.lock_backend}")
    if s.gate_url:
        async with aiohttp.ClientSession() as session:
            report.add(await reach.check_gates(session, s))
    else:
        report.skip("gate", "no --gate-url")
    if s.prometheus_url:
        expected = (
            args.node_count if args.node_count is not None else (len(names) if names else None)
        )
        if expected is None:
            report.skip("scrape", "no --node-count and no Kubernetes API to count the nodes")
        async with aiohttp.ClientSession() as session:
            report.add(
                await prometheus.check_prometheus(session, s, expected, names, args.reboot_duration)
            )
    else:
        report.skip(
            "prometheus", "no --prometheus-url (scrape, retention, alerts and cordon checks)"
        )
    return report


def main(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> int:
    args = parser().parse_args(list(argv))
    env = os.environ if environ is None else environ
    try:
        settings = settings_of(args, env)
    except SettingsError as exc:
        report = Report(invalid_configuration=True)
        report.add(
            [fail("config", p, "correct the flag or KURED_* variable.") for p in exc.problems]
        )
    else:
        report = asyncio.run(diagnose(settings, args))
    print(report.to_json() if args.json else report.to_text())
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
