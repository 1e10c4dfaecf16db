"""Which address reaches a node's agent: the first of a preference list of address types.

Like the kubelet's ``--kubelet-preferred-address-types`` (default here
``InternalIP,ExternalIP,Hostname``): a node with no ExternalIP and an unresolvable Hostname —
a bare-metal or macOS node that registers nothing else, for example — is still reached through its
InternalIP.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

DEFAULT_ADDRESS_TYPES = ("InternalIP", "ExternalIP", "Hostname")
KNOWN_ADDRESS_TYPES = frozenset(
    {"InternalIP", "ExternalIP", "Hostname", "InternalDNS", "ExternalDNS"}
)


def preferred_address(node: Mapping[str, Any], preference: Sequence[str]) -> str | None:
    """The node's address of the first type in ``preference`` that it has, else None.

    ``node`` is a Node object as JSON (``status.addresses`` is a list of ``{type, address}``).
    """
    addresses = (node.get("status") or {}).get("addresses") or []
    by_type: dict[str, str] = {}
    for entry in addresses:
        kind, value = entry.get("type"), entry.get("address")
        if isinstance(kind, str) and isinstance(value, str) and value and kind not in by_type:
            by_type[kind] = value
    for kind in preference:
        if kind in by_type:
            return by_type[kind]
    return None


def url_host(address: str) -> str:
    """An address as it goes in a URL (IPv6 in brackets)."""
    return f"[{address}]" if ":" in address and not address.startswith("[") else address
