"""A real Prometheus (Debian ``prometheus``) for tests: started on a free 127.0.0.1 port with
rule files the test gives, evaluating every second; ``extra_args`` are further command-line
flags (e.g. ``--storage.tsdb.retention.time=7d``). The process is run by
``kura_harness.launch.prometheus``, the launcher ``kura demo rolling-reboot`` uses too."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kura_harness.launch import prometheus
from kura_harness.launch.process import free_port

__all__ = ["ALWAYS_FIRING", "Prometheus", "free_port"]


class Prometheus(prometheus.Prometheus):
    """Started at construction with ``rules`` (rule file text) and ``scrape_targets`` (one job,
    ``targets``); raises RuntimeError (``LaunchError``) when it is missing or does not start."""

    def __init__(
        self,
        root: Path,
        rules: str,
        scrape_targets: list[str] | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        root.mkdir(parents=True, exist_ok=True)
        (root / "rules.yml").write_text(rules)
        super().__init__(
            root,
            [root / "rules.yml"],
            {"targets": scrape_targets} if scrape_targets else None,
            extra_args=extra_args,
        )
        self.start()


ALWAYS_FIRING = """groups:
  - name: test
    rules:
      - alert: NodeDiskPressure
        expr: vector(1)
        for: 0s
"""
