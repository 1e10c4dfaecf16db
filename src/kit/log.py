"""Logging set-up: one line per event, key=value fields, to stderr."""

from __future__ import annotations

import logging
import sys


def configure(level: str = "INFO", name: str = "") -> None:
    """Send log records at ``level`` and above to stderr, one line each."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(
            "%(asctime)s.%(msecs)03d %(levelname)s %(name)s %(message)s", "%Y-%m-%dT%H:%M:%S"
        )
    )
    root = logging.getLogger(name)
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
