"""kured's exception tree, by what the caller should do."""

from __future__ import annotations


class KuredError(Exception):
    """Base class. ``message`` is safe to log and to show in ``kured status``."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


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
