"""kured's settings: every flag, its ``KURED_<FLAG>`` environment override, and their rules.

Flag names, defaults and value syntax are kured 1.23.0's (docs/reference/kured-behaviour.md §1)
so existing DaemonSet manifests and Helm values keep working: Go durations (``30m``, ``1h30m``,
``1.5s``, ``0``), Go booleans (``true``, ``1``, ``T``...), comma-separated lists, and the window
syntax of ``kured.core.window``. The environment variable of ``--lock-release-delay`` is
``KURED_LOCK_RELEASE_DELAY``: the flag upper-cased, ``-`` turned into ``_``.

Precedence is kured's: **the environment overrides the command line** (kured applies
``KURED_*`` on top of the parsed flags). For a repeatable flag (``--reboot-days``,
``--gate-url``) an environment value replaces the flag's values. kured, through pflag, most
likely appends them instead (kured-behaviour.md §1.1 marks that as inferred); replacing is what
"override" means and lets a manifest's env undo a flag.

Where we differ from kured, on purpose:

* Every problem is reported at once (``SettingsError.problems``) instead of exiting at the first.
* ``--start-time`` equal to ``--end-time`` is refused: kured's ``pkg/timewindow`` accepts it
  as a one-second window (the end is inclusive through its second), which nobody configures
  on purpose.
* Values kured accepts but ignores are refused: an unknown ``--log-format``, a negative duration,
  a non-positive ``--period``, a Prometheus or gate URL that is not http(s).
* An empty ``--alert-filter-regexp`` means "no filter". In kured an empty regexp matches every
  alert name, which (without ``--alert-filter-match-only``) silently ignores every alert.
* The regexp is Python's ``re``, not RE2. Patterns kured users write (alternations, classes,
  anchors) mean the same in both.
* A ``KURED_*`` variable that names no flag stops the start with a message naming the closest
  flag's variable (kured ignores it, so ``KURED_REBOOT_DAY`` for ``KURED_REBOOT_DAYS`` is lost
  in silence), unless ``--allow-unknown-settings`` / ``KURED_ALLOW_UNKNOWN_SETTINGS`` is true.
  The Kubernetes service links of a Service ``kured`` (``KURED_PORT=tcp://...``,
  ``KURED_SERVICE_HOST``, ...) are recognised and ignored (``kit.service_link``).
* Boolean flags may be given bare (``--alert-firing-only``), as with pflag; use
  ``kured.settings.add_arguments`` to get that (``kit.settings.add_arguments`` makes every flag
  take a value).

Durations are float seconds. Field names are the flag names (``period``, ``lock_ttl``,
``gate_timeout``...) without the house ``_seconds`` suffix, on purpose: one name per setting
across flags, environment, docs and code reads better than a suffix, and the type and this
docstring carry the unit.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import re
import shlex
from collections.abc import Mapping
from datetime import UTC, time, tzinfo
from pathlib import Path
from typing import Any

from kit.local_zone import local_zone
from kit.settings import (
    Environment,
    Option,
    load,
    option,
    options_of,
    parse_bool,
    parse_choice,
    parse_duration,
    parse_http_url,
    parse_http_urls,
    parse_int,
    parse_non_empty,
    parse_non_negative_int,
    parse_path,
    parse_port,
    parse_positive_int,
    screen_environment,
    split_list,
)
from kured.core.window import EVERY_DAY, RebootWindow, parse_days, parse_time, parse_zone

DEFAULT_REBOOT_COMMAND = ("/bin/systemctl", "reboot")
# The lock backends that talk to the Kubernetes API (and so can act on this node's Node).
KUBERNETES_BACKENDS = ("kubernetes", "lease")


def _optional_url(text: str) -> str:
    return "" if not text.strip() else parse_http_url(text)


def _notify_url(text: str) -> str:
    """A ``--notify-url``: kured's shoutrrr URL or an apprise URL, kept as given once apprise
    can use its translation (``kured.core.notify_urls``)."""
    from kured.actuators.notify import check_url
    from kured.core.notify_urls import translate

    check_url(translate(text))
    return text.strip()


def _template(text: str) -> str:
    from kured.core.notify_urls import check_template

    return check_template(text)


def _duration(text: str) -> float:
    seconds = parse_duration(text)
    if seconds < 0:
        raise ValueError("must not be negative")
    return seconds


def _positive_duration(text: str) -> float:
    seconds = parse_duration(text)
    if seconds <= 0:
        raise ValueError("must be greater than 0")
    return seconds


def _argv(text: str) -> tuple[str, ...]:
    """POSIX shell-style words, no shell (kured lexes with google/shlex the same way)."""
    try:
        return tuple(shlex.split(text))
    except ValueError as exc:
        raise ValueError(f"cannot split into words: {exc}") from None


def _signal(text: str) -> int:
    value = parse_positive_int(text)
    if value > 64:
        raise ValueError("must be a signal number 1-64")
    return value


def _days(text: str) -> frozenset[int]:
    # One occurrence of --reboot-days; it may itself be a comma list (pflag string slice).
    return parse_days([text])


def _regexp(text: str) -> re.Pattern[str] | None:
    if text == "":
        return None
    try:
        return re.compile(text)
    except re.error as exc:
        raise ValueError(f"invalid regular expression: {exc}") from None


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


def _flatten(value: Any) -> Any:
    """``kit.settings.load`` hands a repeatable option the tuple of its per-occurrence parses;
    for options whose one occurrence is itself a list, join them."""
    # The joined form holds (key, value) pairs of strings; the per-occurrence form holds
    # tuples of such pairs (possibly empty), never strings.
    if isinstance(value, tuple) and all(
        isinstance(item, tuple) and all(isinstance(pair, tuple) for pair in item) for item in value
    ):
        return tuple(pair for occurrence in value for pair in occurrence)
    return value


def _flag(name: str) -> tuple[str, str]:
    """(env, flag) for a kured flag name: ``lock-ttl`` -> (``KURED_LOCK_TTL``, ``--lock-ttl``)."""
    return "KURED_" + name.upper().replace("-", "_"), "--" + name


@dataclasses.dataclass(frozen=True)
class Settings:
    """One agent's configuration. Durations are seconds; see the module docstring."""

    node_id: str = option(
        *_flag("node-id"),
        parse_non_empty,
        "this node's name: lock owner id and metric label (required)",
    )
    period: float = option(
        *_flag("period"), _positive_duration, "interval of the main loop", default=3600.0
    )
    concurrency: int = option(
        *_flag("concurrency"),
        parse_positive_int,
        "how many nodes may hold the reboot lock at once",
        default=1,
    )
    lock_ttl: float = option(
        *_flag("lock-ttl"),
        _duration,
        "TTL written into the lock records this agent creates: such a record older than it "
        "expires (0 = never). Expiry uses each record's own TTL, so a record written with "
        "TTL 0 (kured's default, the manual pause) never expires",
        default=0.0,
    )
    lock_release_delay: float = option(
        *_flag("lock-release-delay"),
        _duration,
        "wait this long before releasing the lock after a reboot",
        default=0.0,
    )
    lock_backend: str = option(
        *_flag("lock-backend"),
        parse_choice(["etcd", "kubernetes", "lease"]),
        "where the lock lives: etcd, kubernetes (a DaemonSet annotation) or lease (a "
        "coordination.k8s.io/v1 Lease; the node steps as with kubernetes)",
        default="etcd",
    )
    etcd_endpoints: tuple[str, ...] = option(
        *_flag("etcd-endpoints"),
        parse_http_urls,
        "comma-separated etcd client URLs",
        default=("http://127.0.0.1:2379",),
    )
    lock_key: str = option(
        *_flag("lock-key"),
        parse_non_empty,
        "etcd key holding the lock record",
        default="/kured/lock",
    )
    ds_namespace: str = option(
        *_flag("ds-namespace"),
        parse_non_empty,
        "namespace of the DaemonSet holding the lock (kubernetes backend)",
        default="kube-system",
    )
    ds_name: str = option(
        *_flag("ds-name"),
        parse_non_empty,
        "name of the DaemonSet holding the lock (kubernetes backend)",
        default="kured",
    )
    lock_annotation: str = option(
        *_flag("lock-annotation"),
        parse_non_empty,
        "annotation that stores the lock record: on the DaemonSet (kubernetes backend) or the "
        "Lease (lease backend)",
        default="weave.works/kured-node-lock",
    )
    lease_namespace: str = option(
        *_flag("lease-namespace"),
        parse_non_empty,
        "namespace of the Lease holding the lock (lease backend)",
        default="kube-system",
    )
    lease_name: str = option(
        *_flag("lease-name"),
        parse_non_empty,
        "name of the Lease holding the lock (lease backend; created at the first acquire)",
        default="kured",
    )
    kubeconfig: str = option(
        *_flag("kubeconfig"),
        str.strip,
        "kubeconfig file for the kubernetes backend ('' = the pod's service account, in-cluster)",
        default="",
    )
    kubernetes_timeout: float = option(
        *_flag("kubernetes-timeout"),
        _positive_duration,
        "timeout of one Kubernetes API request",
        default=10.0,
    )
    drain_timeout: float = option(
        *_flag("drain-timeout"),
        _duration,
        "give a drain up after this long: uncordon and release the lock, or reboot anyway with "
        "--force-reboot (0 = wait for ever)",
        default=0.0,
    )
    drain_grace_period: int = option(
        *_flag("drain-grace-period"),
        parse_int,
        "grace seconds for each evicted pod (negative = the pod's own; 0 = kill at once)",
        default=-1,
    )
    skip_wait_for_delete_timeout: int = option(
        *_flag("skip-wait-for-delete-timeout"),
        parse_non_negative_int,
        "neither evict nor wait for pods terminating for longer than this many seconds (0 = off)",
        default=0,
    )
    drain_delay: float = option(
        *_flag("drain-delay"),
        _duration,
        "wait this long after taking the lock (and the pre-reboot labels) before the cordon "
        "and drain (0 = off)",
        default=0.0,
    )
    drain_pod_selector: str = option(
        *_flag("drain-pod-selector"),
        str.strip,
        "label selector: the drain evicts only the pods that match it, e.g. to leave Longhorn's "
        "instance managers for its own node drain policy ('' = every pod)",
        default="",
    )
    reboot_delay: float = option(
        *_flag("reboot-delay"),
        _duration,
        "wait this long after the drain before running the reboot (0 = off)",
        default=0.0,
    )
    prefer_no_schedule_taint: str = option(
        *_flag("prefer-no-schedule-taint"),
        _taint_key,
        "taint key put on the node with effect PreferNoSchedule while it waits for the lock, "
        "so new pods avoid a node about to be drained; removed once no reboot is pending "
        "('' = off; kured's chart suggests kured.dev/kured-node-reboot)",
        default="",
    )
    release_lock_of_deleted_nodes: bool = option(
        *_flag("release-lock-of-deleted-nodes"),
        parse_bool,
        "release the lock of a holder whose Node the API has answered 404 for longer than "
        "--deleted-node-grace (never kured's manual pause record); logged and counted",
        default=False,
    )
    deleted_node_grace: float = option(
        *_flag("deleted-node-grace"),
        _positive_duration,
        "how long a lock holder's Node must be absent before --release-lock-of-deleted-nodes "
        "releases its lock (checked at each check, so at least one --period)",
        default=600.0,
    )
    force_reboot: bool = option(
        *_flag("force-reboot"),
        parse_bool,
        "reboot even when the cordon or drain failed or timed out",
        default=False,
    )
    blocking_pod_selector: tuple[str, ...] = option(
        *_flag("blocking-pod-selector"),
        parse_non_empty,
        "label selector: a matching pod on this node that has not finished blocks reboots "
        "(repeatable, ORed; in the environment separate selectors with ';')",
        default=(),
        repeatable=True,
        separator=";",
    )
    pre_reboot_node_labels: tuple[tuple[str, str], ...] = option(
        *_flag("pre-reboot-node-labels"),
        _labels,
        "key=value labels set on the node before the cordon (comma-separated, repeatable)",
        default=(),
        repeatable=True,
    )
    post_reboot_node_labels: tuple[tuple[str, str], ...] = option(
        *_flag("post-reboot-node-labels"),
        _labels,
        "key=value labels set on the node when it gives the lock back after the reboot or a "
        "failed drain, also when it stays cordoned (comma-separated, repeatable)",
        default=(),
        repeatable=True,
    )
    annotate_nodes: bool = option(
        *_flag("annotate-nodes"),
        parse_bool,
        "write kured's weave.works/kured-reboot-in-progress and "
        "weave.works/kured-most-recent-reboot-needed node annotations",
        default=False,
    )
    reboot_sentinel: Path = option(
        *_flag("reboot-sentinel"),
        parse_path,
        "file whose existence means a reboot is needed",
        default=Path("/var/run/reboot-required"),
    )
    reboot_sentinel_command: tuple[str, ...] = option(
        *_flag("reboot-sentinel-command"),
        _argv,
        "command (split like a shell, run without one) whose exit 0 means a reboot is needed; "
        "replaces the file check",
        default=(),
    )
    reboot_sentinel_kernel: bool = option(
        *_flag("reboot-sentinel-kernel"),
        parse_bool,
        "also require a reboot when the running kernel is older than the newest installed",
        default=False,
    )
    reboot_command: tuple[str, ...] = option(
        *_flag("reboot-command"),
        _argv,
        "command that reboots the host (split like a shell, run without one)",
        default=DEFAULT_REBOOT_COMMAND,
    )
    host_namespace: str = option(
        *_flag("host-namespace"),
        parse_choice(["auto", "true", "false"]),
        "run --reboot-command in PID 1's mount namespace through nsenter: auto = when this "
        "process runs in another mount namespace than PID 1 (a container with hostPID)",
        default="auto",
    )
    reboot_method: str = option(
        *_flag("reboot-method"),
        parse_choice(["command", "signal"]),
        "reboot by running --reboot-command or by sending --reboot-signal to PID 1",
        default="command",
    )
    reboot_signal: int = option(
        *_flag("reboot-signal"),
        _signal,
        "signal sent to PID 1 for --reboot-method=signal (39 = SIGRTMIN+5: systemd reboot)",
        default=39,
    )
    reboot_days: frozenset[int] = option(
        *_flag("reboot-days"),
        _days,
        "days the window opens (su..sa or 0-6, comma-separated, repeatable; empty = never)",
        default=EVERY_DAY,
        repeatable=True,
    )
    start_time: time = option(
        *_flag("start-time"), parse_time, "window start, local to --time-zone", default=time(0, 0)
    )
    end_time: time = option(
        *_flag("end-time"),
        parse_time,
        "window end, inclusive through that second",
        default=time(23, 59, 59),
    )
    time_zone: tzinfo = option(
        *_flag("time-zone"),
        functools.partial(parse_zone, local=local_zone),
        "zone of the window: an IANA name, UTC or Local",
        default=UTC,
    )
    prometheus_url: str = option(
        *_flag("prometheus-url"),
        _optional_url,
        "Prometheus base URL; firing alerts block reboots ('' = off)",
        default="",
    )
    alert_filter_regexp: re.Pattern[str] | None = option(
        *_flag("alert-filter-regexp"),
        _regexp,
        "alerts whose names match (unanchored search) are ignored",
        default=None,
    )
    alert_filter_match_only: bool = option(
        *_flag("alert-filter-match-only"),
        parse_bool,
        "only alerts matching --alert-filter-regexp block, instead of all others",
        default=False,
    )
    alert_firing_only: bool = option(
        *_flag("alert-firing-only"),
        parse_bool,
        "only firing alerts block; pending ones are ignored",
        default=False,
    )
    gate_url: tuple[str, ...] = option(
        *_flag("gate-url"),
        parse_http_url,
        "HTTP gate: a reboot is allowed only while it answers 2xx (repeatable)",
        default=(),
        repeatable=True,
    )
    gate_timeout: float = option(
        *_flag("gate-timeout"), _positive_duration, "timeout of one gate request", default=5.0
    )
    notify_url: tuple[str, ...] = option(
        *_flag("notify-url"),
        _notify_url,
        "where to send the drain, reboot and uncordon messages: a shoutrrr URL as kured takes "
        "(smtp://, generic://, slack://, discord://, telegram://, gotify://, pushover://) or an "
        "apprise URL (repeatable; in the environment separate URLs with ';'; delivery never "
        "blocks a reboot)",
        default=(),
        repeatable=True,
        separator=";",
    )
    message_template_drain: str = option(
        *_flag("message-template-drain"),
        _template,
        "message sent before the drain; %s is the node name",
        default="Draining node %s",
    )
    message_template_reboot: str = option(
        *_flag("message-template-reboot"),
        _template,
        "message sent right before the reboot; %s is the node name",
        default="Rebooting node %s",
    )
    message_template_uncordon: str = option(
        *_flag("message-template-uncordon"),
        _template,
        "message sent after the reboot once the node is uncordoned; %s is the node name",
        default="Node %s rebooted & uncordoned successfully!",
    )
    notify_timeout: float = option(
        *_flag("notify-timeout"),
        _positive_duration,
        "bound of one notification delivery (and of the wait for the reboot message)",
        default=10.0,
    )
    prometheus_timeout: float = option(
        *_flag("prometheus-timeout"),
        _positive_duration,
        "timeout of one Prometheus query",
        default=10.0,
    )
    metrics_host: str = option(
        *_flag("metrics-host"), str.strip, "bind address for /metrics ('' = all)", default=""
    )
    metrics_port: int = option(
        *_flag("metrics-port"), parse_port, "bind port for /metrics", default=8080
    )
    state_dir: Path = option(
        *_flag("state-dir"),
        parse_path,
        "where the agent keeps its reboot bookkeeping",
        default=Path("/var/lib/kured"),
    )
    boot_id_file: Path = option(
        *_flag("boot-id-file"),
        parse_path,
        "the kernel's boot ID; a reboot is confirmed when it changed (proc(5))",
        default=Path("/proc/sys/kernel/random/boot_id"),
    )
    max_consecutive_reboots: int = option(
        *_flag("max-consecutive-reboots"),
        parse_positive_int,
        "circuit breaker: stop after this many reboots in a row that did not clear the sentinel",
        default=3,
    )
    min_reboot_interval: float = option(
        *_flag("min-reboot-interval"),
        _duration,
        "after a reboot attempt that did not clear the sentinel (still required after the "
        "reboot, or the reboot command failed), no new attempt before this much later (0 = off)",
        default=86400.0,
    )
    log_format: str = option(
        *_flag("log-format"), parse_choice(["text", "json"]), "text or json", default="text"
    )
    # Not kured's: kured ignores a KURED_* variable that names no flag, so a misspelt one is lost.
    allow_unknown_settings: bool = option(
        *_flag("allow-unknown-settings"),
        parse_bool,
        "start even when a KURED_* variable names no flag (warned once); by default the start "
        "is refused, naming the closest one",
        default=False,
    )

    def __post_init__(self) -> None:
        # ``kit.settings.load`` hands a repeatable option the tuple of its per-occurrence parses;
        # each ``--reboot-days`` occurrence is already a set of days, so take their union.
        days: Any = self.reboot_days
        if isinstance(days, tuple):
            object.__setattr__(self, "reboot_days", frozenset[int]().union(*days))
        for name in ("pre_reboot_node_labels", "post_reboot_node_labels"):
            object.__setattr__(self, name, _flatten(getattr(self, name)))

    def window(self) -> RebootWindow:
        """The reboot window these settings describe."""
        return RebootWindow(self.reboot_days, self.start_time, self.end_time, self.time_zone)


