"""Retention rules per namespace (``KURA_NAMESPACE_RULES``), and the shed-age histogram (no IO).

A rule names a namespace, or a pattern of them (``pr-*``: shell-style, ``fnmatch.fnmatchcase``:
``*``, ``?`` and ``[...]``), and states any of

* ``max_age``: what no node has used for that long is deleted (the rule's own ``KURA_MAX_AGE``;
  ``0`` = never, even with ``KURA_MAX_AGE`` set);
* ``quota``: the bytes each matching namespace may hold on a node, and in the object-storage
  tier's bucket (``core.bucket_expiry.select_over_quota``); eviction takes from a namespace over
  its quota first, its own least recently used entries;
* ``min_age``: what was used more recently than that is evicted only when nothing else is left
  to keep the disk within its budget (counted as ``forced``).

The first rule that matches a namespace is its rule; a namespace no rule matches keeps the
global behaviour (``KURA_MAX_AGE``, ``KURA_MIN_RETENTION``, plain LRU), and so does a field a
rule leaves out (``max_age`` unset: ``KURA_MAX_AGE``). Ages are times since last use on the node
(or, in the object-storage tier, on any node), like ``KURA_MAX_AGE``'s.

Metric labels come from closed sets: the rule's pattern (``DEFAULT_RULE`` for none), never the
namespace itself, except in the per-namespace usage gauges, which ``top_namespaces`` caps.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

# The label of namespaces no rule matches (cannot be a namespace or pattern: "(" is refused in
# namespace names, kura.core.keys).
DEFAULT_RULE = "(default)"
# The usage gauges show the largest namespaces by bytes, and the rest summed as OTHER: a
# mesh with a namespace per pull request would otherwise grow a series per pull request.
TOP_NAMESPACES = 20
OTHER = "(other)"

# Shed-age buckets (seconds): a minute to 90 days, so a min_age of 1h, 1d or 7d falls on a
# bucket bound, and the alert's quantile is exact there.
SHED_AGE_BUCKETS = (
    60.0,
    300.0,
    900.0,
    3600.0,
    3 * 3600.0,
    6 * 3600.0,
    12 * 3600.0,
    86400.0,
    2 * 86400.0,
    7 * 86400.0,
    14 * 86400.0,
    30 * 86400.0,
    90 * 86400.0,
)

# Why an entry left a namespace: over its quota, past its max_age, the global LRU, or inside
# its min_age because the disk's budget left no choice.
REASONS = ("quota", "max_age", "lru", "forced")


@dataclass(frozen=True)
class NamespaceRule:
    """One rule: a namespace or pattern and what it states (None: the global setting)."""

    pattern: str
    max_age_seconds: float | None = None
    quota_bytes: int | None = None
    min_age_seconds: float = 0.0

    def matches(self, namespace: str) -> bool:
        return fnmatchcase(namespace, self.pattern)


@dataclass(frozen=True)
class NamespaceRules:
    """The rules in the order given; empty = every namespace keeps the global behaviour."""

    rules: tuple[NamespaceRule, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.rules)

    def rule_for(self, namespace: str) -> NamespaceRule | None:
        """The first rule matching ``namespace``, None when none does."""
        for rule in self.rules:
            if rule.matches(namespace):
                return rule
        return None

    def label(self, namespace: str) -> str:
        """The metric label of ``namespace``: its rule's pattern, or ``DEFAULT_RULE``."""
        rule = self.rule_for(namespace)
        return DEFAULT_RULE if rule is None else rule.pattern

    def max_age_seconds(self, namespace: str, default_seconds: float) -> float:
        """The age past which ``namespace``'s entries go (0 = never): its rule's, or
        ``default_seconds`` (``KURA_MAX_AGE``)."""
        rule = self.rule_for(namespace)
        if rule is None or rule.max_age_seconds is None:
            return default_seconds
        return rule.max_age_seconds

    def expires(self, default_seconds: float) -> bool:
        """Whether any namespace can expire (a rule or ``default_seconds`` gives an age)."""
        return default_seconds > 0 or any((r.max_age_seconds or 0) > 0 for r in self.rules)

    def shortest_max_age_seconds(self, default_seconds: float) -> float:
        """The shortest age above 0 any namespace has (0 when none expires): the touch markers
        of the object-storage tier must be refreshed within a quarter of it."""
        ages = [default_seconds, *(r.max_age_seconds or 0.0 for r in self.rules)]
        return min((a for a in ages if a > 0), default=0.0)

    def min_age_labels(self) -> dict[str, float]:
        """Rule pattern -> its min_age in seconds, for the rules that set one."""
        return {r.pattern: r.min_age_seconds for r in self.rules if r.min_age_seconds > 0}


NO_RULES = NamespaceRules()


