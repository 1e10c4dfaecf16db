"""A real Alertmanager (Debian's ``prometheus-alertmanager``) on 127.0.0.1.

One receiver that sends nothing, clustering off (no gossip port), its data under the given
directory. ``start()`` waits until ``/-/ready`` answers 200 and reports an exit with the log's
tail. ``silences()`` reads its API v2 (``GET /api/v2/silences``), the one kured writes to.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from kura_harness.launch.process import (
    START_TIMEOUT_SECONDS,
    free_port,
    get_json,
    spawn_until_ready,
    stop,
    which,
)

BINARY = "prometheus-alertmanager"  # Debian's name for alertmanager
INSTALL_HINT = "apt-get install prometheus-alertmanager (or run scripts/install-deps)"
CONFIG = """route:
  receiver: nowhere
receivers:
  - name: nowhere
"""


class Alertmanager:
    """One Alertmanager process; ``port`` fixes its port (else the OS picks one)."""

    def __init__(
        self, directory: Path, port: int | None = None, timeout: float = START_TIMEOUT_SECONDS
    ) -> None:
        self.binary = which(BINARY, INSTALL_HINT)
        self.dir = directory
        self.port = port if port is not None else free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.timeout = timeout
        self.log_path = directory / "alertmanager.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Alertmanager:
        """Start it and wait until ready; raises LaunchError when it exits or times out."""
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "alertmanager.yml").write_text(CONFIG)
        self.proc = spawn_until_ready(
            [
                self.binary,
                f"--config.file={self.dir / 'alertmanager.yml'}",
                f"--storage.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address=",  # no gossip: a single instance
                "--log.level=warn",
            ],
            self.log_path,
            self.url + "/-/ready",
            self.timeout,
            "alertmanager",
        )
        return self

    def silences(self) -> list[dict[str, Any]]:
        """Every silence it knows (active, pending and expired), as API v2 returns them."""
        return list(get_json(self.url + "/api/v2/silences"))

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 20 s; safe to call twice."""
        stop(self.proc, timeout=20)