def go_duration(seconds: float) -> str:
    """``seconds`` as the Go duration a user would write: ``1h``, ``1h30m``, ``1.5s``, ``0``
    (millisecond resolution; ``parse_duration`` reads every answer back to the same value)."""
    total_ms = round(seconds * 1000)
    if total_ms == 0:
        return "0"
    hours, rest = divmod(total_ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else ""]
    parts.append(f"{rest / 1000:g}s" if rest else "")
    return "".join(parts)


# Placeholders for values that have no text a flag could take.
REQUIRED, EMPTY, NONE, UNSET = "(required)", "(empty)", "(none)", "(unset)"


def flag_text(opt: Option, value: Any) -> str:
    """``value`` of the setting ``opt`` written as its flag accepts it (durations as Go
    durations, booleans as ``true``/``false``, lists comma-separated, commands as shell words),
    or one of the placeholders ``(empty)``, ``(none)`` (an empty list) and ``(unset)``. Used
    for the start-up log line and the flag table in docs/kured.md (a test checks the table)."""
    if value is None:
        return UNSET
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return go_duration(value)
    if isinstance(value, re.Pattern):
        return str(value.pattern)
    if isinstance(value, time):
        return value.isoformat()
    if isinstance(value, frozenset):
        return ",".join(str(day) for day in sorted(value))
    if isinstance(value, tuple):
        if not value:
            return NONE
        if opt.parse is _argv:
            return shlex.join(value)
        if all(isinstance(item, tuple) for item in value):
            return ",".join(f"{k}={v}" for k, v in value)
        return opt.separator.join(str(item) for item in value)
    text = str(value)
    return text if text else EMPTY


