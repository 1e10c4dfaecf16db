"""``kura`` command line: argv and environment → settings → node. Nothing else.

Exit codes: 0 clean stop; 1 the node failed at run time (data dir in use, a background task
died); 2 invalid configuration (every problem listed on stderr).

``kura admin`` (``admin``): 0 done; 1 the node could not be reached or answered nonsense; 2 a
usage error (a purge without ``--yes``, a malformed namespace or writer: 400); 3 refused (401,
403: a token without ``clean``); 4 not found (a namespace with no entry, a writer with none).
``kura admin rollout-gate`` (``kura.rollout_gate``): 0 caught up; 2 usage; 3 refused; 5 not
caught up within ``--wait``.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
import urllib.parse
from collections.abc import Mapping, Sequence

from kit import event_loop
from kit import log as kit_log
from kit.pipes import quiet_broken_pipe
from kit.settings import Environment, SettingsError, add_arguments, print_problems
from kura import __version__
from kura.core.errors import KuraError
from kura.settings import ADMIN_SOCKET, Settings, describe_auth, environment, load_settings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kura", description="A build-cache node.")
    parser.add_argument("--version", action="version", version=f"kura {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run a cache node (settings from flags or KURA_* env)")
    add_arguments(serve, Settings)
    status = sub.add_parser("status", help="print the mesh as a node sees it")
    status.add_argument(
        "--url",
        default=os.environ.get("KURA_URL", "http://127.0.0.1:4000"),
        help="the node's public URL (env KURA_URL)",
    )
    status.add_argument("--json", action="store_true", help="print the raw JSON")
    status.add_argument(
        "--timeout",
        type=positive_seconds,
        default=10.0,
        help="seconds to wait for the answer (default 10)",
    )
    status.add_argument(
        "--token",
        default=os.environ.get("KURA_TOKEN") or _own_token(os.environ),
        help="bearer token, if the node requires one (env KURA_TOKEN; inside a node's own "
        "environment, e.g. `kubectl exec`, the first of KURA_READ_ONLY_TOKENS or "
        "KURA_READ_WRITE_TOKENS)",
    )
    _admin_parser(sub)
    dev = sub.add_parser("dev", help="run an N-node mesh on 127.0.0.1 for trying replication")
    dev.add_argument("--nodes", type=int, default=3, help="how many nodes (default 3)")
    dev.add_argument(
        "--base-port",
        type=int,
        default=4000,
        help="public ports are BASE, BASE+1, ...; internal ports BASE+100, ...",
    )
    dev.add_argument("--dir", default=".kura/dev", help="data and tmp dirs go under here")
    dev.add_argument(
        "request",
        nargs="*",
        metavar="restart N",
        help="`kura dev restart N` starts node N of the running `kura dev` (same --dir) again",
    )
    demo = sub.add_parser("demo", help="run a whole-system scenario on this machine")
    scenarios = demo.add_subparsers(dest="scenario", required=True)
    rolling = scenarios.add_parser(
        "rolling-reboot",
        help="kured reboots every host of a live 3-node mesh, one at a time, under load",
        description=(
            "Runs N hosts on 127.0.0.1 (a kura node and a kured agent each) with one etcd and "
            "one Prometheus, asks every host for a reboot at once, and shows kured rebooting "
            "them one at a time while a load generator and real build tools use the cache. "
            "Needs etcd and prometheus on PATH; the real clients need scripts/install-deps. "
            "Exit 0 when every invariant held, 1 when one did not, 2 when it could not run."
        ),
    )
    rolling.add_argument(
        "--data-mb", type=float, default=40.0, help="artifacts written before the run (MB)"
    )
    rolling.add_argument("--hosts", type=int, default=3, help="how many hosts (default 3)")
    rolling.add_argument(
        "--workdir", default=".kura/demo", help="each run gets a rolling-<time> directory here"
    )
    rolling.add_argument(
        "--keep", action="store_true", help="keep the data dirs (logs and summary always stay)"
    )
    rolling.add_argument(
        "--tmp-mb", type=float, default=16.0, help="each node's KURA_TMP_DIR_MAX_BYTES in MiB"
    )
    rolling.add_argument(
        "--no-clients", action="store_true", help="do not run the real Nx, Turborepo and ccache"
    )
    rolling.add_argument(
        "--bootstrap-limit-mib",
        type=float,
        default=3.0,
        help="per-transfer rate of bodies served to a bootstrapping peer, MiB/s (0 = unthrottled)",
    )
    rolling.add_argument(
        "--downloads-per-peer",
        type=int,
        default=1,
        help="KURA_BOOTSTRAP_DOWNLOADS_PER_PEER of every node (kura's default is 4)",
    )
    rolling.add_argument(
        "--kura-env",
        action="append",
        default=[],
        metavar="KURA_NAME=VALUE",
        help="a setting for every node, after the demo's own (repeatable)",
    )
    rolling.add_argument("--repo", default=None, help="the kura checkout (default: found)")
    rolling.add_argument(
        "--route-before-discovery",
        action="store_true",
        help="send load to a restarted node as soon as /up answers, before it knows its peers",
    )
    rolling.add_argument(
        "--timeout", type=float, default=900.0, help="give the rolling phase up after this long"
    )
    rolling.add_argument(
        "--baseline-seconds",
        type=float,
        default=10.0,
        help="seconds of load before the first reboot and after the last (the latencies "
        "outside reboots)",
    )
    return parser


def _admin_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``kura admin [--data-dir D | --url URL --token T] [--json] ACTION ...``; the options may
    also follow the action (each is declared on both, ``SUPPRESS`` keeping the first)."""

    def options(parser: argparse.ArgumentParser, default: bool) -> None:
        def d(value: object) -> object:
            return value if default else argparse.SUPPRESS

        where = parser.add_mutually_exclusive_group()
        where.add_argument(
            "--data-dir",
            default=d(None),
            help="the node's data directory: talk over its admin.sock, where the file's "
            "permission is the access control (default: KURA_DATA_DIR, else .kura/data)",
        )
        where.add_argument(
            "--url", default=d(None), help="the node's public URL (needs a clean token)"
        )
        parser.add_argument(
            "--token",
            default=d(os.environ.get("KURA_ADMIN_TOKEN")),
            help="with --url: a bearer token with the right clean (env KURA_ADMIN_TOKEN)",
        )
        parser.add_argument(
            "--json", action="store_true", default=d(False), help="print the answer's JSON"
        )
        parser.add_argument(
            "--timeout", type=positive_seconds, default=d(30.0), help="seconds to wait (default 30)"
        )

    admin = sub.add_parser(
        "admin",
        help="operator commands: namespaces, their writers, a writer's entries, purge",
        description="Lists namespaces (bytes, entries, rules, shed age), the writers of one, "
        "what one writer wrote, and purges one writer's entries of a namespace on every node "
        "(docs/security.md#kura-admin). Exit 0 done, 1 unreachable, 2 usage, 3 refused, "
        "4 not found.",
    )
    options(admin, True)
    actions = admin.add_subparsers(dest="action", required=True)
    namespace_help = 'a namespace, as `kura admin namespaces` shows it ("" the default one)'
    writer_help = (
        "a writer, as `kura admin writers` shows it: token:NAME, token:#FINGERPRINT, jwt:SUB, "
        'anonymous, or "" for the entries shown as (unrecorded)'
    )
    listed = actions.add_parser("namespaces", help="every namespace here (what you may clean)")
    listed.description = "Every namespace with an entry on this node, measured now: bytes, "
    listed.description += "entries, its rule and shed age (largest first)."
    options(listed, False)
    writers = actions.add_parser("writers", help='who wrote into NAMESPACE ("" the default)')
    writers.description = "Each writer of NAMESPACE on this node: entries, bytes, last write."
    writers.add_argument("namespace", help=namespace_help)
    options(writers, False)
    entries = actions.add_parser("entries", help="what WRITER wrote in NAMESPACE, newest first")
    entries.description = "The newest entries WRITER wrote in NAMESPACE on this node."
    entries.add_argument("namespace", help=namespace_help)
    entries.add_argument("writer", help=writer_help)
    entries.add_argument(
        "--limit", type=int, default=100, help="at most this many, 1 to 10000 (default 100)"
    )
    options(entries, False)
    purge = actions.add_parser(
        "purge", help="delete every entry WRITER wrote in NAMESPACE, on every node"
    )
    purge.description = (
        "Deletes every entry WRITER wrote in NAMESPACE at or before now, here, on every peer "
        "and in the bucket (a replicated clean of that writer; recorded even when this node "
        "holds none of them). Late copies of them are ignored; the writer's later writes are "
        "stored as usual (docs/durability.md)."
    )
    purge.add_argument("namespace", help=namespace_help)
    purge.add_argument("--writer", required=True, help=writer_help)
    purge.add_argument("--yes", action="store_true", help="really purge (else: exit 2)")
    options(purge, False)
    gate = actions.add_parser(
        "rollout-gate",
        help="wait until the node at --url is ready and the mesh has caught up with it",
    )
    gate.description = (
        "A rollout's step between two nodes (docs/upgrading.md): waits until the node at --url "
        "answers /ready 200, holds no queued message for any peer and no peer holds one for "
        "it (at most --max-queued), reading /status of it and of every --mesh-url node. Exit 0 "
        "caught up, 3 a token refused, 5 not caught up within --wait (the reasons printed)."
    )
    gate.add_argument(
        "--mesh-url",
        action="append",
        default=[],
        help="public URL of a node of the mesh (repeatable or comma-separated; the gated "
        "node's own URL may be among them); every peer of the node must be one",
    )
    gate.add_argument(
        "--wait",
        type=wait_seconds,
        default=600.0,
        help="seconds to wait for it (default 600; 0: look once)",
    )
    gate.add_argument(
        "--max-queued",
        type=int,
        default=0,
        help="outbox messages a peer may still hold for it, and it for a peer (default 0)",
    )
    # Not ``options``: the gate reads /ready and /status over --url only (no --data-dir), with
    # a read token, and prints its reasons (no --json).
    gate.add_argument(
        "--url",
        default=argparse.SUPPRESS,
        help="the gated node's public URL (default: KURA_URL, else http://127.0.0.1:4000)",
    )
    gate.add_argument(
        "--token",
        default=argparse.SUPPRESS,
        help="a read token for /status (env KURA_ADMIN_TOKEN, else KURA_TOKEN, else in a "
        "node's own environment its first read token)",
    )
    gate.add_argument(
        "--timeout",
        type=positive_seconds,
        default=argparse.SUPPRESS,
        help="seconds to wait for each request (default 30)",
    )


