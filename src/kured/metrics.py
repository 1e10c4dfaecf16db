"""kured's metrics: loud about every reason a node is not rebooting.

``kured_reboot_required{node}`` keeps kured's name and meaning (refreshed every minute by its own
loop, independent of the period). The rest are ours, because kured exports nothing else and its
users build alerts blind (kured-behaviour.md, "Little visibility"):

* ``kured_blocking_reason{node,reason}`` — 1 for the reason kind currently in force (closed set,
  ``kured.core.policy.Why``), 0 for the others;
* ``kured_window_open{node}``, ``kured_lock_held{node}``, ``kured_lock_holders{node}`` (how many
  hold it), ``kured_lock_holder_info{node,holder}``: the lock as last read from the store,
  re-read at every scrape (``kured.lockview``), and ``kured_lock_held_seconds{node,holder}``,
  how long each has held it (field report B36: a holder that is up but NotReady keeps a TTL-0
  lock for ever, and this is the number to alert on); ``kured_lock_stale{node}`` is 1 while that read
  fails (the holders are then the last known) and ``kured_lock_read_age_seconds{node}`` says
  how old they are;
* ``kured_last_reboot_timestamp_seconds{node}``, ``kured_circuit_breaker_open{node}``,
  ``kured_consecutive_reboots{node}``;
* ``kured_failures_total{node,kind}`` (sentinel, gate, lock, reboot, tick, drain, uncordon,
  node, reboot_loop) and ``kured_decisions_total{node,action}``;
* with ``--notify-url``: ``kured_notifications_total{node,event,result}`` (event drain, reboot,
  uncordon; result sent, failed, timeout), every delivery to every URL;
* with ``--release-lock-of-deleted-nodes``: ``kured_lock_releases_of_deleted_nodes_total{node}``;
* ``kured_maintenance_active{node}`` (1 from the silence and pre-drain hook until the node is
  back and its gates pass, or the reboot is abandoned); with ``--alertmanager-url``
  ``kured_alertmanager_silence_active{node}`` (1 while this agent holds a silence) and
  ``kured_alertmanager_silence_ends_timestamp_seconds{node}``; with a hook
  ``kured_hooks_total{node,event,result}`` (event pre-drain, post-uncordon; result ok, failed).
  Failures of either also count in ``kured_failures_total`` (kind silence, hook).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kured.actuators.hooks import EVENTS as HOOK_EVENTS
from kured.actuators.hooks import RESULTS as HOOK_RESULTS
from kured.actuators.notify import Notifier
from kured.core.policy import Why
from kured.loop import Agent


class AgentCollector(Collector):
    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.reboot_required: bool | None = None  # set by the one-minute sentinel loop

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        a = self.agent
        node = a.config.node_id
        view = a.view
        obs, decision = view.observation, view.decision
        required = GaugeMetricFamily(
            "kured_reboot_required",
            "OS requires reboot due to software updates.",
            labels=["node"],
        )
        req = self.reboot_required
        if req is None and obs is not None:
            req = obs.reboot_required
        required.add_metric([node], 1 if req else 0)
        yield required
        reason = GaugeMetricFamily(
            "kured_blocking_reason",
            "1 for the reason the node is not rebooting now.",
            labels=["node", "reason"],
        )
        current = decision.why if decision is not None else Why.NONE
        for why in Why:
            reason.add_metric([node, why.value], 1 if why is current else 0)
        yield reason
        yield _gauge(
            "kured_window_open",
            "1 while the reboot window is open.",
            node,
            1 if obs is not None and obs.window_open else 0,
        )
        lv = a.lock_view
        now = a.now()
        holds = any(h.node_id == node and not h.expired(now) for h in lv.holders)
        yield _gauge(
            "kured_lock_held", "1 while this node holds the reboot lock.", node, 1 if holds else 0
        )
        yield _gauge("kured_lock_holders", "Nodes holding the reboot lock.", node, len(lv.holders))
        yield _gauge(
            "kured_lock_stale",
            "1 while the last read of the lock failed (the holders shown are the last known).",
            node,
            1 if lv.stale else 0,
        )
        age = lv.age_seconds()
        if age is not None:
            yield _gauge(
                "kured_lock_read_age_seconds",
                "Seconds since the lock was last read successfully.",
                node,
                age,
            )
        info = GaugeMetricFamily(
            "kured_lock_holder_info",
            "1 per node holding the reboot lock.",
            labels=["node", "holder"],
        )
        for h in lv.holders:
            info.add_metric([node, h.node_id], 1)
        yield info
        held = GaugeMetricFamily(
            "kured_lock_held_seconds",
            "Seconds since each holder took the reboot lock (its record's created time).",
            labels=["node", "holder"],
        )
        for h in lv.holders:
            held.add_metric([node, h.node_id], max(0.0, (now - h.created_at).total_seconds()))
        yield held
        yield _gauge(
            "kured_last_reboot_timestamp_seconds",
            "When this agent last triggered a reboot that completed (unix time).",
            node,
            a.state.last_reboot_at or 0,
        )
        yield _gauge(
            "kured_circuit_breaker_open",
            "1 when repeated reboots did not clear the sentinel and rebooting stopped.",
            node,
            1 if a.state.breaker_open else 0,
        )
        yield _gauge(
            "kured_consecutive_reboots",
            "Reboots in a row after which a reboot was still required.",
            node,
            a.state.consecutive_reboots,
        )
        failures = CounterMetricFamily(
            "kured_failures", "Failures by kind.", labels=["node", "kind"]
        )
        for kind, n in sorted(view.failures_total.items()):
            failures.add_metric([node, kind], n)
        yield failures
        decisions = CounterMetricFamily(
            "kured_decisions", "Decisions by action.", labels=["node", "action"]
        )
        for action, n in sorted(view.decisions_total.items()):
            decisions.add_metric([node, action], n)
        yield decisions
        if a.deleted_holders is not None:
            reaped = CounterMetricFamily(
                "kured_lock_releases_of_deleted_nodes",
                "Lock entries of holders whose Node was gone, released by this agent.",
                labels=["node"],
            )
            reaped.add_metric([node], a.deleted_holders.released_total)
            yield reaped
        yield from _maintenance(a)
        notifier = a.notifier
        if isinstance(notifier, Notifier):
            sent = CounterMetricFamily(
                "kured_notifications",
                "Notification deliveries by event and result (sent, failed, timeout).",
                labels=["node", "event", "result"],
            )
            for (event, result), n in sorted(notifier.counts.items()):
                sent.add_metric([node, event, result], n)
            yield sent


def _maintenance(a: Agent) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    node = a.config.node_id
    m = a.view.maintenance
    yield _gauge(
        "kured_maintenance_active",
        "1 from the silence and pre-drain hook until the node is back and its gates pass.",
        node,
        1 if a.state.maintenance_since is not None else 0,
    )
    if a.maintenance.silencer is not None:
        yield _gauge(
            "kured_alertmanager_silence_active",
            "1 while this agent holds an Alertmanager silence for its node.",
            node,
            1 if m.silence_id else 0,
        )
        if m.silence_ends_at is not None:
            yield _gauge(
                "kured_alertmanager_silence_ends_timestamp_seconds",
                "When the silence held ends unless extended (unix time).",
                node,
                m.silence_ends_at,
            )
    if a.maintenance.pre_drain is not None or a.maintenance.post_uncordon is not None:
        hooks = CounterMetricFamily(
            "kured_hooks", "Hook runs by event and result.", labels=["node", "event", "result"]
        )
        for event in HOOK_EVENTS:
            for result in HOOK_RESULTS:
                hooks.add_metric([node, event, result], m.hooks_total.get((event, result), 0))
        yield hooks


def _gauge(name: str, doc: str, node: str, value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=["node"])
    g.add_metric([node], value)
    return g


def registry_for(collector: AgentCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(collector)
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
