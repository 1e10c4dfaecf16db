"""The pure rules behind ``kured doctor``: unattended-upgrades' origin matching and blacklist
(as /usr/bin/unattended-upgrade 2.9 applies them), os-release → ``${distro_id}``, the parsing of
``apt-config dump`` and ``apt-cache policy``, Prometheus durations and the window's longest
closed stretch."""

from __future__ import annotations

from datetime import date, time

import pytest

from kured.core.window import RebootWindow
from kured.doctor import apt
from kured.doctor.kernel import flavour, package_sources
from kured.doctor.prometheus import (
    longest_closed_seconds,
    parse_prometheus_duration,
    prometheus_duration,
)

SECURITY = apt.Origin("Debian", "Debian-Security", "stable-security", "bookworm-security", "main")
MAIN = apt.Origin("Debian", "Debian", "stable", "bookworm", "main", "deb.debian.org")


@pytest.mark.parametrize(
    ("pattern", "security", "main", "only_security"),
    [
        ("origin=Debian,codename=bookworm-security,label=Debian-Security", True, False, True),
        ("o=Debian,l=Debian-Security", True, False, True),
        ("origin=Debian,codename=bookworm,label=Debian", False, True, False),
        ("origin=*", True, True, False),
        ("o=Debian,a=*-security", True, False, False),  # a glob does not pin the archive
        ("site=deb.debian.org", False, True, False),
        ("", False, False, False),
    ],
)
def test_patterns_match_like_unattended_upgrades(
    pattern: str, security: bool, main: bool, only_security: bool
) -> None:
    assert apt.matches(pattern, SECURITY) is security
    assert apt.matches(pattern, MAIN) is main
    if pattern:
        assert apt.security_only(pattern) is only_security


def test_an_unknown_key_is_refused_as_unattended_upgrades_does() -> None:
    with pytest.raises(ValueError, match="unknown matcher 'orign'"):
        apt.matches("orign=Debian", MAIN)


def test_allowed_origins_become_origin_archive_patterns_with_substitution() -> None:
    config = apt.AptConfig(
        'Unattended-Upgrade::Allowed-Origins:: "${distro_id}:${distro_codename}-security";\n'
        'Unattended-Upgrade::Allowed-Origins:: "Debian stable";\n'
        'Unattended-Upgrade::Origins-Pattern:: "o=${distro_id},n=${distro_codename}";\n'
    )
    patterns = [p for _, p in apt.allowed_patterns(config, "Debian", "bookworm")]
    assert patterns == ["o=Debian,a=bookworm-security", "o=Debian,a=stable", "o=Debian,n=bookworm"]


def test_apt_config_keys_are_case_insensitive_and_lists_collected() -> None:
    config = apt.AptConfig(
        'APT::Periodic::Unattended-Upgrade "1";\n'
        'Unattended-Upgrade::Package-Blacklist "";\n'
        'Unattended-Upgrade::Package-Blacklist:: "linux-";\n'
    )
    assert config.value("apt::periodic::unattended-upgrade") == "1"
    assert config.values("unattended-upgrade::package-BLACKLIST") == ["linux-"]
    assert apt.blacklisted("linux-image-amd64", ["firefox", "linux-"]) == "linux-"
    assert apt.blacklisted("xlinux-image", ["linux-"]) is None  # re.match anchors at the start


def test_distro_follows_lsb_release() -> None:
    assert apt.distro('ID=debian\nNAME="Debian GNU/Linux"\nVERSION_CODENAME=bookworm\n') == (
        "Debian",
        "bookworm",
    )
    assert apt.distro('ID=ubuntu\nNAME="Ubuntu"\nVERSION_CODENAME=jammy\n') == ("Ubuntu", "jammy")


