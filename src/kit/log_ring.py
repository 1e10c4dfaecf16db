"""The last few warnings and errors a process logged, kept in memory for a status view.

``LogRing`` is a ``logging.Handler`` that keeps the newest ``capacity`` records at ``WARNING``
and above in a bounded deque: older ones fall off, so memory stays bounded however much is
logged (each message is also cut to ``MESSAGE_MAX_CHARS``). It formats nothing on the hot path
beyond ``record.getMessage()`` and the exception's one-line summary.
"""

from __future__ import annotations

import logging
from collections import deque
from datetime import UTC, datetime
from typing import TypedDict

DEFAULT_CAPACITY = 20
MESSAGE_MAX_CHARS = 2000


class LoggedProblem(TypedDict):
    """One kept record: ``at`` is RFC 3339 UTC with milliseconds, ``level`` a level name."""

    at: str
    level: str
    logger: str
    message: str


class LogRing(logging.Handler):
    """Keeps the newest ``capacity`` records at ``level`` and above. Safe to use from any
    thread (``logging.Handler`` serialises ``emit`` under its lock). Attach with ``attach()``
    and detach with ``detach()``; a ring never attached stays empty."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY, level: int = logging.WARNING) -> None:
        super().__init__(level)
        self._records: deque[LoggedProblem] = deque(maxlen=capacity)
        self._logger: logging.Logger | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string must not break the caller's logging
            message = str(record.msg)
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            message += f" ({type(exc).__name__}: {exc})"
        if len(message) > MESSAGE_MAX_CHARS:
            message = message[: MESSAGE_MAX_CHARS - 1] + "…"
        at = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        self._records.append(
            LoggedProblem(at=at, level=record.levelname, logger=record.name, message=message)
        )

    def records(self) -> list[LoggedProblem]:
        """The kept records, newest first; empty when nothing was logged at the level."""
        self.acquire()
        try:
            return list(reversed(self._records))
        finally:
            self.release()

    def attach(self, logger: logging.Logger | None = None) -> None:
        """Start collecting from ``logger`` (the root logger by default) and its children."""
        self._logger = logger or logging.getLogger()
        self._logger.addHandler(self)

    def detach(self) -> None:
        """Stop collecting; the kept records stay readable. Safe to call when not attached."""
        if self._logger is not None:
            self._logger.removeHandler(self)
            self._logger = None
