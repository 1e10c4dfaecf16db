"""``kured doctor`` against the real Debian packages of this machine (issue 15, Must show):
``unattended-upgrades`` installed, its real kernel hook, the real package lists and
``apt-config``/``apt-cache``; temporary ``APT_CONFIG`` trees for a good configuration and for
each bad one. The doctor answers OK for the good one, then FAIL with the right line for each
bad one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kured.doctor_host import (
    GOOD,
    AptTree,
    doctor,
    host_root,
    levels,
    messages,
    release,
)

# pytest finds fixtures by name in the module.
__all__ = ["release"]


def test_a_good_configuration_is_ok_for_sentinel_apt_and_kernel(
    tmp_path: Path, release: str, etcd: str
) -> None:
    tree = AptTree(tmp_path / "apt").write("50unattended-upgrades", GOOD)
    code, report = doctor("--kernel-release", release, apt_config=tree.config, etcd=etcd)
    assert levels(report, "sentinel") == ["OK"], report
    assert levels(report, "apt") == ["OK", "OK"], report
    assert levels(report, "kernel") == ["OK"], report
    sentinel = report["findings"][0]["message"]
    assert "/etc/kernel/postinst.d/unattended-upgrades (owned by package unattended-upgrades)" in (
        sentinel
    )
    assert code == 0, report  # the lock WARNs of the defaults do not fail a run


@pytest.mark.parametrize(
    "wide",
    [
        'Unattended-Upgrade::Origins-Pattern { "origin=*"; };',
        'Unattended-Upgrade::Origins-Pattern { "origin=Debian,codename=${distro_codename},'
        'label=Debian"; };',
        'Unattended-Upgrade::Allowed-Origins { "${distro_id}:${distro_codename}"; };',
    ],
    ids=["every-origin", "debian-default-main", "legacy-allowed-origins"],
)
def test_origins_beyond_security_fail_even_when_a_later_file_adds_them(
    tmp_path: Path, release: str, wide: str
) -> None:
    # 50 is good on its own; 99 widens it. Only the merged configuration shows that.
    tree = AptTree(tmp_path / "apt").write("50unattended-upgrades", GOOD)
    tree.write("99local", wide + "\n")
    code, report = doctor("--kernel-release", release, apt_config=tree.config)
    assert code == 1
    [line] = messages(report, "apt")
    assert line.startswith("unattended-upgrades is not limited to security origins: ")
    assert "read from apt-config dump" in line
    entry = wide.split("{")[1].split(";")[0].strip().strip('"')
    assert entry in line, line
    assert levels(report, "sentinel") == ["OK"]


def test_a_kernel_not_blacklisted_fails_in_apt_and_kernel(tmp_path: Path, release: str) -> None:
    tree = AptTree(tmp_path / "apt").write(
        "50unattended-upgrades", GOOD.replace('"linux-";', '"firefox-esr";')
    )
    code, report = doctor("--kernel-release", release, apt_config=tree.config)
    assert code == 1
    [line] = messages(report, "apt")
    assert line.startswith(
        f"the kernel is not blacklisted: unattended-upgrades would install linux-image-{release}"
    )
    [origin] = messages(report, "kernel")
    assert origin.startswith(f"the running kernel {release} comes from an allowed origin: ")
    assert "l=Debian-Security" in origin


def test_no_sentinel_creator_fails_and_the_kernel_sentinel_fixes_it(
    tmp_path: Path, release: str, etcd: str
) -> None:
    tree = AptTree(tmp_path / "apt").write("50unattended-upgrades", GOOD)
    bare = host_root(tmp_path / "host", hook=False)
    code, report = doctor(
        "--kernel-release", release, "--host-root", str(bare), apt_config=tree.config, etcd=etcd
    )
    assert code == 1
    [line] = messages(report, "sentinel")
    assert line.startswith("nothing on this host writes /var/run/reboot-required: no ")
    assert levels(report, "apt") == ["OK", "OK"]
    # The same host with the real package's hook in place: OK again.
    hooked = host_root(tmp_path / "hooked", hook=True)
    code, report = doctor(
        "--kernel-release", release, "--host-root", str(hooked), apt_config=tree.config, etcd=etcd
    )
    assert levels(report, "sentinel") == ["OK"], report
    assert code == 0
    # No hook, but --reboot-sentinel-kernel with an installed kernel: OK.
    (bare / "lib/modules" / release).mkdir(parents=True)
    code, report = doctor(
        "--kernel-release",
        release,
        "--host-root",
        str(bare),
        "--reboot-sentinel-kernel",
        apt_config=tree.config,
        etcd=etcd,
    )
    assert levels(report, "sentinel") == ["OK"], report
    assert code == 0


def test_unattended_upgrades_switched_off_is_a_warning(
    tmp_path: Path, release: str, etcd: str
) -> None:
    tree = AptTree(tmp_path / "apt").write("50unattended-upgrades", GOOD)
    tree.write("20auto-upgrades", 'APT::Periodic::Unattended-Upgrade "0";\n')
    code, report = doctor("--kernel-release", release, apt_config=tree.config, etcd=etcd)
    assert levels(report, "apt") == ["WARN", "OK", "OK"], report
    assert code == 0
