"""kured: the reboot coordinator.

A ``kured`` agent runs on each node and reboots that node only when its sentinel says a reboot is
needed, the maintenance window is open, no gate blocks, and it holds a cluster-wide lock that
admits at most ``--concurrency`` nodes. Compatible with kured's flags, ``KURED_*`` environment
overrides and lock JSON (docs/reference/kured-behaviour.md); where kured's users found it
wrong, it does better and says why. It never imports ``kura``: it talks to kura over HTTP.
"""

__version__ = "0.2.0"
