"""Helpers for ``kured doctor`` tests against the real Debian packages of this machine.

``AptTree`` is a temporary APT configuration: an ``APT_CONFIG`` file that points apt's
configuration parts (``Dir::Etc::Parts``) and main file at a temporary directory, so
``apt-config dump`` shows exactly the files the test writes, merged by apt itself, while the
package lists, sources and dpkg database stay the machine's real ones. The package caches are
switched off so apt builds them in memory and writes nothing.

Every helper fails the test (never skips it) when the real package is missing: run
``scripts/install-deps`` (it installs ``unattended-upgrades``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

UU_HOOK = Path("/etc/kernel/postinst.d/unattended-upgrades")
UU_BINARY = Path("/usr/bin/unattended-upgrade")

GOOD = """
Unattended-Upgrade::Origins-Pattern {
        "origin=Debian,codename=${distro_codename}-security,label=Debian-Security";
        "origin=Debian,codename=${distro_codename},label=Debian-Security";
};
Unattended-Upgrade::Package-Blacklist {
        "linux-";
};
"""
ENABLED = 'APT::Periodic::Update-Package-Lists "1";\nAPT::Periodic::Unattended-Upgrade "1";\n'


def require_unattended_upgrades() -> None:
    for path in (UU_HOOK, UU_BINARY):
        if not path.exists():
            pytest.fail(
                f"{path} is missing: apt-get install unattended-upgrades (scripts/install-deps)"
            )
    if shutil.which("apt-config") is None or shutil.which("apt-cache") is None:
        pytest.fail("apt-config / apt-cache are missing: these tests need Debian's apt")


class AptTree:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.parts = root / "apt.conf.d"
        self.parts.mkdir(parents=True)
        self.config = root / "apt.conf"
        self.config.write_text(
            f'Dir::Etc::Parts "{self.parts}";\n'
            f'Dir::Etc::Main "{root / "main.conf"}";\n'
            'Dir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\n'
        )
        self.write("20auto-upgrades", ENABLED)

    def write(self, name: str, text: str) -> AptTree:
        (self.parts / name).write_text(text)
        return self


def host_root(root: Path, *, hook: bool) -> Path:
    """A host tree: this machine's os-release and unattended-upgrade binary, and its
    sentinel hook only when ``hook``."""
    (root / "etc").mkdir(parents=True)
    shutil.copy("/etc/os-release", root / "etc/os-release")
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/unattended-upgrade").symlink_to(UU_BINARY)
    if hook:
        (root / "etc/kernel/postinst.d").mkdir(parents=True)
        shutil.copy2(UU_HOOK, root / "etc/kernel/postinst.d/unattended-upgrades")
    return root


def security_kernel_release() -> str:
    """The release of a kernel ABI package that Debian's security archive carries (the newest
    one apt knows), e.g. ``6.1.0-57-amd64``."""
    names = subprocess.run(
        ["apt-cache", "pkgnames", "linux-image-"], capture_output=True, text=True, check=True
    ).stdout.split()
    abi = sorted(
        (n for n in names if re.fullmatch(r"linux-image-\d+\.\d+\.\d+-\d+-amd64", n)),
        key=lambda n: [int(x) for x in re.findall(r"\d+", n)],
    )
    for name in reversed(abi):
        policy = subprocess.run(
            ["apt-cache", "policy", name], capture_output=True, text=True, check=True
        ).stdout
        if "-security" in policy:
            return name[len("linux-image-") :]
    pytest.fail("apt knows no kernel from the security archive: run apt-get update")


@pytest.fixture(scope="module")
def release() -> str:
    """A kernel release from the security archive (fails when unattended-upgrades is missing)."""
    require_unattended_upgrades()
    return security_kernel_release()


@pytest.fixture
def good_apt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``APT_CONFIG`` set to a good configuration, so a test's exit codes are its own checks'."""
    tree = AptTree(tmp_path / "apt").write("50unattended-upgrades", GOOD)
    monkeypatch.setenv("APT_CONFIG", str(tree.config))
    return tree.config


def in_process(
    capsys: pytest.CaptureFixture[str], release: str, *args: str, etcd: str | None = None
) -> tuple[int, dict[str, Any]]:
    """``kured doctor --json --node-id n1 --kernel-release <release> <args>`` in this process
    (no ``KURED_*`` environment); (exit code, parsed JSON). ``etcd``: a live etcd's URL for
    ``--etcd-endpoints`` (without it the default endpoint is dead: an ``etcd`` FAIL)."""
    from kured.doctor.command import main

    capsys.readouterr()
    lock = ["--etcd-endpoints", etcd] if etcd else []
    code = main(
        ["--json", "--node-id", "n1", "--kernel-release", release, *lock, *args], environ={}
    )
    return code, json.loads(capsys.readouterr().out)


def doctor(
    *args: str, apt_config: Path | None = None, etcd: str | None = None, **env: str
) -> tuple[int, dict[str, Any]]:
    """Run ``kured doctor --json`` as a process; (exit code, parsed JSON). ``etcd`` as for
    ``in_process``."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KURED_")}
    if apt_config is not None:
        environ["APT_CONFIG"] = str(apt_config)
    environ.update(env)
    proc = subprocess.run(
        [sys.executable, "-m", "kured.cli", "doctor", "--node-id", "n1", "--json"]
        + (["--etcd-endpoints", etcd] if etcd else [])
        + list(args),
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
    )
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def levels(report: dict[str, Any], check: str) -> list[str]:
    return [f["level"] for f in report["findings"] if f["check"] == check]


def messages(report: dict[str, Any], check: str, level: str = "FAIL") -> list[str]:
    return [f["message"] for f in report["findings"] if f["check"] == check and f["level"] == level]
