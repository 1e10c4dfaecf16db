"""A rolling reboot of a live kura mesh, coordinated by real kured agents, on one machine.

Shared by ``kura demo rolling-reboot`` and tests/e2e/test_rolling_reboot.py (``run(config)``
returns a ``RollingResult``; ``evaluate`` lists every violated invariant).

The scenario
------------
``hosts`` "machines" on 127.0.0.1, each a directory with its own kura node (own data and tmp
dirs, fixed public and internal ports picked at start so peers and gates find a restarted node)
and its own kured agent (fixed metrics port). They share one etcd (the reboot lock) and one
Prometheus that scrapes every kura and kured ``/metrics`` each second and loads
``deploy/alerts/*.rules.yml``. Every agent gates on every kura node's ``/ready`` and on "no
firing alert from the kura set" (``--alert-filter-regexp`` = the kura alert names, anchored,
with ``--alert-filter-match-only``).

kured triggers each reboot: its ``--reboot-command`` is ``reboot.sh`` in the work dir, which
appends ``<time> <host> reboot`` to ``events.log``, removes the host's sentinel and touches the
host's ``reboot-requested`` file. The host's supervisor thread sees that file and "reboots" the
host: it stops routing load to it, stops kura (SIGKILL for the hosts in ``sigkill_hosts``,
SIGTERM for the others), wipes its data and tmp dirs for the hosts in ``wipe_hosts`` (a replaced
disk; before that it drains the host like kured's cordon and drain would: no new requests, the
in-flight ones finish, its outbox empties), kills the agent, then starts kura on the same ports
and the agent again. The agent recognises the reboot it triggered, waits
``--lock-release-delay`` and releases the lock; the next agent takes it only once every gate is
open, i.e. once the restarted node has finished bootstrapping and answers ``/ready`` 200.

Throughout, an asyncio load generator writes new artifacts (plain ``/cache``, Nx ``/v1/cache``,
Turborepo ``/v8/artifacts``, key-value) to nodes that are up and reads artifacts written before
the run and acknowledged during it from nodes that are up, and the real Nx, Turborepo and ccache
drivers of ``tests/clients/`` build against a node that is up before, during and after. An
external sampler thread measures each node's tmp dir every few milliseconds. At the end every
acknowledged artifact is read from every node through the public routes and compared by SHA-256.

What counts as a failed read
----------------------------
A read is judged only if its node was up for the whole request (no reboot of that host began
or ended meanwhile); a request cut by a reboot is counted as "excused". On an up node, any
transport error, a status other than 200, or wrong bytes is a violation, with one exception: an
artifact acknowledged during the run by *another* node may not have been replicated yet, so a
404 for it is a "replication-lag miss" (counted, not a violation). Artifacts written before the
run, and reads from the node that acknowledged the write, must always succeed.

Modules
-------
``config`` (what to run, what is recorded), ``scenario`` (the run and its phases), ``host``
(one host and its reboot), ``load`` (the load generator and the final verification),
``clients`` (the real build tools), ``sampler`` (the external tmp-dir sampler), ``observe``
(log and event readers), ``collect`` (the result after the run), ``invariants``
(``evaluate``), ``summary`` (the terminal summary), ``command`` (``kura demo rolling-reboot``).
The processes (kura, kured, etcd, Prometheus) are started by ``kura_harness.launch``.
"""

from kura_harness.rolling.command import main, run
from kura_harness.rolling.config import (
    ClientRun,
    DemoError,
    HostReport,
    LoadReport,
    MiB,
    RollingConfig,
    RollingResult,
)
from kura_harness.rolling.invariants import evaluate
from kura_harness.rolling.observe import kura_alert_names, log_times, percentile, read_events
from kura_harness.rolling.summary import render_summary

__all__ = [
    "ClientRun",
    "DemoError",
    "HostReport",
    "LoadReport",
    "MiB",
    "RollingConfig",
    "RollingResult",
    "evaluate",
    "kura_alert_names",
    "log_times",
    "main",
    "percentile",
    "read_events",
    "render_summary",
    "run",
]
