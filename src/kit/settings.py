"""Settings from environment variables and command-line flags, every problem reported at once.

A component describes its settings as a frozen dataclass whose fields carry ``option(...)``
metadata, a default and a help line, and whose types name the parsers (``Port``,
``PositiveBytes``, ...: ``Annotated`` types, at the end). The environment variable is the class's
``ENV_PREFIX`` followed by the field's name upper-cased (``port`` -> ``KURA_PORT``) unless the
option names another, and the flag is that variable without the prefix, lower-cased, ``_`` turned
into ``-`` (``KURA_MAX_AGE`` -> ``--max-age``). ``add_arguments`` builds argparse flags from that
description; ``load`` reads the environment, applies the precedence the component asks for, and
raises ``SettingsError`` listing *every* invalid or missing value, the way Kura reports
configuration errors (docs/reference/kura-behaviour.md §6.1).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import logging
import re
import sys
import threading
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeAlias, TypeVar
from urllib.parse import urlsplit

from kit.service_link import is_service_link

T = TypeVar("T")
N = TypeVar("N", int, float)

Precedence = Literal["flag-over-env", "env-over-flag"]


class SettingsError(Exception):
    """One or more settings are invalid. ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclasses.dataclass(frozen=True)
class Option:
    """How one setting is read. ``parse`` turns text into the value or raises ValueError."""

    env: str
    flag: str
    parse: Callable[[str], Any]
    help: str
    repeatable: bool = False
    # How an environment value of a repeatable option splits into items (a flag is repeated
    # instead). A comma, unless the items themselves contain commas (label selectors).
    separator: str = ","


@dataclasses.dataclass(frozen=True)
class _Declared:
    help: str
    env: str
    repeatable: bool
    separator: str


def option(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    default_factory: Any = dataclasses.MISSING,
    env: str = "",
    repeatable: bool = False,
    separator: str = ",",
) -> Any:
    """Declare a dataclass field read from its environment variable (``env``, or the class's
    ``ENV_PREFIX`` and the field's name) or its flag (module docstring). Without a default (or
    ``default_factory``) the setting is required. The field's type names the parser: an
    ``Annotated[T, parse]`` (``Port``, ``PositiveBytes``, ... below), also inside ``X | None``
    or ``tuple[X, ...]``, or a ``Literal`` of the accepted words. A ``repeatable`` option may be
    given more than once; ``parse`` reads one occurrence, and the field holds their tuple."""
    if not help:
        raise TypeError("a setting needs a help line")
    meta = {"option": _Declared(help, env, repeatable, separator)}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


_OPTIONS: dict[type[Any], tuple[tuple[dataclasses.Field[Any], Option], ...]] = {}


def options_of(cls: type[Any]) -> tuple[tuple[dataclasses.Field[Any], Option], ...]:
    """The (field, option) pairs of a settings dataclass, in declaration order, each option with
    its environment variable, flag and parser (module docstring, ``option``). Worked out once
    per class: resolving the types takes milliseconds."""
    if cls not in _OPTIONS:
        _OPTIONS[cls] = _options(cls)
    return _OPTIONS[cls]


def _options(cls: type[Any]) -> tuple[tuple[dataclasses.Field[Any], Option], ...]:
    hints = typing.get_type_hints(cls, include_extras=True)
    pairs = []
    for f in dataclasses.fields(cls):
        if "option" in f.metadata:
            d: _Declared = f.metadata["option"]
            env = d.env or cls.ENV_PREFIX + f.name.upper()
            flag = "--" + env.removeprefix(cls.ENV_PREFIX).lower().replace("_", "-")
            parse = _parser_of(hints[f.name])
            if parse is None:
                raise TypeError(f"{cls.__name__}.{f.name}: its type names no parser")
            pairs.append((f, Option(env, flag, parse, d.help, d.repeatable, d.separator)))
    return tuple(pairs)


def _parser_of(hint: Any) -> Callable[[str], Any] | None:
    """The parser ``hint`` names: ``Annotated``'s first extra or a ``Literal``'s words, found
    outermost first (``X | None``, ``tuple[X, ...]``); None without one."""
    if typing.get_origin(hint) is Annotated:
        parse: Callable[[str], Any] = hint.__metadata__[0]
        return parse
    if typing.get_origin(hint) is Literal:
        return parse_choice(typing.get_args(hint))
    for arg in typing.get_args(hint):
        if (parse_arg := _parser_of(arg)) is not None:
            return parse_arg
    return None


