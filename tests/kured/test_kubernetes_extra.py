"""The Kubernetes client is an install extra (``kura-cache[kubernetes]``): the base install runs
``kura serve`` and ``kured`` on etcd without it, and choosing a Kubernetes backend without it
exits non-zero with a message naming ``pip install '.[kubernetes]'``.

The venv has the extra (the ``dev`` extra pulls it in), so its absence is simulated: each
program runs under ``python -c`` with a ``sys.meta_path`` finder in front that refuses
``kubernetes`` and every submodule, as an interpreter without the package would. An import of
it anywhere on these paths then fails the start, so a regression cannot pass silently.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kura_harness.launch.node import KURA_LISTEN, KURED_LISTEN, kura_env, kured_env
from kura_harness.launch.process import spawn_until_line, stop
from tests import oneshot

WITHOUT_KUBERNETES = """
import runpy, sys

class NoKubernetes:
    def find_spec(self, name, path=None, target=None):
        if name == "kubernetes" or name.startswith("kubernetes."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoKubernetes())
program = sys.argv[1]
sys.argv = [program, *sys.argv[2:]]
runpy.run_module(program + ".cli", run_name="__main__", alter_sys=True)
"""


def without_kubernetes(program: str, *args: str) -> list[str]:
    """argv that runs ``program`` (``kura`` or ``kured``) with ``kubernetes`` unimportable."""
    return [sys.executable, "-c", WITHOUT_KUBERNETES, program, *args]


def kured_flags(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "--node-id=n1",
        f"--reboot-sentinel={tmp_path / 'reboot-required'}",
        "--reboot-command=/bin/true",
        f"--state-dir={tmp_path / 'state'}",
        "--metrics-host=127.0.0.1",
        "--metrics-port=0",
        *extra,
    ]


def test_the_base_modules_do_not_import_kubernetes() -> None:
    code = (
        "import sys\n"
        "import kura.cli, kura.app, kured.cli, kured.app, kured.loop, kured.locks.etcd\n"
        "import kured.locks.fleetlock, kured.apiserver, kured.actuators.drain\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'kubernetes'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


def test_the_blocker_really_blocks_kubernetes() -> None:
    """The simulation itself: with the finder in place, the client does not import."""
    code = WITHOUT_KUBERNETES.split("program = ")[0] + "import kubernetes.client\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "No module named 'kubernetes" in out.stderr, out.stderr


def test_kured_on_etcd_starts_and_serves_metrics_without_kubernetes(
    etcd: str, tmp_path: Path
) -> None:
    started = spawn_until_line(
        without_kubernetes("kured", *kured_flags(tmp_path, f"--etcd-endpoints={etcd}")),
        kured_env(),
        tmp_path / "kured.log",
        KURED_LISTEN,
        "kured without kubernetes",
    )
    try:
        metrics = oneshot.get(started.match.group(1) + "/metrics", timeout=10)
        assert metrics.status_code == 200
        assert "kured_reboot_required" in metrics.text
        assert started.proc.poll() is None, (tmp_path / "kured.log").read_text()
    finally:
        assert stop(started.proc, timeout=20) == 0, (tmp_path / "kured.log").read_text()


def test_kura_serve_starts_and_stores_without_kubernetes(tmp_path: Path) -> None:
    started = spawn_until_line(
        without_kubernetes("kura", "serve"),
        kura_env(tmp_path / "data", tmp_path / "tmp"),
        tmp_path / "kura.log",
        KURA_LISTEN,
        "kura without kubernetes",
    )
    try:
        url = started.match.group(1)
        assert oneshot.put(url + "/cache/k", content=b"body", timeout=10).status_code in (200, 201)
        got = oneshot.get(url + "/cache/k", timeout=10)
        assert (got.status_code, got.content) == (200, b"body")
    finally:
        assert stop(started.proc, timeout=30) == 0, (tmp_path / "kura.log").read_text()


def test_a_kubernetes_backend_without_the_client_exits_naming_the_extra(tmp_path: Path) -> None:
    for backend in ("lease", "kubernetes"):
        out = subprocess.run(
            without_kubernetes("kured", *kured_flags(tmp_path, f"--lock-backend={backend}")),
            env=kured_env(),
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        assert out.returncode != 0, (backend, out.stderr)
        assert "`pip install '.[kubernetes]'` in the kura checkout" in out.stderr, (
            backend,
            out.stderr,
        )
        assert "Traceback" not in out.stderr, (backend, out.stderr)
        assert not KURED_LISTEN.search(out.stdout), (backend, out.stdout)
