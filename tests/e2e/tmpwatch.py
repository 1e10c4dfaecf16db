"""An external watcher of a directory's on-disk size: a thread that samples every few ms."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from kura_harness.rolling.sampler import dir_bytes

__all__ = ["TmpWatcher", "dir_bytes"]


class TmpWatcher:
    """Samples ``dir_bytes(path)`` every ``interval`` seconds; ``peak`` is the largest seen."""

    def __init__(self, path: Path, interval: float = 0.002) -> None:
        self.path = path
        self.interval = interval
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, dir_bytes(self.path))
            self.samples += 1
            time.sleep(self.interval)

    def __enter__(self) -> TmpWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