def describe(s: Settings) -> str:
    """Every setting as ``--flag=value``, for the start-up log (notify URLs as
    ``scheme://host``: their tokens are secrets)."""
    from kured.core.notify_urls import redact

    def text(name: str, opt: Option) -> str:
        value = getattr(s, name)
        if name == "notify_url" and value:
            value = tuple(redact(u) for u in value)
        return flag_text(opt, value)

    return " ".join(f"{o.flag}={text(f.name, o)}" for f, o in options_of(Settings))


def validate_settings(s: Settings) -> list[str]:
    """Cross-field rules; returns every problem found (empty when the settings are usable)."""
    problems: list[str] = []
    if s.start_time == s.end_time:
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every kured flag to ``parser``. Boolean flags may be given bare (``--flag`` = true),
    as pflag allows; values stay text so ``load_settings`` reports every problem."""
    for f, opt in options_of(Settings):
        kwargs: dict[str, Any] = {"dest": f.name, "default": None, "metavar": opt.metavar}
        if opt.repeatable:
            kwargs["action"] = "append"
        if opt.parse is parse_bool:
            kwargs.update(nargs="?", const="true", metavar="BOOL")
        parser.add_argument(opt.flag, help=f"{opt.help} (env {opt.env})", **kwargs)


# KURED_* variables that are not the agent's flags but that kured's other commands read.
NOT_AGENT_SETTINGS = (
    "KURED_STATUS_URL",  # kured status --url
    "KURED_ADDRESS_TYPES",  # kured status --all
    "KURED_FLEETLOCK_HOST",  # kured fleetlock
    "KURED_FLEETLOCK_PORT",
    "KURED_FLEETLOCK_PREFIX",
    "KURED_FLEETLOCK_DEFAULT_SLOTS",
    "KURED_FLEETLOCK_GROUP_SLOTS",
)


def load_settings(args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    """Settings from parsed flags and the environment, the environment winning (kured's rule).

    Raises ``kit.settings.SettingsError`` listing every invalid or missing value, and every
    ``KURED_*`` variable that names no flag (and is not in ``NOT_AGENT_SETTINGS`` or a
    Kubernetes service link) unless KURED_ALLOW_UNKNOWN_SETTINGS is true.
    """
    return load(
        Settings,
        args,
        environ,
        precedence="env-over-flag",
        validate=validate_settings,
        prefix="KURED_",
        also_known=NOT_AGENT_SETTINGS,
        allow_unknown_env="KURED_ALLOW_UNKNOWN_SETTINGS",
    )


def environment(environ: Mapping[str, str]) -> Environment:
    """``environ``'s ``KURED_*`` variables sorted as ``load_settings`` sorts them."""
    return screen_environment(Settings, environ, "KURED_", NOT_AGENT_SETTINGS)
