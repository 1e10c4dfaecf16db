"""``kured`` command line: argv and environment → settings → agent. Nothing else.

    kured --node-id n1 [flags]           run the agent (kured's flags; KURED_* env overrides)
    kured status [--url URL] [--json]     print an agent's conditions, blocker and lock holders
    kured fleetlock [flags]               serve the FleetLock protocol for Zincati
    kured doctor [flags] [--json]         check for the failures that stay silent (one line each)

Exit codes: 0 clean stop; 1 a run-time failure; 2 invalid configuration (every problem listed);
``status`` exits 0 when the node would reboot now or needs nothing, 3 when it is blocked;
``doctor`` exits 1 when any finding is FAIL (``kured.doctor.command``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kit import log as kit_log
from kit.pipes import quiet_broken_pipe
from kit.service_link import is_service_link
from kit.settings import SettingsError, print_problems
from kured import __version__

if TYPE_CHECKING:
    from kured.settings import Settings


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; a closed stdout pipe ends it quietly (``kit.pipes``)."""
    return quiet_broken_pipe(lambda: _main(argv))


def _main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "status":
        return status(args[1:])
    if args and args[0] == "fleetlock":
        return fleetlock(args[1:])
    if args and args[0] == "doctor":
        from kured.doctor.command import main as doctor

        return doctor(args[1:])
    return agent(args)


