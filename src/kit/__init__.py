"""Domain-free plumbing shared by kura and kured: clocks, settings loading, logging.

Nothing here knows about caches or reboots; it must never import either component.
"""
