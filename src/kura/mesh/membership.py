"""Peer discovery and membership.

Candidates are the seed URLs (``KURA_PEERS``) plus, with ``KURA_DISCOVERY_DNS_NAME``, every
address the name resolves to (``scheme://ip:port`` with the node URL's scheme and port; with TLS
the name itself, so the certificate's SAN matches). Every interval each candidate is probed on
``/_internal/status``; a peer is admitted only when it reports this node's tenant and a node URL
other than ours (kura-behaviour.md §4). A peer's identity is the node URL it reports.

Admitted peers stay known while they are down (their health flips), so writes keep being queued
for them and they catch up when they return. Every change (joined, left, healthy, unhealthy) is
logged and counted, bumps ``generation`` and starts a settle window.

Each probe also reads the wire and kura versions the peer runs (``kura.mesh.wire``; kura 0.1.0
answers without them: wire 1). ``Peer.wire_version`` and ``Peer.kura_version`` hold them as last
seen (None until seen), a change is logged, and a peer whose wire version this node does not
speak is logged at ERROR and named in ``version_warnings`` (``/ready`` and ``/status``
warnings): it stays a member, so writes keep being queued for it until the versions meet
again. Versions that differ without that are a mixed mesh, a warning too, never a readiness
reason: a rolling upgrade runs one for a while (docs/upgrading.md).

Initial discovery is complete once every candidate has answered at least once (ourselves and
other tenants included), or when there are no candidates, or — so that ``/ready`` can never wait
forever on a seed that never answers — after ``initial_timeout_seconds``. Upstream Kura settles
on the first answer (possibly its own), which lets a node report ready before it has seen any
peer; waiting for every seed is what makes "ready" mean "knows its mesh".
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from kit.backoff import every
from kit.clock import Clock
from kura import __version__
from kura.core.versions import WIRE_VERSION, describe, speaks, unspoken_message
from kura.mesh.client import PeerClient, PeerError, PeerStatus

log = logging.getLogger(__name__)


@dataclass
class Peer:
    """What this node knows about one admitted peer."""

    node_url: str
    region: str = ""
    healthy: bool = False
    last_ok_at: float = 0.0  # monotonic seconds
    candidate_urls: set[str] = field(default_factory=set)
    # As its last answered probe reported them; None until then (kura_version also for kura
    # 0.1.0, which reports no version: wire 1).
    wire_version: int | None = None
    kura_version: str | None = None


@dataclass
class MembershipStats:
    changes_total: dict[str, int] = field(default_factory=dict)
    probes_total: dict[str, int] = field(default_factory=dict)


class Membership:
    """The mesh as this node sees it. Event-loop confined."""

    def __init__(
        self,
        *,
        self_url: Callable[[], str],
        tenant_id: str,
        seeds: tuple[str, ...],
        dns_name: str | None,
        client: PeerClient,
        clock: Clock,
        interval_seconds: float,
        settle_seconds: float,
        initial_timeout_seconds: float,
        tls: bool,
    ) -> None:
        self._self_url = self_url
        self._tenant_id = tenant_id
        self._seeds = seeds
        self._dns_name = dns_name
        self._client = client
        self._clock = clock
        self._interval = interval_seconds
        self._settle = settle_seconds
        self._initial_timeout = initial_timeout_seconds
        self._tls = tls
        self.peers: dict[str, Peer] = {}
        # Candidates that answered as ourselves or as another tenant: never targets.
        self._excluded: set[str] = set()
        # Candidate URL -> node URL it reported, once probed.
        self._resolved: dict[str, str] = {}
        self._answered_once: set[str] = set()
        self.generation = 0
        self.rounds_completed = 0  # discovery rounds finished (every candidate probed)
        self.initial_discovery_completed = False
        self._started_at = clock.monotonic()
        self._changed_at = -1e9
        self.stats = MembershipStats()
        self.listeners: list[Callable[[str, str], None]] = []

    # -- views ---------------------------------------------------------------------------------

    def targets(self) -> list[str]:
        """Where a local write must be replicated: every known peer, plus seeds not yet
        identified (a seed that is down at write time still gets its messages)."""
        me = self._self_url()
        out = {p.node_url for p in self.peers.values()}
        for seed in self._seeds:
            if seed not in self._excluded and seed not in self._resolved:
                out.add(seed)
        out.discard(me)
        return sorted(out)

    def healthy_peers(self) -> list[str]:
        return sorted(p.node_url for p in self.peers.values() if p.healthy)

    def askable_peers(self) -> list[str]:
        """Peers worth a request that can wait for nobody (read-through): the healthy ones once
        a discovery round has finished (empty when all are down), before that the seeds and
        known peers (``targets``), so a restarted node asks its peers from its first read."""
        return self.healthy_peers() if self.rounds_completed else self.targets()

    def members(self) -> list[str]:
        """Node URLs of this node and every known peer, sorted."""
        return sorted({self._self_url(), *(p.node_url for p in self.peers.values())})

    def settling(self) -> bool:
        return self._clock.monotonic() - self._changed_at < self._settle

    # -- discovery loop ------------------------------------------------------------------------

    async def run(self) -> None:
        """Forever: probe every candidate each interval (``kit.backoff.every``: a round that
        crashes is logged and retried after a jittered, growing pause)."""
        await every(self.probe_once, self._interval, what="discovery round", log=log)

    async def candidates(self) -> list[str]:
        found = set(self._seeds)
        if self._dns_name:
            found |= await self._resolve_dns()
        return sorted(found)

    async def _resolve_dns(self) -> set[str]:
        me = urlsplit(self._self_url())
        port = me.port or (443 if me.scheme == "https" else 80)
        assert self._dns_name is not None
        if self._tls:
            return {f"https://{self._dns_name}:{port}"}
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                self._dns_name, port, type=socket.SOCK_STREAM
            )
        except OSError as exc:
            log.warning("DNS discovery of %s failed: %s", self._dns_name, exc)
            return set()
        urls = set()
        for family, _t, _p, _c, addr in infos:
            host = str(addr[0])
            urls.add(
                f"{me.scheme}://[{host}]:{port}"
                if family == socket.AF_INET6
                else f"{me.scheme}://{host}:{port}"
            )
        return urls

    async def probe_once(self) -> None:
        candidates = await self.candidates()
        me = self._self_url()
        results = await asyncio.gather(
            *(self._client.status(c) for c in candidates), return_exceptions=True
        )
        seen_ok: set[str] = set()
        for candidate, result in zip(candidates, results, strict=True):
            if isinstance(result, PeerError):
                self._count_probe("error")
                continue
            if isinstance(result, BaseException):
                raise result
            self._answered_once.add(candidate)
            self._count_probe("ok")
            if result.tenant_id != self._tenant_id or result.node_url == me or candidate == me:
                if candidate not in self._excluded:
                    log.info(
                        "discovery: %s is %s; not a peer",
                        candidate,
                        "this node"
                        if result.tenant_id == self._tenant_id
                        else f"tenant {result.tenant_id!r}",
                    )
                self._excluded.add(candidate)
                self._resolved.pop(candidate, None)
                for url, known in list(self.peers.items()):
                    if candidate in known.candidate_urls or url == candidate:
                        del self.peers[url]  # it now answers as someone else
                        self._change("left", url)
                continue
            self._excluded.discard(candidate)
            self._resolved[candidate] = result.node_url
            seen_ok.add(result.node_url)
            peer = self.peers.get(result.node_url)
            if peer is None:
                peer = Peer(result.node_url, result.region)
                self.peers[result.node_url] = peer
                self._change("joined", result.node_url)
            peer.candidate_urls.add(candidate)
            peer.last_ok_at = self._clock.monotonic()
            self._saw_versions(peer, result)
            if not peer.healthy:
                peer.healthy = True
                self._change("healthy", result.node_url)
        for peer in self.peers.values():
            if peer.healthy and peer.node_url not in seen_ok:
                peer.healthy = False
                self._change("unhealthy", peer.node_url)
        # A peer found only through DNS that is gone from DNS and down has left the mesh.
        current = set(candidates)
        for url, peer in list(self.peers.items()):
            if not peer.healthy and not (peer.candidate_urls & current):
                del self.peers[url]
                self._change("left", url)
        self.rounds_completed += 1
        if not self.initial_discovery_completed and (
            self._answered_once.issuperset(candidates)
            or self._clock.monotonic() - self._started_at >= self._initial_timeout
        ):
            self.initial_discovery_completed = True
            missing = sorted(set(candidates) - self._answered_once)
            log.info(
                "initial discovery completed: %d peers known%s",
                len(self.peers),
                f"; never answered: {', '.join(missing)}" if missing else "",
            )

    def _saw_versions(self, peer: Peer, status: PeerStatus) -> None:
        """Record the versions ``peer`` reported; log a change, at ERROR one this node cannot
        talk to (once per change, not per probe)."""
        seen = (status.wire_version, status.kura_version)
        if seen == (peer.wire_version, peer.kura_version):
            return
        peer.wire_version, peer.kura_version = seen
        if speaks(status.wire_version):
            log.info("membership: peer %s runs %s", peer.node_url, describe(*seen))
        else:
            log.error("membership: peer %s: %s", peer.node_url, unspoken_message(*seen))

    def version_warnings(self) -> list[str]:
        """``/ready`` and ``/status`` warnings about versions (never readiness reasons): one
        per peer whose wire version this node does not speak, and one naming every version
        when the known peers and this node do not all run the same kura (a mixed mesh)."""
        seen = sorted(self.peers.values(), key=lambda p: p.node_url)
        out = [
            f"peer {p.node_url}: {unspoken_message(p.wire_version, p.kura_version)}"
            for p in seen
            if p.wire_version is not None and not speaks(p.wire_version)
        ]
        mine = (WIRE_VERSION, __version__)
        others = [p for p in seen if p.wire_version is not None]
        if any((p.wire_version, p.kura_version) != mine for p in others):
            listed = "; ".join(
                f"{p.node_url} {describe(p.wire_version, p.kura_version)}" for p in others
            )
            out.append(
                f"mixed versions in the mesh: this node {describe(*mine)}; {listed}: finish the "
                "rollout or roll it back (docs/upgrading.md)"
            )
        return out

    def _count_probe(self, result: str) -> None:
        self.stats.probes_total[result] = self.stats.probes_total.get(result, 0) + 1

    def _change(self, change: str, node_url: str) -> None:
        self.generation += 1
        if change in ("joined", "left"):
            self._changed_at = self._clock.monotonic()
        self.stats.changes_total[change] = self.stats.changes_total.get(change, 0) + 1
        log.info("membership: peer %s %s (generation %d)", node_url, change, self.generation)
        for listener in self.listeners:
            listener(change, node_url)