def add_arguments(
    parser: argparse.ArgumentParser, cls: type[Any], *, bare_booleans: bool = False
) -> None:
    """Add one flag per option of ``cls``; values stay text so ``load`` reports all problems.
    With ``bare_booleans``, a boolean flag may also be given without a value (``--flag`` =
    true), as Go's pflag allows."""
    for f, opt in options_of(cls):
        kwargs: dict[str, Any] = {"dest": f.name, "default": None, "metavar": "VALUE"}
        if opt.repeatable:
            kwargs["action"] = "append"
        if bare_booleans and opt.parse is parse_bool:
            kwargs.update(nargs="?", const="true", metavar="BOOL")
        parser.add_argument(
            opt.flag, help=f"{opt.help} (env {opt.env})".replace("%", "%%"), **kwargs
        )


@dataclasses.dataclass(frozen=True)
class Environment:
    """A program's ``PREFIX*`` environment variables, sorted (``screen_environment``).

    ``variables``: the whole environment without the Kubernetes service links. ``service_links``:
    the names of those left out (``kit.service_link``), sorted. ``unknown``: one line per other
    variable with the prefix that is neither a declared setting nor in ``also_known``, sorted,
    naming the closest known name when there is one (never the value, which may be a secret).
    """

    variables: Mapping[str, str]
    service_links: tuple[str, ...]
    unknown: tuple[str, ...]

    def log_ignored(self, log: logging.Logger, allow_unknown_env: str) -> None:
        """Log once what start-up ignores: the unknown variables (a WARNING: they were let
        through by ``allow_unknown_env``) and the service links (INFO), by name only."""
        if self.unknown:
            log.warning(
                "ignoring %d unknown variables (%s=true): %s",
                len(self.unknown),
                allow_unknown_env,
                "; ".join(self.unknown),
            )
        if self.service_links:
            log.info(
                "ignoring %d Kubernetes service-link variables: %s",
                len(self.service_links),
                " ".join(self.service_links),
            )


def screen_environment(
    cls: type[Any], environ: Mapping[str, str], also_known: Collection[str] = ()
) -> Environment:
    """Sort ``environ``'s variables starting with ``cls.ENV_PREFIX`` (e.g. ``"KURA_"``) against
    the options ``cls`` declares plus ``also_known`` (variables other commands of the same
    program read). A declared setting whose value has a service link's shape (``KURA_PORT=tcp://10.0.0.1:
    4000``, which the kubelet injects for a Service ``kura``) counts as the link: no port is such
    a URL, and a pod cannot be told apart from its kubelet here. Pure; never raises."""
    prefix: str = cls.ENV_PREFIX
    declared = {opt.env for _, opt in options_of(cls)}
    known = declared | set(also_known)
    links: list[str] = []
    unknown: list[str] = []
    for name in sorted(environ):
        if not name.startswith(prefix):
            continue
        if is_service_link(name, environ[name], prefix.rstrip("_")):
            links.append(name)
        elif name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
            hint = f": did you mean {close[0]}?" if close else ""
            unknown.append(f"{name} is not a known setting{hint}")
    variables = {k: v for k, v in environ.items() if k not in links}
    return Environment(variables, tuple(links), tuple(unknown))


