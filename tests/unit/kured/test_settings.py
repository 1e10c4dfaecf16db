"""kured's settings (kured.settings over kit.settings): kured's flag names and value syntax,
``KURED_<FLAG>`` overriding flags, and every problem reported at once."""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from datetime import UTC, datetime, time, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from kit.settings import SettingsError, options_of
from kured.core.window import EVERY_DAY, FRIDAY, MONDAY, SATURDAY, SUNDAY, RebootWindow
from kured.settings import Settings, add_arguments, load_settings

NODE = {"KURED_NODE_ID": "node-1"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kured")
    add_arguments(p)
    return p


def settings_from(environ: Mapping[str, str], *flags: str) -> Settings:
    return load_settings(parser().parse_args(list(flags)), environ)


def problems_from(environ: Mapping[str, str], *flags: str) -> list[str]:
    with pytest.raises(SettingsError) as raised:
        settings_from(environ, *flags)
    return raised.value.problems


def test_defaults_are_kureds() -> None:
    s = settings_from(NODE)
    assert s.node_id == "node-1"
    assert s.period == 3600
    assert s.concurrency == 1
    assert (s.lock_ttl, s.lock_release_delay) == (0, 0)
    assert s.lock_backend == "etcd"
    assert s.etcd_endpoints == ("http://127.0.0.1:2379",)
    assert s.lock_key == "/kured/lock"
    assert (s.ds_namespace, s.ds_name) == ("kube-system", "kured")
    assert s.lock_annotation == "weave.works/kured-node-lock"
    assert s.reboot_sentinel == Path("/var/run/reboot-required")
    assert s.reboot_sentinel_command == ()
    assert s.reboot_sentinel_kernel is False
    assert s.reboot_command == ("/bin/systemctl", "reboot")
    assert s.host_namespace == "auto"
    assert (s.reboot_method, s.reboot_signal) == ("command", 39)
    assert s.reboot_days == EVERY_DAY
    assert (s.start_time, s.end_time, s.time_zone) == (time(0, 0), time(23, 59, 59), UTC)
    assert s.prometheus_url == ""
    assert s.alert_filter_regexp is None
    assert (s.alert_filter_match_only, s.alert_firing_only) == (False, False)
    assert s.gate_url == ()
    assert (s.gate_timeout, s.prometheus_timeout) == (5, 10)
    assert (s.metrics_host, s.metrics_port) == ("", 8080)
    assert s.state_dir == Path("/var/lib/kured")
    assert s.max_consecutive_reboots == 3
    assert s.log_format == "text"
    assert s.window() == RebootWindow()
    assert (s.kubeconfig, s.kubernetes_timeout) == ("", 10)
    assert (s.drain_timeout, s.drain_grace_period, s.skip_wait_for_delete_timeout) == (0, -1, 0)
    assert s.force_reboot is False
    assert s.blocking_pod_selector == ()
    assert (s.pre_reboot_node_labels, s.post_reboot_node_labels) == ((), ())
    assert s.annotate_nodes is False


def test_kubernetes_flags_take_kureds_syntax() -> None:
    s = settings_from(
        NODE,
        "--lock-backend",
        "kubernetes",
        "--kubeconfig",
        "/etc/kubeconfig",
        "--drain-timeout",
        "5m",
        "--drain-grace-period",
        "0",
        "--skip-wait-for-delete-timeout",
        "30",
        "--force-reboot",
        "--blocking-pod-selector",
        "app=db,tier=primary",
        "--blocking-pod-selector",
        "job-name",
        "--pre-reboot-node-labels",
        "a=1,b=2",
        "--pre-reboot-node-labels",
        "c=",
        "--post-reboot-node-labels=a=0",
        "--annotate-nodes",
    )
    assert s.kubeconfig == "/etc/kubeconfig"
    assert (s.drain_timeout, s.drain_grace_period, s.skip_wait_for_delete_timeout) == (300, 0, 30)
    assert s.force_reboot is True
    assert s.annotate_nodes is True
    assert s.blocking_pod_selector == ("app=db,tier=primary", "job-name")  # one selector each
    assert s.pre_reboot_node_labels == (("a", "1"), ("b", "2"), ("c", ""))
    assert s.post_reboot_node_labels == (("a", "0"),)


def test_blocking_pod_selectors_in_the_environment_are_separated_by_semicolons() -> None:
    s = settings_from(
        {
            **NODE,
            "KURED_LOCK_BACKEND": "kubernetes",
            "KURED_BLOCKING_POD_SELECTOR": "app=db,tier=primary; job-name",
            "KURED_POST_REBOOT_NODE_LABELS": "a=0,b=0",
        }
    )
    assert s.blocking_pod_selector == ("app=db,tier=primary", "job-name")
    assert s.post_reboot_node_labels == (("a", "0"), ("b", "0"))


def test_a_node_label_without_equals_is_a_reported_problem() -> None:
    problems = problems_from(
        {**NODE, "KURED_LOCK_BACKEND": "kubernetes"},
        "--pre-reboot-node-labels",
        "ok=1,broken",
        "--post-reboot-node-labels",
        "=value",
        "--drain-grace-period",
        "soon",
    )
    assert len(problems) == 3
    assert any("'broken' is not key=value" in p for p in problems)
    assert any("'=value' is not key=value" in p for p in problems)


def test_node_flags_without_the_kubernetes_backend_are_a_reported_problem() -> None:
    problems = problems_from(NODE, "--blocking-pod-selector", "app=db", "--annotate-nodes")
    assert problems == [
        "--blocking-pod-selector, --annotate-nodes need --lock-backend=kubernetes or lease "
        "(they act on the Node object)"
    ]


def test_every_env_name_is_kured_and_the_flag_upper_cased() -> None:
    for _field, opt in options_of(Settings):
        assert opt.flag.startswith("--")
        assert opt.env == "KURED_" + opt.flag[2:].upper().replace("-", "_")


def test_node_id_is_required() -> None:
    assert problems_from({}) == ["KURED_NODE_ID / --node-id is required"]
    assert len(problems_from({"KURED_NODE_ID": "  "})) == 1
    assert settings_from({}, "--node-id", "n2").node_id == "n2"


def test_the_environment_overrides_flags() -> None:
    s = settings_from(
        {
            "KURED_NODE_ID": "from-env",
            "KURED_PERIOD": "5m",
            "KURED_LOCK_RELEASE_DELAY": "1h30m",
            "KURED_ALERT_FIRING_ONLY": "false",
            "KURED_REBOOT_DAYS": "sa,su",
            "KURED_START_TIME": "22:00",
        },
        "--node-id=from-flag",
        "--period=1m",
        "--lock-release-delay=10s",
        "--alert-firing-only",
        "--reboot-days=mo",
        "--start-time=1am",
        "--end-time=4am",
    )
    assert s.node_id == "from-env"
    assert s.period == 300
    assert s.lock_release_delay == 5400
    assert s.alert_firing_only is False
    assert s.reboot_days == {SATURDAY, SUNDAY}  # replaced, not appended
    assert s.start_time == time(22, 0)
    assert s.end_time == time(4, 0)  # no env value: the flag stands


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30m", 1800), ("1h30m", 5400), ("0", 0), ("1.5s", 1.5), ("500ms", 0.5), ("2h", 7200)],
)
def test_durations_are_go_durations(text: str, seconds: float) -> None:
    s = settings_from({**NODE, "KURED_LOCK_TTL": text}, "--lock-release-delay", text)
    assert s.lock_ttl == seconds
    assert s.lock_release_delay == seconds


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("true", True),
        ("1", True),
        ("T", True),
        ("TRUE", True),
        ("t", True),
        ("false", False),
        ("0", False),
        ("F", False),
    ],
)
def test_booleans_are_go_booleans(text: str, value: bool) -> None:
    s = settings_from(
        {**NODE, "KURED_ALERT_FILTER_MATCH_ONLY": text}, f"--alert-firing-only={text}"
    )
    assert s.alert_filter_match_only is value
    assert s.alert_firing_only is value


