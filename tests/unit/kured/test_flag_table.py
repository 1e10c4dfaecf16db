"""The flag table in docs/kured.md agrees with the parser (issue 15, deliver 5): every flag once,
in declaration order, with its environment variable, and a default written in the units the
flag accepts (``1h``, not ``3600.0``) that the parser reads back to the real default."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from kit.settings import options_of, parse_duration
from kured.settings import (
    EMPTY,
    NONE,
    REQUIRED,
    UNSET,
    Settings,
    add_arguments,
    flag_text,
    go_duration,
    load_settings,
)

DOC = Path(__file__).resolve().parents[3] / "docs" / "kured.md"
ROW = re.compile(r"^\| `(--[a-z0-9-]+)` \| `(KURED_[A-Z0-9_]+)` \| `([^`]*)` \| (.+) \|$")
OPTIONS = {o.flag: (f, o) for f, o in options_of(Settings)}


def table() -> list[tuple[str, str, str]]:
    """(flag, env, default cell) of every row of the "## Flags" table."""
    text = DOC.read_text()
    section = text.split("## Flags", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        m = ROW.match(line)
        if m:
            rows.append((m.group(1), m.group(2), m.group(3)))
    return rows


def default_of(field: dataclasses.Field[object]) -> object:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def test_the_table_lists_every_flag_once_in_declaration_order_with_its_env() -> None:
    rows = table()
    assert [flag for flag, _, _ in rows] == list(OPTIONS)
    for flag, env, _ in rows:
        assert OPTIONS[flag][1].env == env


@pytest.mark.parametrize(("flag", "cell"), [(flag, cell) for flag, _, cell in table()])
def test_each_default_is_written_as_the_flag_takes_it_and_reads_back(flag: str, cell: str) -> None:
    field, opt = OPTIONS[flag]
    default = default_of(field)
    if default is dataclasses.MISSING:
        assert cell == REQUIRED
        return
    assert cell == flag_text(opt, default)
    assert not re.fullmatch(r"-?\d+\.\d+", cell), "durations are Go durations, not seconds"
    if cell in (NONE, UNSET):
        return  # no text stands for an empty list or an unset value; nothing to read back
    value = "" if cell == EMPTY else cell
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = [f"{flag}={value}"] + ([] if flag == "--node-id" else ["--node-id=n"])
    settings = load_settings(parser.parse_args(args), {})
    assert getattr(settings, field.name) == default, (flag, value)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0"),
        (0.5, "0.5s"),
        (1.5, "1.5s"),
        (90, "1m30s"),
        (1800, "30m"),
        (3600, "1h"),
        (5400, "1h30m"),
        (86400, "24h"),
        (3661, "1h1m1s"),
    ],
)
def test_durations_are_written_as_go_durations_that_parse_back(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text
    assert parse_duration(text) == seconds
