"""The value types of kured's settings and the rules between them (``kured.settings``
declares the settings with these types; its docstring says where they differ from kured's).

Each type reads as its first argument to a type checker and names the parser of its text
(``kit.settings.option``); a parser raises ValueError with the problem, which ``load`` reports
with every other. ``validate_settings`` holds the rules that involve more than one setting.
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Collection
from datetime import time, tzinfo
from typing import TYPE_CHECKING, Annotated, TypeAlias

from kit.local_zone import local_zone
from kit.settings import checked, parse_http_url, parse_positive_int, split_list
from kured.core.cron_window import check_expression
from kured.core.silence_matchers import Matcher, parse_matcher
from kured.core.window import EVERY_DAY, parse_days, parse_time, parse_zone

if TYPE_CHECKING:
    from kured.settings import Settings

# The lock backends that talk to the Kubernetes API (and so can act on this node's Node).
KUBERNETES_BACKENDS = ("kubernetes", "lease")


def _optional_url(text: str) -> str:
    return "" if not text.strip() else parse_http_url(text)


OptionalUrl: TypeAlias = Annotated[str, _optional_url]


def _notify_url(text: str) -> str:
    """A ``--notify-url``: kured's shoutrrr URL or an apprise URL, kept as given once apprise
    can use its translation (``kured.core.notify_urls``)."""
    from kured.actuators.notify import check_url
    from kured.core.notify_urls import translate

    check_url(translate(text))
    return text.strip()


NotifyUrl: TypeAlias = Annotated[str, _notify_url]


def _template(text: str) -> str:
    from kured.core.notify_urls import check_template

    return check_template(text)


Template: TypeAlias = Annotated[str, _template]


SilenceMatcher: TypeAlias = Annotated[Matcher, parse_matcher]


def parse_argv(text: str) -> tuple[str, ...]:
    """POSIX shell-style words, no shell (kured lexes with google/shlex the same way)."""
    try:
        return tuple(shlex.split(text))
    except ValueError as exc:
        raise ValueError(f"cannot split into words: {exc}") from None


Argv: TypeAlias = Annotated[tuple[str, ...], parse_argv]


def _signal(text: str) -> int:
    return checked(parse_positive_int(text), lambda n: n <= 64, "must be a signal number 1-64")


Signal: TypeAlias = Annotated[int, _signal]


def _days(text: str) -> frozenset[int]:
    # One occurrence of --reboot-days; it may itself be a comma list (pflag string slice).
    return parse_days([text])


Days: TypeAlias = Annotated[frozenset[int], _days]


def _regexp(text: str) -> re.Pattern[str] | None:
    if text == "":
        return None
    try:
        return re.compile(text)
    except re.error as exc:
        raise ValueError(f"invalid regular expression: {exc}") from None


Regexp: TypeAlias = Annotated[re.Pattern[str] | None, _regexp]


def _labels(text: str) -> tuple[tuple[str, str], ...]:
    """One occurrence of a node-label flag: ``key=value`` entries, comma-separated (a pflag
    string slice). An entry without ``=`` is refused (kured crashes on it at the first
    reboot)."""
    out = []
    for item in split_list(text):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{item!r} is not key=value")
        out.append((key.strip(), value.strip()))
    return tuple(out)


Labels: TypeAlias = Annotated[tuple[tuple[str, str], ...], _labels]


_QUALIFIED_NAME = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


def _taint_key(text: str) -> str:
    """'' (off) or a taint key: a Kubernetes qualified name (optional DNS prefix ``/``, a name
    of at most 63 characters), the rule the API server applies to taint keys."""
    text = text.strip()
    if text and (not _QUALIFIED_NAME.match(text) or len(text.rpartition("/")[2]) > 63):
        raise ValueError(f"{text!r} is not a valid taint key (e.g. kured.dev/kured-node-reboot)")
    return text


TaintKey: TypeAlias = Annotated[str, _taint_key]
Stripped: TypeAlias = Annotated[str, str.strip]
ClockTime: TypeAlias = Annotated[time, parse_time]
Zone: TypeAlias = Annotated[tzinfo, functools.partial(parse_zone, local=local_zone)]


def _cron_expression(text: str) -> str:
    """``--window-cron``: empty (off) or a cron expression ``kured.core.cron_window`` takes."""
    return check_expression(text) if text.strip() else ""


CronExpression: TypeAlias = Annotated[str, _cron_expression]


# The longest --window-duration: 366 days, a yearly opening ('0 3 1 1 *') lasting until the next
# one in a leap year. Longer is a slip of the unit, not a window (it is open for good after the
# first opening); and far longer ones (100000000h) end past year 9999, where datetimes end.
MAX_WINDOW_DURATION_SECONDS = 366 * 86400


# The days-and-times window's settings: field, flag, default.
DAYS_WINDOW_SETTINGS = (
    ("reboot_days", "--reboot-days", EVERY_DAY),
    ("start_time", "--start-time", time(0, 0)),
    ("end_time", "--end-time", time(23, 59, 59)),
)


def window_mix_problems(s: Settings, given: Collection[str] | None = None) -> list[str]:
    """The problems of mixing the cron window (``--window-cron``, ``--window-duration``) with
    the days-and-times window: one window at a time, and the cron one needs both flags.

    ``given``: the names of the fields set by a flag or an environment variable (``load_settings``
    knows): one of the days-and-times settings given at all, even to its default, is mixing.
    Without it (settings built directly), one set to other than its default is."""
    days_window = [
        flag
        for name, flag, default in DAYS_WINDOW_SETTINGS
        if (name in given if given is not None else getattr(s, name) != default)
    ]
    problems = []
    if s.window_cron and days_window:
        problems.append(
            f"KURED_WINDOW_CRON / --window-cron cannot be combined with {', '.join(days_window)}: "
            "the window is either a cron expression plus --window-duration, or days plus start "
            "and end times (--time-zone applies to both)"
        )
    if s.window_cron and not s.window_duration:
        problems.append(
            "KURED_WINDOW_DURATION / --window-duration is required with --window-cron: how long "
            "each opening lasts (e.g. 2h); a cron expression only names when it starts"
        )
    if s.window_duration and not s.window_cron:
        problems.append(
            "KURED_WINDOW_DURATION / --window-duration is only meaningful with --window-cron"
        )
    if s.window_duration and s.window_duration < 1:
        problems.append("KURED_WINDOW_DURATION / --window-duration must be at least 1s")
    if s.window_duration > MAX_WINDOW_DURATION_SECONDS:
        problems.append(
            f"KURED_WINDOW_DURATION / --window-duration is {s.window_duration:.0f}s, more than "
            f"{MAX_WINDOW_DURATION_SECONDS // 86400} days: an opening that long outlasts even a "
            "yearly expression's gap, so the window would never close (check the unit: 2h, not "
            "2000000h)"
        )
    return problems


def validate_settings(s: Settings, given: Collection[str] | None = None) -> list[str]:
    """Cross-field rules; returns every problem found (empty when the settings are usable).
    ``given``: as for ``window_mix_problems``."""
    problems: list[str] = window_mix_problems(s, given)
    if s.start_time == s.end_time and not s.window_cron:
        # kured (pkg/timewindow) makes this a one-second window, silently; nobody means that.
        problems.append(
            f"KURED_START_TIME / --start-time and KURED_END_TIME / --end-time are both "
            f"{s.start_time.isoformat()}: that window is open for one second a day. For all day "
            "use --start-time 00:00 --end-time 23:59:59; otherwise give a later end (an end "
            "before the start crosses midnight)"
        )
    if s.reboot_method == "command" and not s.reboot_command:
        problems.append(
            "KURED_REBOOT_COMMAND / --reboot-command must not be empty with --reboot-method=command"
        )
    if s.lock_backend == "etcd" and not s.etcd_endpoints:
        problems.append(
            "KURED_ETCD_ENDPOINTS / --etcd-endpoints must name at least one URL "
            "with --lock-backend=etcd"
        )
    if s.alertmanager_url and not s.alertmanager_silence_matcher:
        problems.append(
            "KURED_ALERTMANAGER_URL / --alertmanager-url needs at least one "
            "--alertmanager-silence-matcher (e.g. instance=~%s(:[0-9]+)?): a silence without "
            "matchers would silence everything"
        )
    if s.alertmanager_silence_matcher and not any(
        m.names_the_node for m in s.alertmanager_silence_matcher
    ):
        problems.append(
            "--alertmanager-silence-matcher: at least one matcher must name the node with %s "
            "(e.g. instance=~%s(:[0-9]+)?): matchers without it silence their alerts on every "
            "node, cluster-wide, during each reboot"
        )
    if s.alertmanager_silence_matcher and not s.alertmanager_url:
        problems.append("--alertmanager-silence-matcher needs --alertmanager-url")
    if s.lock_backend not in KUBERNETES_BACKENDS:
        needs = [
            flag
            for flag, used in (
                ("--blocking-pod-selector", bool(s.blocking_pod_selector)),
                ("--pre-reboot-node-labels", bool(s.pre_reboot_node_labels)),
                ("--post-reboot-node-labels", bool(s.post_reboot_node_labels)),
                ("--annotate-nodes", s.annotate_nodes),
                ("--drain-delay", s.drain_delay > 0),
                ("--drain-pod-selector", bool(s.drain_pod_selector)),
                ("--prefer-no-schedule-taint", bool(s.prefer_no_schedule_taint)),
                ("--release-lock-of-deleted-nodes", s.release_lock_of_deleted_nodes),
            )
            if used
        ]
        if needs:
            problems.append(
                ", ".join(needs)
                + " need --lock-backend=kubernetes or lease (they act on the Node object)"
            )
    return problems