def agent(argv: list[str]) -> int:
    from kured.settings import add_arguments, environment, load_settings

    parser = argparse.ArgumentParser(
        prog="kured",
        description="The reboot coordinator agent.",
        epilog="other commands: 'kured status [--url URL | --all]' prints an agent's conditions; "
        "'kured fleetlock --help' serves FleetLock for Zincati; "
        "'kured doctor --help' checks for the failures that stay silent.",
    )
    parser.add_argument("--version", action="version", version=f"kured {__version__}")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args, os.environ)
    except SettingsError as exc:
        return print_problems("kured", exc.problems)
    kit_log.configure("INFO", fmt=settings.log_format)
    environment(os.environ).log_ignored(logging.getLogger("kured"), "KURED_ALLOW_UNKNOWN_SETTINGS")
    warning = real_reboot_warning(settings, os.geteuid())
    if warning:
        logging.getLogger("kured").warning(warning)
    from kured.app import run_agent
    from kured.core.errors import KuredError

    try:
        asyncio.run(run_agent(settings))
    except KuredError as exc:
        print(f"kured: {exc.message}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"kured: {exc}", file=sys.stderr)
        return 1
    return 0


def real_reboot_warning(settings: Settings, euid: int) -> str | None:
    """The start-up warning for an agent that would reboot this very machine, else None.

    As root, the default ``--reboot-command`` (``/bin/systemctl reboot``) and
    ``--reboot-method=signal`` really reboot the host once a reboot is required and the lock is
    taken: fine on a node, a surprise on a laptop trying kured out.
    """
    from kured.settings import DEFAULT_REBOOT_COMMAND

    if euid != 0:
        return None
    if settings.reboot_method == "signal":
        how = f"--reboot-method=signal sends signal {settings.reboot_signal} to PID 1"
    elif settings.reboot_command == DEFAULT_REBOOT_COMMAND:
        how = "the default --reboot-command " + " ".join(DEFAULT_REBOOT_COMMAND) + " runs"
    else:
        return None
    return (
        f"running as root: {how} and REALLY REBOOTS THIS MACHINE once a reboot is required "
        "and the lock is taken; to try kured out, pass e.g. --reboot-command='/bin/echo reboot'"
    )


def _environ() -> dict[str, str]:
    """``os.environ`` without the kubelet's service links for a Service ``kured*``
    (``KURED_METRICS_PORT=tcp://10.0.0.1:8080`` for ``kured-metrics``), as the agent reads it
    (``kured.settings.load_settings``): a link's value is no port."""
    return {k: v for k, v in os.environ.items() if not is_service_link(k, v, "KURED")}


def status(argv: list[str]) -> int:
    from kured.console import render

    env = _environ()
    parser = argparse.ArgumentParser(prog="kured status")
    parser.add_argument(
        "--url",
        default=env.get("KURED_STATUS_URL", "http://127.0.0.1:8080"),
        help="the agent's metrics address (env KURED_STATUS_URL)",
    )
    parser.add_argument("--json", action="store_true", help="print the raw JSON")
    parser.add_argument(
        "--timeout", type=float, default=10.0, help="seconds to wait for the answer (default 10)"
    )
    parser.add_argument(
        "--all", action="store_true", help="every node's agent, found through the Kubernetes API"
    )
    parser.add_argument(
        "--kubeconfig",
        default=env.get("KURED_KUBECONFIG"),
        help="with --all: kubeconfig (default: in-cluster)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=int(env.get("KURED_METRICS_PORT", "8080")),
        help="with --all: the agents' --metrics-port",
    )
    parser.add_argument(
        "--address-types",
        default=env.get("KURED_ADDRESS_TYPES", "InternalIP,ExternalIP,Hostname"),
        help="with --all: node address types to try, in order",
    )
    args = parser.parse_args(argv)
    if args.all:
        return status_all(args)
    from kit.fetch import FetchError, Hints, fetch_json

    hints = Hints("a kured agent", "--url or KURED_STATUS_URL")
    try:
        data = fetch_json(args.url.rstrip("/") + "/status", hints, None, args.timeout)
    except FetchError as exc:
        print(f"kured status: {exc.message}", file=sys.stderr)
        return 1
    print(json.dumps(data, indent=2) if args.json else render(data))
    return 3 if data.get("reason") not in ("none", "not_required", "lock_not_held") else 0


def status_all(args: argparse.Namespace) -> int:
    """Collect every agent's /status, addressing each node by the preferred address type."""
    from kit.settings import split_list
    from kured.core.addresses import KNOWN_ADDRESS_TYPES

    types = split_list(args.address_types)
    unknown = [t for t in types if t not in KNOWN_ADDRESS_TYPES]
    if not types or unknown:
        print(f"kured status: unknown address types {unknown or types}", file=sys.stderr)
        return 2
    from kured.core.errors import KuredError

    try:
        rows = asyncio.run(_collect_all(args.kubeconfig, types, args.metrics_port))
    except KuredError as exc:
        print(f"kured status: {exc.message}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        width = max([len(r["node"]) for r in rows] + [4])
        for r in rows:
            where = r["address"] or "-"
            print(f"{r['node']:<{width}}  {where:<22}  {r['summary']}")
    blocked = any(
        r["status"] is None
        or r["status"].get("reason") not in ("none", "not_required", "lock_not_held")
        for r in rows
    )
    return 3 if blocked else 0


async def _collect_all(kubeconfig: str | None, types: list[str], port: int) -> list[dict[str, Any]]:
    import aiohttp

    from kured.apiserver import ApiServer
    from kured.core.addresses import preferred_address, url_host

    api = ApiServer.connect(kubeconfig)
    try:
        nodes = await api.list_nodes()
    finally:
        await api.close()

    async def one(session: aiohttp.ClientSession, node: dict[str, Any]) -> dict[str, Any]:
        name = str((node.get("metadata") or {}).get("name", "?"))
        address = preferred_address(node, types)
        row: dict[str, Any] = {"node": name, "address": address, "status": None}
        if address is None:
            row["summary"] = f"no address of types {','.join(types)}"
            return row
        url = f"http://{url_host(address)}:{port}/status"
        try:
            async with asyncio.timeout(5), session.get(url) as resp:
                row["status"] = await resp.json()
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            row["summary"] = f"unreachable at {url}: {exc!r}"
            return row
        row["summary"] = row["status"].get("blocked_by") or row["status"].get("action", "")
        return row

    async with aiohttp.ClientSession() as session:
        return list(await asyncio.gather(*(one(session, n) for n in nodes)))


def fleetlock_parser() -> argparse.ArgumentParser:
    """The ``kured fleetlock`` flags; every one has help text naming its environment variable."""
    parser = argparse.ArgumentParser(
        prog="kured fleetlock",
        description="FleetLock server (Zincati) on etcd; also serves /v1/status and /metrics.",
    )
    env = _environ().get
    parser.add_argument(
        "--host",
        default=env("KURED_FLEETLOCK_HOST", "127.0.0.1"),
        help="bind address (env KURED_FLEETLOCK_HOST; default 127.0.0.1)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=int(env("KURED_FLEETLOCK_PORT", "3333")),
        help="bind port, 0 = the OS picks (env KURED_FLEETLOCK_PORT; default 3333)",
    )
    parser.add_argument(
        "--etcd-endpoints",
        default=env("KURED_ETCD_ENDPOINTS", "http://127.0.0.1:2379"),
        help="comma-separated etcd client URLs (env KURED_ETCD_ENDPOINTS; default "
        "http://127.0.0.1:2379): give it whenever etcd is not on 127.0.0.1:2379",
    )
    parser.add_argument(
        "--prefix",
        default=env("KURED_FLEETLOCK_PREFIX", "/kured/fleetlock"),
        help="etcd key prefix: group G is the key PREFIX/G, beside the agents' --lock-key "
        "(env KURED_FLEETLOCK_PREFIX; default /kured/fleetlock)",
    )
    parser.add_argument(
        "--default-slots",
        type=int,
        default=int(env("KURED_FLEETLOCK_DEFAULT_SLOTS", "1")),
        help="slots (hosts rebooting at once) of a group not in --group-slots "
        "(env KURED_FLEETLOCK_DEFAULT_SLOTS; default 1)",
    )
    parser.add_argument(
        "--group-slots",
        default=env("KURED_FLEETLOCK_GROUP_SLOTS", ""),
        help="per-group slots, e.g. workers=2,control=1 (env KURED_FLEETLOCK_GROUP_SLOTS)",
    )
    return parser


def fleetlock(argv: list[str]) -> int:
    from kit.settings import split_list

    parser = fleetlock_parser()
    args = parser.parse_args(argv)
    groups: dict[str, int] = {}
    problems = []
    for item in split_list(args.group_slots):
        name, _, n = item.partition("=")
        if not name or not n.isdigit() or int(n) < 1:
            problems.append(f"--group-slots entry {item!r} must be GROUP=N with N >= 1")
        else:
            groups[name] = int(n)
    if args.default_slots < 1:
        problems.append("--default-slots must be >= 1")
    if problems:
        return print_problems("kured fleetlock", problems)
    kit_log.configure("INFO")
    from kured.locks.fleetlock import serve

    try:
        asyncio.run(
            serve(
                args.host,
                args.port,
                split_list(args.etcd_endpoints),
                args.prefix,
                args.default_slots,
                groups,
            )
        )
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
