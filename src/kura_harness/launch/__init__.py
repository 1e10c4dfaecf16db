"""Process launchers for real servers on 127.0.0.1: kura nodes, kured agents, etcd, Prometheus,
Alertmanager (``alertmanager``: kured's silences),
SeaweedFS (the object-storage tier's S3 store, ``seaweedfs``).

One place for starting, waiting until ready and stopping these processes, shared by
``kura demo rolling-reboot`` (``kura_harness.rolling``), the tests (``tests/conftest.py``,
``tests/e2e/mesh.py``, ``tests/kured``) and the benchmarks (``bench/``). Standard library only
(no aiohttp, no httpx), so every caller can use it whatever its own HTTP client.

Every launcher raises ``LaunchError`` (with the tail of the process's log) when its process
exits or times out before it is ready, and leaves no process behind in that case.
"""

from kura_harness.launch.process import LaunchError

__all__ = ["LaunchError"]
