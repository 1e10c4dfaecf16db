"""kured's exception tree, by what the caller should do."""

from __future__ import annotations


class KuredError(Exception):
    """Base class. ``message`` is safe to log and to show in ``kured status``."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def printable(text: str) -> str:
    """``text`` with every non-printable character escaped as Python writes it (``\\n``,
    ``\\x1b``): remote text (an answer, a command's output) in a message stays one line and
    cannot forge log lines or terminal escapes."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class SensorError(KuredError):
    """A sensor could not answer (Prometheus down, sentinel command failed to launch...).
    The policy treats the condition as unknown, which blocks a reboot."""


class LockError(KuredError):
    """The lock store could not be read or written (unreachable, unparsable record)."""


class LockConflict(LockError):
    """A compare-and-swap lost a race; re-read and retry."""


class RebootError(KuredError):
    """The reboot could not be triggered."""


class ConfigurationError(KuredError):
    """Invalid settings. ``problems`` lists every one."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid configuration: " + "; ".join(problems))
        self.problems = problems


class ApiError(KuredError):
    """The Kubernetes API server refused a request or could not be reached.

    ``status`` is the HTTP status (0: no answer at all: connection refused, timeout) and
    ``reason`` the ``Status.reason`` the server gave (``Conflict``, ``NotFound``,
    ``TooManyRequests``...; the HTTP reason phrase when the body was not a ``Status``; ``""``
    without an answer). Callers translate it at their own boundary: the lock into ``LockError``,
    a gate into "unknown", the drain into ``DrainError``.
    """

    def __init__(self, message: str, *, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def too_many_requests(self) -> bool:
        return self.status == 429


class DrainError(KuredError):
    """The cordon or the drain did not complete (eviction refused until ``--drain-timeout``,
    API unreachable). Without ``--force-reboot`` the agent gives this attempt up: it uncordons
    the node if it cordoned it and releases the lock at once. ``pods`` names the pods still on
    the node (``namespace/name``), for the log and ``kured status``."""

    def __init__(self, message: str, pods: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.pods = pods
