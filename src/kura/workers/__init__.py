"""``kura serve`` on several cores: one primary process and ``KURA_WORKERS - 1`` workers.

The primary is the node as it always was: it owns the data dir (its lock, the one SQLite
writer, the budget, eviction, expiry, the outbox, the mesh, the internal and gRPC ports).
With ``KURA_WORKERS > 1`` it binds the public port with ``SO_REUSEPORT`` and starts the
workers (``supervisor``), which bind the same port, so the kernel spreads new connections over
all of them (socket(7), ``SO_REUSEPORT``). A worker (``worker``) answers GET and HEAD hits of
the artifact routes from the shared index and blob files (``kura.storage.worker_reads``) and
forwards everything else to the primary over a unix socket before it sends a byte
(``forward``). Its hits reach the primary's LRU within a second; ``/metrics`` adds the
workers' request families to the primary's (``metrics_merge``). See docs/architecture.md.

Each process is an interpreter of its own: a worker loads only what serving needs (no gRPC, no
object-store client, no certificate parser unless TLS is on; an import-linter contract keeps it
so), about 47 MiB of RSS at idle against the primary's 69 MiB, of which about 15 MiB are shared
libraries both map once.
"""
