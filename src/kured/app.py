"""Composition root of the agent: settings → sensors, gates, lock, rebooter → ``Agent``, plus
the HTTP endpoint serving ``/metrics`` and ``/status`` on ``--metrics-host:--metrics-port``.

Background tasks run in one ``TaskGroup``: the agent loop and the one-minute sentinel loop that
refreshes ``kured_reboot_required`` (kured's metric cadence, independent of ``--period``).

With ``--lock-backend=kubernetes`` (or ``lease``: the lock in a Lease) one ``ApiServer`` (``--kubeconfig``, or the pod's service
account) serves the DaemonSet-annotation lock, the blocking-pod gate and the node actuator
(cordon, drain, labels, annotations).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from pathlib import Path

import aiohttp
from aiohttp import web

from kit.clock import Clock, SystemClock
from kured.actuators.deleted_nodes import DeletedHolders
from kured.actuators.drain import DrainOptions
from kured.actuators.hooks import Hook
from kured.actuators.node import KubernetesNode, NodeOptions, label_keys_differ
from kured.actuators.notify import Notifier
from kured.actuators.reboot import CommandReboot, Rebooter, SignalReboot, wants_host_namespace
from kured.actuators.silence import Silencer
from kured.apiserver import ApiServer
from kured.console import status_of
from kured.core.errors import ConfigurationError, LockError, SensorError
from kured.core.notify_urls import translate
from kured.locks.base import Lock
from kured.lockview import READ_TIMEOUT_SECONDS
from kured.loop import Agent, AgentConfig, Gate
from kured.maintenance import MaintenanceKit
from kured.metrics import AgentCollector, exposition, registry_for
from kured.sensors.alerts import PrometheusAlertGate
from kured.sensors.http_gate import HttpGate
from kured.sensors.pods import BlockingPodGate
from kured.sensors.sentinel import (
    AnySentinel,
    CommandSentinel,
    FileSentinel,
    KernelSentinel,
    Sentinel,
)
from kured.settings import Settings, describe
from kured.settings_rules import KUBERNETES_BACKENDS
from kured.state import StateStore, current_boot_id

log = logging.getLogger(__name__)

SENTINEL_METRIC_SECONDS = 60.0


def build_sentinel(s: Settings) -> Sentinel:
    base: Sentinel = (
        CommandSentinel(s.reboot_sentinel_command)
        if s.reboot_sentinel_command
        else FileSentinel(Path(s.reboot_sentinel))
    )
    if s.reboot_sentinel_kernel:
        return AnySentinel([base, KernelSentinel()])
    return base


def build_api(s: Settings) -> ApiServer | None:
    """The Kubernetes API client for the kubernetes backend (None otherwise). Raises
    ``ConfigurationError`` when no credentials can be loaded."""
    if s.lock_backend not in KUBERNETES_BACKENDS:
        return None
    return ApiServer.connect(s.kubeconfig or None, request_timeout_seconds=s.kubernetes_timeout)


def build_lock(s: Settings, api: ApiServer | None = None, clock: Clock | None = None) -> Lock:
    clock = clock or SystemClock()
    if s.lock_backend == "etcd":
        from kured.locks.etcd import EtcdLock

        return EtcdLock(list(s.etcd_endpoints), s.lock_key, s.concurrency, clock)
    if s.lock_backend == "kubernetes" and api is not None:
        from kured.locks.kubernetes import KubernetesLock

        return KubernetesLock(
            api, s.ds_namespace, s.ds_name, s.lock_annotation, s.concurrency, clock
        )
    if s.lock_backend == "lease" and api is not None:
        from kured.locks.lease import LeaseLock

        return LeaseLock(
            api, s.lease_namespace, s.lease_name, s.lock_annotation, s.concurrency, clock
        )
    raise ConfigurationError([f"--lock-backend {s.lock_backend} is not available in this build"])


def build_node(
    s: Settings, api: ApiServer | None, clock: Clock | None = None
) -> KubernetesNode | None:
    if api is None:
        return None
    if label_keys_differ(s.pre_reboot_node_labels, s.post_reboot_node_labels):
        log.warning(
            "--pre-reboot-node-labels and --post-reboot-node-labels have different keys: "
            "a post label will not undo every pre label"
        )
    return KubernetesNode(
        api,
        s.node_id,
        DrainOptions(
            timeout_seconds=s.drain_timeout,
            grace_period_seconds=s.drain_grace_period,
            skip_wait_for_delete_timeout_seconds=s.skip_wait_for_delete_timeout,
            pod_selector=s.drain_pod_selector,
        ),
        NodeOptions(
            pre_reboot_labels=s.pre_reboot_node_labels,
            post_reboot_labels=s.post_reboot_node_labels,
            annotate=s.annotate_nodes,
            prefer_no_schedule_taint=s.prefer_no_schedule_taint,
        ),
        clock,
    )


def build_notifier(s: Settings) -> Notifier | None:
    """The ``--notify-url`` notifier (None without a URL); URLs were checked at load."""
    if not s.notify_url:
        return None
    return Notifier(
        [translate(u) for u in s.notify_url],
        {
            "drain": s.message_template_drain,
            "reboot": s.message_template_reboot,
            "uncordon": s.message_template_uncordon,
            "back": s.message_template_back,
        },
        s.node_id,
        s.notify_timeout,
    )


def build_maintenance(s: Settings, session: aiohttp.ClientSession) -> MaintenanceKit:
    """The silencer and hooks around a reboot (``kured.maintenance``), on ``session``."""

    def hook(event: str, url: str, command: tuple[str, ...]) -> Hook | None:
        return Hook(session, event, url, command, s.hook_timeout) if url or command else None

    return MaintenanceKit(
        silencer=(
            Silencer(
                session,
                s.alertmanager_url,
                s.alertmanager_silence_matcher,
                s.node_id,
                s.alertmanager_timeout,
            )
            if s.alertmanager_url
            else None
        ),
        silence_duration_seconds=s.alertmanager_silence_duration,
        pre_drain=hook("pre-drain", s.pre_drain_hook_url, s.pre_drain_hook_command),
        post_uncordon=hook("post-uncordon", s.post_uncordon_hook_url, s.post_uncordon_hook_command),
    )


def build_rebooter(s: Settings) -> Rebooter:
    if s.reboot_method == "signal":
        return SignalReboot(s.reboot_signal)
    return CommandReboot(s.reboot_command, host_namespace=wants_host_namespace(s.host_namespace))


class AgentService:
    """The agent as ``kured`` runs it: built from its settings, on ``clock`` (the system's
    unless a test gives a ``kit.clock.ManualClock``: ``build_agent`` then wires the same agent on
    virtual time)."""

    def __init__(self, settings: Settings, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
        self.session: aiohttp.ClientSession | None = None
        self.api = build_api(settings)
        self.lock = build_lock(settings, self.api, self.clock)
        self.node = build_node(settings, self.api, self.clock)
        self.notifier = build_notifier(settings)
        self.sentinel = build_sentinel(settings)
        self.window = settings.window()
        self.agent: Agent | None = None
        self.collector: AgentCollector | None = None

    def gates(self, session: aiohttp.ClientSession) -> list[Gate]:
        s = self.settings
        gates: list[Gate] = []
        if s.prometheus_url:
            gates.append(
                PrometheusAlertGate(
                    session,
                    s.prometheus_url,
                    s.alert_filter_regexp,
                    s.alert_filter_match_only,
                    s.alert_firing_only,
                    s.prometheus_timeout,
                )
            )
        if s.blocking_pod_selector and self.api is not None:
            gates.append(BlockingPodGate(self.api, s.node_id, s.blocking_pod_selector))
        gates += [HttpGate(session, url, s.gate_timeout) for url in s.gate_url]
        return gates

    def build_agent(self, session: aiohttp.ClientSession) -> Agent:
        """The agent, wired from the settings (its HTTP gates on ``session``)."""
        s = self.settings
        return Agent(
            AgentConfig(
                node_id=s.node_id,
                period_seconds=s.period,
                lock_ttl_seconds=s.lock_ttl,
                lock_release_delay_seconds=s.lock_release_delay,
                max_consecutive_reboots=s.max_consecutive_reboots,
                min_reboot_interval_seconds=s.min_reboot_interval,
                force_reboot=s.force_reboot,
                drain_delay_seconds=s.drain_delay,
                reboot_delay_seconds=s.reboot_delay,
            ),
            window=self.window,
            sentinel=self.sentinel,
            gates=self.gates(session),
            lock=self.lock,
            rebooter=build_rebooter(s),
            state=StateStore(Path(s.state_dir), s.node_id),
            clock=self.clock,
            node=self.node,
            boot_id=lambda: current_boot_id(s.boot_id_file),
            notifier=self.notifier,
            deleted_holders=(
                DeletedHolders(
                    self.api, self.lock.release, s.node_id, s.deleted_node_grace, self.clock
                )
                if s.release_lock_of_deleted_nodes and self.api is not None
                else None
            ),
            maintenance=build_maintenance(s, session),
        )

    async def run(self) -> None:
        async with aiohttp.ClientSession() as session:
            self.agent = self.build_agent(session)
            self.collector = AgentCollector(self.agent)
            runner = await self._serve_http(self.agent, self.collector)
            try:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(self.agent.run())
                    tg.create_task(self._sentinel_metric_loop())
            finally:
                if self.notifier is not None:
                    await self.notifier.close()  # bounded: messages in flight may still leave
                await runner.cleanup()
                close = getattr(self.lock, "close", None)
                if close is not None:
                    await close()
                if self.api is not None:
                    await self.api.close()

    async def _sentinel_metric_loop(self) -> None:
        assert self.collector is not None
        while True:
            try:
                self.collector.reboot_required = (await self.sentinel.check())[0]
            except SensorError as exc:
                log.warning("sentinel check for the metric failed: %s", exc.message)
                self.collector.reboot_required = None
            await self.clock.sleep(SENTINEL_METRIC_SECONDS)

    async def _serve_http(self, agent: Agent, collector: AgentCollector) -> web.AppRunner:
        registry = registry_for(collector)
        description = self.window.describe()

        async def metrics(_request: web.Request) -> web.Response:
            await refresh_lock()
            return web.Response(
                body=exposition(registry),
                headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
            )

        async def refresh_lock() -> None:
            # Status and metrics follow the lock store, not the last tick (kured.lockview).
            with contextlib.suppress(LockError):  # shown as stale, with the reason and age
                await agent.lock_view.refresh(READ_TIMEOUT_SECONDS)

        async def status(_request: web.Request) -> web.Response:
            await refresh_lock()
            return web.json_response(status_of(agent, description))

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/status", status)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.settings.metrics_host or None, self.settings.metrics_port)
        await site.start()
        addr = runner.addresses[0]
        print(f"kured listening metrics=http://{addr[0]}:{addr[1]}", flush=True)
        return runner


async def run_agent(settings: Settings) -> None:
    log.info("kured starting: %s", describe(settings))
    service = AgentService(settings)
    task = asyncio.create_task(service.run())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        log.info("kured stopped")
