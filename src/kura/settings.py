"""kura's settings: every ``KURA_*`` environment variable and its matching flag.

Names follow the Rust Kura server where it has them (docs/reference/kura-behaviour.md §6), so
deployments can switch without rewriting their environment. Unlike upstream, nothing is
mandatory: with no configuration at all a node serves on 127.0.0.1:4000 with its data under
``./.kura`` (the README's first command). Flags win over the environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
from collections.abc import Mapping
from pathlib import Path

from kit.cpus import available_cpus
from kit.settings import (
    Environment,
    load,
    option,
    parse_bool,
    parse_bytes,
    parse_choice,
    parse_duration,
    parse_http_url,
    parse_http_urls,
    parse_non_empty,
    parse_non_negative_int,
    parse_path,
    parse_port,
    parse_positive_bytes,
    parse_positive_int,
    screen_environment,
    split_list,
)
from kura.core.errors import InvalidRequest
from kura.core.keys import NAMESPACE, validate
from kura.core.object_layout import parse_url

MiB = 1024 * 1024
KiB = 1024
MAX_INLINE_BYTES = 1 * MiB
GiB = 1024 * MiB


def _prefix(text: str) -> str:
    text = "/" + text.strip().strip("/")
    if text == "/" or "//" in text or ".." in text:
        raise ValueError("must be a path such as /cache")
    return text


def _tokens(text: str) -> tuple[str, ...]:
    tokens = tuple(split_list(text))
    if text.strip() and not tokens:
        raise ValueError("no token in the list (an empty list would leave the node open)")
    for t in tokens:
        if any(c.isspace() for c in t):
            raise ValueError("tokens must not contain whitespace")
    return tokens


def _duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``30m`` or ``0``; must not be negative."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = parse_duration(text)
    if not seconds >= 0:
        raise ValueError("must be a duration of 0 or more, such as 0, 60s or 5m")
    return seconds


def _positive_duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``30m``, ``6h`` or ``1h30m``; must be above 0."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = parse_duration(text)
    if not seconds > 0:
        raise ValueError("must be a duration above 0, such as 90s, 30m or 6h")
    return seconds


def _max_age(text: str) -> float:
    """Seconds from a duration that may start with whole days: ``30d``, ``1d12h``, ``12h``,
    ``90s``, plain seconds, or ``0`` (off). Days are not part of Go's duration syntax
    (``parse_duration``), but an age rule is naturally stated in days, as S3 lifecycle rules
    state theirs (``Days``: https://docs.aws.amazon.com/AmazonS3/latest/API/API_LifecycleExpiration.html)."""
    days, sep, rest = text.strip().partition("d")
    try:
        if sep and days.isdigit():
            seconds = int(days) * 86400 + (_duration(rest) if rest else 0.0)
        else:
            seconds = _duration(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise ValueError("must be an age such as 30d, 1d12h, 12h or 90s, or 0 (off)")
    return seconds


def _percent(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError("must be a whole percentage from 1 to 100") from None
    if not 1 <= value <= 100:
        raise ValueError("must be a whole percentage from 1 to 100")
    return value


def _object_store_url(text: str) -> str:
    """``s3://bucket/prefix`` or empty (the tier off)."""
    if not text.strip():
        return ""
    parse_url(text)
    return text.strip().rstrip("/")


WORKERS_PER_CPU_MAX = 4


def parse_workers(text: str) -> int:
    """``auto`` (the CPUs this process may use: affinity and cgroup quota, ``kit.cpus``) or an
    integer from 1 to ``WORKERS_PER_CPU_MAX`` times those CPUs. Processes beyond the CPUs only
    add memory (about 50 MiB each); a typo such as ``100000`` would fork that many."""
    cpus = available_cpus()
    if text.strip().lower() == "auto":
        return cpus
    value = parse_positive_int(text)
    if value > WORKERS_PER_CPU_MAX * cpus:
        raise ValueError(
            f"must be at most {WORKERS_PER_CPU_MAX * cpus} ({WORKERS_PER_CPU_MAX} per CPU this "
            f"process may use, {cpus} here)"
        )
    return value


def _tenant(text: str) -> str:
    text = parse_non_empty(text)
    try:
        validate(text, NAMESPACE, "tenant id")
    except InvalidRequest as exc:
        # Parsers report problems as ValueError so ``load`` lists them with the others.
        raise ValueError(exc.message) from None
    return text


@dataclasses.dataclass(frozen=True)
class Settings:
    """One node's configuration. Sizes are bytes, durations seconds."""

    host: str = option(
        "KURA_HOST", "--host", parse_non_empty, "address to listen on", default="127.0.0.1"
    )
    port: int = option("KURA_PORT", "--port", parse_port, "public HTTP port", default=4000)
    internal_port: int = option(
        "KURA_INTERNAL_PORT",
        "--internal-port",
        parse_port,
        "peer-only listener for /_internal/ routes (0 = OS-chosen)",
        default=0,
    )
    data_dir: Path = option(
        "KURA_DATA_DIR", "--data-dir", parse_path, "blobs and metadata", default=Path(".kura/data")
    )
    tmp_dir: Path = option(
        "KURA_TMP_DIR",
        "--tmp-dir",
        parse_path,
        "staging area for bodies",
        default=Path(".kura/tmp"),
    )
    tmp_dir_max_bytes: int = option(
        "KURA_TMP_DIR_MAX_BYTES",
        "--tmp-dir-max-bytes",
        parse_positive_bytes,
        "byte budget for everything staged in the tmp dir",
        default=8 * GiB,
    )
    max_disk_bytes: int = option(
        "KURA_MAX_DISK_BYTES",
        "--max-disk-bytes",
        parse_positive_bytes,
        "stored artifact bytes kept before least-recently-used eviction",
        default=50 * GiB,
    )
    hot_cache_bytes: int = option(
        "KURA_HOT_CACHE_BYTES",
        "--hot-cache-bytes",
        parse_bytes,
        "memory for verified small artifacts served without touching disk, the node's whole "
        "budget: each of KURA_WORKERS processes keeps an equal share (0 = off)",
        default=64 * MiB,
    )
    min_free_disk_bytes: int = option(
        "KURA_MIN_FREE_DISK_BYTES",
        "--min-free-disk-bytes",
        parse_bytes,
        "writes fail with 503 when the data filesystem would have less free space",
        default=256 * MiB,
    )
    verify_reads: str = option(
        "KURA_VERIFY_READS",
        "--verify-reads",
        parse_choice(["always", "changed"]),
        "hash large blobs on every GET while sending them (always), or only when their file's "
        "stat signature changed (changed: faster, misses corruption below the filesystem)",
        default="always",
    )
    scrub_interval_seconds: int = option(
        "KURA_SCRUB_INTERVAL_SECONDS",
        "--scrub-interval-seconds",
        parse_non_negative_int,
        "every stored artifact is re-hashed once per this period (0 = no scrub)",
        default=86400,
    )
    scrub_max_bytes_per_second: int = option(
        "KURA_SCRUB_MAX_BYTES_PER_SECOND",
        "--scrub-max-bytes-per-second",
        parse_positive_bytes,
        "the scrub never hashes faster than this",
        default=16 * MiB,
    )
    max_age_seconds: float = option(
        "KURA_MAX_AGE",
        "--max-age",
        _max_age,
        "drop artifacts not read or written on this node for longer than this (30d, 12h, 90s "
        "or seconds; 0 = never); a local rule, never replicated",
        default=0.0,
    )
    expiry_interval_seconds: float = option(
        "KURA_EXPIRY_INTERVAL",
        "--expiry-interval",
        _positive_duration,
        "pause between expiry passes (5m, 30s or seconds), with KURA_MAX_AGE set",
        default=300.0,
    )
    expiry_max_deletes_per_second: int = option(
        "KURA_EXPIRY_MAX_DELETES_PER_SECOND",
        "--expiry-max-deletes-per-second",
        parse_positive_int,
        "an expiry pass deletes at most this many artifacts per second",
        default=200,
    )
    expiry_batch_size: int = option(
        "KURA_EXPIRY_BATCH_SIZE",
        "--expiry-batch-size",
        parse_positive_int,
        "artifacts an expiry pass deletes in one index transaction (at most the per-second rate)",
        default=100,
    )
    quarantine_max_bytes: int = option(
        "KURA_QUARANTINE_MAX_BYTES",
        "--quarantine-max-bytes",
        parse_bytes,
        "damaged blobs kept in DATA_DIR/quarantine for inspection; the oldest are deleted past "
        "this (0 = keep none)",
        default=1 * GiB,
    )
    tenant_id: str = option(
        "KURA_TENANT_ID", "--tenant-id", _tenant, "this mesh's tenant", default="default"
    )
    region: str = option(
        "KURA_REGION", "--region", parse_non_empty, "label for this node", default="local"
    )
    node_url: str | None = option(
        "KURA_NODE_URL",
        "--node-url",
        parse_http_url,
        "this node's internal URL as peers reach it (default: http://HOST:INTERNAL_PORT)",
        default=None,
    )
    peers: tuple[str, ...] = option(
        "KURA_PEERS",
        "--peers",
        parse_http_urls,
        "comma-separated peer internal URLs",
        default=(),
    )
    discovery_dns_name: str | None = option(
        "KURA_DISCOVERY_DNS_NAME",
        "--discovery-dns-name",
        parse_non_empty,
        "DNS name whose addresses are peer candidates (e.g. a headless Service)",
        default=None,
    )
    discovery_interval_ms: int = option(
        "KURA_DISCOVERY_INTERVAL_MS",
        "--discovery-interval-ms",
        parse_positive_int,
        "how often peers are probed",
        default=2000,
    )
    discovery_settle_ms: int = option(
        "KURA_DISCOVERY_SETTLE_MS",
        "--discovery-settle-ms",
        parse_non_negative_int,
        "after a membership change, /ready waits this long for the view to settle",
        default=5000,
    )
    discovery_initial_timeout_ms: int = option(
        "KURA_DISCOVERY_INITIAL_TIMEOUT_MS",
        "--discovery-initial-timeout-ms",
        parse_positive_int,
        "initial discovery counts as done after this long even if no peer answered",
        default=30000,
    )
    internal_tls_ca_cert_path: Path | None = option(
        "KURA_INTERNAL_TLS_CA_CERT_PATH",
        "--internal-tls-ca-cert-path",
        parse_path,
        "CA that signs every peer's certificate (enables mutual TLS between peers)",
        default=None,
    )
    internal_tls_cert_path: Path | None = option(
        "KURA_INTERNAL_TLS_CERT_PATH",
        "--internal-tls-cert-path",
        parse_path,
        "this node's certificate, used as server and as client",
        default=None,
    )
    internal_tls_key_path: Path | None = option(
        "KURA_INTERNAL_TLS_KEY_PATH",
        "--internal-tls-key-path",
        parse_path,
        "this node's private key",
        default=None,
    )
    internal_tokens: tuple[str, ...] = option(
        "KURA_INTERNAL_TOKENS",
        "--internal-tokens",
        _tokens,
        "comma-separated shared peer tokens: the first is sent to peers, any is accepted on "
        "/_internal/ (list old,new while rotating)",
        default=(),
    )
    max_clock_skew_ms: int = option(
        "KURA_MAX_CLOCK_SKEW_MS",
        "--max-clock-skew-ms",
        parse_positive_int,
        "a peer's artifact or tombstone version further ahead of this node's clock is refused",
        default=300_000,
    )
    outbox_max_depth: int = option(
        "KURA_OUTBOX_MAX_DEPTH",
        "--outbox-max-depth",
        parse_positive_int,
        "pending replication messages per peer; a peer at it gets no more and is marked "
        "to be caught up (writes are never refused because of a peer)",
        default=100_000,
    )
    peer_forget_after_seconds: float = option(
        "KURA_PEER_FORGET_AFTER",
        "--peer-forget-after",
        _positive_duration,
        "a peer not seen healthy this long (6h, 30m, 90s or seconds) loses its outbox queue "
        "and is caught up when it returns",
        default=6 * 3600.0,
    )
    changes_poll_interval_seconds: float = option(
        "KURA_CHANGES_POLL_INTERVAL",
        "--changes-poll-interval",
        _positive_duration,
        "how often (30s, 5m or seconds) this node pulls each peer's change feed to move its "
        "durable cursor, so a restart pulls only what changed since",
        default=30.0,
    )
    replication_backoff_max_ms: int = option(
        "KURA_REPLICATION_BACKOFF_MAX_MS",
        "--replication-backoff-max-ms",
        parse_positive_int,
        "per-peer retry backoff doubles from 2 s up to this",
        default=60_000,
    )
    read_through: str = option(
        "KURA_READ_THROUGH",
        "--read-through",
        parse_choice(["joining", "always", "never"]),
        "ask healthy peers on a local miss: always, only while not ready (joining), or never",
        default="always",
    )
    # The object-storage tier (docs/object-storage.md); endpoint, region and credentials come
    # from the usual AWS_* variables, read by kura.storage.object_store.
    object_store_url: str = option(
        "KURA_OBJECT_STORE_URL",
        "--object-store-url",
        _object_store_url,
        "s3://bucket/prefix of a shared object-storage tier (empty = local disk only)",
        default="",
    )
    object_store_timeout_seconds: float = option(
        "KURA_OBJECT_STORE_TIMEOUT",
        "--object-store-timeout",
        _positive_duration,
        "how long one object-store request may take before it counts as failed",
        default=30.0,
    )
    object_store_breaker_failures: int = option(
        "KURA_OBJECT_STORE_BREAKER_FAILURES",
        "--object-store-breaker-failures",
        parse_positive_int,
        "object-store failures in a row (timeouts, refused connections, 5xx) after which "
        "requests skip the store for KURA_OBJECT_STORE_BREAKER_COOLDOWN",
        default=3,
    )
    object_store_breaker_cooldown_seconds: float = option(
        "KURA_OBJECT_STORE_BREAKER_COOLDOWN",
        "--object-store-breaker-cooldown",
        _positive_duration,
        "how long (10s, 1m or seconds) requests skip a failing object store before one "
        "request probes it again",
        default=10.0,
    )
    read_through_timeout_ms: int = option(
        "KURA_READ_THROUGH_TIMEOUT_MS",
        "--read-through-timeout-ms",
        parse_positive_int,
        "how long one read-through may wait for all the peers it asks together",
        default=1000,
    )
    read_through_negative_ttl_ms: int = option(
        "KURA_READ_THROUGH_NEGATIVE_TTL_MS",
        "--read-through-negative-ttl-ms",
        parse_non_negative_int,
        "a key no peer had is not asked for again for this long (0 = off)",
        default=5000,
    )
    bootstrap_max_concurrent_peers: int = option(
        "KURA_BOOTSTRAP_MAX_CONCURRENT_PEERS",
        "--bootstrap-max-concurrent-peers",
        parse_positive_int,
        "peers bootstrapped from at once",
        default=8,
    )
    bootstrap_downloads_per_peer: int = option(
        "KURA_BOOTSTRAP_DOWNLOADS_PER_PEER",
        "--bootstrap-downloads-per-peer",
        parse_positive_int,
        "artifact bodies downloaded at once from one peer",
        default=4,
    )
    bootstrap_max_failed_passes: int = option(
        "KURA_BOOTSTRAP_MAX_FAILED_PASSES",
        "--bootstrap-max-failed-passes",
        parse_positive_int,
        "after this many failed passes in a row a peer stops gating /ready (it is reported)",
        default=5,
    )
    bootstrap_timeout_ms: int = option(
        "KURA_BOOTSTRAP_TIMEOUT_MS",
        "--bootstrap-timeout-ms",
        parse_positive_int,
        "a bootstrap pass that makes no progress for this long is abandoned and retried",
        default=300_000,
    )
    bootstrap_disk_percent: int = option(
        "KURA_BOOTSTRAP_DISK_PERCENT",
        "--bootstrap-disk-percent",
        _percent,
        "bootstrap stops fetching before stored bytes pass this share of KURA_MAX_DISK_BYTES "
        "(the rest is left for live writes)",
        default=90,
    )
    anti_entropy_interval_seconds: float = option(
        "KURA_ANTI_ENTROPY_INTERVAL",
        "--anti-entropy-interval",
        _duration,
        "pause between anti-entropy rounds against every healthy peer (60s, 5m or seconds; "
        "0 = off)",
        default=60.0,
    )
    anti_entropy_max_requests_per_second: int = option(
        "KURA_ANTI_ENTROPY_MAX_REQUESTS_PER_SECOND",
        "--anti-entropy-max-requests-per-second",
        parse_positive_int,
        "anti-entropy requests to peers (digests, listings, fetches) per second, at most",
        default=20,
    )
    anti_entropy_max_requests_per_round: int = option(
        "KURA_ANTI_ENTROPY_MAX_REQUESTS_PER_ROUND",
        "--anti-entropy-max-requests-per-round",
        parse_positive_int,
        "an anti-entropy round stops after this many requests; the next round goes on",
        default=1000,
    )
    replication_bandwidth_limit_bytes_per_second: int = option(
        "KURA_REPLICATION_BANDWIDTH_LIMIT_BYTES_PER_SECOND",
        "--replication-bandwidth-limit-bytes-per-second",
        parse_bytes,
        "throttle for artifact bodies this node serves to bootstrapping peers, not to a "
        "read-through (0 = off)",
        default=0,
    )
    replication_public_latency_target_ms: int = option(
        "KURA_REPLICATION_PUBLIC_LATENCY_TARGET_MS",
        "--replication-public-latency-target-ms",
        parse_non_negative_int,
        "peer body traffic slows by max(public requests in flight + 1, public latency EWMA / "
        "this) (0 = off)",
        default=100,
    )
    replication_shared_bandwidth_bytes_per_second: int = option(
        "KURA_REPLICATION_SHARED_BANDWIDTH_BYTES_PER_SECOND",
        "--replication-shared-bandwidth-bytes-per-second",
        parse_bytes,
        "node-wide rate of peer body traffic on a quiet node, divided by the public-load factor "
        "(0 = off)",
        default=512 * MiB,
    )
    max_keyvalue_bytes: int = option(
        "KURA_MAX_KEYVALUE_BYTES",
        "--max-keyvalue-bytes",
        parse_positive_bytes,
        "largest key-value (action cache) body",
        default=1 * MiB,
    )
    inline_max_bytes: int = option(
        "KURA_INLINE_MAX_BYTES",
        "--inline-max-bytes",
        parse_bytes,
        "bodies of at most this many bytes are stored inside the index, not as files (0 = off)",
        default=16 * KiB,
    )
    max_xcode_bytes: int = option(
        "KURA_MAX_XCODE_BYTES",
        "--max-xcode-bytes",
        parse_positive_bytes,
        "largest Xcode CAS body",
        default=256 * MiB,
    )
    max_gradle_bytes: int = option(
        "KURA_MAX_GRADLE_BYTES",
        "--max-gradle-bytes",
        parse_positive_bytes,
        "largest Gradle body",
        default=100 * MiB,
    )
    max_artifact_bytes: int = option(
        "KURA_MAX_ARTIFACT_BYTES",
        "--max-artifact-bytes",
        parse_positive_bytes,
        "largest body on the Nx, Metro, Turborepo, HTTP-cache and WebDAV routes",
        default=2 * GiB,
    )
    http_cache_prefix: str = option(
        "KURA_HTTP_CACHE_PREFIX",
        "--http-cache-prefix",
        _prefix,
        "path of the plain GET/PUT cache (ccache, Gradle HttpBuildCache, Bazel ac/ and cas/)",
        default="/cache",
    )
    webdav_prefix: str = option(
        "KURA_WEBDAV_PREFIX",
        "--webdav-prefix",
        _prefix,
        "path of the WebDAV cache (sccache)",
        default="/dav",
    )
    read_write_tokens: tuple[str, ...] = option(
        "KURA_READ_WRITE_TOKENS",
        "--read-write-tokens",
        _tokens,
        "comma-separated bearer tokens that may read and write (none = open access)",
        default=(),
    )
    read_only_tokens: tuple[str, ...] = option(
        "KURA_READ_ONLY_TOKENS",
        "--read-only-tokens",
        _tokens,
        "comma-separated bearer tokens that may only read",
        default=(),
    )
    read_write_tokens_file: Path | None = option(
        "KURA_READ_WRITE_TOKENS_FILE",
        "--read-write-tokens-file",
        parse_path,
        "file of read-write bearer tokens, one a line (# comments), re-read when it changes",
        default=None,
    )
    read_only_tokens_file: Path | None = option(
        "KURA_READ_ONLY_TOKENS_FILE",
        "--read-only-tokens-file",
        parse_path,
        "file of read-only bearer tokens, one a line (# comments), re-read when it changes",
        default=None,
    )
    auth_jwt_public_key: str | None = option(
        "KURA_AUTH_JWT_PUBLIC_KEY",
        "--auth-jwt-public-key",
        parse_non_empty,
        "PEM public key (the text, or a file's path) that verifies JWT bearer tokens",
        default=None,
    )
    auth_jwt_jwks_url: str | None = option(
        "KURA_AUTH_JWT_JWKS_URL",
        "--auth-jwt-jwks-url",
        parse_http_url,
        "JWKS URL whose keys verify JWT bearer tokens (instead of KURA_AUTH_JWT_PUBLIC_KEY)",
        default=None,
    )
    auth_jwt_jwks_refresh_seconds: float = option(
        "KURA_AUTH_JWT_JWKS_REFRESH_SECONDS",
        "--auth-jwt-jwks-refresh-seconds",
        _positive_duration,
        "how often the JWKS is fetched again",
        default=300.0,
    )
    auth_jwt_issuer: str | None = option(
        "KURA_AUTH_JWT_ISSUER",
        "--auth-jwt-issuer",
        parse_non_empty,
        "the iss every JWT must carry (required with a JWT key)",
        default=None,
    )
    auth_jwt_audience: str | None = option(
        "KURA_AUTH_JWT_AUDIENCE",
        "--auth-jwt-audience",
        parse_non_empty,
        "the aud every JWT must name (required with a JWT key)",
        default=None,
    )
    metrics_require_token: bool = option(
        "KURA_METRICS_REQUIRE_TOKEN",
        "--metrics-require-token",
        parse_bool,
        "/metrics needs a read token like the cache routes (when access control is on)",
        default=False,
    )
    public_tls_cert_path: Path | None = option(
        "KURA_PUBLIC_TLS_CERT_PATH",
        "--public-tls-cert-path",
        parse_path,
        "certificate chain (PEM) of the public listener; enables HTTPS, reloaded on change",
        default=None,
    )
    public_tls_key_path: Path | None = option(
        "KURA_PUBLIC_TLS_KEY_PATH",
        "--public-tls-key-path",
        parse_path,
        "private key (PEM) of the public listener's certificate, reloaded on change",
        default=None,
    )
    grpc_port: int | None = option(
        "KURA_GRPC_PORT",
        "--grpc-port",
        parse_port,
        "port of the REAPI v2 gRPC listener (ActionCache, CAS, ByteStream, Capabilities); "
        "unset = off, 0 = OS-chosen; TLS with the public TLS certificate when that is set",
        default=None,
    )
    grpc_max_message_bytes: int = option(
        "KURA_GRPC_MAX_MESSAGE_BYTES",
        "--grpc-max-message-bytes",
        parse_positive_bytes,
        "largest gRPC message received or sent; batch calls are advertised 64 KiB less",
        default=4 * MiB,
    )
    action_cache_tree_max_bytes: int = option(
        "KURA_ACTION_CACHE_TREE_MAX_BYTES",
        "--action-cache-tree-max-bytes",
        parse_positive_bytes,
        "bytes of distinct output-directory Trees one action-cache look-up may read to check "
        "their files are stored; past it the entry is a miss",
        default=64 * MiB,
    )
    action_cache_check_seconds: float = option(
        "KURA_ACTION_CACHE_CHECK_SECONDS",
        "--action-cache-check-seconds",
        _positive_duration,
        "how long one action-cache look-up may spend checking its outputs are stored; past it "
        "the entry is a miss",
        default=10.0,
    )
    grpc_upload_resume_seconds: float = option(
        "KURA_GRPC_UPLOAD_RESUME_SECONDS",
        "--grpc-upload-resume-seconds",
        _positive_duration,
        "how long a ByteStream write whose stream dropped can be resumed; its tmp budget is "
        "held that long, then it is discarded",
        default=60.0,
    )
    multipart_upload_ttl_seconds: int = option(
        "KURA_MULTIPART_UPLOAD_TTL_SECONDS",
        "--multipart-upload-ttl-seconds",
        parse_positive_int,
        "abandoned multipart uploads (and the tmp budget their parts hold) are removed after "
        "this long",
        default=3600,
    )
    body_idle_timeout_seconds: int = option(
        "KURA_BODY_IDLE_TIMEOUT_SECONDS",
        "--body-idle-timeout-seconds",
        parse_positive_int,
        "an upload that sends no byte for this long is aborted and its tmp reservation freed; "
        "a gRPC stream whose client takes no message for this long is cut",
        default=60,
    )
    min_upload_bytes_per_second: int = option(
        "KURA_MIN_UPLOAD_BYTES_PER_SECOND",
        "--min-upload-bytes-per-second",
        parse_non_negative_int,
        "after the grace period, an upload averaging less than this is aborted and its tmp "
        "reservation freed (0 = no minimum)",
        default=16 * 1024,
    )
    upload_grace_seconds: int = option(
        "KURA_UPLOAD_GRACE_SECONDS",
        "--upload-grace-seconds",
        parse_positive_int,
        "how long an upload may run before its average rate is held to the minimum",
        default=10,
    )
    header_read_timeout_seconds: int = option(
        "KURA_HEADER_READ_TIMEOUT_SECONDS",
        "--header-read-timeout-seconds",
        parse_positive_int,
        "a connection that has not sent a complete request head this long after it opened (or "
        "after its previous response) is closed",
        default=60,
    )
    max_connections: int = option(
        "KURA_MAX_CONNECTIONS",
        "--max-connections",
        parse_positive_int,
        "open client and peer connections per process, every listener together (gRPC's "
        "share included; clamped below the descriptor limit)",
        default=4096,
    )
    multipart_upload_idle_seconds: int = option(
        "KURA_MULTIPART_UPLOAD_IDLE_SECONDS",
        "--multipart-upload-idle-seconds",
        parse_positive_int,
        "at the open-upload cap, a multipart upload idle this long may be reclaimed for a new one",
        default=60,
    )
    multipart_uploads_per_namespace: int = option(
        "KURA_MULTIPART_UPLOADS_PER_NAMESPACE",
        "--multipart-uploads-per-namespace",
        parse_positive_int,
        "open multipart uploads one namespace may hold (of the node's 1,024); at the cap its "
        "own idle or too slow upload is reclaimed for a new one, else start answers 503",
        default=256,
    )
    shutdown_timeout_seconds: int = option(
        "KURA_SHUTDOWN_TIMEOUT_SECONDS",
        "--shutdown-timeout-seconds",
        parse_non_negative_int,
        "on SIGTERM, how long in-flight requests may take to finish",
        default=30,
    )
    allow_unknown_settings: bool = option(
        "KURA_ALLOW_UNKNOWN_SETTINGS",
        "--allow-unknown-settings",
        parse_bool,
        "start even when a KURA_* variable is not a setting (warned once); by default the "
        "start is refused, naming the closest setting",
        default=False,
    )
    log_level: str = option(
        "KURA_LOG_LEVEL",
        "--log-level",
        parse_choice(["DEBUG", "INFO", "WARNING", "ERROR"]),
        "log verbosity",
        default="INFO",
    )
    access_log: bool = option(
        "KURA_ACCESS_LOG", "--access-log", parse_bool, "log every request", default=False
    )
    workers: int = option(
        "KURA_WORKERS",
        "--workers",
        parse_workers,
        "processes serving the public port (auto = the CPUs this process may use); the extra "
        "ones serve GET and HEAD hits and forward the rest to the one process that owns the "
        "data dir",
        default_factory=available_cpus,  # auto
    )
    worker_probe_period_seconds: float = option(
        "KURA_WORKER_PROBE_PERIOD",
        "--worker-probe-period",
        _positive_duration,
        "with KURA_WORKERS > 1, how often the primary asks each worker over its own socket "
        "whether its event loop still answers (5s or seconds)",
        default=5.0,
    )
    worker_probe_timeout_seconds: float = option(
        "KURA_WORKER_PROBE_TIMEOUT",
        "--worker-probe-timeout",
        _positive_duration,
        "a worker that does not answer 3 probes in a row, each within this long, is killed "
        "(SIGKILL) and started again (5s or seconds)",
        default=5.0,
    )
    event_loop: str = option(
        "KURA_EVENT_LOOP",
        "--event-loop",
        parse_choice(["auto", "asyncio", "uvloop"]),
        "the event loop: asyncio's own, uvloop, or auto (uvloop when installed)",
        default="asyncio",
    )

    @property
    def auth_enabled(self) -> bool:
        return bool(
            self.read_write_tokens
            or self.read_only_tokens
            or self.read_write_tokens_file
            or self.read_only_tokens_file
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
NOT_NODE_SETTINGS = (
    "KURA_URL",  # kura status --url
    "KURA_TOKEN",  # kura status --token
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
        prefix="KURA_",
        also_known=NOT_NODE_SETTINGS,
        allow_unknown_env="KURA_ALLOW_UNKNOWN_SETTINGS",
    )


def environment(environ: Mapping[str, str]) -> Environment:
    """``environ``'s ``KURA_*`` variables sorted as ``load_settings`` sorts them."""
    return screen_environment(Settings, environ, "KURA_", NOT_NODE_SETTINGS)


def validate_settings(s: Settings) -> list[str]:
    """Cross-field rules; returns every problem found."""
    problems: list[str] = []
    if s.port != 0 and s.port == s.internal_port:
        problems.append("KURA_INTERNAL_PORT must differ from KURA_PORT")
    if s.http_cache_prefix == s.webdav_prefix:
        problems.append("KURA_HTTP_CACHE_PREFIX and KURA_WEBDAV_PREFIX must differ")
    for name in ("http_cache_prefix", "webdav_prefix"):
        value = getattr(s, name)
        # "ns": the namespaced form of these routes, /ns/{namespace}/<prefix> (kura.api.scope).
        if value.split("/")[1] in ("api", "v1", "v8", "_internal", "up", "ready", "metrics", "ns"):
            problems.append(f"KURA_{name.upper()} {value!r} collides with a built-in route")
    data, tmp = Path(s.data_dir).resolve(), Path(s.tmp_dir).resolve()
    if data == tmp or data in tmp.parents or tmp in data.parents:
        problems.append(
            "KURA_DATA_DIR and KURA_TMP_DIR must not be the same directory or inside each other "
            "(stored blobs would count against the tmp budget, and the start-up sweep of the "
            "tmp dir must never reach data)"
        )
    # An inline body is held in memory while it is received (kura.storage.small_body).
    if s.inline_max_bytes > MAX_INLINE_BYTES:
        problems.append(f"KURA_INLINE_MAX_BYTES must be at most {MAX_INLINE_BYTES} bytes")
    overlap = set(s.read_write_tokens) & set(s.read_only_tokens)
    if overlap:
        problems.append("a token is listed as both read-write and read-only")
    problems.extend(_auth_problems(s))
    tls = (s.internal_tls_ca_cert_path, s.internal_tls_cert_path, s.internal_tls_key_path)
    if any(tls) and not all(tls):
        problems.append(
            "KURA_INTERNAL_TLS_CA_CERT_PATH, KURA_INTERNAL_TLS_CERT_PATH and "
            "KURA_INTERNAL_TLS_KEY_PATH must be set together"
        )
    scheme = "https://" if all(tls) else "http://"
    for name, urls in (
        ("KURA_NODE_URL", (s.node_url,) if s.node_url else ()),
        ("KURA_PEERS", s.peers),
    ):
        for url in urls:
            if not url.startswith(scheme):
                problems.append(
                    f"{name} {url!r} must use {scheme[:-3]} "
                    f"({'peer TLS is on' if all(tls) else 'peer TLS is off'})"
                )
    for path in tls:
        if path is not None and not Path(path).is_file():
            problems.append(f"TLS file {path} does not exist")
    if not is_loopback(s.host) and not s.internal_tokens and not all(tls):
        problems.append(
            f"KURA_HOST {s.host!r} exposes the peer listener (/_internal/) beyond this machine "
            "without credentials: set KURA_INTERNAL_TOKENS (a shared secret, e.g. "
            "`openssl rand -hex 32`) or KURA_INTERNAL_TLS_CA_CERT_PATH, "
            "KURA_INTERNAL_TLS_CERT_PATH and KURA_INTERNAL_TLS_KEY_PATH, or bind 127.0.0.1"
        )
    return problems


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


def _auth_problems(s: Settings) -> list[str]:
    """Token files, JWT and public TLS settings that cannot work as given."""
    problems = []
    for path in (s.read_write_tokens_file, s.read_only_tokens_file):
        if path is not None and not path.is_file():
            problems.append(f"token file {path} does not exist")
    if s.auth_jwt_public_key and s.auth_jwt_jwks_url:
        problems.append("set KURA_AUTH_JWT_PUBLIC_KEY or KURA_AUTH_JWT_JWKS_URL, not both")
    key = s.auth_jwt_public_key
    if key and not key.lstrip().startswith("-----BEGIN") and not Path(key).is_file():
        problems.append(f"KURA_AUTH_JWT_PUBLIC_KEY: neither PEM text nor a file: {key}")
    if s.auth_jwt and not (s.auth_jwt_issuer and s.auth_jwt_audience):
        problems.append("JWT auth needs KURA_AUTH_JWT_ISSUER and KURA_AUTH_JWT_AUDIENCE")
    pair = (s.public_tls_cert_path, s.public_tls_key_path)
    if any(pair) and not all(pair):
        problems.append("KURA_PUBLIC_TLS_CERT_PATH and KURA_PUBLIC_TLS_KEY_PATH go together")
    for path in pair:
        if path is not None and not path.is_file():
            problems.append(f"TLS file {path} does not exist")
    return problems


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and addresses in 127.0.0.0/8 or ``::1``; False for anything else,
    including names that merely resolve to loopback (only the literal is trusted)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False