def load(
    cls: type[T],
    args: argparse.Namespace,
    environ: Mapping[str, str],
    *,
    precedence: Precedence = "flag-over-env",
    validate: Callable[[T], list[str]] | None = None,
    screen: bool = False,
    also_known: Collection[str] = (),
) -> T:
    """Build ``cls`` from parsed flags and the environment.

    Raises ``SettingsError`` with every problem: unparsable values, missing required values
    (fields without a default), and whatever ``validate`` returns for the assembled value.
    With ``screen``, the environment is screened first (``screen_environment``): service links
    are ignored, and every unknown ``ENV_PREFIX`` variable is a problem too, unless ``cls`` has
    a boolean option ``allow_unknown_settings`` and it is true (then the caller warns, from
    ``screen_environment``'s ``unknown``). A misspelt setting would otherwise be ignored in
    silence: ``KURA_READ_WRITE_TOKEN`` for ``KURA_READ_WRITE_TOKENS`` started a node open.
    """
    problems: list[str] = []
    values: dict[str, Any] = {}
    screened = screen_environment(cls, environ, also_known) if screen else None
    if screened is not None:
        environ = screened.variables
    for f, opt in options_of(cls):
        from_flag = getattr(args, f.name, None)
        from_env = environ.get(opt.env)
        if opt.repeatable:
            flag_items: list[str] = list(from_flag or [])
            env_items = split_list(from_env, opt.separator) if from_env is not None else []
            raw_items = (
                env_items + flag_items if flag_items and env_items else (flag_items or env_items)
            )
            if precedence == "env-over-flag" and from_env is not None:
                raw_items = env_items
            if from_flag is None and from_env is None:
                continue
            try:
                values[f.name] = tuple(opt.parse(item) for item in raw_items)
            except ValueError as exc:
                problems.append(f"{opt.env} / {opt.flag}: {exc}")
            continue
        if precedence == "flag-over-env":
            raw = from_flag if from_flag is not None else from_env
            source = opt.flag if from_flag is not None else opt.env
        else:
            raw = from_env if from_env is not None else from_flag
            source = opt.env if from_env is not None else opt.flag
        if raw is None:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                problems.append(f"{opt.env} / {opt.flag} is required")
            continue
        try:
            values[f.name] = opt.parse(raw)
        except ValueError as exc:
            problems.append(f"{source}={raw!r}: {exc}")
    if screened is not None and screened.unknown:
        problems.extend(_unknown_problems(cls, values, screened.unknown))
    if problems:
        raise SettingsError(problems)
    result = cls(**values)
    if validate is not None:
        more = validate(result)
        if more:
            raise SettingsError(more)
    return result


def print_problems(program: str, problems: Sequence[str]) -> int:
    """Print ``problems`` to stderr under ``PROGRAM: invalid configuration:``, one ``  - ``
    line each; return 2, the exit code of a command given a bad configuration."""
    print(f"{program}: invalid configuration:", file=sys.stderr)
    for problem in problems:
        print(f"  - {problem}", file=sys.stderr)
    return 2


def _unknown_problems(
    cls: type[Any], values: Mapping[str, Any], unknown: Sequence[str]
) -> list[str]:
    """``unknown`` and how to start anyway, unless the option ``allow_unknown_settings`` of
    ``cls`` (its value parsed, or its default) lets them through: then none."""
    for f, opt in options_of(cls):
        if f.name == "allow_unknown_settings":
            if values.get(f.name, f.default):
                return []
            return [*unknown, f"{opt.env}=true starts anyway, ignoring unknown variables"]
    return list(unknown)


def split_list(text: str, separator: str = ",") -> list[str]:
    """``separator``-separated list (comma by default), items trimmed, empty items dropped."""
    return [item.strip() for item in text.split(separator) if item.strip()]


def parse_non_empty(text: str) -> str:
    """The text trimmed; ``ValueError`` when nothing is left."""
    if not text.strip():
        raise ValueError("must not be empty")
    return text.strip()


def parse_path(text: str) -> Path:
    """A path, not empty (trimmed)."""
    return Path(parse_non_empty(text))


def parse_http_url(text: str) -> str:
    """An ``http://`` or ``https://`` URL with a host, trailing ``/`` dropped."""
    text = text.strip().rstrip("/")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{text!r} must be an http:// or https:// URL")
    return text


def parse_http_urls(text: str) -> tuple[str, ...]:
    """A comma-separated list of ``parse_http_url`` URLs (empty: none)."""
    return tuple(parse_http_url(u) for u in split_list(text))


def parse_bool(text: str) -> bool:
    """Go's strconv.ParseBool spellings (kured's env overrides use them)."""
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise ValueError("expected a boolean (true/false/1/0)")


def parse_port(text: str) -> int:
    """A TCP port 0-65535 (0 lets the OS choose)."""
    value = parse_int(text)
    if not 0 <= value <= 65535:
        raise ValueError("expected a port number 0-65535")
    return value


def parse_int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError("expected an integer") from None


def parse_non_negative_int(text: str) -> int:
    return checked(parse_int(text), lambda value: value >= 0, "must not be negative")


def parse_positive_int(text: str) -> int:
    return checked(parse_int(text), lambda value: value > 0, "must be greater than 0")


def checked(value: N, ok: Callable[[N], bool], problem: str) -> N:
    """``value`` when ``ok(value)``; ``ValueError(problem)`` otherwise."""
    if not ok(value):
        raise ValueError(problem)
    return value


