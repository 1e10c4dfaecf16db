"""The external tmp-dir sampler: a thread that measures every host's tmp dir from outside the
nodes, every few milliseconds.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


def dir_bytes(path: Path) -> int:
    """Apparent size of every file under ``path`` (0 when it does not exist)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                continue
    return total


class TmpSampler:
    """A thread that samples every host's tmp dir size every ``interval`` seconds; keeps the
    peak per host for the whole run and for each open window."""

    def __init__(self, dirs: dict[str, Path], interval: float = 0.005) -> None:
        self.dirs = dirs
        self.interval = interval
        self.peaks: dict[str, int] = dict.fromkeys(dirs, 0)
        self.samples = 0
        self._windows: dict[int, dict[str, int]] = {}
        self._next = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="tmp sampler")

    def start(self) -> None:
        self._thread.start()

    def _sample(self) -> None:
        sizes = {name: dir_bytes(path) for name, path in self.dirs.items()}
        with self._lock:
            self.samples += 1
            for name, size in sizes.items():
                self.peaks[name] = max(self.peaks[name], size)
                for window in self._windows.values():
                    window[name] = max(window[name], size)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def open_window(self) -> int:
        with self._lock:
            self._next += 1
            self._windows[self._next] = dict.fromkeys(self.dirs, 0)
            return self._next

    def close_window(self, key: int) -> dict[str, int]:
        self._sample()  # one sample at the very end of the window too
        with self._lock:
            return self._windows.pop(key)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