POLICY = """Package files:
 100 /var/lib/dpkg/status
     release a=now
 500 http://deb.debian.org/debian-security bookworm-security/main amd64 Packages
     release v=12,o=Debian,a=oldstable-security,n=bookworm-security,l=Debian-Security,c=main,b=amd64
     origin deb.debian.org
Pinned packages:
"""
PACKAGE = """linux-image-6.1.0-57-amd64:
  Installed: (none)
  Candidate: 6.1.192-3
  Version table:
     6.1.192-3 500
        500 http://deb.debian.org/debian-security bookworm-security/main amd64 Packages
"""


def test_policy_sources_resolve_to_their_release_fields() -> None:
    known = apt.parse_policy(POLICY)
    line = "http://deb.debian.org/debian-security bookworm-security/main amd64 Packages"
    assert known[line] == apt.Origin(
        "Debian", "Debian-Security", "oldstable-security", "bookworm-security", "main",
        "deb.debian.org",
    )  # fmt: skip
    assert package_sources(PACKAGE) == {"linux-image-6.1.0-57-amd64": [line]}


@pytest.mark.parametrize(
    ("release", "expected"),
    [("6.1.0-25-amd64", "amd64"), ("6.1.0-25-cloud-amd64", "cloud-amd64"),
     ("5.15.0-91-generic", "generic"), ("6.12.9+bpo-amd64", "amd64"), ("6.1.0", "")],
)  # fmt: skip
def test_kernel_flavour(release: str, expected: str) -> None:
    assert flavour(release) == expected


def test_prometheus_durations_read_and_written() -> None:
    assert parse_prometheus_duration("1w") == 7 * 86400
    assert parse_prometheus_duration("1d12h") == 36 * 3600
    assert parse_prometheus_duration("10GiB") is None
    assert prometheus_duration(8 * 86400) == "8d"
    assert prometheus_duration(36 * 3600) == "1d12h"


def test_a_weekly_window_stays_closed_almost_a_week_and_an_all_day_one_never() -> None:
    weekly = RebootWindow(frozenset({0}), time(2, 0), time(4, 0))
    closed = longest_closed_seconds(weekly, date(2026, 12, 1))
    assert closed == 7 * 86400 - (2 * 3600 + 1)  # the end second is inclusive
    assert longest_closed_seconds(RebootWindow(), date(2026, 12, 1)) == 0


@pytest.mark.parametrize(
    ("config", "level", "start"),
    [
        ('Unattended-Upgrade::Origins-Pattern:: "o=Debian,l=Debian-Security";\n', "FAIL",
         "the running kernel 6.1.0-57-amd64 comes from an allowed origin: linux-image-6.1.0-57"),
        ('Unattended-Upgrade::Origins-Pattern:: "o=Debian,l=Debian-Security";\n'
         'Unattended-Upgrade::Package-Blacklist:: "linux-";\n', "OK",
         "the running kernel 6.1.0-57-amd64 is not upgraded by unattended-upgrades"),
        ('Unattended-Upgrade::Origins-Pattern:: "o=Debian,n=bookworm-updates";\n', "OK",
         "the running kernel 6.1.0-57-amd64 is not upgraded by unattended-upgrades"),
    ],
    ids=["allowed", "allowed-but-blacklisted", "not-allowed"],
)  # fmt: skip
def test_the_kernel_origin(config: str, level: str, start: str) -> None:
    from kured.doctor.kernel import kernel_origin

    finding = kernel_origin(
        apt.AptConfig(config),
        apt.parse_policy(POLICY),
        "Debian",
        "bookworm",
        "6.1.0-57-amd64",
        package_sources(PACKAGE),
    )
    assert finding.level == level, finding
    assert finding.message.startswith(start), finding


def test_a_kernel_from_no_apt_source_cannot_be_replaced() -> None:
    from kured.doctor.kernel import kernel_origin

    config = apt.AptConfig('Unattended-Upgrade::Origins-Pattern:: "origin=*";\n')
    finding = kernel_origin(config, apt.parse_policy(POLICY), "Debian", "bookworm", "6.18-fc", {})
    assert finding.level == "OK"
    assert "comes from no APT source" in finding.message


