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
  take a value unless told ``bare_booleans``).

Durations are float seconds. Field names are the flag names (``period``, ``lock_ttl``,
``gate_timeout``...) without the house ``_seconds`` suffix, on purpose: one name per setting
across flags, environment, docs and code reads better than a suffix, and the type and this
docstring carry the unit.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import shlex
from collections.abc import Mapping
from datetime import UTC, time, timedelta
from pathlib import Path
from typing import Any, ClassVar, Literal

from kit import settings as kit_settings
from kit.settings import (
    Bool,
    Duration,
    Environment,
    FilePath,
    HttpUrl,
    HttpUrls,
    Int,
    NonEmpty,
    NonNegativeInt,
    Option,
    Port,
    PositiveDuration,
    PositiveInt,
    load,
    option,
    options_of,
    screen_environment,
)
from kured.core.cron_window import CronWindow
from kured.core.errors import ConfigurationError
from kured.core.window import EVERY_DAY, RebootWindow
from kured.settings_rules import (
    DAYS_WINDOW_SETTINGS,
    Argv,
    ClockTime,
    CronExpression,
    Days,
    Labels,
    NotifyUrl,
    OptionalUrl,
    Regexp,
    Signal,
    SilenceMatcher,
    Stripped,
    TaintKey,
    Template,
    Zone,
    parse_argv,
    validate_settings,
    window_mix_problems,
)

DEFAULT_REBOOT_COMMAND = ("/bin/systemctl", "reboot")


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


