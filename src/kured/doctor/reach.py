"""Whether the services the agent depends on answer now (``kured doctor``'s ``etcd`` and
``gate`` checks). Both are fail-closed in the agent, so a dead one means no node ever reboots,
and the only sign is a blocking reason in the agent's log and metrics.

* ``etcd`` (``--lock-backend=etcd``): every ``--etcd-endpoints`` URL is asked for the lock key,
  one at a time, through the agent's own client (``kured.locks.etcd.EtcdKV``, with its request
  timeout). None answers: FAIL (no lock can be taken). Some do not: WARN (the lock works, but
  one more lost member may stop it).
* ``gate`` (each ``--gate-url``): the agent's own gate check (``kured.sensors.http_gate``)
  within ``--gate-timeout``. Unreachable or timed out: FAIL. Non-2xx: WARN, since a gate may be
  closed on purpose (a kura node refilling), with the reasons it gave.
"""

from __future__ import annotations

import aiohttp

from kured.core import lockrecord
from kured.core.errors import LockError
from kured.doctor.finding import Finding, fail, ok, warn
from kured.locks.etcd import EtcdKV
from kured.sensors.http_gate import HttpGate
from kured.settings import Settings


async def check_etcd(s: Settings) -> list[Finding]:
    """One finding for the etcd lock store: OK, WARN (some endpoints down) or FAIL (none)."""
    answered: list[str] = []
    failed: list[str] = []
    holder = "free"
    for endpoint in s.etcd_endpoints:
        kv = EtcdKV([endpoint])
        try:
            current = await kv.get(s.lock_key.encode())
        except LockError as exc:
            failed.append(f"{endpoint} ({exc})")
            continue
        finally:
            await kv.close()
        answered.append(endpoint)
        if current is not None:
            try:
                record = lockrecord.parse(current.value)
            except LockError:
                holder = "an unreadable record"
            else:
                holder = "held by " + ", ".join(e.node_id for e in record.entries)
    if not answered:
        return [
            fail(
                "etcd",
                f"no --etcd-endpoints answers: {'; '.join(failed)}; the agent cannot take the "
                "lock, so no node reboots.",
                "start etcd, or correct --etcd-endpoints (every member's client URL).",
            )
        ]
    if failed:
        return [
            warn(
                "etcd",
                f"{len(answered)} of {len(s.etcd_endpoints)} etcd endpoints answer; down: "
                f"{'; '.join(failed)}.",
                "bring the member back, or drop it from --etcd-endpoints.",
            )
        ]
    return [ok("etcd", f"every etcd endpoint answers; {s.lock_key} is {holder}.")]


async def check_gates(session: aiohttp.ClientSession, s: Settings) -> list[Finding]:
    """One finding per ``--gate-url``: OK (2xx), WARN (closed now) or FAIL (unreachable)."""
    findings: list[Finding] = []
    for url in s.gate_url:
        result = await HttpGate(session, url, s.gate_timeout).check()
        if result.blocking is None:
            findings.append(
                fail(
                    "gate",
                    f"{result.detail}; the agent treats that as closed and never reboots.",
                    "start the service behind --gate-url, or correct the URL.",
                )
            )
        elif result.blocking:
            findings.append(
                warn(
                    "gate",
                    f"{result.detail}: closed now, so a reboot would wait.",
                    "fine if it is closed on purpose; otherwise see why it refuses.",
                )
            )
        else:
            findings.append(ok("gate", f"{result.detail}: open."))
    return findings