_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_bytes(text: str) -> int:
    """A byte count below 2^63: a plain integer, or with a binary suffix (``512M``, ``8GiB``,
    ``64KiB``). ``ValueError`` otherwise."""
    m = _SIZE.match(text)
    if m is None:
        raise ValueError("expected a byte count such as 1048576, 512M or 8GiB")
    unit = (m.group(2) or "").lower()[:1]
    value = int(m.group(1)) * _UNITS[unit]
    if value >= 2**63:
        # Not a silent wrap or clamp: no file, body or disk is that large, and a signed 64-bit
        # field (SQLite's INTEGER, a Content-Length parser) cannot hold it (field report B22).
        raise ValueError(f"{text.strip()} is 2^63 bytes or more: no byte count is that large")
    return value


def parse_positive_bytes(text: str) -> int:
    return checked(parse_bytes(text), lambda value: value > 0, "must be greater than 0")


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


# Go's time.Duration is an int64 of nanoseconds, so time.ParseDuration refuses anything past
# 2^63 - 1 ns (about 292 years): "time: invalid duration". So does this parser: a value that
# large is a slip of the unit, and one added to a date overflowed Python's datetime (a
# 100000000h silence crashed kured with its reboot lock held; a hostile tester's find).
MAX_DURATION_SECONDS = min((2**63 - 1) / 1e9, threading.TIMEOUT_MAX)  # a thread's wait too


def parse_duration(text: str) -> float:
    """A Go-style duration (``30m``, ``1h30m``, ``1.5s``, ``0``) in seconds.

    Follows Go's time.ParseDuration: a sequence of decimal numbers each with a unit; a bare
    ``0`` is allowed; an optional leading sign; at most ``MAX_DURATION_SECONDS`` either way.
    Raises ValueError otherwise.
    """
    s = text.strip()
    sign = 1.0
    if s[:1] in "+-" and s:
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    if not s:
        raise ValueError("expected a duration such as 30s, 5m or 1h30m")
    pos = 0
    total = 0.0
    while pos < len(s):
        m = _DURATION_PART.match(s, pos)
        if m is None:
            raise ValueError("expected a duration such as 30s, 5m or 1h30m")
        total += float(m.group(1)) * _DURATION_SECONDS[m.group(2)]
        pos = m.end()
    if total > MAX_DURATION_SECONDS:
        raise ValueError(
            "longer than a Go duration can be (about 292 years, 2^63 ns): check the unit"
        )
    return sign * total


def parse_non_negative_duration(text: str) -> float:
    """A ``parse_duration`` of 0 or more."""
    return checked(parse_duration(text), lambda seconds: seconds >= 0, "must not be negative")


def parse_positive_duration(text: str) -> float:
    """A ``parse_duration`` above 0."""
    return checked(parse_duration(text), lambda seconds: seconds > 0, "must be greater than 0")


def parse_seconds(text: str) -> float:
    """Seconds as a number (``90``, ``1.5``) or a ``parse_duration`` (``90s``, ``1h30m``);
    not range-checked."""
    try:
        return float(text)
    except ValueError:
        return parse_duration(text)


def parse_choice(choices: Sequence[str]) -> Callable[[str], str]:
    """A parser accepting exactly one of ``choices``."""

    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return text

    return parse


# The types of settings: each reads as its first argument to a type checker and names the parser
# of its text (``option``).
NonEmpty: TypeAlias = Annotated[str, parse_non_empty]
FilePath: TypeAlias = Annotated[Path, parse_path]
HttpUrl: TypeAlias = Annotated[str, parse_http_url]
HttpUrls: TypeAlias = Annotated[tuple[str, ...], parse_http_urls]
Bool: TypeAlias = Annotated[bool, parse_bool]
Port: TypeAlias = Annotated[int, parse_port]
Int: TypeAlias = Annotated[int, parse_int]
NonNegativeInt: TypeAlias = Annotated[int, parse_non_negative_int]
PositiveInt: TypeAlias = Annotated[int, parse_positive_int]
Bytes: TypeAlias = Annotated[int, parse_bytes]
PositiveBytes: TypeAlias = Annotated[int, parse_positive_bytes]
Duration: TypeAlias = Annotated[float, parse_non_negative_duration]
PositiveDuration: TypeAlias = Annotated[float, parse_positive_duration]
