"""Byte accounting for the tmp staging budget (the rules; the waiting lives in storage).

A ledger has a fixed ``capacity_bytes`` and a running ``reserved_bytes``. A reservation is taken
only if it fits entirely; nothing is ever written to the tmp dir before its bytes are taken here.
This is the fix for Kura's bootstrap stall (docs/reference/kura-behaviour.md §0): a
point-in-time "is there room?" check reserved nothing, so concurrent stagers all passed it.

``outside_bytes`` lets the caller count occupants the ledger did not reserve (leftover or
foreign files measured on disk): a reservation fits only if reserved + outside + n <= capacity.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ByteLedger:
    """Reserved bytes against a capacity. Not thread-safe: one event loop owns it."""

    capacity_bytes: int
    reserved_bytes: int = 0

    def __post_init__(self) -> None:
        if self.capacity_bytes <= 0:
            raise ValueError("capacity_bytes must be > 0")

    def fits(self, n_bytes: int, outside_bytes: int = 0) -> bool:
        """True if ``n_bytes`` more can be reserved now."""
        return self.reserved_bytes + outside_bytes + n_bytes <= self.capacity_bytes

    def take(self, n_bytes: int, outside_bytes: int = 0) -> bool:
        """Reserve ``n_bytes`` if it fits; return whether it was taken."""
        if n_bytes < 0:
            raise ValueError("n_bytes must be >= 0")
        if not self.fits(n_bytes, outside_bytes):
            return False
        self.reserved_bytes += n_bytes
        return True

    def give_back(self, n_bytes: int) -> None:
        """Return ``n_bytes`` taken earlier. Returning more than is reserved is a bug."""
        if n_bytes < 0 or n_bytes > self.reserved_bytes:
            raise ValueError(f"cannot give back {n_bytes} of {self.reserved_bytes} reserved bytes")
        self.reserved_bytes -= n_bytes

    def clamp(self, n_bytes: int) -> int:
        """``n_bytes`` limited to [1, capacity]: the most a single reservation may ask for."""
        return max(1, min(n_bytes, self.capacity_bytes))
