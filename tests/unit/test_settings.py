"""kura's settings (kura.settings over kit.settings): defaults, environment, flags, errors.

Configuration errors are collected and reported all at once, like Kura
(kura-behaviour.md §6.1); flags win over the environment.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from kit.settings import SettingsError, load, options_of, parse_bytes
from kura.cli import build_parser
from kura.settings import GiB, MiB, Settings, validate_settings


def settings_from(environ: Mapping[str, str], *flags: str) -> Settings:
    args = build_parser().parse_args(["serve", *flags])
    return load(Settings, args, environ, validate=validate_settings)


def problems_from(environ: Mapping[str, str], *flags: str) -> list[str]:
    with pytest.raises(SettingsError) as raised:
        settings_from(environ, *flags)
    assert str(raised.value) == "; ".join(raised.value.problems)
    return raised.value.problems


def test_with_no_configuration_a_node_serves_on_localhost_4000_with_data_under_dot_kura() -> None:
    s = settings_from({})
    assert (s.host, s.port) == ("127.0.0.1", 4000)
    assert s.data_dir == Path(".kura/data")
    assert s.tmp_dir == Path(".kura/tmp")
    assert s.tmp_dir_max_bytes == 8 * GiB
    assert s.max_disk_bytes == 50 * GiB
    assert s.tenant_id == "default"
    assert s.peers == ()
    assert (s.http_cache_prefix, s.webdav_prefix) == ("/cache", "/dav")
    assert not s.auth_enabled
    assert (s.max_keyvalue_bytes, s.max_gradle_bytes, s.max_artifact_bytes) == (
        1 * MiB,
        100 * MiB,
        2 * GiB,
    )
    assert s.log_level == "INFO"
    assert s.access_log is False


def test_every_setting_has_a_default() -> None:
    # "Nothing is mandatory" (kura.settings): an empty environment must never be an error.
    missing = [
        f.name
        for f, _opt in options_of(Settings)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    assert missing == []


def test_environment_values_are_parsed() -> None:
    s = settings_from(
        {
            "KURA_HOST": "0.0.0.0",
            "KURA_INTERNAL_TOKENS": "peer-old,peer-new",
            "KURA_MAX_CLOCK_SKEW_MS": "60000",
            "KURA_PORT": " 5000 ",
            "KURA_DATA_DIR": "/srv/kura",
            "KURA_TMP_DIR_MAX_BYTES": "512M",
            "KURA_MAX_DISK_BYTES": "8GiB",
            "KURA_MIN_FREE_DISK_BYTES": "0",
            "KURA_PEERS": "http://a:7443/, http://b:7443 ,,",
            "KURA_READ_WRITE_TOKENS": "one, two",
            "KURA_READ_ONLY_TOKENS": "ro",
            "KURA_HTTP_CACHE_PREFIX": "store/",
            "KURA_TENANT_ID": "acme",
            "KURA_ACCESS_LOG": "true",
            "KURA_LOG_LEVEL": "DEBUG",
            "KURA_SHUTDOWN_TIMEOUT_SECONDS": "0",
        }
    )
    assert (s.host, s.port, s.data_dir) == ("0.0.0.0", 5000, Path("/srv/kura"))
    assert s.tmp_dir_max_bytes == 512 * MiB
    assert s.max_disk_bytes == 8 * GiB
    assert s.min_free_disk_bytes == 0
    assert s.peers == ("http://a:7443", "http://b:7443")
    assert s.read_write_tokens == ("one", "two")
    assert s.read_only_tokens == ("ro",)
    assert s.auth_enabled
    assert s.http_cache_prefix == "/store"
    assert s.tenant_id == "acme"
    assert s.access_log is True
    assert s.log_level == "DEBUG"
    assert s.shutdown_timeout_seconds == 0
    assert s.internal_tokens == ("peer-old", "peer-new")
    assert s.max_clock_skew_ms == 60000


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1048576", 1048576),
        ("0", 0),
        ("512M", 512 * MiB),
        ("512m", 512 * MiB),
        ("512MB", 512 * MiB),
        ("8GiB", 8 * GiB),
        ("8G", 8 * GiB),
        ("64KiB", 64 * 1024),
        ("64k", 64 * 1024),
        ("1T", 1024**4),
        ("100B", 100),
        (" 2 GiB ", 2 * GiB),
    ],
)
def test_byte_sizes_accept_binary_suffixes(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "-1", "1.5G", "12X", "G", "8 GiBs", "0x10", "1e6"])
def test_malformed_byte_sizes_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="byte count"):
        parse_bytes(text)


@pytest.mark.parametrize("text", [str(2**63), "99999999999999999999999", "9223372036854775807K"])
def test_byte_sizes_of_2_63_or_more_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match=r"2\^63"):
        parse_bytes(text)
    assert parse_bytes(str(2**63 - 1)) == 2**63 - 1


def test_flags_are_parsed_and_win_over_the_environment() -> None:
    s = settings_from(
        {"KURA_PORT": "5000", "KURA_MAX_DISK_BYTES": "1G", "KURA_TENANT_ID": "from-env"},
        "--port",
        "6000",
        "--max-disk-bytes",
        "2GiB",
    )
    assert s.port == 6000
    assert s.max_disk_bytes == 2 * GiB
    assert s.tenant_id == "from-env"  # no flag given: the environment still counts


def test_a_good_flag_hides_a_bad_environment_value() -> None:
    assert settings_from({"KURA_PORT": "abc"}, "--port", "4001").port == 4001


def test_every_bad_value_is_reported_at_once() -> None:
    problems = problems_from(
        {
            "KURA_PORT": "abc",
            "KURA_TMP_DIR_MAX_BYTES": "-1",
            "KURA_PEERS": "notaurl",
            "KURA_LOG_LEVEL": "LOUD",
        },
        "--max-disk-bytes",
        "0",
    )
    assert len(problems) == 5, problems
    joined = "\n".join(problems)
    for name in (
        "KURA_PORT",
        "KURA_TMP_DIR_MAX_BYTES",
        "KURA_PEERS",
        "KURA_LOG_LEVEL",
        "--max-disk-bytes",
    ):
        assert name in joined
    assert "'abc'" in joined  # the offending value is shown


# One value per parser that it must reject. A new setting with a new parser fails
# test_each_setting_reports_its_own_bad_value until a bad value is added here.
BAD_VALUE_BY_PARSER = {
    "_positive_duration": "0s",
    "_percent": "101",
    "_startup_wait": "61",
    "parse_workers": "0",
    "_duration": "-5s",
    "_max_age": "3w",
    "parse_non_empty": "   ",
    "parse_port": "65536",
    "parse_path": " ",
    "parse_positive_bytes": "0",
    "parse_bytes": "lots",
    "_tenant": "a/b",
    "parse_http_url": "ftp://example.com",
    "parse_http_urls": "http://ok:1,notaurl",
    "parse_positive_int": "0",
    "parse_non_negative_int": "-1",
    "_prefix": "/",
    "_tokens": "has space",
    "_asset_hosts": "*evil.example",
    "parse_choice.<locals>.parse": "not-a-choice",
    "parse_bool": "maybe",
    "_object_store_url": "https://bucket/prefix",
    "parse_namespace_rules": "pr-*:ttl=2d",
}


def _parser_name(parse: Callable[[str], Any]) -> str:
    return getattr(parse, "__qualname__", repr(parse))


def test_each_setting_reports_its_own_bad_value_together_with_all_the_others() -> None:
    environ: dict[str, str] = {}
    for f, opt in options_of(Settings):
        name = _parser_name(opt.parse)
        assert name in BAD_VALUE_BY_PARSER, f"add a bad value for {name} ({f.name})"
        environ[opt.env] = BAD_VALUE_BY_PARSER[name]
    problems = problems_from(environ)
    for _f, opt in options_of(Settings):
        assert any(p.startswith(opt.env + "=") for p in problems), (opt.env, problems)
    assert len(problems) == len(options_of(Settings))


def test_an_invalid_tenant_id_is_a_configuration_problem_not_a_crash() -> None:
    problems = problems_from({"KURA_TENANT_ID": "../etc", "KURA_PORT": "x"})
    assert len(problems) == 2, problems
    assert any("KURA_TENANT_ID" in p and "tenant id" in p for p in problems)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"KURA_PORT": "4100", "KURA_INTERNAL_PORT": "4100"}, "must differ from KURA_PORT"),
        ({"KURA_WEBDAV_PREFIX": "/cache"}, "KURA_WEBDAV_PREFIX must differ"),
        ({"KURA_HTTP_CACHE_PREFIX": "/api/x"}, "collides with a built-in route"),
        ({"KURA_WEBDAV_PREFIX": "/metrics"}, "collides with a built-in route"),
        ({"KURA_WEBDAV_PREFIX": "/ns/x"}, "collides with a built-in route"),
        (
            {"KURA_READ_WRITE_TOKENS": "a,b", "KURA_READ_ONLY_TOKENS": "b"},
            "both read-write and read-only",
        ),
        ({"KURA_PEERS": "https://peer:7443"}, "must use http (peer TLS is off)"),
    ],
)
def test_cross_field_rules_are_checked(environ: dict[str, str], message: str) -> None:
    problems = problems_from(environ)
    assert len(problems) == 1, problems
    assert message in problems[0]


def test_all_cross_field_problems_are_reported_together() -> None:
    problems = problems_from(
        {
            "KURA_PORT": "4100",
            "KURA_INTERNAL_PORT": "4100",
            "KURA_WEBDAV_PREFIX": "/cache",
            "KURA_READ_WRITE_TOKENS": "t",
            "KURA_READ_ONLY_TOKENS": "t",
        }
    )
    assert len(problems) == 3, problems


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.7", "::", "kura-0.kura", "127.example"])
def test_a_non_loopback_peer_listener_without_credentials_is_refused(host: str) -> None:
    problems = problems_from({"KURA_HOST": host})
    assert len(problems) == 1, problems
    assert "KURA_INTERNAL_TOKENS" in problems[0]
    assert "openssl rand -hex 32" in problems[0]
    s = settings_from({"KURA_HOST": host, "KURA_INTERNAL_TOKENS": "s3cret"})
    assert s.internal_tokens == ("s3cret",)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.2.1", "::1", "[::1]", "localhost"])
def test_a_loopback_peer_listener_may_stay_open(host: str) -> None:
    assert settings_from({"KURA_HOST": host}).internal_tokens == ()


def test_port_zero_twice_is_allowed() -> None:
    s = settings_from({"KURA_PORT": "0", "KURA_INTERNAL_PORT": "0"})
    assert (s.port, s.internal_port) == (0, 0)


@pytest.mark.parametrize(
    ("text", "seconds"), [("6h", 21600.0), ("30m", 1800.0), ("90s", 90.0), ("45", 45.0)]
)
def test_peer_forget_after_takes_a_duration_or_seconds(text: str, seconds: float) -> None:
    assert settings_from({"KURA_PEER_FORGET_AFTER": text}).peer_forget_after_seconds == seconds


@pytest.mark.parametrize("text", ["0", "-5m", "soon", ""])
def test_peer_forget_after_refuses_what_is_not_a_duration_above_zero(text: str) -> None:
    with pytest.raises(SettingsError, match="KURA_PEER_FORGET_AFTER"):
        settings_from({"KURA_PEER_FORGET_AFTER": text})


PRINT_DEFAULT_WORKERS = (
    "import argparse; from kit.settings import load; from kura.settings import Settings; "
    "print(load(Settings, argparse.Namespace(), {}).workers)"
)


def test_workers_is_a_count_or_auto() -> None:
    """KURA_WORKERS: an integer of at least 1, or ``auto`` for the usable CPUs (the default)."""
    from kit.cpus import available_cpus
    from kura.settings_rules import parse_workers

    assert parse_workers("3") == 3
    assert parse_workers("auto") == available_cpus()
    assert settings_from({}).workers == available_cpus()
    assert settings_from({"KURA_WORKERS": "1"}).workers == 1
    # The default follows the CPUs this process may use, not the host's count.
    pinned = subprocess.run(
        ["taskset", "-c", "0", sys.executable, "-c", PRINT_DEFAULT_WORKERS],
        capture_output=True,
        text=True,
        check=True,
    )
    assert pinned.stdout.strip() == "1"
    # A typo must not fork the machine to death: at most 4 processes per usable CPU.
    assert parse_workers(str(4 * available_cpus())) == 4 * available_cpus()
    for typo in ("100000", str(4 * available_cpus() + 1)):
        with pytest.raises(ValueError, match="must be at most"):
            parse_workers(typo)
    assert "KURA_WORKERS" in "; ".join(problems_from({"KURA_WORKERS": "100000"}))
    for bad in ("0", "-1", "two"):
        with pytest.raises(ValueError, match=r"must be|integer|invalid"):
            parse_workers(bad)
