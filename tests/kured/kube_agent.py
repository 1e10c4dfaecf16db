"""In-process kured agents wired like ``kured.app`` does for ``--lock-backend=kubernetes``,
against the Kubernetes API double, with a fake reboot.

``KubeHost`` is one machine: its sentinel file, its state dir, its boot ID file, and a
``FakeReboot`` that records the reboot, clears the sentinel (as a boot clears /var/run) and
writes a new boot ID (as the kernel does at every boot). ``boot()`` builds a
fresh ``Agent`` on the same state dir, as the process started after a reboot would be, and runs
its start-up recovery.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from kit.clock import Clock, SystemClock
from kured.actuators.drain import DrainOptions
from kured.actuators.node import KubernetesNode, NodeOptions
from kured.apiserver import ApiServer
from kured.core.errors import RebootError
from kured.core.window import RebootWindow
from kured.locks.kubernetes import KubernetesLock
from kured.loop import Agent, AgentConfig, Gate
from kured.sensors.pods import BlockingPodGate
from kured.sensors.sentinel import CommandSentinel, FileSentinel, Sentinel
from kured.state import StateStore, current_boot_id
from tests.kured.conftest import LOCK_ANNOTATION, LOCK_DAEMONSET, LOCK_NAMESPACE


class FakeReboot:
    """A reboot that records itself and clears the sentinel, as a boot would."""

    def __init__(self, sentinel: Path, boot_id: Path) -> None:
        self.sentinel = sentinel
        self.boot_id = boot_id
        self.calls = 0
        self.at: list[float] = []  # time.monotonic() of each call
        self.happens = True  # False: the command "succeeds" but the machine stays up
        self.error = ""  # set: the command fails with this message (nothing happens)

    async def reboot(self) -> None:
        self.calls += 1
        self.at.append(time.monotonic())
        if self.error:
            raise RebootError(self.error)
        if self.happens:
            self.sentinel.unlink(missing_ok=True)
            self.boot_id.write_text(f"{uuid.uuid4()}\n")


@dataclass
class KubeHost:
    root: Path
    node_id: str
    kubeconfig: Path
    release_delay_seconds: float = 0.0
    force_reboot: bool = False
    drain: DrainOptions = field(default_factory=DrainOptions)
    node_options: NodeOptions = field(default_factory=NodeOptions)
    blocking_pod_selectors: tuple[str, ...] = ()
    concurrency: int = 1
    uncordon_backoff_initial_seconds: float = 1.0
    drain_delay_seconds: float = 0.0
    reboot_delay_seconds: float = 0.0
    sentinel_command: tuple[str, ...] = ()  # --reboot-sentinel-command; () = the file
    min_reboot_interval_seconds: float = 0.0
    clock: Clock = field(default_factory=SystemClock)
    # The drain's: the real clock unless given (the double deletes evicted pods in real time, so
    # a drain that waits for one cannot run on virtual time; one that only times out can).
    drain_clock: Clock | None = None
    apis: list[ApiServer] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.dir = self.root / self.node_id
        self.dir.mkdir(parents=True, exist_ok=True)
        self.sentinel = self.dir / "reboot-required"
        self.boot_id = self.dir / "boot_id"
        self.boot_id.write_text(f"{uuid.uuid4()}\n")
        self.rebooter = FakeReboot(self.sentinel, self.boot_id)

    def agent(self) -> Agent:
        """A new agent process for this host (not yet recovered)."""
        api = ApiServer.connect(self.kubeconfig, request_timeout_seconds=5)
        self.apis.append(api)
        gates: list[Gate] = []
        sentinel: Sentinel = (
            CommandSentinel(self.sentinel_command)
            if self.sentinel_command
            else FileSentinel(self.sentinel)
        )
        if self.blocking_pod_selectors:
            gates.append(BlockingPodGate(api, self.node_id, self.blocking_pod_selectors))
        return Agent(
            AgentConfig(
                node_id=self.node_id,
                period_seconds=3600,
                lock_ttl_seconds=0,
                lock_release_delay_seconds=self.release_delay_seconds,
                max_consecutive_reboots=3,
                force_reboot=self.force_reboot,
                uncordon_backoff_initial_seconds=self.uncordon_backoff_initial_seconds,
                drain_delay_seconds=self.drain_delay_seconds,
                reboot_delay_seconds=self.reboot_delay_seconds,
                min_reboot_interval_seconds=self.min_reboot_interval_seconds,
            ),
            window=RebootWindow(),
            sentinel=sentinel,
            gates=gates,
            lock=KubernetesLock(
                api,
                LOCK_NAMESPACE,
                LOCK_DAEMONSET,
                LOCK_ANNOTATION,
                self.concurrency,
                self.clock,
            ),
            rebooter=self.rebooter,
            state=StateStore(self.dir / "state", self.node_id),
            clock=self.clock,
            node=KubernetesNode(api, self.node_id, self.drain, self.node_options, self.drain_clock),
            boot_id=lambda: current_boot_id(self.boot_id),
        )

    async def boot(self) -> Agent:
        """Start an agent as the process does after (re)boot: recovery first."""
        agent = self.agent()
        await agent.recover()
        return agent

    async def close(self) -> None:
        for api in self.apis:
            await api.close()
