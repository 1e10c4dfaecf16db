"""A worker process's share of the node's public load, for the primary's ``PublicLoad``.

With ``KURA_WORKERS`` > 1 (``kura.workers``) the public port is served by several processes,
but peer traffic, and so ``kura.mesh.peer_pace``, lives in the primary alone. Each worker
counts its own public requests in a ``LoadTally`` (the same middleware, ``kura.api.public_load``)
and sends a ``LoadReport`` with the hits it posts to the primary every second; the primary's
``PublicLoad.merge`` adds it to the node's signal:

* in flight: the worker's count at the time of the report, added to the primary's own until the
  next report replaces it (or for at most ``REMOTE_STALE_SECONDS``, so a worker that died or
  stopped reporting no longer counts);
* latency: the worker's samples themselves, not its EWMA, so the node's EWMA is one EWMA over
  every process's requests (never an average of per-process averages). A report carries the
  last ``RECENT_SAMPLES`` samples in order and the count and sum of any earlier ones of the
  same second, which enter as one step of their mean: after 64 later samples their weight is
  0.9**64 (about 0.1 %), so the EWMA differs from feeding every sample by less than that.

A worker's samples enter the EWMA when its report arrives (up to a second late), after the
primary's own samples of that second. Event-loop confined, no locks.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

# Samples a report carries one by one (newest last); earlier ones go as a count and a sum.
RECENT_SAMPLES = 64
# A report counts for this long (seconds) unless a newer one from the same worker replaces it:
# three missed flushes of a worker that reports every second.
REMOTE_STALE_SECONDS = 3.0


@dataclass(frozen=True)
class LoadReport:
    """One worker's public load since its previous report.

    ``inflight``: its public requests in flight now; ``recent``: its latest latency samples
    (seconds, oldest first, at most ``RECENT_SAMPLES``); ``older_count`` and ``older_sum``:
    the samples before those (a count and their sum in seconds)."""

    inflight: int
    recent: tuple[float, ...] = ()
    older_count: int = 0
    older_sum: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "inflight": self.inflight,
            "recent": list(self.recent),
            "older_count": self.older_count,
            "older_sum": self.older_sum,
        }

    @classmethod
    def from_json(cls, doc: Any) -> LoadReport:
        """The report in ``doc`` (as ``to_json`` made it); ValueError if it is not one."""
        try:
            report = cls(
                inflight=int(doc["inflight"]),
                recent=tuple(float(s) for s in doc.get("recent") or ()),
                older_count=int(doc.get("older_count") or 0),
                older_sum=float(doc.get("older_sum") or 0.0),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a load report: {exc}") from exc
        if report.inflight < 0 or report.older_count < 0 or len(report.recent) > RECENT_SAMPLES:
            raise ValueError("not a load report: out of range")
        return report


class LoadTally:
    """A worker's public load, for ``kura.api.public_load.middleware``: ``started()``,
    ``sample(seconds)`` and ``ended()`` as on ``PublicLoad``; ``take()`` the report since the
    last one (O(``RECENT_SAMPLES``))."""

    def __init__(self) -> None:
        self.inflight = 0
        self._recent: deque[float] = deque(maxlen=RECENT_SAMPLES)
        self._older_count = 0
        self._older_sum = 0.0
        self._reported_inflight = 0

    def started(self) -> None:
        self.inflight += 1

    def sample(self, latency_seconds: float) -> None:
        if len(self._recent) == RECENT_SAMPLES:
            self._older_count += 1
            self._older_sum += self._recent[0]  # the deque drops it on append
        self._recent.append(latency_seconds)

    def ended(self) -> None:
        self.inflight = max(0, self.inflight - 1)

    def pending(self) -> bool:
        """True when a report would tell the primary something: samples, requests in flight
        (they must stay counted past ``REMOTE_STALE_SECONDS``) or a changed count."""
        return bool(self._recent) or self.inflight > 0 or self.inflight != self._reported_inflight

    def take(self) -> LoadReport:
        """The report since the previous ``take`` (samples are handed over once)."""
        report = LoadReport(self.inflight, tuple(self._recent), self._older_count, self._older_sum)
        self._recent.clear()
        self._older_count, self._older_sum = 0, 0.0
        self._reported_inflight = self.inflight
        return report