def test_boolean_flags_may_be_given_bare_like_pflag() -> None:
    s = settings_from(NODE, "--alert-firing-only", "--reboot-sentinel-kernel")
    assert s.alert_firing_only is True
    assert s.reboot_sentinel_kernel is True


def test_every_invalid_value_is_reported_at_once() -> None:
    problems = problems_from(
        {
            "KURED_PERIOD": "1 hour",
            "KURED_CONCURRENCY": "0",
            "KURED_LOCK_TTL": "-5m",
            "KURED_REBOOT_METHOD": "kexec",
            "KURED_REBOOT_SIGNAL": "65",
            "KURED_START_TIME": "5:00pm",
            "KURED_END_TIME": "9AM",
            "KURED_TIME_ZONE": "Mars/Olympus_Mons",
            "KURED_ALERT_FIRING_ONLY": "yes",
            "KURED_METRICS_PORT": "99999",
            "KURED_LOG_FORMAT": "xml",
            "KURED_PROMETHEUS_URL": "prometheus:9090",
        },
        "--reboot-days=mo,funday",
        "--gate-url=ftp://gate",
        "--reboot-sentinel-command=test -f '/var/run/x",
    )
    named = sorted(p.split("=")[0].split(" ")[0] for p in problems)
    assert named == sorted(
        [
            "KURED_NODE_ID",
            "KURED_PERIOD",
            "KURED_CONCURRENCY",
            "KURED_LOCK_TTL",
            "KURED_REBOOT_METHOD",
            "KURED_REBOOT_SIGNAL",
            "KURED_START_TIME",
            "KURED_END_TIME",
            "KURED_TIME_ZONE",
            "KURED_ALERT_FIRING_ONLY",
            "KURED_METRICS_PORT",
            "KURED_LOG_FORMAT",
            "KURED_PROMETHEUS_URL",
            "KURED_REBOOT_DAYS",
            "KURED_GATE_URL",
            "--reboot-sentinel-command",
        ]
    ), problems
    text = "\n".join(problems)
    assert "funday" in text
    assert "No closing quotation" in text


