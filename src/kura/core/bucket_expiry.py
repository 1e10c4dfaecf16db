"""The bucket-side expiry rule (no IO): which objects of a shared bucket are unused for too long.

Nodes that share a bucket each see only their own reads, so "unused" in the bucket must be the
union of every node's use. An artifact's last use in the bucket is the later of

* its object's last-modified time (the upload of its current version: a write), and
* its touch marker's last-modified time (``core.object_layout.touch_key``), which every node
  rewrites when it uses the artifact and has not rewritten the marker for ``refresh_ms``.

A node refreshes a marker at most every ``refresh_ms`` (``marker_refresh_ms``: a quarter of the
age), so the marker can lag a use by up to that much; the cut-off therefore leaves that slack:
``cutoff_ms = now - max_age - refresh`` (``bucket_cutoff_ms``). An artifact used on any node
within the age (once its access reached the bucket) is never selected; an unused one leaves the
bucket between 1.25 and 1.25 x age plus one pass interval after its last use.

Never selected: an object last used at or after the cut-off, and one whose upload is still
pending on the deciding node (its newer version is only there; the upload will refresh the
object). A marker without its object (the object expired or was cleaned) is selected once it
is older than the cut-off too.

Quotas (a rule's ``quota``, ``select_over_quota``) hold in the bucket too, per namespace of the
bucket: when a namespace's objects hold more bytes there than its quota (their listed sizes,
header included; markers count nothing), its own least recently used objects (last use as
above) are selected until it is back within the quota; other namespaces are not looked at.
As on a node the quota is a hard cap, and ``min_age`` only orders the choice: least recently
used first means an object used within ``min_age`` goes only once every older one of its
namespace is gone and it is still over; those are counted ``forced`` instead of ``quota``
("used within ``min_age``" with the markers' refresh slack, as the cut-off). An object whose
upload is pending on the deciding node is never selected, and its bytes still count, so a
namespace can stay over its quota until that upload lands.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass

from kura.core.namespace_rule import NamespaceRules
from kura.core.object_layout import namespace_of

# Why an object leaves the bucket: the reason labels of ``core.namespace_rule.REASONS``.
MAX_AGE, QUOTA, FORCED = "max_age", "quota", "forced"


def marker_refresh_ms(max_age_seconds: float) -> int:
    """How often (ms) one node rewrites an artifact's touch marker at most: a quarter of the
    age, so markers cost at most four writes per artifact and node per age."""
    return max(1, int(max_age_seconds * 1000) // 4)


def bucket_cutoff_ms(now_ms: int, max_age_seconds: float, refresh_ms: int | None = None) -> int:
    """Objects last used before this wall-clock ms are expired (module docstring). With ages
    per namespace (``KURA_NAMESPACE_RULES``) every marker is refreshed at the pace of the
    shortest age, ``refresh_ms``, which is then the slack of every age."""
    if refresh_ms is None:
        refresh_ms = marker_refresh_ms(max_age_seconds)
    return now_ms - int(max_age_seconds * 1000) - refresh_ms


def retention_in_bucket(rules: NamespaceRules, max_age_seconds: float) -> bool:
    """Whether the bucket has anything to enforce: an age (``KURA_MAX_AGE`` or a rule's
    ``max_age``) or a rule's ``quota``."""
    return rules.expires(max_age_seconds) or any(r.quota_bytes for r in rules.rules)


def marker_age_seconds(
    rules: NamespaceRules, max_age_seconds: float, interval_seconds: float
) -> float:
    """The age the touch markers are kept fresh for (a marker is rewritten every quarter of
    it, ``marker_refresh_ms``): the shortest age of any namespace; with quotas and no age at
    all, four pass intervals, so a marker lags a use by one ``KURA_EXPIRY_INTERVAL`` at most
    and the quota's least-recently-used order is as fine as the passes are frequent."""
    shortest = rules.shortest_max_age_seconds(max_age_seconds)
    return shortest if shortest > 0 else 4 * interval_seconds


def last_use_ms(object_modified_ms: int, marker_modified_ms: int | None) -> int:
    """An artifact's last use in the bucket: the later of its object's and its marker's time."""
    if marker_modified_ms is None:
        return object_modified_ms
    return max(object_modified_ms, marker_modified_ms)


