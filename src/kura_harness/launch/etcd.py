"""A real single-member etcd (Debian's ``etcd-server``) on 127.0.0.1.

``Etcd(directory).start()`` runs it with a fresh data dir under ``directory`` and waits until
``/health`` answers ``{"health":"true"}``; ``url`` is its client URL. Election and heartbeat
are shortened (50 ms, 250 ms) so a single member has a leader within a fraction of a second
instead of the default ~1 s.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from kit.wait import wait_until
from kura_harness.launch.process import (
    START_TIMEOUT_SECONDS,
    LaunchError,
    free_ports,
    get_json,
    log_tail,
    stop,
    which,
)

INSTALL_HINT = "apt-get install etcd-server (or run scripts/install-deps)"


class Etcd:
    """One etcd process. ``ports`` = (client, peer) fixes its ports; without it the OS picks
    them and a start that fails (a port taken in between) is retried ``attempts`` times with
    new ones."""

    def __init__(
        self,
        directory: Path,
        ports: tuple[int, int] | list[int] | None = None,
        name: str = "kura",
        attempts: int = 3,
        timeout: float = START_TIMEOUT_SECONDS,
    ) -> None:
        self.binary = which("etcd", INSTALL_HINT)
        self.dir = directory
        self.ports = tuple(ports) if ports is not None else None
        self.name = name
        self.attempts = attempts if ports is None else 1
        self.timeout = timeout
        self.url = ""
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Etcd:
        """Start it and wait until healthy; raises LaunchError with every attempt's log tail."""
        self.dir.mkdir(parents=True, exist_ok=True)
        tails = []
        for attempt in range(self.attempts):
            client, peer = self.ports if self.ports is not None else free_ports(2)
            self.url = f"http://127.0.0.1:{client}"
            log_path = self.dir / f"etcd-{attempt}.log"
            self.proc = self._spawn(attempt, f"http://127.0.0.1:{peer}", log_path)
            if wait_until(
                self.healthy,
                self.timeout,
                ignoring=(OSError, ValueError),
                give_up=lambda: self.proc is not None and self.proc.poll() is not None,
            ):
                return self
            stop(self.proc)
            tails.append(log_tail(log_path))
        raise LaunchError("etcd did not become healthy:\n" + "\n---\n".join(tails))

    def _spawn(self, attempt: int, peer_url: str, log_path: Path) -> subprocess.Popen[bytes]:
        with log_path.open("ab") as log:
            return subprocess.Popen(
                [
                    self.binary,
                    f"--name={self.name}",
                    f"--data-dir={self.dir / f'data-{attempt}'}",
                    f"--listen-client-urls={self.url}",
                    f"--advertise-client-urls={self.url}",
                    f"--listen-peer-urls={peer_url}",
                    f"--initial-advertise-peer-urls={peer_url}",
                    f"--initial-cluster={self.name}={peer_url}",
                    "--initial-cluster-state=new",
                    "--heartbeat-interval=50",
                    "--election-timeout=250",
                    "--log-level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def healthy(self) -> bool:
        """``/health`` answers ``{"health":"true"}`` (False when nothing answers)."""
        try:
            return bool(get_json(self.url + "/health", 1).get("health") == "true")
        except (OSError, ValueError):
            return False

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s; safe to call twice."""
        stop(self.proc, timeout=10)