def parse_rules(
    text: str, parse_age: Callable[[str], float], parse_bytes: Callable[[str], int]
) -> NamespaceRules:
    """``main:max_age=30d,min_age=1d;pr-*:max_age=2d,quota=10GiB`` -> rules, in order. Ages
    and sizes are read by the given parsers (``KURA_MAX_AGE``'s and the byte settings'); empty
    text = no rules. Raises ValueError naming the rule and the problem: an empty pattern, an
    unknown or repeated field, a value its parser refuses, a quota of 0, a min_age at or above
    the rule's max_age, a pattern given twice (the second could never match), or one of the
    reserved labels ``DEFAULT_RULE`` and ``OTHER`` (its series would merge with theirs)."""
    rules: list[NamespaceRule] = []
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        pattern, sep, fields_text = part.partition(":")
        pattern = pattern.strip()
        if not pattern or any(c.isspace() or c in ",=" for c in pattern):
            raise ValueError(f"rule {part!r}: must start with a namespace or pattern, then ':'")
        if not sep or not fields_text.strip():
            raise ValueError(f"rule {part!r}: names no max_age, quota or min_age")
        if pattern in (DEFAULT_RULE, OTHER):
            raise ValueError(
                f"rule {part!r}: {pattern!r} is a reserved metric label (namespaces without a "
                "rule, or the smaller namespaces summed), not a namespace"
            )
        if any(r.pattern == pattern for r in rules):
            raise ValueError(f"rule {part!r}: {pattern!r} is given twice")
        values: dict[str, str] = {}
        for item in fields_text.split(","):
            name, eq, value = (s.strip() for s in item.partition("="))
            if name not in ("max_age", "quota", "min_age") or not eq:
                raise ValueError(
                    f"rule {part!r}: {item.strip()!r} is not max_age=, quota= or min_age="
                )
            if name in values:
                raise ValueError(f"rule {part!r}: {name} is given twice")
            values[name] = value
        try:
            max_age = parse_age(values["max_age"]) if "max_age" in values else None
            quota = parse_bytes(values["quota"]) if "quota" in values else None
            min_age = parse_age(values["min_age"]) if "min_age" in values else 0.0
        except ValueError as exc:
            raise ValueError(f"rule {part!r}: {exc}") from None
        if quota == 0:
            raise ValueError(f"rule {part!r}: quota must be above 0")
        if max_age and min_age >= max_age:
            raise ValueError(f"rule {part!r}: min_age must be below max_age")
        rules.append(NamespaceRule(pattern, max_age, quota, min_age))
    return NamespaceRules(tuple(rules))


def top_namespaces(
    usage: Mapping[str, tuple[int, int]], top: int = TOP_NAMESPACES
) -> dict[str, tuple[int, int]]:
    """``usage`` (namespace -> (bytes, entries)) capped to the ``top`` largest by bytes (ties
    by name), the rest summed under ``OTHER`` (absent when nothing is left over)."""
    ranked = sorted(usage.items(), key=lambda kv: (-kv[1][0], kv[0]))
    shown = dict(ranked[:top])
    rest = ranked[top:]
    if rest:
        shown[OTHER] = (sum(b for _n, (b, _e) in rest), sum(e for _n, (_b, e) in rest))
    return shown


@dataclass
class ShedAges:
    """A histogram of the ages (seconds since last use) of evicted entries, per rule label:
    cumulative bucket counts over ``SHED_AGE_BUCKETS`` and +Inf, and the sum."""

    counts: dict[str, list[int]] = field(default_factory=dict)
    sums: dict[str, float] = field(default_factory=dict)

    def observe(self, label: str, ages_seconds: Iterable[float]) -> None:
        buckets = self.counts.setdefault(label, [0] * (len(SHED_AGE_BUCKETS) + 1))
        for age in ages_seconds:
            buckets[bisect_left(SHED_AGE_BUCKETS, age)] += 1
            self.sums[label] = self.sums.get(label, 0.0) + age

    def cumulative(self, label: str) -> list[tuple[str, int]]:
        """``[(le, count), ...]`` for ``label``, the last one ``+Inf``."""
        total, out = 0, []
        bounds = [repr(b) for b in SHED_AGE_BUCKETS] + ["+Inf"]
        for le, n in zip(bounds, self.counts.get(label, []), strict=True):
            total += n
            out.append((le, total))
        return out

    def quantile_seconds(self, label: str, q: float) -> float | None:
        """The upper bound of the bucket holding the ``q`` quantile (0 < q <= 1) of
        ``label``'s shed ages (``inf`` past the last bound), None when none was observed."""
        counts = self.counts.get(label, [])
        total = sum(counts)
        if not total:
            return None
        seen = 0
        for bound, n in zip((*SHED_AGE_BUCKETS, float("inf")), counts, strict=True):
            seen += n
            if seen >= q * total:
                return bound
        return float("inf")
