"""The one rule for how slowly an upload may send while it holds tmp budget, on every listener:
HTTP bodies (``kura.api.http.request_body``, peer replication included), the bodies a worker
relays to the primary (``kura.workers.forward``) and gRPC ByteStream writes
(``kura.grpc.bytestream``, across the streams of a resumed write).

An upload is given up when

* **stalled**: no byte came for ``KURA_BODY_IDLE_TIMEOUT_SECONDS``, or
* **slow**: once ``KURA_UPLOAD_GRACE_SECONDS`` have passed since it started, its average rate
  since then is below ``KURA_MIN_UPLOAD_BYTES_PER_SECOND`` (0: no minimum).

Four uploads declaring 2 GiB and sending a byte every few seconds held a whole 8 GiB staging
budget, over HTTP and then over gRPC (issues 10 and 26), so every other write was refused.
The time an upload is not attached to any stream (a parked resumable gRPC write) counts toward
its average: the reservation is held meanwhile, and a client cannot reset the clock by
reconnecting. Times are the event loop's (``loop.time()``, seconds).
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Literal

from kura.api.metrics import KuraMetrics
from kura.settings import Settings

log = logging.getLogger(__name__)

Verdict = Literal["stalled", "slow"]


@dataclass(frozen=True)
class UploadRule:
    """The limits (module docstring): seconds, and bytes per second (0: no minimum rate)."""

    idle_seconds: float
    min_bytes_per_second: int
    grace_seconds: float

    @classmethod
    def of(cls, settings: Settings) -> UploadRule:
        """The rule of ``settings``: one per settings object, built on the first call and
        shared by every listener after (HTTP bodies, a worker's forwarder, gRPC ByteStream
        writes and origin fetches), so an upload or a forwarded request builds nothing. Kept
        by the object's identity: hashing a ``Settings`` hashes every field, which costs more
        than building the rule."""
        rule = _RULES.get(id(settings))
        if rule is None:
            rule = _RULES[id(settings)] = cls(
                float(settings.body_idle_timeout_seconds),
                settings.min_upload_bytes_per_second,
                float(settings.upload_grace_seconds),
            )
            # Forgotten with its settings, before another object can take over their id.
            weakref.finalize(settings, _RULES.pop, id(settings), None)
        return rule

    def meter(self, now: float) -> UploadMeter:
        """A meter for an upload that starts at ``now``."""
        return UploadMeter(self, started=now, last=now)


# ``UploadRule.of``: id of a live ``Settings`` -> its rule.
_RULES: dict[int, UploadRule] = {}


@dataclass
class UploadMeter:
    """What one upload sent so far and when. Not thread-safe (one event loop)."""

    rule: UploadRule
    started: float
    last: float  # when the last byte came (or the start)
    received: int = 0

    def add(self, n: int, now: float) -> None:
        """``n`` bytes came at ``now``; 0 bytes (an empty message) is no sign of life."""
        if n > 0:
            self.received += n
            self.last = now

    def slow_at(self) -> float:
        """When the average rate falls below the minimum if nothing more comes (inf: none)."""
        rate = self.rule.min_bytes_per_second
        if rate <= 0:
            return float("inf")
        return self.started + max(self.rule.grace_seconds, self.received / rate)

    def deadline(self) -> float:
        """When the upload is given up if nothing more comes."""
        return min(self.last + self.rule.idle_seconds, self.slow_at())

    def seconds_left(self, now: float) -> float:
        """How long to wait for more bytes before ``verdict`` (0 when already due)."""
        return max(self.deadline() - now, 0.0)

    def verdict(self, now: float) -> Verdict | None:
        """``"slow"`` or ``"stalled"`` once the upload is to be given up at ``now`` (a timer
        set from ``seconds_left`` may fire a hair early: then the nearer reason), else None."""
        slow_at, idle_at = self.slow_at(), self.last + self.rule.idle_seconds
        if now >= slow_at:
            return "slow"
        if now >= idle_at:
            return "stalled"
        return None

    def due(self, now: float) -> Verdict:
        """The reason a wait of ``seconds_left`` ended: ``verdict``, or the nearer deadline's."""
        return self.verdict(now) or (
            "slow" if self.slow_at() < self.last + self.rule.idle_seconds else "stalled"
        )

    def give_up(self, metrics: KuraMetrics, protocol: str, verdict: Verdict, now: float) -> str:
        """Count (``kura_http_aborted_uploads_total{reason}``) and log once the upload given up
        for ``verdict``; the message for the client."""
        metrics.count_aborted_upload(verdict)
        if verdict == "stalled":
            message = f"no body bytes arrived for {self.rule.idle_seconds:g} s; giving up"
        else:
            message = (
                f"upload too slow: {self.received} bytes in {now - self.started:.1f} s, below "
                f"the minimum of {self.rule.min_bytes_per_second} bytes per second; giving up"
            )
        log.info("aborted a %s upload (%s): %s", protocol, verdict, message)
        return message
