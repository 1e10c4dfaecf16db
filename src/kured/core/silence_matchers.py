"""The matchers of an Alertmanager silence (``--alertmanager-silence-matcher``; kured #499): a
value type and its parser, with no HTTP client, so that settings parsing does not import one.
``kured.actuators.silence`` sends them to Alertmanager.

A matcher is ``name=value``, ``name!=value``, ``name=~regex`` or ``name!~regex`` (Alertmanager's
``amtool`` spelling), its value a template like the notification templates (``%s`` is the node
name; in a regex the node name is escaped, a literal).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kured.core.notify_urls import render

_MATCHER = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*(.*?)\s*$")


@dataclass(frozen=True)
class Matcher:
    """One silence matcher: ``name``, operator, ``value`` (a template: ``%s`` is the node)."""

    name: str
    op: str
    value: str

    @property
    def is_regex(self) -> bool:
        return self.op in ("=~", "!~")

    @property
    def names_the_node(self) -> bool:
        """True when the matcher is positive (``=`` or ``=~``) and its value holds the node name
        (``%s``): it ties the silence to this node. A negative one (``instance!=%s``) would
        silence every other node instead (a reviewer's find)."""
        return self.op in ("=", "=~") and render(self.value, "a") != render(self.value, "b")

    def for_node(self, node: str) -> dict[str, Any]:
        """The API v2 matcher object for ``node`` (in a regex, the node name is escaped: the
        ``.`` of ``ip-10-0-0-1.ec2.internal`` matches a dot only)."""
        return {
            "name": self.name,
            "value": render(self.value, regex_escape(node) if self.is_regex else node),
            "isRegex": self.is_regex,
            "isEqual": self.op in ("=", "=~"),
        }

    def __str__(self) -> str:
        return f"{self.name}{self.op}{self.value}"


_REGEX_META = re.compile(r"[\\.+*?()|\[\]{}^$]")


def regex_escape(text: str) -> str:
    """``text`` as a literal in a regular expression, RE2's (Alertmanager's) and Python's: each
    metacharacter behind a backslash (not ``-``, which RE2 takes literally outside a class)."""
    return _REGEX_META.sub(lambda m: "\\" + m.group(0), text)


def parse_matcher(text: str) -> Matcher:
    """``name=value``, ``name!=value``, ``name=~regex`` or ``name!~regex``; ValueError else."""
    m = _MATCHER.match(text)
    if m is None:
        raise ValueError(
            f"{text!r} is not a matcher: write name=value, name!=value, name=~regex or "
            "name!~regex (%s is the node name)"
        )
    name, op, value = m.groups()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    if op in ("=~", "!~"):
        try:
            re.compile(render(value, "node"))
        except re.error as exc:
            raise ValueError(f"{text!r}: invalid regular expression: {exc}") from None
    return Matcher(name, op, value)