def test_reboot_days_repeat_and_split_on_commas() -> None:
    s = settings_from(NODE, "--reboot-days=mo", "--reboot-days", "fr,sa", "--reboot-days=0")
    assert s.reboot_days == {MONDAY, FRIDAY, SATURDAY, SUNDAY}
    assert settings_from({**NODE, "KURED_REBOOT_DAYS": "mon, 5"}).reboot_days == {MONDAY, FRIDAY}


def test_an_explicitly_empty_reboot_days_means_never() -> None:
    for s in (
        settings_from(NODE, "--reboot-days="),
        settings_from({**NODE, "KURED_REBOOT_DAYS": ""}),
    ):
        assert s.reboot_days == frozenset()
        assert s.window().next_open(datetime(2024, 1, 1, tzinfo=UTC)) is None


def test_gate_urls_repeat() -> None:
    s = settings_from(NODE, "--gate-url=http://a:1/ok/", "--gate-url", "https://b/health")
    assert s.gate_url == ("http://a:1/ok", "https://b/health")
    from_env = settings_from({**NODE, "KURED_GATE_URL": "http://c,http://d"}, "--gate-url=http://a")
    assert from_env.gate_url == ("http://c", "http://d")


def test_the_alert_filter_compiles_and_an_invalid_regexp_is_reported() -> None:
    s = settings_from({**NODE, "KURED_ALERT_FILTER_REGEXP": "^(RebootRequired|Watchdog)$"})
    assert isinstance(s.alert_filter_regexp, re.Pattern)
    assert s.alert_filter_regexp.search("Watchdog")
    assert settings_from({**NODE, "KURED_ALERT_FILTER_REGEXP": ""}).alert_filter_regexp is None
    problems = problems_from({**NODE, "KURED_ALERT_FILTER_REGEXP": "Foo(["})
    assert len(problems) == 1
    assert problems[0].startswith("KURED_ALERT_FILTER_REGEXP='Foo([': invalid regular expression")


def test_commands_are_split_like_a_shell_without_one() -> None:
    s = settings_from(
        NODE,
        "--reboot-sentinel-command",
        "sh -c 'test -f /var/run/reboot-required'",
        '--reboot-command=/usr/bin/systemctl reboot --message="kured maintenance" a\\ b',
    )
    assert s.reboot_sentinel_command == ("sh", "-c", "test -f /var/run/reboot-required")
    assert s.reboot_command == (
        "/usr/bin/systemctl",
        "reboot",
        "--message=kured maintenance",
        "a b",
    )


def test_an_empty_reboot_command_is_a_problem_only_for_the_command_method() -> None:
    assert problems_from(NODE, "--reboot-command=") == [
        "KURED_REBOOT_COMMAND / --reboot-command must not be empty with --reboot-method=command"
    ]
    s = settings_from(NODE, "--reboot-command=", "--reboot-method=signal", "--reboot-signal=40")
    assert (s.reboot_method, s.reboot_signal, s.reboot_command) == ("signal", 40, ())
    assert len(problems_from(NODE, "--reboot-method=signal", "--reboot-signal=0")) == 1


def test_cross_field_problems_are_reported_together() -> None:
    problems = problems_from({**NODE, "KURED_ETCD_ENDPOINTS": ""}, "--reboot-command= ")
    assert len(problems) == 2
    s = settings_from(
        {**NODE, "KURED_ETCD_ENDPOINTS": ""}, "--lock-backend=kubernetes", "--ds-name=kured-x"
    )
    assert (s.lock_backend, s.etcd_endpoints, s.ds_name) == ("kubernetes", (), "kured-x")


