"""The container image, built for real by ``./dev image`` and run with podman.

The module's fixture runs the build command (``scripts/build-image``: mmdebstrap base, host-built
wheels, ``podman build``; a warm build reuses the day's base and takes seconds). Then each test
runs a container from ``localhost/kura:VERSION`` through ``scripts/podman`` (the runtime flags
this machine needs): the programs and the unprivileged user are there, a public bind without peer
credentials is refused, and a container serving on a published port gives real ccache on the host
a remote hit, stores the artifacts on its volume as uid 10001 and stops cleanly on SIGTERM. Every
container is removed when its test ends, passed or failed. A missing podman, runc or mmdebstrap
fails the build (scripts/install-deps installs them); nothing here skips.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kit.wait import wait_until
from kura import __version__
from kura_harness.launch.process import free_ports
from tests import oneshot

ROOT = Path(__file__).resolve().parents[2]
PODMAN = ROOT / "scripts" / "podman"
CCACHE_SH = ROOT / "tests" / "clients" / "ccache.sh"
IMAGE = f"localhost/kura:{__version__}"
UID = "10001"
# A cold build (mmdebstrap, every dependency's wheel) took 2-3.5 min here under load; warm ~15 s.
BUILD_TIMEOUT_SECONDS = 900.0
READY_TIMEOUT_SECONDS = 60.0

pytestmark = [pytest.mark.slow, pytest.mark.timeout(BUILD_TIMEOUT_SECONDS + 300)]


def podman(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """``scripts/podman ARGS`` with its output captured (never raises on a non-zero status)."""
    return subprocess.run(
        [str(PODMAN), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def image() -> str:
    """Build the image with the documented command and return its tag."""
    assert shutil.which("podman"), "podman is not installed: run scripts/install-deps"
    started = time.monotonic()
    build = subprocess.run(
        [str(ROOT / "dev"), "image"],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_SECONDS,
        check=False,
    )
    seconds = time.monotonic() - started
    assert build.returncode == 0, (
        f"./dev image failed after {seconds:.0f}s:\n{build.stdout}\n{build.stderr}"
    )
    assert re.search(rf"^build-image: \[ *\d+s\] OK {re.escape(IMAGE)} ", build.stdout, re.M), (
        build.stdout
    )
    print(f"./dev image: {seconds:.1f}s\n{build.stdout}")
    return IMAGE


@pytest.fixture
def container_name() -> Iterator[str]:
    """A unique container name; the container (and its anonymous volume) is removed afterwards."""
    name = f"kura-test-{secrets.token_hex(4)}"
    yield name
    podman("rm", "--force", "--volumes", "--time", "5", name)
    assert podman("container", "exists", name).returncode == 1, f"container {name} was left behind"


def test_kured_and_kura_run_in_the_image(image: str) -> None:
    kured = podman("run", "--rm", "--network", "none", image, "kured", "--version")
    assert kured.returncode == 0, kured.stderr
    assert kured.stdout.strip() == f"kured {__version__}"
    kura = podman("run", "--rm", "--network", "none", image, "kura", "--help")
    assert kura.returncode == 0, kura.stderr
    assert "serve" in kura.stdout


def test_the_image_runs_as_uid_10001_with_its_volume(image: str) -> None:
    # nsenter (util-linux) too: kured's --reboot-method=command runs the reboot through it.
    script = (
        "id -u; id -g; for c in kura kured nsenter; do command -v $c; done; "
        "stat -c %u:%g /var/lib/kura; "
        "touch /var/lib/kura/probe"
    )
    run = podman("run", "--rm", "--network", "none", image, "sh", "-c", script)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [
        UID,
        UID,
        "/opt/kura/bin/kura",
        "/opt/kura/bin/kured",
        "/usr/bin/nsenter",
        f"{UID}:{UID}",
    ]
    fmt = "{{.Config.User}}|{{json .Config.Cmd}}|{{json .Config.ExposedPorts}}|{{json .Config.Volumes}}"
    inspect = podman("image", "inspect", "--format", fmt, image)
    assert inspect.returncode == 0, inspect.stderr
    user, cmd, ports, volumes = inspect.stdout.strip().split("|")
    assert user == f"{UID}:{UID}"
    assert json.loads(cmd) == ["kura", "serve"]
    assert set(json.loads(ports)) == {"4000/tcp", "4100/tcp"}
    assert set(json.loads(volumes)) == {"/var/lib/kura"}


def test_a_public_bind_without_peer_credentials_is_refused(image: str) -> None:
    """The image listens on 0.0.0.0, so kura's rule applies: no peer token, no start (exit 2)."""
    run = podman("run", "--rm", "--network", "none", image)
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert "KURA_INTERNAL_TOKENS" in run.stderr


def _logs(name: str) -> str:
    """The container's output, stdout and stderr, for failure messages."""
    logs = podman("logs", name)
    return logs.stdout + logs.stderr


def _samples(text: str) -> dict[str, float]:
    """A Prometheus text exposition as ``{"name{labels}": value}``."""
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def _ready(url: str) -> bool:
    return oneshot.get(url + "/ready", timeout=5).status_code == 200


def _wait_ready(url: str, name: str) -> None:

    def ready() -> bool:
        try:
            return _ready(url)
        except httpx.HTTPError:
            state = podman("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
            assert state == "running", f"container {state}:\n{_logs(name)}"
            return False

    if wait_until(ready, READY_TIMEOUT_SECONDS, interval=0.2):
        return
    pytest.fail(f"{url}/ready not 200 in {READY_TIMEOUT_SECONDS:.0f}s:\n{_logs(name)}")


def test_ccache_on_the_host_gets_a_remote_hit_from_a_container(
    image: str, container_name: str
) -> None:
    (port,) = free_ports(1)
    started = podman(
        "run",
        "--detach",
        "--name",
        container_name,
        "--publish",
        f"127.0.0.1:{port}:4000",
        "--env",
        f"KURA_INTERNAL_TOKENS={secrets.token_hex(32)}",
        image,
    )
    assert started.returncode == 0, started.stderr
    url = f"http://127.0.0.1:{port}"
    _wait_ready(url, container_name)

    env = {k: v for k, v in os.environ.items() if k not in ("TOKEN", "CLIENT_CONFIG")}
    env.update(PREFIX="/cache", LAYOUT="subdirs")
    ccache = subprocess.run(
        ["bash", str(CCACHE_SH), url],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ccache.returncode == 0, f"{ccache.stdout}\n--- kura ---\n{_logs(container_name)}"
    assert "REMOTE HIT (ccache" in ccache.stdout

    # The hit was this container's: it stored ccache's two objects (manifest and result) and
    # answered both reads of the second compile, and what it wrote on its volume is uid 10001's.
    metrics = _samples(oneshot.get(url + "/metrics", timeout=10).text)
    assert metrics["kura_storage_artifacts"] == 2
    assert metrics['kura_cache_lookups_total{protocol="http_cache",result="hit"}'] >= 2
    owners = podman("exec", container_name, "find", "/var/lib/kura", "-printf", "%u\n")
    assert owners.returncode == 0, owners.stderr
    assert len(owners.stdout.split()) > 3
    assert set(owners.stdout.split()) == {"kura"}

    # kura is PID 1 in the container: SIGTERM (podman stop) must stop it cleanly, not time out.
    stop_started = time.monotonic()
    stopped = podman("stop", "--time", "30", container_name, timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    assert time.monotonic() - stop_started < 30, "kura ignored SIGTERM and was killed"
    code = podman("inspect", "--format", "{{.State.ExitCode}}", container_name).stdout.strip()
    assert code == "0", _logs(container_name)
