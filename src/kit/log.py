"""Logging set-up: one line per event to stderr, as text or as JSON.

``text`` (the default)::

    2026-12-06T08:15:09.132 INFO kura.app kura listening public=...

local time with milliseconds, then the level, the logger and the message; a traceback follows
on the lines after it.

``json`` (kured's ``--log-format json``): one JSON object per line, a traceback included, for
log pipelines that parse lines (Loki, Elasticsearch, ``jq``)::

    {"time": "2026-12-06T08:15:09.132Z", "level": "INFO", "logger": "kured", "message": "..."}

``time`` is RFC 3339 UTC with milliseconds, ``level`` the level's name. A record with an
exception adds ``exception`` (the formatted traceback, newlines escaped inside the string), one
with ``stack_info`` adds ``stack``. The standard library's ``json`` does it; no dependency.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """Formats a record as one line of JSON (see the module's docstring for the keys)."""

    def format(self, record: logging.LogRecord) -> str:
        at = datetime.fromtimestamp(record.created, UTC)
        line: dict[str, str] = {
            "time": at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False)


def formatter(fmt: str = "text") -> logging.Formatter:
    """The formatter of ``fmt``, one of ``FORMATS``; ValueError for another."""
    if fmt == "json":
        return JsonFormatter()
    if fmt == "text":
        return logging.Formatter(
            "%(asctime)s.%(msecs)03d %(levelname)s %(name)s %(message)s", "%Y-%m-%dT%H:%M:%S"
        )
    raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {fmt!r}")


def configure(level: str = "INFO", name: str = "", fmt: str = "text") -> None:
    """Send log records at ``level`` and above to stderr, one line each, formatted as ``fmt``
    (``text`` or ``json``; ValueError for another)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(fmt))
    root = logging.getLogger(name)
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
