"""Disk budget rule: how many bytes to evict before a write is committed.

Least-recently-used eviction keeps stored bytes at or under ``limit_bytes``. To avoid evicting
on every write once the store is full, eviction frees down to ``low_watermark`` (a fraction of
the limit) in one pass.
"""

from __future__ import annotations

LOW_WATERMARK = 0.95


def bytes_to_free(used_bytes: int, incoming_bytes: int, limit_bytes: int) -> int:
    """Bytes that must be evicted so that ``used + incoming`` fits under ``limit_bytes``.

    Returns 0 when it already fits. When it does not, the answer frees down to the low
    watermark so the next writes do not each trigger a pass. ``incoming_bytes`` larger than the
    limit cannot fit at all; callers reject such writes before staging them.
    """
    if used_bytes + incoming_bytes <= limit_bytes:
        return 0
    target = int(limit_bytes * LOW_WATERMARK) - incoming_bytes
    return max(used_bytes - max(target, 0), used_bytes + incoming_bytes - limit_bytes)
