"""Metric names in PromQL expressions and in Prometheus text exposition, for conformance checks.

promtool 2.42 cannot print an expression's syntax tree, so ``metric_names`` is a tokenizer that
knows PromQL's lexical structure well enough to tell a metric name from everything else:

* skipped: strings (``"..."``, ``'...'``, raw backticks), ``#`` comments, numbers and durations,
  ``[...]`` ranges and subqueries, keywords (``and``, ``bool``, ``offset``...), and the label
  lists after ``by``, ``without``, ``on``, ``ignoring``, ``group_left`` and ``group_right``;
* inside ``{...}`` only a ``__name__="x"`` matcher counts (as the name ``x``); label names and
  values do not;
* an identifier followed by ``(`` is a function or aggregation, as is an aggregation operator
  followed by ``by``/``without``;
* every other identifier is a metric name.

A ``__name__`` regex or inequality matcher selects names nobody can check, so it raises
``ValueError`` rather than pass unchecked. ``tests/deploy/test_alert_conformance.py`` pins the
tokenizer on tricky expressions.
"""

from __future__ import annotations

import re

_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
# Durations first (5m, 1h30m, 100ms), then hex, then decimal/float with exponent.
_NUMBER = re.compile(
    r"(?:\d+(?:ms|[smhdwy]))+|0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"
)
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"}
_LABEL_LIST_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_AGGREGATIONS = {
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
}
_MATCHER = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*")


def metric_names(expr: str) -> set[str]:
    """Every metric name ``expr`` selects. Raises ``ValueError`` on an unclosed string,
    bracket or brace, or on a ``__name__`` matcher other than ``=``."""
    names: set[str] = set()
    i, n = 0, len(expr)
    while i < n:
        c = expr[i]
        if c.isspace():
            i += 1
        elif c == "#":
            end = expr.find("\n", i)
            i = n if end < 0 else end
        elif c in "\"'`":
            i = _skip_string(expr, i)
        elif c == "{":
            i, name = _selector(expr, i)
            if name is not None:
                names.add(name)
        elif c == "[":
            end = expr.find("]", i)
            if end < 0:
                raise ValueError(f"unclosed '[' at {i} in {expr!r}")
            i = end + 1
        elif c.isdigit() or (c == "." and i + 1 < n and expr[i + 1].isdigit()):
            m = _NUMBER.match(expr, i)
            assert m is not None
            i = m.end()
        elif m := _IDENT.match(expr, i):
            word = m.group()
            i = m.end()
            lower = word.lower()
            nxt = _next_token(expr, i)
            # A function call, or an aggregation whose grouping comes first (`max by (x) (...)`).
            call = nxt == "(" or (lower in _AGGREGATIONS and nxt in ("by", "without"))
            if lower in _LABEL_LIST_KEYWORDS:
                if nxt == "(":
                    i = _skip_parens(expr, expr.index("(", i))
            elif lower not in _KEYWORDS and not call:
                names.add(word)
        else:
            i += 1
    return names


def _next_token(expr: str, i: int) -> str:
    """The next ``(`` or identifier after ``i`` (skipping spaces), else the next character."""
    while i < len(expr) and expr[i].isspace():
        i += 1
    if i >= len(expr):
        return ""
    m = _IDENT.match(expr, i)
    return m.group().lower() if m else expr[i]


def _skip_string(expr: str, i: int) -> int:
    quote = expr[i]
    j = i + 1
    while j < len(expr):
        if expr[j] == "\\" and quote != "`":
            j += 2
            continue
        if expr[j] == quote:
            return j + 1
        j += 1
    raise ValueError(f"unclosed string at {i} in {expr!r}")


def _skip_parens(expr: str, i: int) -> int:
    end = expr.find(")", i)
    if end < 0:
        raise ValueError(f"unclosed '(' at {i} in {expr!r}")
    return end + 1


def _selector(expr: str, i: int) -> tuple[int, str | None]:
    """Parse ``{matchers}`` at ``i``; return the index after ``}`` and a ``__name__`` value."""
    j = i + 1
    name = None
    while True:
        while j < len(expr) and (expr[j].isspace() or expr[j] == ","):
            j += 1
        if j >= len(expr):
            raise ValueError(f"unclosed '{{' at {i} in {expr!r}")
        if expr[j] == "}":
            return j + 1, name
        m = _MATCHER.match(expr, j)
        if m is None or j + len(m.group()) >= len(expr) or expr[m.end()] not in "\"'`":
            raise ValueError(f"cannot read the label matcher at {j} in {expr!r}")
        end = _skip_string(expr, m.end())
        if m.group(1) == "__name__":
            if m.group(2) != "=":
                raise ValueError(f"{expr!r} selects metric names by {m.group(2)}: cannot check")
            name = expr[m.end() + 1 : end - 1]
        j = end


def exposition_names(text: str) -> set[str]:
    """Every series name a scrape of ``text`` (Prometheus text format) can produce.

    Names of samples present, plus, from each ``# TYPE`` line, the names of that family's
    samples, so a family that has no samples yet (no peers, no failures so far) still counts:
    counters ``<name>`` ending in ``_total`` (``<name>_total`` otherwise), histograms
    ``_bucket``, ``_sum`` and ``_count``, summaries the name, ``_sum`` and ``_count``.
    """
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(maxsplit=3)
            if kind == "counter":
                names.add(family if family.endswith("_total") else family + "_total")
            elif kind == "histogram":
                names.update(family + s for s in ("_bucket", "_sum", "_count"))
            elif kind == "summary":
                names.update(family + s for s in ("", "_sum", "_count"))
            else:
                names.add(family)
        elif line and not line.startswith("#"):
            m = _IDENT.match(line)
            if m:
                names.add(m.group())
    return names