@dataclasses.dataclass(frozen=True)
class Settings:
    """One agent's configuration. Durations are seconds; see the module docstring."""

    ENV_PREFIX: ClassVar[str] = "KURED_"

    node_id: NonEmpty = option(help="this node's name: lock owner id and metric label (required)")
    period: PositiveDuration = option(3600.0, "interval of the main loop")
    concurrency: PositiveInt = option(1, "how many nodes may hold the reboot lock at once")
    lock_ttl: Duration = option(
        0.0,
        "TTL written into the lock records this agent creates: such a record older than it "
        "expires (0 = never). Expiry uses each record's own TTL, so a record written with TTL 0 "
        "(kured's default, the manual pause) never expires",
    )
    lock_release_delay: Duration = option(
        0.0, "wait this long before releasing the lock after a reboot"
    )
    lock_backend: Literal["etcd", "kubernetes", "lease"] = option(
        "etcd",
        "where the lock lives: etcd, kubernetes (a DaemonSet annotation) or lease (a "
        "coordination.k8s.io/v1 Lease; the node steps as with kubernetes)",
    )
    etcd_endpoints: HttpUrls = option(
        ("http://127.0.0.1:2379",), "comma-separated etcd client URLs"
    )
    lock_key: NonEmpty = option("/kured/lock", "etcd key holding the lock record")
    ds_namespace: NonEmpty = option(
        "kube-system", "namespace of the DaemonSet holding the lock (kubernetes backend)"
    )
    ds_name: NonEmpty = option(
        "kured", "name of the DaemonSet holding the lock (kubernetes backend)"
    )
    lock_annotation: NonEmpty = option(
        "weave.works/kured-node-lock",
        "annotation that stores the lock record: on the DaemonSet (kubernetes backend) or the "
        "Lease (lease backend)",
    )
    lease_namespace: NonEmpty = option(
        "kube-system", "namespace of the Lease holding the lock (lease backend)"
    )
    lease_name: NonEmpty = option(
        "kured", "name of the Lease holding the lock (lease backend; created at the first acquire)"
    )
    kubeconfig: Stripped = option(
        "",
        "kubeconfig file for the kubernetes backend ('' = the pod's service account, in-cluster)",
    )
    kubernetes_timeout: PositiveDuration = option(10.0, "timeout of one Kubernetes API request")
    drain_timeout: Duration = option(
        0.0,
        "give a drain up after this long: uncordon and release the lock, or reboot anyway with "
        "--force-reboot (0 = wait for ever)",
    )
    drain_grace_period: Int = option(
        -1, "grace seconds for each evicted pod (negative = the pod's own; 0 = kill at once)"
    )
    skip_wait_for_delete_timeout: NonNegativeInt = option(
        0, "neither evict nor wait for pods terminating for longer than this many seconds (0 = off)"
    )
    drain_delay: Duration = option(
        0.0,
        "wait this long after taking the lock (and the pre-reboot labels) before the cordon and "
        "drain (0 = off)",
    )
    drain_pod_selector: Stripped = option(
        "",
        "label selector: the drain evicts only the pods that match it, e.g. to leave Longhorn's "
        "instance managers for its own node drain policy ('' = every pod)",
    )
    reboot_delay: Duration = option(
        0.0, "wait this long after the drain before running the reboot (0 = off)"
    )
    prefer_no_schedule_taint: TaintKey = option(
        "",
        "taint key put on the node with effect PreferNoSchedule while it waits for the lock, so "
        "new pods avoid a node about to be drained; removed once no reboot is pending ('' = off; "
        "kured's chart suggests kured.dev/kured-node-reboot)",
    )
    release_lock_of_deleted_nodes: Bool = option(
        False,
        "release the lock of a holder whose Node the API has answered 404 for longer than "
        "--deleted-node-grace (never kured's manual pause record); logged and counted",
    )
    deleted_node_grace: PositiveDuration = option(
        600.0,
        "how long a lock holder's Node must be absent before --release-lock-of-deleted-nodes "
        "releases its lock (checked at each check, so at least one --period)",
    )
    force_reboot: Bool = option(False, "reboot even when the cordon or drain failed or timed out")
    blocking_pod_selector: tuple[NonEmpty, ...] = option(
        (),
        "label selector: a matching pod on this node that has not finished blocks reboots "
        "(repeatable, ORed; in the environment separate selectors with ';')",
        repeatable=True,
        separator=";",
    )
    pre_reboot_node_labels: Labels = option(
        (),
        "key=value labels set on the node before the cordon (comma-separated, repeatable)",
        repeatable=True,
    )
    post_reboot_node_labels: Labels = option(
        (),
        "key=value labels set on the node when it gives the lock back after the reboot or a "
        "failed drain, also when it stays cordoned (comma-separated, repeatable)",
        repeatable=True,
    )
    annotate_nodes: Bool = option(
        False,
        "write kured's weave.works/kured-reboot-in-progress and "
        "weave.works/kured-most-recent-reboot-needed node annotations",
    )
    reboot_sentinel: FilePath = option(
        Path("/var/run/reboot-required"), "file whose existence means a reboot is needed"
    )
    reboot_sentinel_command: Argv = option(
        (),
        "command (split like a shell, run without one) whose exit 0 means a reboot is needed; "
        "replaces the file check",
    )
    reboot_sentinel_kernel: Bool = option(
        False, "also require a reboot when the running kernel is older than the newest installed"
    )
    reboot_command: Argv = option(
        DEFAULT_REBOOT_COMMAND,
        "command that reboots the host (split like a shell, run without one)",
    )
    host_namespace: Literal["auto", "true", "false"] = option(
        "auto",
        "run --reboot-command in PID 1's mount namespace through nsenter: auto = when this "
        "process runs in another mount namespace than PID 1 (a container with hostPID)",
    )
    reboot_method: Literal["command", "signal"] = option(
        "command", "reboot by running --reboot-command or by sending --reboot-signal to PID 1"
    )
    reboot_signal: Signal = option(
        39, "signal sent to PID 1 for --reboot-method=signal (39 = SIGRTMIN+5: systemd reboot)"
    )
    reboot_days: Days = option(
        EVERY_DAY,
        "days the window opens (su..sa or 0-6, comma-separated, repeatable; empty = never)",
        repeatable=True,
    )
    start_time: ClockTime = option(time(0, 0), "window start, local to --time-zone")
    end_time: ClockTime = option(time(23, 59, 59), "window end, inclusive through that second")
    time_zone: Zone = option(UTC, "zone of the window: an IANA name, UTC or Local")
    # Not kured's (kured #891): a cron window instead of the days and times above.
    window_cron: CronExpression = option(
        "",
        "cron expression (minute hour day-of-month month day-of-week, in --time-zone) for when "
        "each window opening starts, e.g. '0 3 * * sun#1'; replaces --reboot-days, --start-time "
        "and --end-time, which may not be given with it ('' = off)",
    )
    window_duration: Duration = option(
        0.0,
        "how long each --window-cron opening lasts, in elapsed time (required with it, "
        "at most 366 days)",
    )
    prometheus_url: OptionalUrl = option(
        "", "Prometheus base URL; firing alerts block reboots ('' = off)"
    )
    alert_filter_regexp: Regexp = option(
        None, "alerts whose names match (unanchored search) are ignored"
    )
    alert_filter_match_only: Bool = option(
        False, "only alerts matching --alert-filter-regexp block, instead of all others"
    )
    alert_firing_only: Bool = option(False, "only firing alerts block; pending ones are ignored")
    gate_url: tuple[HttpUrl, ...] = option(
        (), "HTTP gate: a reboot is allowed only while it answers 2xx (repeatable)", repeatable=True
    )
    gate_timeout: PositiveDuration = option(5.0, "timeout of one gate request")
    notify_url: tuple[NotifyUrl, ...] = option(
        (),
        "where to send the drain, reboot and uncordon messages: a shoutrrr URL as kured takes "
        "(smtp://, generic://, slack://, discord://, telegram://, gotify://, pushover://) or an "
        "apprise URL (repeatable; in the environment separate URLs with ';'; delivery never "
        "blocks a reboot)",
        repeatable=True,
        separator=";",
    )
    message_template_drain: Template = option(
        "Draining node %s", "message sent before the drain; %s is the node name"
    )
    message_template_reboot: Template = option(
        "Rebooting node %s", "message sent right before the reboot; %s is the node name"
    )
    message_template_uncordon: Template = option(
        "Node %s rebooted & uncordoned successfully!",
        "message sent after the reboot once the node is uncordoned; %s is the node name",
    )
    message_template_back: Template = option(
        "",
        "message sent once the node is uncordoned after the reboot and its gates pass again, "
        "e.g. 'Node %s is back' (not kured's; '' = none, as kured); %s is the node name",
    )
    notify_timeout: PositiveDuration = option(
        10.0, "bound of one notification delivery (and of the wait for the reboot message)"
    )
    alertmanager_url: OptionalUrl = option(
        "",
        "Alertmanager base URL: a silence with --alertmanager-silence-matcher is created before "
        "the drain and expired once the node is back and its gates pass, or the reboot is "
        "abandoned; an unreachable Alertmanager blocks the reboot ('' = off)",
    )
    alertmanager_silence_matcher: tuple[SilenceMatcher, ...] = option(
        (),
        "matcher of the silence: name=value, name!=value, name=~regex or name!~regex; %s is the "
        "node name (escaped in a regex), needed in one matcher at least (repeatable, ANDed; in "
        "the environment separate matchers with ';')",
        repeatable=True,
        separator=";",
    )
    alertmanager_silence_duration: PositiveDuration = option(
        1800.0,
        "the silence ends this long after its last extension: kured extends it every third of "
        "it and right before the reboot, so the silence of a dead agent ends by itself",
    )
    alertmanager_timeout: PositiveDuration = option(10.0, "timeout of one Alertmanager request")
    pre_drain_hook_url: OptionalUrl = option(
        "",
        "POST a JSON document (node, event, time, lock_holder) here after the lock is taken, "
        "before the drain; a failure (no 2xx, timeout) blocks the reboot ('' = off)",
    )
    pre_drain_hook_command: Argv = option(
        (),
        "command run (split like a shell, no shell; the JSON document on its stdin) after the "
        "lock is taken, before the drain; a non-zero exit or timeout blocks the reboot",
    )
    post_uncordon_hook_url: OptionalUrl = option(
        "",
        "POST the JSON document here once the node is uncordoned after the reboot and its "
        "gates pass again; a failure is logged and counted ('' = off)",
    )
    post_uncordon_hook_command: Argv = option(
        (),
        "command run (the JSON document on its stdin) once the node is uncordoned after the "
        "reboot and its gates pass again; a failure is logged and counted",
    )
    hook_timeout: PositiveDuration = option(30.0, "bound of one hook (its POST or its command)")
    prometheus_timeout: PositiveDuration = option(10.0, "timeout of one Prometheus query")
    metrics_host: Stripped = option("", "bind address for /metrics ('' = all)")
    metrics_port: Port = option(8080, "bind port for /metrics")
    state_dir: FilePath = option(
        Path("/var/lib/kured"), "where the agent keeps its reboot bookkeeping"
    )
    boot_id_file: FilePath = option(
        Path("/proc/sys/kernel/random/boot_id"),
        "the kernel's boot ID; a reboot is confirmed when it changed (proc(5))",
    )
    max_consecutive_reboots: PositiveInt = option(
        3, "circuit breaker: stop after this many reboots in a row that did not clear the sentinel"
    )
    min_reboot_interval: Duration = option(
        86400.0,
        "after a reboot attempt that did not clear the sentinel (still required after the reboot, "
        "or the reboot command failed), no new attempt before this much later (0 = off)",
    )
    log_format: Literal["text", "json"] = option(
        "text",
        "text, or json: one JSON object per log line (time, level, logger, message, exception)",
    )
    # Not kured's: kured ignores a KURED_* variable that names no flag, so a misspelt one is lost.
    allow_unknown_settings: Bool = option(
        False,
        "start even when a KURED_* variable names no flag (warned once); by default the start is "
        "refused, naming the closest one",
    )

    def __post_init__(self) -> None:
        # ``kit.settings.load`` hands a repeatable option the tuple of its per-occurrence parses;
        # each ``--reboot-days`` occurrence is already a set of days, so take their union.
        days: Any = self.reboot_days
        if isinstance(days, tuple):
            object.__setattr__(self, "reboot_days", frozenset[int]().union(*days))
        for name in ("pre_reboot_node_labels", "post_reboot_node_labels"):
            object.__setattr__(self, name, _flatten(getattr(self, name)))

    def window(self) -> RebootWindow | CronWindow:
        """The reboot window these settings describe: the cron window when ``--window-cron``
        is set, else days and times. Raises ``ConfigurationError`` when both are given (which
        ``load_settings`` already refuses)."""
        if self.window_cron or self.window_duration:
            problems = window_mix_problems(self)
            if problems:
                raise ConfigurationError(problems)
            return CronWindow(
                self.window_cron, timedelta(seconds=self.window_duration), self.time_zone
            )
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
        if opt.parse is parse_argv:
            return shlex.join(value)
        if all(isinstance(item, tuple) for item in value):
            return ",".join(f"{k}={v}" for k, v in value)
        return opt.separator.join(str(item) for item in value)
    text = str(value)
    return text if text else EMPTY


