"""The agent's reboot bookkeeping, kept on disk across restarts (``--state-dir``).

``reboot_triggered_at`` is written *before* the reboot is triggered, so the next start knows a
reboot it caused has happened (kured infers it from holding the lock; we need it for the circuit
breaker too). ``consecutive_reboots`` counts reboots after which the sentinel still asked for a
reboot; at ``--max-consecutive-reboots`` the breaker opens and stays open until an operator
removes the state file (or a reboot is no longer required). Writes are atomic (temp + rename).

``boot_id`` is the kernel's boot ID (``/proc/sys/kernel/random/boot_id``, a fresh random UUID at
every boot; see proc(5)) read just before the reboot is triggered. The next start compares it
with the current one: unchanged means the machine did not reboot (the process was restarted),
and recovery must not run as if it had. An empty ID (not Linux, file unreadable, state written
by an older version) cannot confirm anything and counts as a reboot, the behaviour before.

``held_off_until`` (unix seconds) is set when a reboot attempt of this agent did not clear the
sentinel: the machine came back (new boot ID) and a reboot is still required, or the reboot
command failed. No new attempt is made before it (``--min-reboot-interval``, field reports B39
and B40); it is cleared as soon as no reboot is required.

``came_back_at`` is when the agent first started after a confirmed reboot (unix seconds); it is
cleared once the lock is released. ``--lock-release-delay`` counts from it, so an agent restarted
during the delay sleeps only what is left instead of skipping the delay (issue 15).

``maintenance_since``, ``maintenance_rebooted``, ``back_uncordoned`` and ``back_announced``
follow the maintenance around a reboot (``kured.maintenance``: the Alertmanager silence, the
hooks, the "node is back" message). A start that finds a maintenance whose reboot did not happen abandons it (expires the
silence); one that finds the machine rebooted within it carries it on to the end.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class AgentState:
    reboot_triggered_at: float | None = None  # unix seconds
    boot_id: str = ""
    consecutive_reboots: int = 0
    breaker_open: bool = False
    last_reboot_at: float | None = None
    came_back_at: float | None = None  # unix seconds; set while post-reboot recovery runs
    held_off_until: float | None = None  # unix seconds; no reboot attempt before it
    # The maintenance around a reboot (kured.maintenance): since when (unix seconds; None: none
    # in progress), whether the machine rebooted within it (the "back" phase runs then; else a
    # restart abandons it), and whether the back message and post-uncordon hook went out.
    maintenance_since: float | None = None
    maintenance_rebooted: bool = False
    back_announced: bool = False
    # Whether the lock release after the reboot uncordoned the node (False: an operator had
    # cordoned it before the lock; it stays cordoned and gets no post-uncordon hook and no
    # "back" message). Saved so that an agent restarted while waiting for its gates knows.
    back_uncordoned: bool = True


class StateStore:
    def __init__(self, directory: Path, node_id: str) -> None:
        self.path = directory / f"kured-{node_id}.json"

    def load(self) -> AgentState:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return AgentState()
        except (OSError, ValueError) as exc:
            raise OSError(f"cannot read agent state {self.path}: {exc}") from exc
        known = {k: v for k, v in data.items() if k in AgentState.__dataclass_fields__}
        return AgentState(**known)

    def save(self, state: AgentState) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w") as f:
            json.dump(asdict(state), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")


def current_boot_id(path: Path = BOOT_ID_PATH) -> str:
    """The boot ID read from ``path`` (``--boot-id-file``), or "" when it cannot be read."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""
