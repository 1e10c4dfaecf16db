"""``kura`` command line: argv and environment → settings → node. Nothing else.

Exit codes: 0 clean stop; 1 the node failed at run time (data dir in use, a background task
died); 2 invalid configuration (every problem listed on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from kit import log as kit_log
from kit.settings import SettingsError, add_arguments, load
from kura import __version__
from kura.core.errors import KuraError
from kura.settings import Settings, validate_settings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kura", description="A build-cache node.")
    parser.add_argument("--version", action="version", version=f"kura {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run a cache node (settings from flags or KURA_* env)")
    add_arguments(serve, Settings)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve(args)
    parser.error(f"unknown command {args.command}")
    return 2


def serve(args: argparse.Namespace) -> int:
    try:
        settings = load(Settings, args, os.environ, validate=validate_settings)
    except SettingsError as exc:
        print("kura: invalid configuration:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  - {problem}", file=sys.stderr)
        return 2
    kit_log.configure(settings.log_level)
    from kura.app import Node  # imported late: configuration errors need no aiohttp start-up

    try:
        asyncio.run(Node(settings).serve_forever())
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


if __name__ == "__main__":
    sys.exit(main())
