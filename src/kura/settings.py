"""kura's settings: every ``KURA_*`` environment variable and its matching flag.

Names follow the Rust Kura server where it has them (docs/reference/kura-behaviour.md §6), so
deployments can switch without rewriting their environment. Unlike upstream, nothing is
mandatory: with no configuration at all a node serves on 127.0.0.1:4000 with its data under
``./.kura`` (the README's first command). Flags win over the environment.

A setting is one line of ``Settings``: its type (``kit.settings`` and ``kura.settings_rules``
name the parser), its default and its help; its variable is ``KURA_`` and the field's name
upper-cased unless the field names another, and its flag that variable's ``--kebab-case``
(``kit.settings``). Rules between settings are ``kura.settings_rules.validate_settings``.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, Literal

from kit.cpus import available_cpus
from kit.settings import (
    Bool,
    Bytes,
    Environment,
    FilePath,
    HttpUrl,
    HttpUrls,
    NonEmpty,
    NonNegativeInt,
    Port,
    PositiveBytes,
    PositiveInt,
    load,
    option,
    screen_environment,
)
from kura.core.namespace_rule import NamespaceRules
from kura.settings_rules import (
    Age,
    AssetHosts,
    GiB,
    KiB,
    MiB,
    NamespaceRulesSetting,
    ObjectStoreUrl,
    Percent,
    PositiveSeconds,
    Seconds,
    StartupWaitSeconds,
    Tenant,
    Tokens,
    UrlPrefix,
    Workers,
    validate_settings,
)


@dataclasses.dataclass(frozen=True)
class Settings:
    """One node's configuration. Sizes are bytes, durations seconds."""

    ENV_PREFIX: ClassVar[str] = "KURA_"

    host: NonEmpty = option("127.0.0.1", "address to listen on")
    port: Port = option(4000, "public HTTP port")
    internal_port: Port = option(0, "peer-only listener for /_internal/ routes (0 = OS-chosen)")
    data_dir: FilePath = option(Path(".kura/data"), "blobs and metadata")
    tmp_dir: FilePath = option(Path(".kura/tmp"), "staging area for bodies")
    tmp_dir_max_bytes: PositiveBytes = option(
        8 * GiB, "byte budget for everything staged in the tmp dir"
    )
    max_disk_bytes: PositiveBytes = option(
        50 * GiB, "stored artifact bytes kept before least-recently-used eviction"
    )
    hot_cache_bytes: Bytes = option(
        64 * MiB,
        "memory for verified small artifacts served without touching disk, the node's whole "
        "budget: each of KURA_WORKERS processes keeps an equal share (0 = off)",
    )
    min_free_disk_bytes: Bytes = option(
        256 * MiB, "writes fail with 503 when the data filesystem would have less free space"
    )
    verify_reads: Literal["always", "changed"] = option(
        "always",
        "hash large blobs on every GET while sending them (always), or only when their file's "
        "stat signature changed (changed: faster, misses corruption below the filesystem)",
    )
    scrub_interval_seconds: NonNegativeInt = option(
        86400, "every stored artifact is re-hashed once per this period (0 = no scrub)"
    )
    scrub_max_bytes_per_second: PositiveBytes = option(
        16 * MiB, "the scrub never hashes faster than this"
    )
    max_age_seconds: Age = option(
        0.0,
        "drop artifacts not read or written on this node for longer than this (30d, 12h, 90s or "
        "seconds; 0 = never); a local rule, never replicated",
        env="KURA_MAX_AGE",
    )
    min_retention_seconds: Seconds = option(
        3 * 3600.0,
        "a blob clients were told exists (an action-cache hit, a FindMissingBlobs answer) is "
        "not evicted for this long while the disk budget allows (3h, 30m, 90s or seconds; "
        "0 = off); Bazel's default --experimental_remote_cache_ttl",
        env="KURA_MIN_RETENTION",
    )
    namespace_rules: NamespaceRulesSetting = option(
        NamespaceRules(),
        "retention per namespace: ';'-separated rules of a namespace or pattern and any of "
        "max_age, quota and min_age, first match wins (main:max_age=30d,min_age=1d;"
        "pr-*:max_age=2d,quota=10GiB); a namespace no rule matches keeps KURA_MAX_AGE and LRU",
    )
    expiry_interval_seconds: PositiveSeconds = option(
        300.0,
        "pause between expiry passes (5m, 30s or seconds), with KURA_MAX_AGE set",
        env="KURA_EXPIRY_INTERVAL",
    )
    expiry_max_deletes_per_second: PositiveInt = option(
        200, "an expiry pass deletes at most this many artifacts per second"
    )
    expiry_batch_size: PositiveInt = option(
        100,
        "artifacts an expiry pass deletes in one index transaction (at most the per-second rate)",
    )
    quarantine_max_bytes: Bytes = option(
        1 * GiB,
        "damaged blobs kept in DATA_DIR/quarantine for inspection; the oldest are deleted past "
        "this (0 = keep none)",
    )
    tenant_id: Tenant = option("default", "this mesh's tenant")
    region: NonEmpty = option("local", "label for this node")
    node_url: HttpUrl | None = option(
        None, "this node's internal URL as peers reach it (default: http://HOST:INTERNAL_PORT)"
    )
    peers: HttpUrls = option((), "comma-separated peer internal URLs")
    discovery_dns_name: NonEmpty | None = option(
        None, "DNS name whose addresses are peer candidates (e.g. a headless Service)"
    )
    discovery_interval_ms: PositiveInt = option(2000, "how often peers are probed")
    discovery_settle_ms: NonNegativeInt = option(
        5000, "after a membership change, /ready waits this long for the view to settle"
    )
    discovery_initial_timeout_ms: PositiveInt = option(
        30000, "initial discovery counts as done after this long even if no peer answered"
    )
    internal_tls_ca_cert_path: FilePath | None = option(
        None, "CA that signs every peer's certificate (enables mutual TLS between peers)"
    )
    internal_tls_cert_path: FilePath | None = option(
        None, "this node's certificate, used as server and as client"
    )
    internal_tls_key_path: FilePath | None = option(None, "this node's private key")
    internal_tokens: Tokens = option(
        (),
        "comma-separated shared peer tokens: the first is sent to peers, any is accepted on "
        "/_internal/ (list old,new while rotating)",
    )
    max_clock_skew_ms: PositiveInt = option(
        300_000,
        "a peer's artifact or tombstone version further ahead of this node's clock is refused",
    )
    outbox_max_depth: PositiveInt = option(
        100_000,
        "pending replication messages per peer; a peer at it gets no more and is marked to be "
        "caught up (writes are never refused because of a peer)",
    )
    peer_forget_after_seconds: PositiveSeconds = option(
        6 * 3600.0,
        "a peer not seen healthy this long (6h, 30m, 90s or seconds) loses its outbox queue and "
        "is caught up when it returns",
        env="KURA_PEER_FORGET_AFTER",
    )
    changes_poll_interval_seconds: PositiveSeconds = option(
        30.0,
        "how often (30s, 5m or seconds) this node pulls each peer's change feed to move its "
        "durable cursor, so a restart pulls only what changed since",
        env="KURA_CHANGES_POLL_INTERVAL",
    )
    replication_backoff_max_ms: PositiveInt = option(
        60_000, "per-peer retry backoff doubles from 2 s up to this"
    )
    read_through: Literal["joining", "always", "never"] = option(
        "always",
        "ask healthy peers on a local miss: always, only while not ready (joining), or never",
    )
    # The object-storage tier (docs/object-storage.md); endpoint, region and credentials come
    # from the usual AWS_* variables, read by kura.storage.object_store.
    object_store_url: ObjectStoreUrl = option(
        "", "s3://bucket/prefix of a shared object-storage tier (empty = local disk only)"
    )
    object_store_timeout_seconds: PositiveSeconds = option(
        30.0,
        "how long one object-store request may take before it counts as failed",
        env="KURA_OBJECT_STORE_TIMEOUT",
    )
    object_store_breaker_failures: PositiveInt = option(
        3,
        "object-store failures in a row (timeouts, refused connections, 5xx) after which requests "
        "skip the store for KURA_OBJECT_STORE_BREAKER_COOLDOWN",
    )
    object_store_breaker_cooldown_seconds: PositiveSeconds = option(
        10.0,
        "how long (10s, 1m or seconds) requests skip a failing object store before one request "
        "probes it again",
        env="KURA_OBJECT_STORE_BREAKER_COOLDOWN",
    )
    read_through_timeout_ms: PositiveInt = option(
        1000, "how long one read-through may wait for all the peers it asks together"
    )
    read_through_negative_ttl_ms: NonNegativeInt = option(
        5000, "a key no peer had is not asked for again for this long (0 = off)"
    )
    bootstrap_max_concurrent_peers: PositiveInt = option(8, "peers bootstrapped from at once")
    bootstrap_downloads_per_peer: PositiveInt = option(
        4, "artifact bodies downloaded at once from one peer"
    )
    bootstrap_max_failed_passes: PositiveInt = option(
        5, "after this many failed passes in a row a peer stops gating /ready (it is reported)"
    )
    bootstrap_timeout_ms: PositiveInt = option(
        300_000, "a bootstrap pass that makes no progress for this long is abandoned and retried"
    )
    bootstrap_disk_percent: Percent = option(
        90,
        "bootstrap stops fetching before stored bytes pass this share of KURA_MAX_DISK_BYTES (the "
        "rest is left for live writes)",
    )
    anti_entropy_interval_seconds: Seconds = option(
        60.0,
        "pause between anti-entropy rounds against every healthy peer (60s, 5m or seconds; 0 = "
        "off)",
        env="KURA_ANTI_ENTROPY_INTERVAL",
    )
    anti_entropy_max_requests_per_second: PositiveInt = option(
        20, "anti-entropy requests to peers (digests, listings, fetches) per second, at most"
    )
    anti_entropy_max_requests_per_round: PositiveInt = option(
        1000, "an anti-entropy round stops after this many requests; the next round goes on"
    )
    replication_bandwidth_limit_bytes_per_second: Bytes = option(
        0,
        "throttle for artifact bodies this node serves to bootstrapping peers, not to a "
        "read-through (0 = off)",
    )
    replication_public_latency_target_ms: NonNegativeInt = option(
        100,
        "peer body traffic slows by max(public requests in flight + 1, public latency EWMA / "
        "this) (0 = off)",
    )
    replication_shared_bandwidth_bytes_per_second: Bytes = option(
        512 * MiB,
        "node-wide rate of peer body traffic on a quiet node, divided by the public-load factor "
        "(0 = off)",
    )
    max_keyvalue_bytes: PositiveBytes = option(1 * MiB, "largest key-value (action cache) body")
    inline_max_bytes: Bytes = option(
        16 * KiB,
        "bodies of at most this many bytes are stored inside the index, not as files (0 = off)",
    )
    max_xcode_bytes: PositiveBytes = option(256 * MiB, "largest Xcode CAS body")
    max_gradle_bytes: PositiveBytes = option(100 * MiB, "largest Gradle body")
    max_artifact_bytes: PositiveBytes = option(
        2 * GiB, "largest body on the Nx, Metro, Turborepo, HTTP-cache and WebDAV routes"
    )
    http_cache_prefix: UrlPrefix = option(
        "/cache",
        "path of the plain GET/PUT cache (ccache, Gradle HttpBuildCache, Bazel ac/ and cas/)",
    )
    webdav_prefix: UrlPrefix = option("/dav", "path of the WebDAV cache (sccache)")
    read_write_tokens: Tokens = option(
        (), "comma-separated bearer tokens that may read and write (none = open access)"
    )
    read_only_tokens: Tokens = option((), "comma-separated bearer tokens that may only read")
    read_write_tokens_file: FilePath | None = option(
        None, "file of read-write bearer tokens, one a line (# comments), re-read when it changes"
    )
    read_only_tokens_file: FilePath | None = option(
        None, "file of read-only bearer tokens, one a line (# comments), re-read when it changes"
    )
    tokens_file: FilePath | None = option(
        None,
        "credentials file: one a line, the token (16+ characters) then "
        "rights=read,write:cas,write,clean (none implies read: rights=write:cas alone reads "
        "nothing, unlike the JWT scope cache:write:cas) and an optional name=; re-read when it "
        "changes (replace it by rename)",
    )
    auth_jwt_public_key: NonEmpty | None = option(
        None, "PEM public key (the text, or a file's path) that verifies JWT bearer tokens"
    )
    auth_jwt_jwks_url: HttpUrl | None = option(
        None, "JWKS URL whose keys verify JWT bearer tokens (instead of KURA_AUTH_JWT_PUBLIC_KEY)"
    )
    auth_jwt_jwks_refresh_seconds: PositiveSeconds = option(
        300.0, "how often the JWKS is fetched again"
    )
    auth_jwt_issuer: NonEmpty | None = option(
        None, "the iss every JWT must carry (required with a JWT key)"
    )
    auth_jwt_audience: NonEmpty | None = option(
        None, "the aud every JWT must name (required with a JWT key)"
    )
    metrics_require_token: Bool = option(
        False, "/metrics needs a read token like the cache routes (when access control is on)"
    )
    public_tls_cert_path: FilePath | None = option(
        None, "certificate chain (PEM) of the public listener; enables HTTPS, reloaded on change"
    )
    public_tls_key_path: FilePath | None = option(
        None, "private key (PEM) of the public listener's certificate, reloaded on change"
    )
    grpc_port: Port | None = option(
        None,
        "port of the REAPI v2 gRPC listener (ActionCache, CAS, ByteStream, Capabilities); unset = "
        "off, 0 = OS-chosen; TLS with the public TLS certificate when that is set",
    )
    grpc_max_message_bytes: PositiveBytes = option(
        4 * MiB, "largest gRPC message received or sent; batch calls are advertised 64 KiB less"
    )
    asset_fetch_allowed_hosts: AssetHosts = option(
        (),
        "comma-separated origins the Remote Asset FetchBlob may download from on a miss: host, "
        "host:port, *.domain or *; empty = off. Only a host:port (no '*') may resolve to a "
        "private, loopback or link-local address",
    )
    grpc_max_split_splice_calls: PositiveInt = option(
        4,
        "REAPI SplitBlob/SpliceBlob calls running at once on this node (each holds up to "
        "16 MiB); another gets RESOURCE_EXHAUSTED",
    )
    asset_fetch_max_downloads: PositiveInt = option(
        8,
        "Remote Asset FetchBlob calls that may download from origin at once on this node; "
        "another waits up to 10 s for one to end, then gets RESOURCE_EXHAUSTED",
    )
    action_cache_tree_max_bytes: PositiveBytes = option(
        64 * MiB,
        "bytes of distinct output-directory Trees one action-cache look-up may read to check "
        "their files are stored; past it the entry is a miss",
    )
    action_cache_check_seconds: PositiveSeconds = option(
        10.0,
        "how long one action-cache look-up may spend checking its outputs are stored; past it the "
        "entry is a miss",
    )
    grpc_upload_resume_seconds: PositiveSeconds = option(
        60.0,
        "how long a ByteStream write whose stream dropped can be resumed; its tmp budget is held "
        "that long, then it is discarded",
    )
    multipart_upload_ttl_seconds: PositiveInt = option(
        3600,
        "abandoned multipart uploads (and the tmp budget their parts hold) are removed after this "
        "long",
    )
    body_idle_timeout_seconds: PositiveInt = option(
        60,
        "an upload that sends no byte for this long is aborted and its tmp reservation freed; a "
        "gRPC stream whose client takes no message for this long is cut",
    )
    min_upload_bytes_per_second: NonNegativeInt = option(
        16 * 1024,
        "after the grace period, an upload averaging less than this is aborted and its tmp "
        "reservation freed (0 = no minimum)",
    )
    upload_grace_seconds: PositiveInt = option(
        10, "how long an upload may run before its average rate is held to the minimum"
    )
    header_read_timeout_seconds: PositiveInt = option(
        60,
        "a connection that has not sent a complete request head this long after it opened (or "
        "after its previous response) is closed",
    )
    max_connections: PositiveInt = option(
        4096,
        "open client and peer connections per process, every listener together (gRPC's share "
        "included; clamped below the descriptor limit)",
    )
    multipart_upload_idle_seconds: PositiveInt = option(
        60,
        "at the open-upload cap, a multipart upload idle this long may be reclaimed for a new one",
    )
    multipart_uploads_per_namespace: PositiveInt = option(
        256,
        "open multipart uploads one namespace may hold (of the node's 1,024); at the cap its own "
        "idle or too slow upload is reclaimed for a new one, else start answers 503",
    )
    shutdown_timeout_seconds: NonNegativeInt = option(
        30, "on SIGTERM, how long in-flight requests may take to finish"
    )
    startup_wait_seconds: StartupWaitSeconds = option(
        10,
        "while start-up checks the index in the background, how long a request waits for it "
        "(reads and writes), and while it reconciles files with the index, how long a write "
        "waits, each wait counted from when it starts (a request that reads, then writes, may "
        "wait twice: up to 2 x this), at most 60; then 503 with Retry-After naming what still "
        "runs (a write is refused at once when the work's estimate is past the wait)",
    )
    allow_unknown_settings: Bool = option(
        False,
        "start even when a KURA_* variable is not a setting (warned once); by default the start "
        "is refused, naming the closest setting",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = option("INFO", "log verbosity")
    access_log: Bool = option(False, "log every request")
    workers: Workers = option(
        help="processes serving the public port (auto = the CPUs this process may use); the "
        "extra ones serve GET and HEAD hits and forward the rest to the one process that owns "
        "the data dir",
        default_factory=available_cpus,  # auto
    )
    worker_probe_period_seconds: PositiveSeconds = option(
        5.0,
        "with KURA_WORKERS > 1, how often the primary asks each worker over its own socket "
        "whether its event loop still answers (5s or seconds)",
        env="KURA_WORKER_PROBE_PERIOD",
    )
    worker_probe_timeout_seconds: PositiveSeconds = option(
        5.0,
        "a worker that does not answer 3 probes in a row, each within this long, is killed "
        "(SIGKILL) and started again (5s or seconds)",
        env="KURA_WORKER_PROBE_TIMEOUT",
    )
    event_loop: Literal["auto", "asyncio", "uvloop"] = option(
        "asyncio", "the event loop: asyncio's own, uvloop, or auto (uvloop when installed)"
    )

    @property
    def auth_enabled(self) -> bool:
        return bool(
            self.read_write_tokens
            or self.read_only_tokens
            or self.read_write_tokens_file
            or self.read_only_tokens_file
            or self.tokens_file
            or self.auth_jwt
        )

    @property
    def auth_jwt(self) -> bool:
        return bool(self.auth_jwt_public_key or self.auth_jwt_jwks_url)

    @property
    def internal_tls(self) -> bool:
        return self.internal_tls_ca_cert_path is not None


# KURA_* variables that are not node settings but that kura's other commands and tools read, so
# that `kura serve` in the same environment does not refuse them as misspelt settings.
# The operator socket in KURA_DATA_DIR (kura.api.admin, ``kura admin --data-dir``).
ADMIN_SOCKET = "admin.sock"

NOT_NODE_SETTINGS = (
    "KURA_URL",  # kura status --url
    "KURA_TOKEN",  # kura status --token
    "KURA_ADMIN_TOKEN",  # kura admin --token
    "KURA_FAILPOINTS",  # kit.failpoint (tests inject faults)
    "KURA_WORKER_PARENT_PID",  # set by the supervisor for its worker processes
    "KURA_TOOLS",  # the build tools of tests/clients and the rolling demo
    "KURA_TEST_WORKERS",  # the test suite's processes per node
)


def load_settings(args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    """Settings from parsed flags and ``environ``, flags winning. Raises
    ``kit.settings.SettingsError`` listing every problem: invalid values, cross-field rules, and
    each ``KURA_*`` variable that is neither a setting nor in ``NOT_NODE_SETTINGS`` (naming the
    closest setting) unless KURA_ALLOW_UNKNOWN_SETTINGS is true. Kubernetes service links for a
    Service named ``kura`` or ``kura-*`` are ignored (``kit.service_link``)."""
    return load(
        Settings,
        args,
        environ,
        validate=validate_settings,
        screen=True,
        also_known=NOT_NODE_SETTINGS,
    )


def environment(environ: Mapping[str, str]) -> Environment:
    """``environ``'s ``KURA_*`` variables sorted as ``load_settings`` sorts them."""
    return screen_environment(Settings, environ, NOT_NODE_SETTINGS)


def describe_auth(s: Settings) -> str:
    """One log line saying whether clients and peers must authenticate, and how: which kinds of
    credential are accepted (counts and paths, never a token), for example ``auth on: 2
    read-write tokens (KURA_READ_WRITE_TOKENS), JWT (JWKS https://idp/jwks, iss=..., aud=...);
    /metrics open; peers: 1 internal token``."""
    kinds = []
    for count, what, env in (
        (len(s.read_write_tokens), "read-write", "KURA_READ_WRITE_TOKENS"),
        (len(s.read_only_tokens), "read-only", "KURA_READ_ONLY_TOKENS"),
    ):
        if count:
            kinds.append(f"{count} {what} token{'s' if count > 1 else ''} ({env})")
    for path, what in (
        (s.read_write_tokens_file, "read-write"),
        (s.read_only_tokens_file, "read-only"),
    ):
        if path is not None:
            kinds.append(f"{what} token file {path}")
    if s.tokens_file is not None:
        kinds.append(f"credentials file {s.tokens_file}")
    if s.auth_jwt:
        key = f"JWKS {s.auth_jwt_jwks_url}" if s.auth_jwt_jwks_url else "a public key"
        kinds.append(f"JWT ({key}, iss={s.auth_jwt_issuer}, aud={s.auth_jwt_audience})")
    if kinds:
        metrics = "needs a read token" if s.metrics_require_token else "open"
        clients = f"auth on: {', '.join(kinds)}; /metrics {metrics}"
    else:
        clients = (
            "auth off: every client may read and write (set KURA_READ_WRITE_TOKENS, a token "
            "file or JWT to require a token)"
        )
    peer_kinds = []
    if s.internal_tokens:
        count = len(s.internal_tokens)
        peer_kinds.append(f"{count} internal token{'s' if count > 1 else ''}")
    if s.internal_tls:
        peer_kinds.append("mutual TLS")
    return f"{clients}; peers: {' and '.join(peer_kinds) or 'no credentials'}"
