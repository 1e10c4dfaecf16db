"""A real Prometheus (Debian ``prometheus``) for tests: started on a free 127.0.0.1 port with
rule files the test gives, evaluating every second; ``extra_args`` are further command-line
flags (e.g. ``--storage.tsdb.retention.time=7d``)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    def __init__(
        self,
        root: Path,
        rules: str,
        scrape_targets: list[str] | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("prometheus is not installed (scripts/install-deps installs it)")
        root.mkdir(parents=True, exist_ok=True)
        (root / "rules.yml").write_text(rules)
        targets = ", ".join(f"'{t}'" for t in scrape_targets or [])
        scrape = (
            f"scrape_configs:\n  - job_name: targets\n    static_configs:\n"
            f"      - targets: [{targets}]\n"
            if scrape_targets
            else ""
        )
        (root / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            f"rule_files:\n  - {root / 'rules.yml'}\n{scrape}"
        )
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (root / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={root / 'prometheus.yml'}",
                f"--storage.tsdb.path={root / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                *extra_args,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/-/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("prometheus did not become ready")

    def firing(self) -> list[str]:
        r = httpx.get(self.url + "/api/v1/query", params={"query": "ALERTS"}, timeout=5).json()
        return sorted(
            s["metric"]["alertname"]
            for s in r["data"]["result"]
            if s["metric"].get("alertstate") == "firing"
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


ALWAYS_FIRING = """groups:
  - name: test
    rules:
      - alert: NodeDiskPressure
        expr: vector(1)
        for: 0s
"""