def artifact_of(key: str) -> str:
    """The artifact id an object or marker key ends with."""
    return key.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Victim:
    """One artifact to delete from the bucket: its object key (None: only a stale marker is
    left), its marker key (None: it has none), its last use in wall-clock ms, and why it goes
    (``MAX_AGE``, ``QUOTA`` or ``FORCED``)."""

    object_key: str | None
    marker_key: str | None
    last_use_ms: int
    reason: str = MAX_AGE


def select_expired(
    objects: Mapping[str, int],
    markers: Mapping[str, tuple[str, int]],
    cutoff_ms: int | Callable[[str], int | None],
    pending_artifact_ids: Container[str],
) -> list[Victim]:
    """The victims of one pass, least recently used first (equal: by key).

    ``objects``: object key -> last-modified ms. ``markers``: the object key a marker stands
    for -> (marker key, last-modified ms). ``cutoff_ms``: one cut-off for every object, or the
    cut-off of each object key (None: it never expires; ages per namespace).
    ``pending_artifact_ids``: artifacts whose upload is queued on this node. Empty inputs give
    an empty list."""
    cutoff_of = (lambda _key: cutoff_ms) if isinstance(cutoff_ms, int) else cutoff_ms
    victims: list[Victim] = []
    for key, modified_ms in objects.items():
        marker = markers.get(key)
        used_ms = last_use_ms(modified_ms, None if marker is None else marker[1])
        cutoff = cutoff_of(key)
        if cutoff is None or used_ms >= cutoff or artifact_of(key) in pending_artifact_ids:
            continue
        victims.append(Victim(key, None if marker is None else marker[0], used_ms))
    for key, (marker_key, modified_ms) in markers.items():
        cutoff = cutoff_of(key)
        if key not in objects and cutoff is not None and modified_ms < cutoff:
            victims.append(Victim(None, marker_key, modified_ms))
    victims.sort(key=lambda v: (v.last_use_ms, v.object_key or v.marker_key or ""))
    return victims


def select_over_quota(
    tenant_id: str,
    objects: Mapping[str, int],
    sizes: Mapping[str, int],
    markers: Mapping[str, tuple[str, int]],
    rules: NamespaceRules,
    now_ms: int,
    refresh_ms: int,
    pending_artifact_ids: Container[str],
    leaving: Container[str] = (),
) -> list[Victim]:
    """The victims that bring each namespace over its rule's quota back within it (module
    docstring), least recently used first (equal: by key); each ``QUOTA``, or ``FORCED`` when
    last used at or after ``now_ms - min_age - refresh_ms``.

    ``objects`` and ``markers`` as ``select_expired``'s; ``sizes``: object key -> bytes (its
    listed size; absent: 0). ``refresh_ms``: the markers' refresh (``marker_refresh_ms``), the
    slack of ``min_age``. ``leaving``: object keys already selected in this pass (expired),
    whose bytes no longer count. A namespace without a quota, or within it, gives nothing."""
    held: dict[str, int] = {}
    candidates: dict[str, list[tuple[int, str]]] = {}
    for key, modified_ms in objects.items():
        if key in leaving:
            continue
        namespace = namespace_of(tenant_id, key)
        held[namespace] = held.get(namespace, 0) + sizes.get(key, 0)
        marker = markers.get(key)
        used_ms = last_use_ms(modified_ms, None if marker is None else marker[1])
        candidates.setdefault(namespace, []).append((used_ms, key))
    victims: list[Victim] = []
    for namespace, size in held.items():
        rule = rules.rule_for(namespace)
        if rule is None or rule.quota_bytes is None or size <= rule.quota_bytes:
            continue
        young_from = now_ms - int(rule.min_age_seconds * 1000) - refresh_ms
        for used_ms, key in sorted(candidates[namespace]):
            if size <= rule.quota_bytes:
                break
            if artifact_of(key) in pending_artifact_ids:
                continue
            marker = markers.get(key)
            reason = FORCED if rule.min_age_seconds > 0 and used_ms >= young_from else QUOTA
            victims.append(Victim(key, None if marker is None else marker[0], used_ms, reason))
            size -= sizes.get(key, 0)
    victims.sort(key=lambda v: (v.last_use_ms, v.object_key or ""))
    return victims
