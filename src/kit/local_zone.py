"""The host's time zone as Go's ``time.Local`` resolves it (Go ``src/time/zoneinfo_unix.go``,
``initLocal``): ``$TZ`` when set (empty means UTC, a leading ``:`` is dropped, an absolute path
is a zone file, anything else an IANA name), else ``/etc/localtime``, else UTC.

It reads the environment and the file system, so it lives here and not in a pure core: a core
that needs the local zone (``kured.core.window.parse_zone``) is handed this function.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import UTC, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError


def local_zone(environ: Mapping[str, str] | None = None) -> tzinfo:
    """The zone named ``Local`` (module docstring); ``environ`` defaults to ``os.environ``.

    Never raises: an unknown or unreadable zone is UTC, as Go falls back silently.
    """
    tz = (os.environ if environ is None else environ).get("TZ")
    try:
        if tz is None:
            with open("/etc/localtime", "rb") as f:
                return ZoneInfo.from_file(f, key="Local")
        tz = tz.removeprefix(":")
        if tz.startswith("/"):
            with open(tz, "rb") as f:
                return ZoneInfo.from_file(f, key="Local")
        if tz not in ("", "UTC"):
            return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        pass  # Go falls back to UTC silently.
    return UTC
