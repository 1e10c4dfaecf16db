"""The running kernel and APT: which package it is, where that package comes from, and whether
unattended-upgrades would replace it on its own (``kured doctor``'s ``apt`` and ``kernel``
checks; the rules are in ``kured.doctor.apt``).

* The running kernel is ``--kernel-release`` (default: ``uname -r``).
* Its package is the one ``dpkg-query -S /boot/vmlinuz-<release>`` names (on the host itself),
  else Debian's and Ubuntu's naming, ``linux-image-<release>``. Its metapackage (the one that
  pulls each new ABI: ``linux-image-amd64``, ``linux-image-cloud-amd64``,
  ``linux-image-generic``) is ``linux-image-<flavour>``, the release after its numeric parts,
  counted only when APT knows it.
* Its origins are the APT sources of its versions in ``apt-cache policy <package>``, resolved
  to their Release fields through ``apt-cache policy``'s ``release`` lines. The dpkg status
  file (``/var/lib/dpkg/status``, the local "now" origin) is not a source.

A kernel from an allowed origin that the blacklist does not cover is a FAIL: unattended-upgrades
installs it overnight on every node, and every node asks for a reboot at once.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from kured.doctor import apt
from kured.doctor.finding import Finding, Report, fail, ok
from kured.doctor.process import run

CHECK = "kernel"
MAX_SHOWN = 3  # origins named in one finding
_PACKAGE = re.compile(r"^(\S+):$")
_SOURCE = re.compile(r"^\s+-?\d+ (\S.* Packages)$")


def flavour(release: str) -> str:
    """``6.1.0-25-cloud-amd64`` → ``cloud-amd64``; ``5.15.0-91-generic`` → ``generic``;
    ``''`` when nothing follows the numeric parts."""
    parts = release.split("-")
    while parts and parts[0][:1].isdigit():
        parts.pop(0)
    return "-".join(parts)


def package_sources(policy: str) -> dict[str, list[str]]:
    """``apt-cache policy <pkg>...`` → {package: [source line of each version]} (packages APT
    does not know are absent)."""
    out: dict[str, list[str]] = {}
    current = None
    for line in policy.splitlines():
        head = _PACKAGE.match(line)
        if head:
            current = head.group(1)
            out[current] = []
            continue
        source = _SOURCE.match(line)
        if current and source:
            out[current].append(source.group(1))
    return out


async def kernel_package(release: str, host_root: Path) -> str:
    if host_root == Path("/"):
        result = await run(["dpkg-query", "-S", f"/boot/vmlinuz-{release}"], timeout_seconds=30)
        if result.returncode == 0 and ":" in result.stdout:
            return result.stdout.split(": ", 1)[0].split(":")[0].strip()
    return f"linux-image-{release}"


async def check_apt(report: Report, host_root: Path, kernel_release: str) -> None:
    """Add the ``apt`` and ``kernel`` findings to ``report`` (or skip them when this host has
    no APT)."""
    dump = await run(["apt-config", "dump"])
    if dump.returncode is None:
        report.skip("apt", f"no APT on this host ({dump.error})")
        return
    if dump.returncode != 0:
        report.add(
            [
                fail(
                    "apt",
                    f"apt-config dump failed: {dump.stderr[-300:]}",
                    "fix the APT configuration it names (apt-config dump must succeed).",
                )
            ]
        )
        return
    config = apt.AptConfig(dump.stdout)
    try:
        os_release = (host_root / "etc/os-release").read_text()
    except OSError:
        try:
            os_release = (host_root / "usr/lib/os-release").read_text()
        except OSError:
            os_release = ""
    distro_id, codename = apt.distro(os_release)
    package = await kernel_package(kernel_release, host_root)
    names = [package]
    if flavour(kernel_release):
        names.append(f"linux-image-{flavour(kernel_release)}")
    # Each apt-cache builds its cache from the lists (seconds, without a pkgcache): both at once.
    policy, per_package = await asyncio.gather(
        run(["apt-cache", "policy"]), run(["apt-cache", "policy", *names])
    )
    known = apt.parse_policy(policy.stdout) if policy.returncode == 0 else {}
    sources = package_sources(per_package.stdout) if per_package.returncode == 0 else {}
    kernel_packages = [n for n in names if n in sources] or [package]
    findings = apt.check_unattended_upgrades(
        config, known, distro_id, codename, kernel_packages, host_root
    )
    report.add(findings)
    if len(findings) == 1 and "not installed" in findings[0].message:
        report.skip(CHECK, "unattended-upgrades is not installed: it replaces no kernel")
        return
    report.add([kernel_origin(config, known, distro_id, codename, kernel_release, sources)])


def kernel_origin(
    config: apt.AptConfig,
    known: dict[str, apt.Origin],
    distro_id: str,
    codename: str,
    release: str,
    sources: dict[str, list[str]],
) -> Finding:
    """The ``kernel`` finding: is any origin of the kernel's packages allowed, unblacklisted?"""
    patterns = apt.allowed_patterns(config, distro_id, codename)
    blacklist = config.values("Unattended-Upgrade::Package-Blacklist")
    allowed: list[str] = []
    origins: list[str] = []
    for package, lines in sources.items():
        for line in lines:
            origin = known.get(line)
            if origin is None:
                continue
            origins.append(f"{package} from {origin.text()}")
            for where, pattern in patterns:
                try:
                    hit = apt.matches(pattern, origin)
                except ValueError:
                    continue
                if hit and apt.blacklisted(package, blacklist) is None:
                    allowed.append(f"{package} from {origin.text()} (allowed by {where})")
                    break
    if allowed:
        return fail(
            CHECK,
            f"the running kernel {release} comes from an allowed origin: "
            + "; ".join(list(dict.fromkeys(allowed))[:MAX_SHOWN])
            + ". unattended-upgrades installs new kernels on its own, on every node the same "
            "night.",
            'blacklist the kernel (Unattended-Upgrade::Package-Blacklist { "linux-"; };) or '
            "take its origin out of Allowed-Origins/Origins-Pattern.",
        )
    if not origins:
        return ok(
            CHECK,
            f"the running kernel {release} comes from no APT source (apt-cache policy "
            f"{' '.join(sources) or 'linux-image-' + release}): unattended-upgrades cannot "
            "replace it",
        )
    return ok(
        CHECK,
        f"the running kernel {release} is not upgraded by unattended-upgrades (its origins "
        f"are not allowed, or it is blacklisted): "
        + "; ".join(list(dict.fromkeys(origins))[:MAX_SHOWN]),
    )
