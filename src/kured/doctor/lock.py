"""Lock settings that are risky on a 3-node etcd control plane (``kured doctor``'s ``lock``
check). Pure: it reads the settings and ``--reboot-duration`` only.

* ``--lock-ttl`` shorter than one node's time out of service (``--drain-delay`` +
  ``--drain-timeout`` + ``--reboot-delay`` + ``--reboot-duration`` + ``--lock-release-delay``)
  is a FAIL: the lock expires while the node is still down and the next node goes, so two are
  out at once — on a 3-member etcd that is quorum lost (etcd tolerates (n-1)/2 = 1 failure,
  https://etcd.io/docs/v3.5/faq/#what-is-failure-tolerance). With ``--drain-timeout 0`` (a drain
  may last for ever) any TTL above 0 can expire during a drain: a WARN.
* ``--concurrency`` above 1 lets two control-plane nodes reboot together: a WARN (the agent
  cannot tell which nodes are control plane; give them their own lock, ``--concurrency 1``).
* ``--lock-backend=etcd`` with one ``--etcd-endpoints`` URL: while that member reboots the lock
  is unknown and every agent waits; a WARN (list all three).
* ``--lock-release-delay 0`` without a ``--gate-url``: the next node may go down before this
  node's etcd member has rejoined; a WARN.
* ``--lock-ttl 0`` (kured's default) is OK but said: a holder that dies keeps the lock until
  someone deletes it.
"""

from __future__ import annotations

from kured.doctor.finding import Finding, fail, ok, warn
from kured.settings import Settings, go_duration

CHECK = "lock"


def out_of_service_seconds(s: Settings, reboot_seconds: float) -> float:
    """How long one node holds the lock, in seconds, when its drain takes ``--drain-timeout``
    (the worst case; 0 counts as 0 here, the caller warns about it)."""
    return s.drain_delay + s.drain_timeout + s.reboot_delay + reboot_seconds + s.lock_release_delay


def check_lock(s: Settings, reboot_seconds: float) -> list[Finding]:
    findings: list[Finding] = []
    held = out_of_service_seconds(s, reboot_seconds)
    parts = (
        f"--drain-delay {go_duration(s.drain_delay)} + --drain-timeout "
        f"{go_duration(s.drain_timeout)} + --reboot-delay {go_duration(s.reboot_delay)} + "
        f"--reboot-duration {go_duration(reboot_seconds)} + --lock-release-delay "
        f"{go_duration(s.lock_release_delay)} = {go_duration(held)}"
    )
    if s.lock_ttl > 0 and s.lock_ttl < held:
        findings.append(
            fail(
                CHECK,
                f"--lock-ttl {go_duration(s.lock_ttl)} is shorter than a reboot ({parts}): the "
                "lock expires while the node is still down and the next node goes too; on a "
                "3-member etcd control plane that loses quorum.",
                f"set --lock-ttl above {go_duration(held)} (or 0: never expire).",
            )
        )
    elif s.lock_ttl > 0 and s.drain_timeout == 0:
        findings.append(
            warn(
                CHECK,
                f"--lock-ttl {go_duration(s.lock_ttl)} with --drain-timeout 0: a drain that "
                "waits longer than the TTL loses the lock while the node is cordoned.",
                f"set --drain-timeout so that {parts} stays below the TTL.",
            )
        )
    elif s.lock_ttl > 0:
        findings.append(
            ok(CHECK, f"--lock-ttl {go_duration(s.lock_ttl)} outlasts a reboot ({parts})")
        )
    else:
        findings.append(
            ok(
                CHECK,
                "--lock-ttl 0: the lock never expires, so a holder that dies keeps it until "
                "someone deletes it (etcdctl del, or the DaemonSet annotation)",
            )
        )
    if s.concurrency > 1:
        findings.append(
            warn(
                CHECK,
                f"--concurrency {s.concurrency}: two control-plane nodes may reboot at once, "
                "and a 3-member etcd tolerates one member down.",
                "run the control-plane nodes with their own lock (--lock-key or --ds-name) and "
                "--concurrency 1.",
            )
        )
    if s.lock_backend == "etcd" and len(s.etcd_endpoints) == 1:
        findings.append(
            warn(
                CHECK,
                f"--etcd-endpoints names one member ({s.etcd_endpoints[0]}): while it reboots "
                "the lock cannot be read and every agent waits.",
                "list every etcd member, comma-separated.",
            )
        )
    if s.lock_release_delay == 0 and not s.gate_url:
        findings.append(
            warn(
                CHECK,
                "--lock-release-delay 0 and no --gate-url: the next node may go down before "
                "this node's etcd member and workloads are healthy again.",
                "set --lock-release-delay (e.g. 5m) or a --gate-url that answers 2xx only "
                "when the node is ready (e.g. etcd's /health).",
            )
        )
    return findings
