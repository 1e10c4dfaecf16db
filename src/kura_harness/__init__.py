"""The harness that runs the whole system on one machine, as processes: never loaded by a node.

* ``kura_harness.launch``: the process launchers (kura, etcd, Prometheus, SeaweedFS), standard
  library only, shared by the demo, ``kura dev``, the tests and ``bench/``.
* ``kura_harness.rolling``: ``kura demo rolling-reboot``, a rolling reboot of a live kura mesh
  coordinated by kured agents, with real load and real build tools throughout. The same code runs
  the user command and the e2e test (tests/e2e/test_rolling_reboot.py).
* ``kura_harness.devmesh``: ``kura dev --nodes N``, a local mesh for development.

It starts kura and kured as subprocesses and imports neither (import-linter contracts in
pyproject.toml); ``kura.cli`` imports it inside ``kura demo`` and ``kura dev`` only, so the
serving package (``src/kura``) does not carry it.
"""
