"""The index queries of retention per namespace (``KURA_NAMESPACE_RULES``, ``core.namespace_rule``):
what each namespace holds, and the clause that keeps a namespace's young entries out of an
eviction (its ``min_age``).

Usage is measured by one scan of the covering index ``artifacts_by_namespace_access``,
``GROUP BY namespace_id`` (0.2 to 0.25 s per million rows measured here, on the writer
thread), at every expiry and eviction pass, only while rules are set (the index exists only
then: ``storage.schema``), never per request. The gauges show the last measurement
(``StorageStats.namespace_usage``): empty without rules.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from kura.core.namespace_rule import NamespaceRules
from kura.storage.retention import WARNING_SECONDS
from kura.storage.stats import StorageStats

# One (used_since_ms, namespaces) per distinct min_age: an artifact of one of ``namespaces``
# used at or after ``used_since_ms`` (unix ms) is protected from an eviction pass.
Protected = Sequence[tuple[int, Sequence[str]]]


def usage(conn: sqlite3.Connection) -> dict[str, tuple[int, int]]:
    """Namespace -> (stored bytes, entries), every namespace with at least one entry."""
    rows = conn.execute(
        "SELECT namespace_id, SUM(size), COUNT(*) FROM artifacts GROUP BY namespace_id"
    ).fetchall()
    return {str(r[0]): (int(r[1]), int(r[2])) for r in rows}


def protected(rules: NamespaceRules, present: Sequence[str], now_ms: int) -> Protected:
    """The young entries ``rules`` protect from eviction at ``now_ms``: for each distinct
    ``min_age``, the cut-off and the namespaces of ``present`` whose rule states it. Empty when
    no rule sets a ``min_age``."""
    by_age: dict[float, list[str]] = {}
    for namespace in present:
        rule = rules.rule_for(namespace)
        if rule is not None and rule.min_age_seconds > 0:
            by_age.setdefault(rule.min_age_seconds, []).append(namespace)
    return [(now_ms - int(age * 1000), names) for age, names in sorted(by_age.items())]


def protect_clause(protect: Protected) -> tuple[str, tuple[object, ...]]:
    """The ``AND ...`` that keeps ``protect``'s young entries out of a query over ``artifacts
    a``, and its arguments (the namespaces travel as one JSON array each, ``json_each``)."""
    sql, args = "", []
    for since_ms, names in protect:
        sql += (
            "AND NOT (a.last_access_ms >= ? AND a.namespace_id IN "
            "(SELECT value FROM json_each(?))) "
        )
        args += [since_ms, json.dumps(list(names))]
    return sql, tuple(args)


def shortfall_warning(stats: StorageStats, now_ms: int) -> str | None:
    """The ``/ready`` warning while an entry inside its rule's ``min_age`` was evicted (forced)
    less than ``retention.WARNING_SECONDS`` before ``now_ms`` (unix ms), else None: like the
    retention floor's, it names the counts since start and never latches."""
    last_ms = stats.namespace_forced_last_ms
    if not last_ms or now_ms - last_ms >= WARNING_SECONDS * 1000:
        return None
    forced = {
        label: n
        for (label, reason), n in stats.namespace_evictions_total.items()
        if reason == "forced"
    }
    shown = ", ".join(f"{n} of {label}" for label, n in sorted(forced.items()))
    return (
        f"namespace min_age not held: {shown} evicted inside their rule's min_age "
        f"(KURA_NAMESPACE_RULES), the last {(now_ms - last_ms) // 1000} s ago: nothing else was "
        "left to keep within KURA_MAX_DISK_BYTES, so the disk is too small for the rules; raise "
        "KURA_MAX_DISK_BYTES or lower a quota or min_age (docs/durability.md, retention per "
        "namespace)"
    )