def test_etcd_endpoints_are_a_comma_list_of_urls() -> None:
    s = settings_from(NODE, "--etcd-endpoints=http://10.0.0.1:2379/, https://10.0.0.2:2379")
    assert s.etcd_endpoints == ("http://10.0.0.1:2379", "https://10.0.0.2:2379")


def test_the_window_is_built_from_days_times_and_zone() -> None:
    s = settings_from(
        NODE,
        "--reboot-days=fr",
        "--start-time=10pm",
        "--end-time=02:00",
        "--time-zone=Europe/London",
    )
    w = s.window()
    assert w == RebootWindow(frozenset({FRIDAY}), time(22), time(2), ZoneInfo("Europe/London"))
    # 2024-03-02 is a Saturday: the Friday night window is still open at 01:00.
    assert w.contains(datetime(2024, 3, 2, 1, 0, tzinfo=UTC))
    assert not w.contains(datetime(2024, 3, 1, 1, 0, tzinfo=UTC))


def test_time_zone_local_is_the_hosts_zone_from_tz(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    s = settings_from({**NODE, "KURED_TIME_ZONE": "Local"})
    assert datetime(2024, 1, 15, 12, tzinfo=s.time_zone).utcoffset() == timedelta(hours=9)


def test_period_must_be_positive_and_timeouts_too() -> None:
    problems = problems_from(
        {**NODE, "KURED_PERIOD": "0", "KURED_GATE_TIMEOUT": "0s", "KURED_PROMETHEUS_TIMEOUT": "-1s"}
    )
    assert len(problems) == 3


@pytest.mark.parametrize(
    ("start", "end"), [("03:00", "03:00"), ("3am", "03:00:00"), ("0", "00:00")]
)
def test_a_window_whose_start_equals_its_end_is_refused(start: str, end: str) -> None:
    problems = problems_from(NODE, "--start-time", start, "--end-time", end)
    assert len(problems) == 1
    assert "--start-time" in problems[0]
    assert "--end-time" in problems[0]
    assert "one second" in problems[0]
    assert "23:59:59" in problems[0]  # says how to write "all day"


def test_a_one_second_longer_window_and_a_midnight_crossing_one_are_accepted() -> None:
    assert settings_from(NODE, "--start-time", "03:00", "--end-time", "03:00:01")
    assert settings_from(NODE, "--start-time", "22:00", "--end-time", "21:59:59")


def test_deleted_node_release_is_off_by_default_and_needs_a_kubernetes_backend() -> None:
    s = settings_from(NODE)
    assert s.release_lock_of_deleted_nodes is False
    assert s.deleted_node_grace == 600.0
    problems = problems_from(NODE, "--release-lock-of-deleted-nodes")
    assert problems == [
        "--release-lock-of-deleted-nodes need --lock-backend=kubernetes or lease "
        "(they act on the Node object)"
    ]
    lease = settings_from(
        NODE, "--lock-backend=lease", "--release-lock-of-deleted-nodes", "--deleted-node-grace=90s"
    )
    assert (lease.release_lock_of_deleted_nodes, lease.deleted_node_grace) == (True, 90.0)
    assert problems_from(NODE, "--deleted-node-grace=0")


def test_help_prints_a_percent_in_a_help_text_as_written() -> None:
    """A help text naming kured's ``%s`` placeholder is printed as written: argparse formats
    help with ``%`` (it printed its own internals, with memory addresses, for ``%s``)."""
    parser = argparse.ArgumentParser(prog="kured")
    add_arguments(parser)
    text = " ".join(parser.format_help().split())
    assert "message sent before the drain; %s is the node name" in text
    assert "0x" not in text


# --- the cron window (not kured's: kured #891) -------------------------------------------------


def test_the_cron_flags_give_a_cron_window_in_the_time_zone() -> None:
    from kured.core.cron_window import CronWindow

    s = settings_from(
        NODE,
        "--window-cron", "0 3 * * sun#1",
        "--window-duration", "2h",
        "--time-zone", "Europe/Berlin",
    )  # fmt: skip
    w = s.window()
    assert w == CronWindow("0 3 * * sun#1", timedelta(hours=2), ZoneInfo("Europe/Berlin"))
    # 2026-12-06 is the first Sunday of December: 03:00 CET is 02:00Z.
    assert w.next_open(datetime(2026, 12, 1, tzinfo=UTC)) == datetime(2026, 12, 6, 2, tzinfo=UTC)
    from_env = settings_from(
        {**NODE, "KURED_WINDOW_CRON": "0 3 * * sun#1", "KURED_WINDOW_DURATION": "2h"}
    ).window()
    assert from_env == CronWindow("0 3 * * sun#1", timedelta(hours=2), UTC)


def test_without_the_cron_flags_the_window_is_kureds_days_and_times() -> None:
    s = settings_from(NODE, "--reboot-days", "fri", "--start-time", "22:00", "--end-time", "2am")
    assert s.window() == RebootWindow(frozenset({FRIDAY}), time(22), time(2), UTC)
    assert (s.window_cron, s.window_duration) == ("", 0.0)


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (("--window-cron", "0 3 * * sun#1", "--window-duration", "2h", "--reboot-days", "sun"),
         ["cannot be combined with --reboot-days"]),
        (("--window-cron", "0 3 * * *", "--window-duration", "2h", "--start-time", "03:00",
          "--end-time", "05:00"),
         ["cannot be combined with --start-time, --end-time"]),
        # Given at all, even at their defaults: refused, not silently ignored.
        (("--window-cron", "0 3 * * *", "--window-duration", "2h",
          "--reboot-days", "su,mo,tu,we,th,fr,sa"),
         ["cannot be combined with --reboot-days"]),
        (("--window-cron", "0 3 * * *", "--window-duration", "2h", "--start-time", "00:00",
          "--end-time", "23:59:59"),
         ["cannot be combined with --start-time, --end-time"]),
        (("--window-cron", "0 3 * * sun#1"), ["--window-duration is required"]),
        (("--window-duration", "2h"), ["only meaningful with --window-cron"]),
        (("--window-cron", "0 3 1-7 * sun", "--window-duration", "2h"), ["sun#1"]),
        (("--window-cron", "0 3 30 2 *", "--window-duration", "2h"), ["30th of February"]),
        # Before: loaded, then every contains() raised OverflowError (the agent crash-looped).
        (("--window-cron", "0 3 * * *", "--window-duration", "10000h"), ["more than 366 days"]),
        (("--window-cron", "0 3 * * *", "--window-duration", "8785h"), ["more than 366 days"]),
    ],
)  # fmt: skip
def test_cron_flags_mixed_or_incomplete_are_refused_with_every_reason(
    flags: tuple[str, ...], needles: list[str]
) -> None:
    problems = problems_from(NODE, *flags)
    assert len(problems) == len(needles), problems
    for problem, needle in zip(problems, needles, strict=True):
        assert needle in problem, problems


