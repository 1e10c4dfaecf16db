"""The value types of kura's settings and the rules between them (``kura.settings`` declares
the settings with these types).

Each type reads as its first argument to a type checker and names the parser of its text
(``kit.settings.option``); a parser raises ValueError with the problem, which ``load`` reports
with every other. ``validate_settings`` holds the rules that involve more than one setting.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeAlias

from kit.cpus import available_cpus
from kit.settings import (
    checked,
    parse_bytes,
    parse_non_empty,
    parse_positive_int,
    parse_seconds,
    split_list,
)
from kura.core.asset import AllowedHosts
from kura.core.errors import InvalidRequest
from kura.core.keys import NAMESPACE, validate
from kura.core.namespace_rule import NamespaceRules, parse_rules
from kura.core.object_layout import parse_url
from kura.storage.startup_work import MAX_WAIT_SECONDS

if TYPE_CHECKING:
    from kura.settings import Settings

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
MAX_INLINE_BYTES = 1 * MiB


def _prefix(text: str) -> str:
    text = "/" + text.strip().strip("/")
    if text == "/" or "//" in text or ".." in text:
        raise ValueError("must be a path such as /cache")
    return text


UrlPrefix: TypeAlias = Annotated[str, _prefix]


def _tokens(text: str) -> tuple[str, ...]:
    tokens = tuple(split_list(text))
    if text.strip() and not tokens:
        raise ValueError("no token in the list (an empty list would leave the node open)")
    for t in tokens:
        if any(c.isspace() for c in t):
            raise ValueError("tokens must not contain whitespace")
    return tokens


Tokens: TypeAlias = Annotated[tuple[str, ...], _tokens]


def _asset_hosts(text: str) -> tuple[str, ...]:
    hosts = tuple(split_list(text))
    AllowedHosts.parse(hosts)  # ValueError names the bad entry
    return hosts


AssetHosts: TypeAlias = Annotated[tuple[str, ...], _asset_hosts]


def _duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``30m`` or ``0``; must not be negative."""
    problem = "must be a duration of 0 or more, such as 0, 60s or 5m"
    return checked(parse_seconds(text), lambda seconds: seconds >= 0, problem)


Seconds: TypeAlias = Annotated[float, _duration]


def _positive_duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``30m``, ``6h`` or ``1h30m``; must be above 0."""
    problem = "must be a duration above 0, such as 90s, 30m or 6h"
    return checked(parse_seconds(text), lambda seconds: seconds > 0, problem)


PositiveSeconds: TypeAlias = Annotated[float, _positive_duration]


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


Age: TypeAlias = Annotated[float, _max_age]


def parse_namespace_rules(text: str) -> NamespaceRules:
    """``main:max_age=30d,min_age=1d;pr-*:max_age=2d,quota=10GiB`` (``core.namespace_rule``):
    ages as ``KURA_MAX_AGE`` reads them, quotas as the byte settings do."""
    return parse_rules(text, _max_age, parse_bytes)


NamespaceRulesSetting: TypeAlias = Annotated[NamespaceRules, parse_namespace_rules]


def _percent(text: str) -> int:
    problem = "must be a whole percentage from 1 to 100"
    try:
        return checked(int(text), lambda value: 1 <= value <= 100, problem)
    except ValueError:
        raise ValueError(problem) from None


Percent: TypeAlias = Annotated[int, _percent]


def _startup_wait(text: str) -> int:
    problem = f"must be a whole number of seconds from 0 to {MAX_WAIT_SECONDS}"
    try:
        return checked(int(text), lambda value: 0 <= value <= MAX_WAIT_SECONDS, problem)
    except ValueError:
        raise ValueError(problem) from None


# How long a request may wait for start-up's background work (storage.startup_work): no single
# wait is longer than MAX_WAIT_SECONDS (a request that reads, then writes, waits at most twice).
StartupWaitSeconds: TypeAlias = Annotated[int, _startup_wait]


def _object_store_url(text: str) -> str:
    """``s3://bucket/prefix`` or empty (the tier off)."""
    if not text.strip():
        return ""
    parse_url(text)
    return text.strip().rstrip("/")


ObjectStoreUrl: TypeAlias = Annotated[str, _object_store_url]


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


Workers: TypeAlias = Annotated[int, parse_workers]


def _tenant(text: str) -> str:
    text = parse_non_empty(text)
    try:
        validate(text, NAMESPACE, "tenant id")
    except InvalidRequest as exc:
        # Parsers report problems as ValueError so ``load`` lists them with the others.
        raise ValueError(exc.message) from None
    return text


Tenant: TypeAlias = Annotated[str, _tenant]


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


def _auth_problems(s: Settings) -> list[str]:
    """Token files, JWT and public TLS settings that cannot work as given."""
    problems = []
    for path in (s.read_write_tokens_file, s.read_only_tokens_file, s.tokens_file):
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
