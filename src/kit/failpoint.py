"""Fault-injection points for tests: ``failpoint("storage.after_publish")``.

A failpoint is a named place in the code where a test can make the process fail on purpose,
so that a crash lands inside a window (between publishing a file and committing its row, say)
deterministically instead of by luck. The idea is FreeBSD's ``fail(9)`` and the ``fail`` crate
of TiKV (https://docs.rs/fail); this is the smallest useful subset.

They are configured only by the ``KURA_FAILPOINTS`` environment variable, read once at import,
never by a setting: a comma-separated list of ``name=action[@probability]`` where action is

* ``kill``: SIGKILL this process at that point (it dies as on a power cut of the process:
  no handler, no flush, no clean-up);
* ``sleep(MS)``: sleep ``MS`` milliseconds there (to widen a race window);
* ``eio(N)``: raise ``OSError(EIO)`` there on every pass after the first ``N`` (a disk that
  starts failing once the process is up: an fsync error, say);

and probability (0 to 1, default 1) is the chance each pass through the point fires. Example:
``KURA_FAILPOINTS="storage.after_publish=kill@0.2,storage.after_commit=sleep(50)"``.

With the variable unset, ``failpoint`` is one dictionary lookup on an empty dict. A malformed
value raises ``ValueError`` at import: a test that asks for a fault must get it or fail.
Before a kill, one line ``failpoint NAME: kill`` goes to stderr so a test can count the kills
that landed at the point.
"""

from __future__ import annotations

import errno
import os
import random
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass

ENV_VAR = "KURA_FAILPOINTS"
_SPEC = re.compile(r"^(kill|sleep\((\d+)\)|eio\((\d+)\))(?:@([0-9.]+))?$")


@dataclass
class _Action:
    kind: str  # "kill", "sleep" or "eio"
    sleep_ms: int
    probability: float
    healthy_passes: int = 0  # eio: passes left before it fires


def parse(spec: str) -> dict[str, _Action]:
    """``{name: action}`` from a ``KURA_FAILPOINTS`` value; ``ValueError`` if malformed."""
    actions: dict[str, _Action] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, action = item.partition("=")
        m = _SPEC.match(action.strip())
        if not sep or not name.strip() or m is None:
            raise ValueError(
                f"{ENV_VAR}: {item!r} is not name=kill[@p], name=sleep(ms)[@p] or name=eio(n)[@p]"
            )
        probability = float(m.group(4)) if m.group(4) else 1.0
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"{ENV_VAR}: probability in {item!r} must be between 0 and 1")
        kind = m.group(1).partition("(")[0]
        actions[name.strip()] = _Action(
            kind, int(m.group(2) or 0), probability, int(m.group(3) or 0)
        )
    return actions


_ACTIVE = parse(os.environ.get(ENV_VAR, ""))
_lock = threading.Lock()


def failpoint(name: str) -> None:
    """Fire the action configured for ``name``, if any (see module docstring). Thread-safe."""
    action = _ACTIVE.get(name)
    if action is None or random.random() >= action.probability:
        return
    if action.kind == "sleep":
        time.sleep(action.sleep_ms / 1000)
        return
    if action.kind == "eio":
        with _lock:
            if action.healthy_passes > 0:
                action.healthy_passes -= 1
                return
        raise OSError(errno.EIO, f"failpoint {name}: injected I/O error")
    sys.stderr.write(f"failpoint {name}: kill\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)
