"""``GET /metrics`` of ``kured fleetlock``: the semaphores as Prometheus gauges, read from etcd
at every scrape (the same read as ``/v1/status``, so the two always agree):

* ``kured_fleetlock_slots{group}`` - the group's slot count under the current configuration;
* ``kured_fleetlock_slots_in_use{group}`` - holders stored for it;
* ``kured_fleetlock_holder_info{group,holder}`` - 1 per holder (the Zincati client id);
* ``kured_fleetlock_group_unreadable{group}`` - 1 when the group's record does not parse (its
  holders are then unknown);
* ``kured_fleetlock_lock_store_up`` - 1 when etcd answered this scrape, 0 otherwise (the
  per-group series are then absent, not zero: unknown is not free).

Groups are the configured ones plus those stored in etcd, at most ``MAX_STATUS_GROUPS``;
holders per group are at most its slots (plus holders kept after a slot count was lowered),
so the label sets stay bounded.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kured.core.errors import LockError

log = logging.getLogger("kured.fleetlock")


class _Snapshot(Collector):
    def __init__(self, status: dict[str, Any] | None) -> None:
        self._status = status

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily(
            "kured_fleetlock_lock_store_up", "1 when etcd answered this scrape, else 0."
        )
        up.add_metric([], 0 if self._status is None else 1)
        yield up
        if self._status is None:
            return
        groups: dict[str, dict[str, Any]] = self._status["groups"]
        slots = GaugeMetricFamily(
            "kured_fleetlock_slots",
            "Slots of the group (hosts that may reboot at once).",
            labels=["group"],
        )
        used = GaugeMetricFamily(
            "kured_fleetlock_slots_in_use", "Slots of the group held now.", labels=["group"]
        )
        info = GaugeMetricFamily(
            "kured_fleetlock_holder_info",
            "1 per client holding a slot.",
            labels=["group", "holder"],
        )
        bad = GaugeMetricFamily(
            "kured_fleetlock_group_unreadable",
            "1 when the group's stored record does not parse (holders unknown).",
            labels=["group"],
        )
        for group, entry in groups.items():
            slots.add_metric([group], entry["slots"])
            bad.add_metric([group], 1 if "error" in entry else 0)
            if "error" in entry:
                continue
            used.add_metric([group], len(entry["holders"]))
            for holder in entry["holders"]:
                info.add_metric([group, holder["id"]], 1)
        yield from (slots, used, info, bad)


def exposition(status: dict[str, Any] | None) -> bytes:
    """Prometheus text for a ``FleetLockService.status()`` answer (None: etcd unreachable)."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(_Snapshot(status))
    return generate_latest(registry)


async def metrics(request: web.Request) -> web.Response:
    """The ``/metrics`` route (the service is the app's ``SERVICE``)."""
    from kured.locks.fleetlock import SERVICE

    try:
        status: dict[str, Any] | None = await request.app[SERVICE].status()
    except LockError as exc:
        log.warning("metrics: cannot read the lock store: %s", exc.message)
        status = None
    return web.Response(
        body=exposition(status),
        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
    )