def test_a_monthly_cron_window_stays_closed_for_weeks() -> None:
    from datetime import timedelta

    from kured.core.cron_window import CronWindow

    monthly = CronWindow("0 3 * * sun#1", timedelta(hours=2))
    # From 2026-12-01: first Sundays 12-06, 2027-01-03, ... the longest gap between two of
    # them (five weeks, e.g. 2027-01-03 to 2027-02-07) less the 2h opening, over 400 days.
    assert longest_closed_seconds(monthly, date(2026, 12, 1)) == 35 * 86400 - 2 * 3600
    every_hour = CronWindow("0 * * * *", timedelta(hours=1))
    assert longest_closed_seconds(every_hour, date(2026, 12, 1)) == 0


def test_sparse_cron_windows_are_walked_only_to_the_horizon() -> None:
    import time as clock
    from datetime import timedelta

    from kured.core.cron_window import CronWindow

    # Before: all 5,000 openings were built first; for the 29th of February that is 20,000
    # years on, and cronsim raised OverflowError (a traceback from `kured doctor`).
    leap = CronWindow("0 3 29 2 *", timedelta(hours=2))
    began = clock.monotonic()
    # No 29th of February from 2026-12-01 to the horizon (2028-01-05): closed throughout.
    assert longest_closed_seconds(leap, date(2026, 12, 1)) == 400 * 86400
    # One, 2028-02-29 03:00-05:00, from 2027-12-01: closed from its end to the horizon, 400
    # days on (2029-01-04, 2028 being a leap year).
    after = (date(2029, 1, 4) - date(2028, 2, 29)).days * 86400 - 5 * 3600
    assert longest_closed_seconds(leap, date(2027, 12, 1)) == after
    # Fifth Sundays from 2026-12-01: 2027-01-31, 05-30, 08-29, 10-31 before the horizon; the
    # longest gap is 2027-01-31 to 2027-05-30 (119 days) less the 2h opening.
    fifth = CronWindow("0 3 * * sun#5", timedelta(hours=2))
    assert longest_closed_seconds(fifth, date(2026, 12, 1)) == 119 * 86400 - 2 * 3600
    assert clock.monotonic() - began < 0.5


@pytest.mark.parametrize("expression", ["0 3 29 2 *", "0 3 * * sun#5"])
def test_doctor_retention_on_a_sparse_cron_window_warns_quickly(expression: str) -> None:
    import time as clock
    from datetime import timedelta

    from kured.core.cron_window import CronWindow
    from kured.doctor.prometheus import check_retention

    rule = {"name": "KuredRebootPending", "duration": 3600, "query": "kured_reboot_required > 0"}
    began = clock.monotonic()
    # Before: '0 3 29 2 *' raised OverflowError (a traceback); 'sun#5' took about 1.8 s.
    findings = check_retention(
        [rule], 30 * 86400, "30d", CronWindow(expression, timedelta(hours=2))
    )
    assert clock.monotonic() - began < 0.5
    # Closed for months either way (at least 62 days between fifth Sundays): the 1h for: warns.
    [finding] = findings
    assert finding.level == "WARN", finding
    assert "the window stays closed" in finding.message, finding


def test_a_reboots_cordon_does_not_count_the_drain_delay() -> None:
    """``--drain-delay`` is slept before the cordon (``choreography``), so the cordon that
    ``KuredNodeCordonedTooLong`` sees lasts the drain, the reboot delay and the boot: with 45m
    of drain delay, 30m of drain and a 10m boot, 40m (counting the delay gave 85m, and a WARN
    against the 1h default)."""
    from kured.doctor.prometheus import cordoned_seconds
    from kured.settings import Settings

    s = Settings(node_id="n1", drain_delay=2700.0, drain_timeout=1800.0, reboot_delay=0.0)
    assert cordoned_seconds(s, 600.0) == 2400.0
