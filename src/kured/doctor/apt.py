"""unattended-upgrades, as APT really configures it: which origins it upgrades from, and whether
the kernel is kept out of it.

The configuration is read from ``apt-config dump``: the **effective** configuration after every
file of ``/etc/apt/apt.conf.d`` and ``apt.conf`` is merged, with ``APT_CONFIG`` honoured (apt
reads that file first, apt.conf(5)), not one file that a later one overrides. The origins apt
knows come from ``apt-cache policy`` (its ``release o=…,a=…,n=…,l=…,c=…`` lines).

The matching rules are unattended-upgrades' own (``/usr/bin/unattended-upgrade`` 2.9,
``get_allowed_origins``, ``match_whitelist_string``, ``is_pkgname_in_blacklist``):

* ``Unattended-Upgrade::Allowed-Origins`` entries ``"<origin>:<archive>"`` become the pattern
  ``o=<origin>,a=<archive>``; ``Unattended-Upgrade::Origins-Pattern`` entries are used as they
  are. ``${distro_id}`` and ``${distro_codename}`` are what ``lsb_release -i -s`` / ``-c -s``
  print (``Debian``, ``bookworm``), read here from os-release(5) the way ``lsb_release`` does.
* A pattern is comma-separated ``key=value`` tokens (``\\,`` escapes a comma), all of which
  must match (``fnmatch``): ``o``/``origin``, ``l``/``label``, ``a``/``archive``/``suite``,
  ``c``/``component``, ``site``, ``n``/``codename``. Any other key makes unattended-upgrades
  stop with ``UnknownMatcherError``; here it is a FAIL.
* ``Unattended-Upgrade::Package-Blacklist`` entries are Python regular expressions matched with
  ``re.match`` (anchored at the start) against package names.

"Limited to security origins" means every pattern pins a security archive: a ``label``
containing ``Security`` (Debian's ``Debian-Security``) or an ``archive``/``codename`` ending in
``-security`` (Ubuntu's ``jammy-security``), without wildcards in that token.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
import string
from collections.abc import Mapping, Sequence
from pathlib import Path

from kured.doctor.finding import Finding, fail, ok, warn

CHECK = "apt"
_DUMP_LINE = re.compile(r'^(\S+?) "(.*)";$')
_KEYS = {
    "o": "origin",
    "origin": "origin",
    "l": "label",
    "label": "label",
    "a": "archive",
    "archive": "archive",
    "suite": "archive",
    "c": "component",
    "component": "component",
    "site": "site",
    "n": "codename",
    "codename": "codename",
}
_GLOB = re.compile(r"[*?\[]")


class AptConfig:
    """The output of ``apt-config dump``. Keys compare case-insensitively, as in apt."""

    def __init__(self, dump: str) -> None:
        self._scalars: dict[str, str] = {}
        self._lists: dict[str, list[str]] = {}
        for line in dump.splitlines():
            m = _DUMP_LINE.match(line.strip())
            if m is None:
                continue
            key, value = m.group(1).casefold(), m.group(2)
            if key.endswith("::"):
                self._lists.setdefault(key[:-2], []).append(value)
            else:
                self._scalars[key] = value

    def value(self, key: str, default: str = "") -> str:
        return self._scalars.get(key.casefold(), default)

    def values(self, key: str) -> list[str]:
        return list(self._lists.get(key.casefold(), []))

    def has_tree(self, key: str) -> bool:
        prefix = key.casefold()
        return any(k == prefix or k.startswith(prefix + "::") for k in self._scalars)


@dataclasses.dataclass(frozen=True)
class Origin:
    """One APT source as ``apt-cache policy`` describes it (its Release file's fields)."""

    origin: str = ""
    label: str = ""
    archive: str = ""
    codename: str = ""
    component: str = ""
    site: str = ""

    def text(self) -> str:
        return (
            f"o={self.origin},a={self.archive},n={self.codename},l={self.label},c={self.component}"
        )


_RELEASE_FIELDS = {"o": "origin", "l": "label", "a": "archive", "n": "codename", "c": "component"}


def parse_policy(text: str) -> dict[str, Origin]:
    """``apt-cache policy`` (no argument) → {source line: Origin}. The source line is the
    ``<url> <dist>/<component> <arch> Packages`` text after the priority, the same text the
    version table of ``apt-cache policy <package>`` shows."""
    out: dict[str, Origin] = {}
    source = ""
    for raw in text.splitlines():
        line = raw.strip()
        head = re.match(r"^-?\d+ (.+ Packages)$", line)
        if head:
            source = head.group(1)
            out[source] = Origin()
        elif source and line.startswith("release "):
            fields: dict[str, str] = {}
            for item in re.split(r"(?<!\\),", line[len("release ") :]):
                key, _, value = item.partition("=")
                if key in _RELEASE_FIELDS:
                    fields[_RELEASE_FIELDS[key]] = value.replace("\\,", ",")
            out[source] = dataclasses.replace(out[source], **fields)
        elif source and line.startswith("origin "):
            out[source] = dataclasses.replace(out[source], site=line[len("origin ") :].strip())
    return out


def distro(os_release: str) -> tuple[str, str]:
    """(distro_id, distro_codename) from os-release(5) text, as ``lsb_release -i -s`` and
    ``-c -s`` compute them: ``ID`` capitalised, or ``NAME`` when it differs from ``ID`` only in
    case; ``VERSION_CODENAME``."""
    values: dict[str, str] = {}
    for line in os_release.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip().strip("\"'")
    ident = values.get("ID", "")
    ident = ident[:1].upper() + ident[1:]
    name = values.get("NAME")
    if name is not None and name.lower() == ident.lower():
        ident = name
    return ident, values.get("VERSION_CODENAME", "")


def allowed_patterns(config: AptConfig, distro_id: str, codename: str) -> list[tuple[str, str]]:
    """[(setting and entry as configured, substituted pattern)] in unattended-upgrades' order:
    Allowed-Origins first, then Origins-Pattern."""
    mapping = {"distro_id": distro_id, "distro_codename": codename}

    def sub(text: str) -> str:
        return string.Template(text).safe_substitute(mapping)

    out = []
    for entry in config.values("Unattended-Upgrade::Allowed-Origins"):
        if re.search(r"(?<!\\):", entry):
            origin, archive = ([*re.split(r"(?<!\\):", entry, maxsplit=1), ""])[:2]
        else:
            origin, archive = ([*entry.split(), "", ""])[:2]
        origin = re.sub(r"([^\\]),", r"\1\\,", origin.replace("\\:", ":"))
        archive = re.sub(r"([^\\]),", r"\1\\,", archive)
        out.append((f'Allowed-Origins "{entry}"', f"o={sub(origin)},a={sub(archive)}"))
    for entry in config.values("Unattended-Upgrade::Origins-Pattern"):
        out.append((f'Origins-Pattern "{entry}"', sub(entry)))
    return out


def tokens(pattern: str) -> list[tuple[str, str]]:
    """[(field, value)] of a pattern. Raises ``ValueError`` for a key unattended-upgrades does
    not know (it stops with UnknownMatcherError on it) or a token without ``=``."""
    out = []
    for token in pattern.replace("\\,", "%2C").split(","):
        key, sep, value = token.partition("=")
        key = key.strip()
        if not sep or key not in _KEYS:
            raise ValueError(f"unknown matcher {key!r} (token {token.strip()!r})")
        out.append((_KEYS[key], value.strip().replace("%2C", ",")))
    return out


def matches(pattern: str, origin: Origin) -> bool:
    """unattended-upgrades' ``match_whitelist_string``: every token matches (fnmatch); an empty
    pattern matches nothing. Raises ``ValueError`` as ``tokens`` does."""
    if not pattern.strip():
        return False
    return all(fnmatch.fnmatch(getattr(origin, f), v) for f, v in tokens(pattern))


def security_only(pattern: str) -> bool:
    """True when the pattern can only match a security archive (see the module docstring)."""
    for field_name, value in tokens(pattern):
        if _GLOB.search(value):
            continue
        if field_name == "label" and "security" in value.lower():
            return True
        if field_name in ("archive", "codename") and value.lower().endswith("-security"):
            return True
    return False


def blacklisted(package: str, blacklist: Sequence[str]) -> str | None:
    """The first Package-Blacklist entry that ``re.match``-es ``package``, or None."""
    for entry in blacklist:
        try:
            if re.match(entry, package):
                return entry
        except re.error:
            continue
    return None


def check_unattended_upgrades(
    config: AptConfig,
    known: Mapping[str, Origin],
    distro_id: str,
    codename: str,
    kernel_packages: Sequence[str],
    host_root: Path,
) -> list[Finding]:
    """Findings for the ``apt`` check (see the module docstring); ``kernel_packages`` are the
    names that must be blacklisted (the running kernel's package and its metapackage)."""
    installed = (host_root / "usr/bin/unattended-upgrade").exists()
    if not installed and not config.has_tree("Unattended-Upgrade"):
        return [
            warn(
                CHECK,
                "unattended-upgrades is not installed: nothing installs security updates on its "
                "own, so nothing writes the sentinel until someone upgrades by hand.",
                "apt-get install unattended-upgrades (or run your own upgrade rollout).",
            )
        ]
    findings: list[Finding] = []
    if config.value("APT::Periodic::Unattended-Upgrade", "0") in ("", "0"):
        findings.append(
            warn(
                CHECK,
                'APT::Periodic::Unattended-Upgrade is "'
                + config.value("APT::Periodic::Unattended-Upgrade", "0")
                + '" (apt-config dump): unattended-upgrades never runs.',
                'set APT::Periodic::Unattended-Upgrade "1"; (e.g. dpkg-reconfigure -plow '
                "unattended-upgrades writes /etc/apt/apt.conf.d/20auto-upgrades).",
            )
        )
    patterns = allowed_patterns(config, distro_id, codename)
    if not patterns:
        findings.append(
            warn(
                CHECK,
                "unattended-upgrades allows no origin (no Allowed-Origins, no Origins-Pattern in "
                "apt-config dump): it upgrades nothing.",
                'add Unattended-Upgrade::Origins-Pattern { "origin=${distro_id},'
                'label=${distro_id}-Security"; };',
            )
        )
    wide = []
    for where, pattern in patterns:
        try:
            limited = security_only(pattern)
        except ValueError as exc:
            findings.append(
                fail(
                    CHECK,
                    f"{where}: {exc}; unattended-upgrades stops on it and upgrades nothing.",
                    "use only the keys o, l, a, n, c, site (origin, label, archive, codename, "
                    "component).",
                )
            )
            continue
        if not limited:
            hits = [o.text() for o in known.values() if matches(pattern, o)]
            seen = f" (matches {'; '.join(hits)})" if hits else ""
            findings.append(
                fail(
                    CHECK,
                    f"unattended-upgrades is not limited to security origins: {where} = "
                    f"{pattern!r}{seen}, read from apt-config dump.",
                    "allow only security archives, e.g. Unattended-Upgrade::Origins-Pattern "
                    '{ "origin=Debian,codename=${distro_codename}-security,label=Debian-Security"; '
                    "}; and remove the other entries (a later file in apt.conf.d can add them).",
                )
            )
            wide.append(where)
    if patterns and not wide and not any(f.level == "FAIL" for f in findings):
        findings.append(
            ok(
                CHECK,
                "unattended-upgrades is limited to security origins: "
                + "; ".join(p for _, p in patterns),
            )
        )
    blacklist = config.values("Unattended-Upgrade::Package-Blacklist")
    missing = [p for p in kernel_packages if blacklisted(p, blacklist) is None]
    if missing:
        findings.append(
            fail(
                CHECK,
                "the kernel is not blacklisted: unattended-upgrades would install "
                + ", ".join(missing)
                + " on its own (Unattended-Upgrade::Package-Blacklist = "
                + (", ".join(repr(b) for b in blacklist) or "empty")
                + ").",
                'add Unattended-Upgrade::Package-Blacklist { "linux-"; }; so a new kernel '
                "arrives through your own rollout, not overnight on every node.",
            )
        )
    elif kernel_packages:
        findings.append(
            ok(
                CHECK,
                "the kernel is blacklisted: "
                + ", ".join(f"{p} by {blacklisted(p, blacklist)!r}" for p in kernel_packages),
            )
        )
    return findings
