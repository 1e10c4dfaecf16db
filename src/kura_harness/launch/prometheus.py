"""A real Prometheus (Debian's ``prometheus``) on 127.0.0.1.

It scrapes and evaluates every second, loads the given rule files, and scrapes the given
static jobs. ``start()`` waits until ``/-/ready`` answers 200: a rule file it cannot load makes
it exit, which ``start()`` reports with the log's tail.
"""

from __future__ import annotations

import subprocess
import urllib.parse
from collections.abc import Mapping, Sequence
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

INSTALL_HINT = "apt-get install prometheus (or run scripts/install-deps)"


class Prometheus:
    """One Prometheus process. ``scrape_jobs`` maps a job name to ``host:port`` targets;
    ``port`` fixes its port (else the OS picks one); ``extra_args`` are further flags (e.g.
    ``--storage.tsdb.retention.time=7d``)."""

    def __init__(
        self,
        directory: Path,
        rule_files: Sequence[Path] = (),
        scrape_jobs: Mapping[str, Sequence[str]] | None = None,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        timeout: float = START_TIMEOUT_SECONDS,
    ) -> None:
        self.binary = which("prometheus", INSTALL_HINT)
        self.dir = directory
        self.rule_files = list(rule_files)
        self.scrape_jobs = {k: list(v) for k, v in (scrape_jobs or {}).items()}
        self.port = port if port is not None else free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra_args = list(extra_args)
        self.timeout = timeout
        self.log_path = directory / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def config_text(self) -> str:
        """prometheus.yml: 1 s scrape and evaluation, the rule files, one static job each."""
        rules = "".join(f"  - '{p}'\n" for p in self.rule_files)
        text = (
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
            f"rule_files:\n{rules}"
        )
        if self.scrape_jobs:
            text += "scrape_configs:\n"
            for job, targets in self.scrape_jobs.items():
                listed = "[" + ", ".join(f"'{t}'" for t in targets) + "]"
                text += f"  - job_name: {job}\n    static_configs:\n      - targets: {listed}\n"
        return text

    def start(self) -> Prometheus:
        """Start it and wait until ready; raises LaunchError when it exits or times out."""
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "prometheus.yml").write_text(self.config_text())
        self.proc = spawn_until_ready(
            [
                self.binary,
                f"--config.file={self.dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
                *self.extra_args,
            ],
            self.log_path,
            self.url + "/-/ready",
            self.timeout,
            "prometheus (a rule file it cannot load?)",
        )
        return self

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The ``result`` list of an instant query; raises OSError/ValueError on failure."""
        q = urllib.parse.quote(promql)
        data = get_json(f"{self.url}/api/v1/query?query={q}")
        return list(data["data"]["result"])

    def firing(self) -> list[str]:
        """Sorted names of the alerts firing now (one entry per firing series)."""
        return sorted(
            s["metric"]["alertname"]
            for s in self.query("ALERTS")
            if s["metric"].get("alertstate") == "firing"
        )

    def rules(self) -> list[dict[str, Any]]:
        """Every loaded rule as {group, name, health, lastError}."""
        data = get_json(self.url + "/api/v1/rules")
        return [
            {
                "group": g["name"],
                "name": r.get("name", ""),
                "health": r.get("health", ""),
                "lastError": r.get("lastError", ""),
            }
            for g in data["data"]["groups"]
            for r in g["rules"]
        ]

    def targets(self) -> list[dict[str, Any]]:
        """Every active target as {job, url, health}."""
        data = get_json(self.url + "/api/v1/targets")
        return [
            {"job": t["labels"].get("job", ""), "url": t["scrapeUrl"], "health": t["health"]}
            for t in data["data"]["activeTargets"]
        ]

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 20 s; safe to call twice."""
        stop(self.proc, timeout=20)
