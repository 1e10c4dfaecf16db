"""Can anything on this host create the sentinel? (``kured doctor``'s ``sentinel`` check)

kured reboots only when its sentinel says so. A node where nothing ever writes the sentinel
looks healthy for ever and is never patched (the home-lab report behind
``--reboot-sentinel-kernel``: no package wrote the file at all). One of these must hold:

* ``--reboot-sentinel-command``: the command runs (through kured's own ``CommandSentinel``) and
  exits 0 (reboot needed) or 1 (not needed). 126/127 or a failure to start is a FAIL (kured
  #976: ``sh -c "! needs-restarting"`` without the tool rebooted hourly); any other status is a
  WARN, because kured reads it as "not needed", so a command that errors reads as "never";
* ``--reboot-sentinel-kernel``: kernels are found under ``/lib/modules`` or ``/boot``;
* the file sentinel is the Debian/Ubuntu ``/var/run/reboot-required`` (``/run/…``) and a
  package hook that writes it is present and executable: Debian's unattended-upgrades ships
  ``/etc/kernel/postinst.d/unattended-upgrades`` (it touches the file when a kernel is
  installed); Ubuntu's update-notifier-common ships ``/etc/kernel/postinst.d/update-notifier``
  and ``/usr/share/update-notifier/notify-reboot-required`` (packages call it from their
  maintainer scripts). Hooks in ``/etc`` are conffiles and outlive a removed package, so the
  file is what counts; its owner is named through ``dpkg-query -S`` when ``--host-root`` is
  ``/``.

Files are read under ``--host-root`` (``/`` on the node itself; e.g. ``/host`` in a pod that
mounts the host's root there).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from kured.core.errors import SensorError
from kured.doctor.finding import Finding, fail, ok, warn
from kured.doctor.process import run
from kured.sensors.sentinel import CommandSentinel, KernelSentinel
from kured.settings import Settings

CHECK = "sentinel"
DEBIAN_SENTINELS = (Path("/var/run/reboot-required"), Path("/run/reboot-required"))
# (path under the host root, the package that ships it)
SENTINEL_HOOKS = (
    (Path("etc/kernel/postinst.d/unattended-upgrades"), "unattended-upgrades"),
    (Path("etc/kernel/postinst.d/update-notifier"), "update-notifier-common"),
    (Path("usr/share/update-notifier/notify-reboot-required"), "update-notifier-common"),
)


def _under(root: Path, path: Path) -> Path:
    return root / path.relative_to("/") if path.is_absolute() else root / path


async def _owner(path: Path, host_root: Path, fallback: str) -> str:
    """The package owning ``/path`` per dpkg (on the host itself), else ``fallback``'s name."""
    if host_root != Path("/"):
        return f"shipped by {fallback}"
    result = await run(["dpkg-query", "-S", "/" + str(path)], timeout_seconds=30)
    if result.returncode == 0 and ":" in result.stdout:
        return "owned by package " + result.stdout.split(":", 1)[0].strip()
    return f"no package owns it now (a conffile left by {fallback}?)"


def hooks(host_root: Path) -> list[Path]:
    """The sentinel-writing hooks present under ``host_root``: executable files that mention
    ``reboot-required`` (an emptied conffile does not count)."""
    found = []
    for path, _package in SENTINEL_HOOKS:
        full = host_root / path
        try:
            executable = full.is_file() and bool(full.stat().st_mode & 0o111)
            if executable and "reboot-required" in full.read_text(errors="replace"):
                found.append(path)
        except OSError:
            continue
    return found


async def check_command(argv: tuple[str, ...]) -> Finding:
    sentinel = CommandSentinel(argv, timeout_seconds=60.0)
    shown = shlex.join(argv)
    try:
        required, _detail = await sentinel.check()
    except SensorError as exc:
        return fail(
            CHECK,
            exc.message + ": kured can never tell whether a reboot is needed.",
            "install what the command runs, or give its full path; it must exit 0 when a "
            "reboot is needed and 1 when not.",
        )
    rc = sentinel.last_returncode
    if required:
        return ok(CHECK, f"sentinel command {shown} runs and exits 0: a reboot is needed now")
    if rc == 1:
        return ok(CHECK, f"sentinel command {shown} runs and exits 1: no reboot needed now")
    return warn(
        CHECK,
        f"sentinel command {shown} exits {rc}: kured reads any status but 0 as 'not needed', "
        "so a command that fails reads as 'never reboot'.",
        "make the command exit 0 (needed) or 1 (not needed) and nothing else.",
    )


def check_kernel(host_root: Path, kernel_release: str) -> Finding:
    sentinel = KernelSentinel(
        running=kernel_release,
        modules_dir=host_root / "lib/modules",
        boot_dir=host_root / "boot",
    )
    try:
        installed = sentinel.installed()
    except OSError as exc:
        installed, why = [], f" ({exc})"
    else:
        why = ""
    if not installed:
        return warn(
            CHECK,
            f"--reboot-sentinel-kernel finds no installed kernel under {host_root / 'lib/modules'}"
            f" or {host_root / 'boot'}{why}: it can never require a reboot.",
            "mount the host's /lib/modules and /boot into the kured pod (read-only).",
        )
    return ok(
        CHECK,
        f"--reboot-sentinel-kernel compares the running kernel {kernel_release} with the "
        f"newest installed ({installed[-1]})",
    )


async def check_sentinel(s: Settings, host_root: Path, kernel_release: str) -> list[Finding]:
    """Findings of the ``sentinel`` check (see the module docstring)."""
    findings: list[Finding] = []
    if s.reboot_sentinel_command:
        findings.append(await check_command(s.reboot_sentinel_command))
    if s.reboot_sentinel_kernel:
        findings.append(check_kernel(host_root, kernel_release))
    if s.reboot_sentinel_command:
        return findings
    path = Path(s.reboot_sentinel)
    pending = _under(host_root, path).exists()
    now = "; it exists now: a reboot is pending" if pending else ""
    if path not in DEBIAN_SENTINELS:
        if not s.reboot_sentinel_kernel:
            findings.append(
                warn(
                    CHECK,
                    f"nothing known writes the sentinel file {path} (Debian and Ubuntu hooks "
                    f"write /var/run/reboot-required){now}.",
                    "make sure a package or job of yours creates it, or add "
                    "--reboot-sentinel-kernel.",
                )
            )
        return findings
    found = hooks(host_root)
    if found:
        by = dict(SENTINEL_HOOKS)
        owners = [f"/{p} ({await _owner(p, host_root, by[p])})" for p in found]
        findings.append(ok(CHECK, f"{path} is written by " + ", ".join(owners) + now))
    elif not s.reboot_sentinel_kernel:
        findings.append(
            fail(
                CHECK,
                f"nothing on this host writes {path}: no "
                + ", ".join(f"/{p}" for p, _ in SENTINEL_HOOKS)
                + f" under {host_root}{now}, so kured never sees a reboot is needed.",
                "Debian: apt-get install unattended-upgrades (its kernel hook writes the file); "
                "Ubuntu: apt-get install update-notifier-common; or run kured with "
                "--reboot-sentinel-kernel.",
            )
        )
    return findings
