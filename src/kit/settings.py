"""Settings from environment variables and command-line flags, every problem reported at once.

A component describes its settings as a frozen dataclass whose fields carry ``option(...)``
metadata: the environment variable, the flag, a parser and a help line. ``load`` builds an
argparse parser from that description, reads the environment, applies the precedence the
component asks for, and raises ``SettingsError`` listing *every* invalid or missing value, the
way Kura reports configuration errors (docs/reference/kura-behaviour.md §6.1).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

T = TypeVar("T")

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
    metavar: str = "VALUE"
    repeatable: bool = False
    # How an environment value of a repeatable option splits into items (a flag is repeated
    # instead). A comma, unless the items themselves contain commas (label selectors).
    separator: str = ","


def option(
    env: str,
    flag: str,
    parse: Callable[[str], Any],
    help: str,
    *,
    default: Any = dataclasses.MISSING,
    default_factory: Any = dataclasses.MISSING,
    metavar: str = "VALUE",
    repeatable: bool = False,
    separator: str = ",",
) -> Any:
    """Declare a dataclass field read from ``env`` or ``flag`` (see module docstring)."""
    meta = {"option": Option(env, flag, parse, help, metavar, repeatable, separator)}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def options_of(cls: type[Any]) -> list[tuple[dataclasses.Field[Any], Option]]:
    """The (field, option) pairs of a settings dataclass, in declaration order."""
    return [(f, f.metadata["option"]) for f in dataclasses.fields(cls) if "option" in f.metadata]


def add_arguments(parser: argparse.ArgumentParser, cls: type[Any]) -> None:
    """Add one flag per option of ``cls``; values stay text so ``load`` reports all problems."""
    for f, opt in options_of(cls):
        kwargs: dict[str, Any] = {"dest": f.name, "default": None, "metavar": opt.metavar}
        if opt.repeatable:
            kwargs["action"] = "append"
        parser.add_argument(opt.flag, help=f"{opt.help} (env {opt.env})", **kwargs)


def load(
    cls: type[T],
    args: argparse.Namespace,
    environ: Mapping[str, str],
    *,
    precedence: Precedence = "flag-over-env",
    validate: Callable[[T], list[str]] | None = None,
) -> T:
    """Build ``cls`` from parsed flags and the environment.

    Raises ``SettingsError`` with every problem: unparsable values, missing required values
    (fields without a default), and whatever ``validate`` returns for the assembled value.
    """
    problems: list[str] = []
    values: dict[str, Any] = {}
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
    if problems:
        raise SettingsError(problems)
    result = cls(**values)
    if validate is not None:
        more = validate(result)
        if more:
            raise SettingsError(more)
    return result


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
    value = parse_int(text)
    if value < 0:
        raise ValueError("must not be negative")
    return value


def parse_positive_int(text: str) -> int:
    value = parse_int(text)
    if value <= 0:
        raise ValueError("must be greater than 0")
    return value


_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_bytes(text: str) -> int:
    """A byte count: a plain integer, or with a binary suffix (``512M``, ``8GiB``, ``64KiB``)."""
    m = _SIZE.match(text)
    if m is None:
        raise ValueError("expected a byte count such as 1048576, 512M or 8GiB")
    unit = (m.group(2) or "").lower()[:1]
    return int(m.group(1)) * _UNITS[unit]


def parse_positive_bytes(text: str) -> int:
    value = parse_bytes(text)
    if value <= 0:
        raise ValueError("must be greater than 0")
    return value


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


def parse_duration(text: str) -> float:
    """A Go-style duration (``30m``, ``1h30m``, ``1.5s``, ``0``) in seconds.

    Follows Go's time.ParseDuration: a sequence of decimal numbers each with a unit; a bare
    ``0`` is allowed; an optional leading sign. Raises ValueError otherwise.
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
    return sign * total


def parse_choice(choices: Sequence[str]) -> Callable[[str], str]:
    """A parser accepting exactly one of ``choices``."""

    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return text

    return parse