def positive_seconds(text: str) -> float:
    """argparse ``type`` of a request timeout: a positive finite number of seconds (``0``,
    ``-1``, ``nan``, ``inf``: ``ArgumentTypeError``, exit 2 with the usage)."""
    value = _seconds(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def wait_seconds(text: str) -> float:
    """argparse ``type`` of ``--wait``: a finite number of seconds, 0 or more (0: look once;
    ``-5``, ``nan``, ``inf``: ``ArgumentTypeError``, exit 2; ``nan`` would never time out)."""
    value = _seconds(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds of 0 or more")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds")
    return value


def http_url_problem(url: str) -> str | None:
    """Why ``url`` is not a node's URL (``http``/``https`` with a host), or None when it is."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url[:80]!r} is not an http(s) URL with a host (e.g. http://kura-0.kura:4000)"
    try:
        parts.port  # noqa: B018 (raises ValueError for a port that is not a number or too big)
    except ValueError:
        return f"{url[:80]!r} has an invalid port"
    return None


def _own_token(env: Mapping[str, str]) -> str | None:
    for name in ("KURA_READ_ONLY_TOKENS", "KURA_READ_WRITE_TOKENS"):
        tokens = [t.strip() for t in env.get(name, "").split(",") if t.strip()]
        if tokens:
            return tokens[0]
    return None


def main(argv: Sequence[str] | None = None, stops: list[int] | None = None) -> int:
    """The command line; a closed stdout pipe ends it quietly (``kit.pipes``). ``stops``: the
    signals that already asked ``kura serve`` to stop, noted by the entry point
    (``kura.entry``) while this module was imported; later ones are added to it."""
    return quiet_broken_pipe(lambda: _main(argv, stops))


def _main(argv: Sequence[str] | None = None, stops: list[int] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve(args, [] if stops is None else stops)
    if args.command == "status":
        return status(args)
    if args.command == "admin":
        return admin(args)
    if args.command == "dev":
        from kura_harness.devmesh import restart_node, run_dev_mesh

        if not args.request:
            return run_dev_mesh(args.nodes, args.base_port, args.dir)
        if len(args.request) != 2 or args.request[0] != "restart" or not args.request[1].isdigit():
            parser.error("kura dev: the only request is `kura dev restart N`")
        return restart_node(int(args.request[1]), args.dir)
    if args.command == "demo":
        return demo(args)
    parser.error(f"unknown command {args.command}")
    return 2


def serve(args: argparse.Namespace, requested: list[int]) -> int:
    # From here a SIGTERM or SIGINT asks for a graceful stop, also while the node is still being
    # built (about 0.5 s: before, the signal's default action killed it, exit 143); the node's
    # loop takes the signals over and honours one that came first (Node.serve_forever).
    # ``requested`` holds those the entry point noted before this module was imported.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: requested.append(signum))
    try:
        settings = load_settings(args, os.environ)
    except SettingsError as exc:
        return print_problems("kura", exc.problems)
    try:
        event_loop.choose(settings.event_loop)
    except ImportError as exc:
        print(f"kura: invalid configuration: KURA_EVENT_LOOP=uvloop: {exc}", file=sys.stderr)
        return 2
    kit_log.configure(settings.log_level)
    log_start_up(settings, environment(os.environ))
    from kura.app import Node  # imported late: configuration errors need no aiohttp start-up

    try:
        event_loop.run(
            Node(settings).serve_forever(stop_requested=lambda: bool(requested)),
            settings.event_loop,
        )
    except KuraError as exc:
        print(f"kura: {exc.message}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"kura: {exc}", file=sys.stderr)
        return 1
    except RuntimeError as exc:
        print(f"kura: {exc}", file=sys.stderr)
        return 1
    return 0


def log_start_up(settings: Settings, env: Environment) -> None:
    """Log how clients and peers authenticate, and once each, the ``KURA_*`` variables
    ignored: unknown ones (with KURA_ALLOW_UNKNOWN_SETTINGS) and Kubernetes service links."""
    log = logging.getLogger("kura")
    log.info("%s", describe_auth(settings))
    env.log_ignored(log, "KURA_ALLOW_UNKNOWN_SETTINGS")


def demo(args: argparse.Namespace) -> int:
    from kura_harness import rolling  # imported late: only this command needs it

    if args.hosts < 2 or args.data_mb <= 0 or args.tmp_mb < 1 or args.downloads_per_peer < 1:
        print(
            "kura demo: --hosts >= 2, --data-mb > 0, --tmp-mb >= 1, --downloads-per-peer >= 1",
            file=sys.stderr,
        )
        return 2
    kura_env = dict(item.partition("=")[::2] for item in args.kura_env)
    if any(not name.startswith("KURA_") or not value for name, value in kura_env.items()):
        print("kura demo: --kura-env takes KURA_NAME=VALUE", file=sys.stderr)
        return 2
    return rolling.main(
        data_mb=args.data_mb,
        hosts=args.hosts,
        workdir=args.workdir,
        keep=args.keep,
        tmp_mb=args.tmp_mb,
        clients=not args.no_clients,
        repo=args.repo,
        timeout=args.timeout,
        route_before_discovery=args.route_before_discovery,
        bootstrap_limit_mib=args.bootstrap_limit_mib,
        downloads_per_peer=args.downloads_per_peer,
        kura_env=kura_env,
        baseline_seconds=args.baseline_seconds,
    )


def status(args: argparse.Namespace) -> int:
    import json

    from kit.fetch import FetchError, Hints, fetch_json
    from kura.console import render_status

    hints = Hints("a kura node", "--url or KURA_URL", "--token or KURA_TOKEN")
    try:
        data = fetch_json(args.url.rstrip("/") + "/status", hints, args.token, args.timeout)
    except FetchError as exc:
        print(f"kura status: {exc.message}", file=sys.stderr)
        return 1
    print(json.dumps(data, indent=2) if args.json else render_status(data))
    return 0 if data.get("ready") else 3


# kura admin's exit code for an HTTP status (kura.api.admin), and for no answer.
ADMIN_EXIT = {400: 2, 401: 3, 403: 3, 404: 4}


def admin(args: argparse.Namespace) -> int:
    """``kura admin``: one request to ``kura.api.admin``, printed (``kura.console``)."""
    import json
    from urllib.parse import urlencode

    from kit.fetch import FetchError, Hints, fetch_json
    from kura import console

    if args.action == "rollout-gate":
        return rollout_gate(args)
    if args.token and not args.url and args.token != os.environ.get("KURA_ADMIN_TOKEN"):
        print(
            "kura admin: --token is used only with --url (over the data directory's socket no "
            "token is asked): pass the node's --url too",
            file=sys.stderr,
        )
        return 2
    query: dict[str, object] = {}
    if args.action != "namespaces":
        query["namespace"] = args.namespace
    if args.action == "entries":
        query.update(writer=args.writer, limit=args.limit)
    if args.action == "purge":
        query["writer"] = args.writer
        if not args.yes:
            print(
                f"kura admin: purge deletes every entry {args.writer!r} wrote in namespace "
                f"{args.namespace!r}, on every node and the bucket: add --yes to do it",
                file=sys.stderr,
            )
            return 2
    route = {"namespaces": "namespaces", "writers": "writers", "entries": "entries"}
    target = f"/_admin/{route.get(args.action, 'purge')}" + (
        f"?{urlencode(query)}" if query else ""
    )
    method = "POST" if args.action == "purge" else "GET"
    try:
        if args.url:
            hints = Hints("a kura node", "--url", "--token or KURA_ADMIN_TOKEN", "clean")
            url = args.url.rstrip("/") + target
            data = fetch_json(url, hints, args.token, args.timeout, method=method)
        else:
            data = _admin_over_socket(args, target, method)
    except FetchError as exc:
        print(f"kura admin: {exc.message}", file=sys.stderr)
        return 1 if exc.status is None else ADMIN_EXIT.get(exc.status, 1)
    except OSError as exc:  # the data directory itself cannot be opened
        print(f"kura admin: {exc}: pass the node's data directory with --data-dir", file=sys.stderr)
        return 1
    render = {
        "namespaces": console.render_namespaces,
        "writers": console.render_writers,
        "entries": console.render_entries,
        "purge": console.render_purge,
    }[args.action]
    print(json.dumps(data, indent=2) if args.json else render(data))
    return 0


def rollout_gate(args: argparse.Namespace) -> int:
    """``kura admin rollout-gate`` (``kura.rollout_gate.run``). Reads ``/status``: a read token
    from --token, KURA_ADMIN_TOKEN, KURA_TOKEN or, inside a node's own environment, its first
    read token."""
    from kura import rollout_gate

    if args.data_dir:
        print(
            "kura admin rollout-gate: pass the node's public --url, not --data-dir", file=sys.stderr
        )
        return 2
    if args.json:
        print("kura admin rollout-gate: prints its reasons; it has no --json", file=sys.stderr)
        return 2
    if args.max_queued < 0:
        print("kura admin rollout-gate: --max-queued must be >= 0", file=sys.stderr)
        return 2
    url = args.url or os.environ.get("KURA_URL") or "http://127.0.0.1:4000"
    token = args.token or os.environ.get("KURA_TOKEN") or _own_token(os.environ)
    mesh = [u.strip() for item in args.mesh_url for u in item.split(",") if u.strip()]
    # At once, not after --wait: a URL without a scheme or host never answers.
    for flag, value in [("--url", url), *(("--mesh-url", u) for u in mesh)]:
        if (problem := http_url_problem(value)) is not None:
            print(f"kura admin rollout-gate: argument {flag}: {problem}", file=sys.stderr)
            return 2
    return rollout_gate.run(
        url,
        mesh,
        token,
        wait_seconds=args.wait,
        max_queued=args.max_queued,
        request_timeout_seconds=args.timeout,
    )


def _admin_over_socket(args: argparse.Namespace, target: str, method: str) -> object:
    """``kura admin``'s request over the data directory's ``admin.sock``."""
    from pathlib import Path

    from kit.fetch import Hints, fetch_json_unix
    from kit.unix_socket import socket_address

    data_dir = Path(args.data_dir or os.environ.get("KURA_DATA_DIR") or ".kura/data")
    hints = Hints("kura serve", "--data-dir")
    path, fd = socket_address(data_dir, ADMIN_SOCKET)
    try:
        shown = str(data_dir / ADMIN_SOCKET)
        return fetch_json_unix(path, target, hints, args.timeout, method=method, shown=shown)
    finally:
        if fd is not None:
            os.close(fd)


if __name__ == "__main__":
    sys.exit(main())