def test_days_window_variables_at_their_defaults_with_a_cron_window_are_refused() -> None:
    cron_env = {**NODE, "KURED_WINDOW_CRON": "0 3 * * *", "KURED_WINDOW_DURATION": "2h"}
    problems = problems_from({**cron_env, "KURED_START_TIME": "00:00"})
    assert len(problems) == 1
    assert "cannot be combined with --start-time" in problems[0], problems
    problems = problems_from({**cron_env, "KURED_REBOOT_DAYS": "su,mo,tu,we,th,fr,sa"})
    assert "cannot be combined with --reboot-days" in problems[0], problems
    # Not given at all: the cron window alone loads.
    assert settings_from(cron_env).window_cron == "0 3 * * *"


def test_a_window_duration_of_366_days_is_the_longest_accepted() -> None:
    s = settings_from(NODE, "--window-cron", "0 3 1 1 *", "--window-duration", "8784h")
    assert s.window_duration == 366 * 86400
    assert s.window().contains(datetime(2027, 6, 1, tzinfo=UTC))


def test_settings_built_directly_refuse_a_mixed_window() -> None:
    from kured.core.errors import ConfigurationError

    s = Settings(node_id="n1", window_cron="0 3 * * *", window_duration=3600.0, start_time=time(3))
    with pytest.raises(ConfigurationError, match="cannot be combined with --start-time"):
        s.window()


@pytest.mark.parametrize(
    "flag", ["--alertmanager-silence-duration", "--period", "--drain-timeout", "--lock-ttl"]
)
def test_a_duration_past_gos_limit_is_refused_at_start_up(flag: str) -> None:
    """Go's time.ParseDuration refuses more than 2^63 - 1 ns (2562047h47m16.854775807s, about
    292 years), and so do we: a ``--alertmanager-silence-duration 100000000h`` was accepted
    and, added to a date, crashed the agent with its reboot lock held (a hostile tester's
    find). The largest Go duration is still taken."""
    with pytest.raises(SettingsError) as raised:
        settings_from({}, "--node-id", "n1", flag, "100000000h")
    assert "longer than a Go duration can be" in str(raised.value.problems)
    with pytest.raises(SettingsError):
        settings_from({}, "--node-id", "n1", flag, "2562048h")
    largest = settings_from({}, "--node-id", "n1", flag, "2562047h47m16s")
    assert getattr(largest, flag[2:].replace("-", "_")) == 2562047 * 3600 + 47 * 60 + 16
