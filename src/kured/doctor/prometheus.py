"""What Prometheus really does for kured (``kured doctor``'s ``scrape``, ``retention`` and
``alerts`` checks), read from its HTTP API (https://prometheus.io/docs/prometheus/latest/querying/api/):

* **scrape**: ``count(kured_reboot_required)`` (``/api/v1/query``) must equal the node count
  (``--node-count``, else the Nodes of the Kubernetes API). Fewer means some agents are not
  scraped, so every alert about them is blind; the nodes without a series are named when the
  API gives the node names.
* **retention**: every alerting rule's ``for:`` (``/api/v1/rules``, ``duration`` in seconds)
  must fit within the time retention (``/api/v1/status/runtimeinfo`` ``storageRetention``, else
  ``/api/v1/status/flags`` ``storage.tsdb.retention.time``; Prometheus' default is 15d). A rule
  reading ``kured_reboot_required`` must also outlast the longest stretch the agent's window is
  closed, or it fires every time nodes wait for the window: a weekly window forces ``for: 8d``,
  longer than a 7-day retention.
* **alerts**: the alerts active now that would block a reboot under the agent's own
  ``--alert-filter-regexp``, ``--alert-filter-match-only`` and ``--alert-firing-only``, decided
  by the agent's gate code (``kured.sensors.alerts``), and the ones the filter ignores. An
  alert about kured itself (its expression reads a ``kured_`` metric) that the filter lets
  block is a FAIL: it would block the very reboot that clears it (the gate loop that
  ``deploy/alerts/kured.rules.yml`` warns about).

* **cordon**: kured's alert on a node left cordoned, ``KuredNodeCordonedTooLong``
  (``deploy/alerts/kured.rules.yml``), must be loaded (``/api/v1/rules``), else a WARN: a
  stuck drain, a node that did not come back or a cordon kured left behind (kured #1129) goes
  unnoticed. Loaded, it must see nodes (``kube_node_spec_unschedulable``, kube-state-metrics':
  no series, no alert ever), and its ``for:`` must outlast one reboot cycle under the agent's
  flags, ``--drain-timeout`` + ``--reboot-delay`` + ``--reboot-duration`` (``--drain-delay``
  is slept before the cordon, and the node is uncordoned before ``--lock-release-delay``), or
  it fires during normal reboots;
  each a WARN. So is a filter that lets it block reboots while it is only pending (no
  ``--alert-firing-only``): it is pending through every cordon, kured's own included.

A Prometheus that cannot be reached is a FAIL: the agent's gate is fail-closed, so no node
reboots while it is down.
"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, date, datetime, timedelta
from itertools import takewhile
from typing import Any

import aiohttp

from kured.client_errors import unreachable
from kured.core.cron_window import CronWindow
from kured.core.errors import SensorError
from kured.core.window import RebootWindow, weekday_of
from kured.doctor.finding import Finding, fail, ok, warn
from kured.sensors.alerts import PrometheusAlertGate, active_alerts
from kured.settings import Settings, go_duration

DEFAULT_RETENTION_SECONDS = 15 * 86400.0
CORDON_ALERT = "KuredNodeCordonedTooLong"
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_UNITS["y"] = 365 * 86400.0
_PROM_DURATION = re.compile(r"^(?:\d+(?:ms|s|m|h|d|w|y))+$")
_PART = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")


def parse_prometheus_duration(text: str) -> float | None:
    """``7d``, ``1w2d``, ``36h`` → seconds; None when ``text`` is not one (e.g. ``10GiB``)."""
    text = text.strip()
    if not _PROM_DURATION.match(text):
        return None
    return sum(int(n) * _UNITS[u] for n, u in _PART.findall(text))


def prometheus_duration(seconds: float) -> str:
    """Seconds as Prometheus writes a duration: ``8d``, ``1d12h``, ``15m``, ``0s``."""
    rest = round(seconds)
    if rest == 0:
        return "0s"
    out = ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, rest = divmod(rest, size)
        out += f"{count}{unit}" if count else ""
    return out


def longest_closed_seconds(window: RebootWindow | CronWindow, today: date | None = None) -> float:
    """The longest stretch, in seconds, during which ``window`` stays closed (over the two
    weeks from ``today`` for days and times; over about 400 days, at most 5,000 openings, for a
    cron window, whose openings may be a month or more apart, counting the stretch from the last
    opening's end to the horizon too); the whole span when it never opens."""
    start = today or datetime.now(UTC).date()
    if isinstance(window, CronWindow):
        since = datetime.combine(start, datetime.min.time(), tzinfo=UTC)
        horizon = since + timedelta(days=400)
        # Stop at the first opening past the horizon: a leap-day cron ('0 3 29 2 *') would
        # otherwise be walked 5,000 openings (20,000 years) on, past what a datetime can hold.
        openings = list(takewhile(lambda o: o[0] <= horizon, window.openings(since, 5000)))
        if not openings:
            return (horizon - since).total_seconds()
    else:
        openings = sorted(
            window.opening(start + timedelta(days=i))
            for i in range(15)
            if weekday_of(start + timedelta(days=i)) in window.days
        )
        if not openings:
            return 15 * 86400.0
    longest, reach = 0.0, openings[0][1]
    for open_at, close_at in openings[1:]:
        longest = max(longest, (open_at - reach).total_seconds())
        reach = max(reach, close_at)
    if isinstance(window, CronWindow) and len(openings) < 5000:
        # From the last opening's end to the horizon: with one opening in 400 days (the 29th of
        # February) the gaps between openings alone would say 0; the stretch is at least this.
        # (Not when the 5,000 ran out first: the horizon was not reached.)
        longest = max(longest, (horizon - reach).total_seconds())
    return longest


class PrometheusApi:
    """GETs against one Prometheus; each answer's ``data``. Raises ``SensorError``."""

    def __init__(self, session: aiohttp.ClientSession, url: str, timeout_seconds: float) -> None:
        self._session, self.url, self.timeout_seconds = session, url.rstrip("/"), timeout_seconds

    async def get(self, path: str, params: dict[str, str] | None = None) -> Any:
        try:
            async with asyncio.timeout(self.timeout_seconds):
                async with self._session.get(self.url + path, params=params) as resp:
                    body = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            raise SensorError(
                unreachable(f"Prometheus at {self.url}", exc, self.timeout_seconds)
            ) from exc
        if not isinstance(body, dict) or body.get("status") != "success":
            error = body.get("error") if isinstance(body, dict) else None
            raise SensorError(f"Prometheus at {self.url} refused {path}: {error or body!r:.200}")
        return body.get("data")

    async def vector(self, query: str) -> list[dict[str, Any]]:
        data = await self.get("/api/v1/query", {"query": query})
        return list((data or {}).get("result") or [])

    async def retention_seconds(self) -> tuple[float | None, str]:
        """(time retention in seconds or None when only a size limit applies, as written)."""
        try:
            info = await self.get("/api/v1/status/runtimeinfo")
            text = str((info or {}).get("storageRetention") or "")
        except SensorError:
            text = ""
        for part in text.split(" or "):
            seconds = parse_prometheus_duration(part)
            if seconds:
                return seconds, part.strip()
        flags = await self.get("/api/v1/status/flags")
        value = str((flags or {}).get("storage.tsdb.retention.time") or "0s")
        seconds = parse_prometheus_duration(value) or 0.0
        if seconds:
            return seconds, value
        size = str((flags or {}).get("storage.tsdb.retention.size") or "0B")
        if size not in ("0B", "0", ""):
            return None, text or f"size {size}"
        return DEFAULT_RETENTION_SECONDS, "15d (the default)"

    async def alerting_rules(self) -> list[dict[str, Any]]:
        data = await self.get("/api/v1/rules", {"type": "alert"})
        return [
            rule
            for group in (data or {}).get("groups") or []
            for rule in group.get("rules") or []
            if rule.get("type") == "alerting"
        ]


def check_scrape(
    samples: list[dict[str, Any]], url: str, expected: int, names: list[str] | None
) -> Finding:
    """``samples``: the answer to ``kured_reboot_required`` (one per scraped agent)."""
    count = len(samples)
    reporting = sorted({str(s.get("metric", {}).get("node", "")) for s in samples})
    if count == expected:
        return ok("scrape", f"Prometheus at {url} scrapes {count} of {expected} agents")
    missing = sorted(set(names or []) - set(reporting))
    detail = f"; no series for node{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
    return fail(
        "scrape",
        f"count(kured_reboot_required) at {url} is {count}, but the cluster has {expected} "
        f"nodes{detail if missing else ''}: alerts about the other nodes can never fire.",
        "check the kured DaemonSet runs on every node (tolerations, nodeSelector), its Service"
        " and ServiceMonitor, and NetworkPolicies; a count above the node count means two "
        "jobs scrape the same agents.",
    )


def check_retention(
    rules: list[dict[str, Any]],
    retention: float | None,
    written: str,
    window: RebootWindow | CronWindow,
) -> list[Finding]:
    if retention is None:
        return [
            warn(
                "retention",
                f"Prometheus keeps data by size only ({written}): alert for: durations cannot "
                "be compared with a retention time.",
                "set --storage.tsdb.retention.time as well.",
            )
        ]
    findings = []
    closed = longest_closed_seconds(window)
    closed_shown = round(closed / 60) * 60  # the end second is inclusive: 6d21h59m59s reads 6d22h
    written = prometheus_duration(retention)
    for rule in rules:
        name, seconds = str(rule.get("name")), float(rule.get("duration") or 0)
        if seconds > retention:
            findings.append(
                fail(
                    "retention",
                    f"alert {name} has for: {prometheus_duration(seconds)}, longer than "
                    f"Prometheus' retention of {written}.",
                    f"raise --storage.tsdb.retention.time above {prometheus_duration(seconds)}"
                    " or shorten the alert's for:.",
                )
            )
        if "kured_reboot_required" in str(rule.get("query", "")) and seconds < closed:
            need = prometheus_duration(closed_shown + 86400)
            findings.append(
                warn(
                    "retention",
                    f"alert {name} reads kured_reboot_required with for: "
                    f"{prometheus_duration(seconds)}, shorter than the {prometheus_duration(closed_shown)}"
                    f" the window stays closed ({window.describe()}): it fires whenever nodes "
                    "wait for the window.",
                    f"raise its for: to about {need}"
                    + (f", which also needs a retention above {need}" if closed > retention else "")
                    + ".",
                )
            )
    if not findings:
        longest = max(rules, key=lambda r: float(r.get("duration") or 0), default=None)
        top = (
            f", the longest for: is {prometheus_duration(float(longest.get('duration') or 0))}"
            f" ({longest.get('name')})"
            if longest
            else ""
        )
        findings.append(
            ok("retention", f"{len(rules)} alert rules fit within retention {written}{top}")
        )
    return findings


def _synthetic(name: str) -> dict[str, Any]:
    metric = {"alertname": name, "alertstate": "firing"}
    return {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": metric, "value": [0, "1"]}]},
    }


def check_alerts(s: Settings, data: Any, rules: list[dict[str, Any]]) -> list[Finding]:
    """Which alerts block now, through the agent's own filter (``active_alerts``)."""
    regexp, only = s.alert_filter_regexp, s.alert_filter_match_only
    blocking = active_alerts(data, regexp, only, s.alert_firing_only)
    ignored = sorted(set(active_alerts(data, None, False, False)) - set(blocking))
    flags = (
        f"--alert-filter-regexp={regexp.pattern if regexp else ''!r} "
        f"--alert-filter-match-only={str(only).lower()} "
        f"--alert-firing-only={str(s.alert_firing_only).lower()}"
    )
    findings = []
    loops = sorted(
        str(r.get("name"))
        for r in rules
        if "kured_" in str(r.get("query", ""))
        and active_alerts(_synthetic(str(r.get("name"))), regexp, only, False)
    )
    if loops:
        findings.append(
            fail(
                "alerts",
                f"alert{'s' if len(loops) > 1 else ''} {', '.join(loops)} watch kured itself "
                f"but would block reboots under {flags}: once firing, the reboot that clears "
                "them can never happen.",
                "with --alert-filter-match-only keep them out of the regexp; without it, add "
                "them to the regexp (e.g. '^Kured').",
            )
        )
    shown_ignored = f"; ignored by the filter: {', '.join(ignored)}" if ignored else ""
    if blocking:
        findings.append(
            warn(
                "alerts",
                f"alerts that block a reboot now under {flags}: {', '.join(blocking)}"
                f"{shown_ignored}.",
                "resolve them; if they should not stop reboots, change the filter.",
            )
        )
    else:
        findings.append(
            ok("alerts", f"no active alert blocks a reboot under {flags}{shown_ignored}")
        )
    return findings


def cordoned_seconds(s: Settings, reboot_seconds: float) -> float:
    """How long one reboot keeps the node cordoned when its drain takes ``--drain-timeout``:
    the cordon comes after ``--drain-delay`` (so that does not count), the uncordon at the
    agent's first check after the boot, before ``--lock-release-delay``."""
    return s.drain_timeout + s.reboot_delay + reboot_seconds


def check_cordon(
    rules: list[dict[str, Any]],
    cordon_nodes: int,
    url: str,
    s: Settings,
    reboot_seconds: float,
) -> list[Finding]:
    """``cordon_nodes``: how many nodes ``kube_node_spec_unschedulable`` reports."""
    rule = next((r for r in rules if r.get("name") == CORDON_ALERT), None)
    if rule is None:
        return [
            warn(
                "cordon",
                f"alert {CORDON_ALERT} is NOT loaded in Prometheus at {url}: a node left "
                "cordoned (a drain that never ends, a node that did not come back, an uncordon "
                "that keeps failing, a cordon an earlier kured left, kured #1129) keeps the "
                "cluster a node short and nothing tells you.",
                "load deploy/alerts/kured.rules.yml into this Prometheus (the PrometheusRule "
                "deploy/alerts/prometheusrule-kured.yaml, with the label your Prometheus "
                "selects), and scrape kube-state-metrics.",
            )
        ]
    findings = []
    if cordon_nodes == 0:
        findings.append(
            warn(
                "cordon",
                f"alert {CORDON_ALERT} is loaded but Prometheus at {url} has no "
                "kube_node_spec_unschedulable series: it can never fire.",
                "scrape kube-state-metrics (kube-prometheus-stack does), with its node "
                "metrics enabled.",
            )
        )
    seconds = float(rule.get("duration") or 0)
    cycle = cordoned_seconds(s, reboot_seconds)
    parts = (
        f"--drain-timeout {go_duration(s.drain_timeout)} + --reboot-delay "
        f"{go_duration(s.reboot_delay)} + --reboot-duration {go_duration(reboot_seconds)} = "
        f"{go_duration(cycle)}"
    )
    if seconds <= cycle:
        findings.append(
            warn(
                "cordon",
                f"alert {CORDON_ALERT} has for: {prometheus_duration(seconds)}, not longer "
                f"than one reboot keeps a node cordoned ({parts}): it fires during normal "
                "reboots whose drain runs to its timeout.",
                f"raise its for: above {prometheus_duration(cycle)} (with some margin for slow "
                "boots), or shorten --drain-timeout.",
            )
        )
    regexp, only = s.alert_filter_regexp, s.alert_filter_match_only
    if not s.alert_firing_only and active_alerts(_synthetic(CORDON_ALERT), regexp, only, False):
        findings.append(
            warn(
                "cordon",
                f"alert {CORDON_ALERT} would block reboots while only pending (no "
                "--alert-firing-only), and it is pending from the first minute of every "
                "cordon: kured's own cordon of one node holds every other node's reboot, and "
                "an operator's cordon holds them all.",
                "keep it out of the gate like kured's other alerts (--alert-filter-regexp "
                "'^Kured'), or gate on it on purpose with --alert-firing-only.",
            )
        )
    if not findings:
        unbounded = (
            " (--drain-timeout 0: a drain may last for ever, and this alert is what notices "
            "one that does)"
            if s.drain_timeout == 0
            else ""
        )
        findings.append(
            ok(
                "cordon",
                f"alert {CORDON_ALERT} is loaded, sees {cordon_nodes} nodes, and its for: "
                f"{prometheus_duration(seconds)} outlasts one reboot's cordon ({parts})"
                f"{unbounded}",
            )
        )
    return findings


async def check_prometheus(
    session: aiohttp.ClientSession,
    s: Settings,
    expected: int | None,
    names: list[str] | None,
    reboot_seconds: float = 600.0,
) -> list[Finding]:
    """Every Prometheus finding; ``expected`` None skips the scrape count; ``reboot_seconds``
    is ``--reboot-duration`` (the cordon check)."""
    api = PrometheusApi(session, s.prometheus_url, s.prometheus_timeout)
    gate = PrometheusAlertGate(
        session,
        s.prometheus_url,
        s.alert_filter_regexp,
        s.alert_filter_match_only,
        s.alert_firing_only,
        s.prometheus_timeout,
    )
    findings = []
    try:
        if expected is not None:
            findings.append(
                check_scrape(await api.vector("kured_reboot_required"), api.url, expected, names)
            )
        rules = await api.alerting_rules()
        retention, written = await api.retention_seconds()
        findings += check_retention(rules, retention, written, s.window())
        findings += check_alerts(s, await gate.query(), rules)
        nodes = 0
        if any(r.get("name") == CORDON_ALERT for r in rules):
            nodes = len(await api.vector("max by (node) (kube_node_spec_unschedulable)"))
        findings += check_cordon(rules, nodes, api.url, s, reboot_seconds)
    except SensorError as exc:
        findings.append(
            fail(
                "alerts",
                f"{exc.message}: the agent's alert gate is fail-closed, so no node reboots "
                "while this lasts.",
                "check --prometheus-url and that Prometheus answers /api/v1/query.",
            )
        )
    return findings
