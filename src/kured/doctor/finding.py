"""What ``kured doctor`` reports: findings (OK, WARN, FAIL, each with its fix), checks it could
not run, and their text and JSON forms.

A finding is one line of text::

    FAIL  sentinel       nothing on this host writes /var/run/reboot-required. Fix: install ...

``--json`` prints one object (``to_json``)::

    {"ok": false, "exit_code": 1,
     "findings": [{"level": "FAIL", "check": "sentinel", "message": "...", "fix": "..."}],
     "skipped": [{"check": "prometheus", "reason": "no --prometheus-url"}]}

``ok`` is true and ``exit_code`` 0 when no finding is FAIL (WARNs do not fail a run);
``exit_code`` is 1 with a FAIL, 2 when the flags themselves are invalid (then the ``config``
findings say why and no check ran). ``fix`` is
``""`` for an OK finding. Findings keep the order the checks ran in.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Literal

Level = Literal["OK", "WARN", "FAIL"]
LEVELS: tuple[Level, ...] = ("OK", "WARN", "FAIL")
# Exit codes: a FAIL finding; invalid flags (kured's agent uses 2 for that too).
EXIT_FAIL = 1
EXIT_CONFIGURATION = 2


@dataclasses.dataclass(frozen=True)
class Finding:
    """One result: ``check`` names the group (``sentinel``, ``apt``, ``kernel``, ``scrape``,
    ``retention``, ``alerts``, ``cordon``, ``lock``, ``pdb``, ``config``); ``message`` says
    what was found and where it was read; ``fix`` what to change (empty for OK)."""

    level: Level
    check: str
    message: str
    fix: str = ""

    def line(self) -> str:
        """The one-line text form (no newline inside: embedded newlines become spaces)."""
        text = f"{self.level:<5} {self.check:<10} {self.message}"
        if self.fix:
            text += f" Fix: {self.fix}"
        return " ".join(text.split("\n"))


def ok(check: str, message: str) -> Finding:
    return Finding("OK", check, message)


def warn(check: str, message: str, fix: str) -> Finding:
    return Finding("WARN", check, message, fix)


def fail(check: str, message: str, fix: str) -> Finding:
    return Finding("FAIL", check, message, fix)


@dataclasses.dataclass(frozen=True)
class Skipped:
    """A check that did not run, and why (its input was not given)."""

    check: str
    reason: str


@dataclasses.dataclass
class Report:
    """Every finding and skipped check of one run, in order."""

    findings: list[Finding] = dataclasses.field(default_factory=list)
    skipped: list[Skipped] = dataclasses.field(default_factory=list)
    # The flags could not be read: the FAIL ``config`` findings list why; nothing else ran.
    invalid_configuration: bool = False

    def add(self, findings: Sequence[Finding]) -> None:
        self.findings.extend(findings)

    def skip(self, check: str, reason: str) -> None:
        self.skipped.append(Skipped(check, reason))

    @property
    def failed(self) -> bool:
        return any(f.level == "FAIL" for f in self.findings)

    @property
    def exit_code(self) -> int:
        if self.invalid_configuration:
            return EXIT_CONFIGURATION
        return EXIT_FAIL if self.failed else 0

    def to_text(self) -> str:
        lines = [f.line() for f in self.findings]
        lines += [f"SKIP  {s.check:<10} {s.reason}" for s in self.skipped]
        counts = {level: sum(f.level == level for f in self.findings) for level in LEVELS}
        lines.append(
            f"{counts['FAIL']} FAIL, {counts['WARN']} WARN, {counts['OK']} OK"
            + (f", {len(self.skipped)} not checked" if self.skipped else "")
        )
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(
            {
                "ok": not self.failed,
                "exit_code": self.exit_code,
                "findings": [dataclasses.asdict(f) for f in self.findings],
                "skipped": [dataclasses.asdict(s) for s in self.skipped],
            },
            indent=2,
        )