# Settings whose URL may hold a secret: logged as scheme://host[:port] only.
SECRET_URL_SETTINGS = frozenset(
    {"pre_drain_hook_url", "post_uncordon_hook_url", "alertmanager_url"}
)


def describe(s: Settings) -> str:
    """Every setting as ``--flag=value``, for the start-up log (notify URLs as
    ``scheme://host``, the hook and Alertmanager URLs as ``scheme://host[:port]``: their user
    info, paths and queries may hold secrets)."""
    from kured.core.notify_urls import endpoint, redact

    def text(name: str, opt: Option) -> str:
        value = getattr(s, name)
        if name == "notify_url" and value:
            value = tuple(redact(u) for u in value)
        elif name in SECRET_URL_SETTINGS and value:
            value = endpoint(value)
        return flag_text(opt, value)

    return " ".join(f"{o.flag}={text(f.name, o)}" for f, o in options_of(Settings))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every kured flag to ``parser``. Boolean flags may be given bare (``--flag`` = true),
    as pflag allows; values stay text so ``load_settings`` reports every problem."""
    kit_settings.add_arguments(parser, Settings, bare_booleans=True)


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
    # Which days-and-times settings were given at all (a flag, or a variable even if empty):
    # given with --window-cron, even at their defaults, they are refused, not silently ignored.
    given = frozenset(
        f.name
        for f, opt in options_of(Settings)
        if f.name in {name for name, _, _ in DAYS_WINDOW_SETTINGS}
        and (getattr(args, f.name, None) is not None or opt.env in environ)
    )
    return load(
        Settings,
        args,
        environ,
        precedence="env-over-flag",
        validate=lambda s: validate_settings(s, given),
        screen=True,
        also_known=NOT_AGENT_SETTINGS,
    )


def environment(environ: Mapping[str, str]) -> Environment:
    """``environ``'s ``KURED_*`` variables sorted as ``load_settings`` sorts them."""
    return screen_environment(Settings, environ, NOT_AGENT_SETTINGS)
