"""The pure rules of the Remote Asset API (``build.bazel.remote.asset.v1``; served by
``kura.grpc.asset``): record keys and bodies, Subresource Integrity checksums and the origin
allow-list. No IO.

* **Key.** A record maps (kind, canonical URI, qualifiers without ``checksum.sri``, sorted by
  name) to a CAS digest; its artifact key is ``asset/<hex>``, the SHA-256 of that tuple's
  canonical JSON (``record_key``). ``checksum.sri`` is not part of the key: it is checked
  against the blob's bytes instead (remote_asset.proto: Fetch "MUST ensure Fetch'd content
  matches all the specified qualifiers"). The canonical URI of an ``http``/``https`` URI has its
  scheme and host lower-cased and its default port dropped; any other URI is taken as given.
* **Record.** The stored body: canonical JSON with the digest, the referenced blobs and
  directories, the push's ``expire_at`` (ms, or null) and the verified ``checksum.sri`` (or
  null). When it was stored is its manifest's ``created_at_ms``, which replicas keep. A
  *secret* qualifier's value (``http_header:*``, ``http_header_url:*``,
  ``bazel.auth_headers``: credentials Bazel 7+ passes for the origin) is never stored nor
  replicated: the body names the qualifier with a null value, and the value only enters the
  key's SHA-256. So do a URI's *userinfo* (``user:password@``) and *query* (``?token=…``):
  the body's ``uri`` is the URI without them (``stored_uri``), while the key hashes it whole.
  A download never sends userinfo (``credentials_in``: the request is INVALID_ARGUMENT, a
  redirect to one UNAVAILABLE): aiohttp would send it to the origin as Basic auth.
* **Honoured qualifiers.** A download from origin can make its bytes match ``checksum.sri``
  only; ``bazel.canonical_id`` (Bazel's cache discriminator) asks nothing of the bytes and is
  only part of the key. Any other qualifier (``resource_type``, ``vcs.*``, ``http_header:*``…)
  is one kura cannot ensure, so a miss that names one downloads nothing (``unsupported``;
  remote_asset.proto: servers "MUST ensure Fetch'd content matches all the specified
  qualifiers", pushed content aside).
* **SRI** (W3C Subresource Integrity, https://www.w3.org/TR/SRI/ §3.3): whitespace-separated
  ``alg-base64[?options]``; sha256, sha384 and sha512 are understood, others ignored (SRI:
  "unknown algorithms are ignored"); the strongest algorithm present decides, and content
  matches when it matches any of that algorithm's digests. None understood, or a digest of the
  wrong length: ``InvalidRequest``.
* **Origins.** ``KURA_ASSET_FETCH_ALLOWED_HOSTS`` entries: ``host`` (any port), ``host:port``,
  ``[v6]`` (any port), ``[v6]:port``, ``*.suffix`` (any subdomain) or ``*`` (any host). A host named by an entry
  without ``*`` and with its port is allowed *explicitly*: only then may it resolve to a
  non-global address. ``localhost`` or ``mirror.internal`` alone (any port) reaches global
  addresses only: else one entry would open every port of a private host to any read token,
  kura's own internal listener included, with the answer readable from the CAS.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from kura.core.errors import InvalidRequest

CHECKSUM_SRI = "checksum.sri"
# The qualifiers a download from origin satisfies (module docstring, "Honoured qualifiers").
HONOURED = frozenset({CHECKSUM_SRI, "bazel.canonical_id"})
SECRET_PREFIXES = ("http_header:", "http_header_url:")
SECRET_NAMES = frozenset({"bazel.auth_headers"})
MAX_URI_CHARS = 8192
MAX_QUALIFIERS = 64
# Digest lengths in bytes, weakest first: the order SRI's "strongest" follows.
SRI_ALGORITHMS = {"sha256": 32, "sha384": 48, "sha512": 64}
DEFAULT_PORTS = {"http": 80, "https": 443}

Digest = tuple[str, int]  # (lowercase hex SHA-256, size in bytes)


@dataclass(frozen=True)
class Sri:
    """A parsed ``checksum.sri``: ``algorithm`` (the strongest present) and its digests."""

    text: str
    algorithm: str
    digests: tuple[bytes, ...]

    def matches(self, digest: bytes) -> bool:
        """Whether ``digest`` (of ``algorithm``) is one of the expected ones."""
        return digest in self.digests

    def sha256_hex(self) -> tuple[str, ...]:
        """The expected SHA-256 digests (hex) when ``algorithm`` is sha256, else empty."""
        return tuple(d.hex() for d in self.digests) if self.algorithm == "sha256" else ()


def parse_sri(text: str) -> Sri:
    """``text`` as SRI metadata (module docstring); ``InvalidRequest`` when unusable."""
    found: dict[str, list[bytes]] = {}
    for token in text.split():
        alg, _, rest = token.partition("-")
        if alg not in SRI_ALGORITHMS:
            continue
        b64 = rest.split("?", 1)[0]
        try:
            raw = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequest(f"checksum.sri {token[:80]!r} is not valid base64") from None
        if len(raw) != SRI_ALGORITHMS[alg]:
            raise InvalidRequest(
                f"checksum.sri {token[:80]!r} is {len(raw)} bytes, not the "
                f"{SRI_ALGORITHMS[alg]} of {alg}"
            )
        found.setdefault(alg, []).append(raw)
    if not found:
        raise InvalidRequest(f"checksum.sri {text[:80]!r} names no sha256, sha384 or sha512 digest")
    strongest = max(found, key=lambda a: SRI_ALGORITHMS[a])
    return Sri(text, strongest, tuple(found[strongest]))


@dataclass(frozen=True)
class AssetQuery:
    """What a Fetch or Push names: the URIs, the qualifiers of the key (sorted (name, value)
    pairs, ``checksum.sri`` taken out) and the SRI when one was given."""

    uris: tuple[str, ...]
    qualifiers: tuple[tuple[str, str], ...]
    sri: Sri | None


def parse_query(uris: Sequence[str], qualifiers: Iterable[tuple[str, str]]) -> AssetQuery:
    """Check a request's URIs and qualifiers. ``InvalidRequest``: no URI (the proto: "Clients
    MUST supply at least one URI"), an empty or over-long URI, a qualifier named twice ("MUST be
    unique"), an unnamed one, too many, or an unusable ``checksum.sri``."""
    if not uris:
        raise InvalidRequest("the request names no URI: at least one is required")
    for uri in uris:
        if not uri or len(uri) > MAX_URI_CHARS or any(ord(c) < 0x20 for c in uri):
            raise InvalidRequest(
                f"URI {uri[:80]!r} must be 1-{MAX_URI_CHARS} characters with no control character"
            )
    pairs = list(qualifiers)
    if len(pairs) > MAX_QUALIFIERS:
        raise InvalidRequest(f"{len(pairs)} qualifiers: at most {MAX_QUALIFIERS} are taken")
    names = [n for n, _v in pairs]
    if "" in names:
        raise InvalidRequest("a qualifier has no name")
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise InvalidRequest(f"qualifier {dup[:80]!r} is given twice (names must be unique)")
    sri = None
    keyed = []
    for name, value in pairs:
        if name == CHECKSUM_SRI:
            sri = parse_sri(value)
        else:
            keyed.append((name, value))
    return AssetQuery(tuple(uris), tuple(sorted(keyed)), sri)


def unsupported(query: AssetQuery) -> list[str]:
    """The names of ``query``'s qualifiers a download cannot honour (not in ``HONOURED``)."""
    return [name for name, _value in query.qualifiers if name not in HONOURED]


def is_secret(name: str) -> bool:
    """Whether qualifier ``name`` carries a credential (module docstring, "Record")."""
    return name in SECRET_NAMES or name.startswith(SECRET_PREFIXES)


def canonical_uri(uri: str) -> str:
    """``uri`` with an http(s) scheme and host lower-cased and its default port dropped."""
    origin = origin_of(uri)
    if origin is None:
        return uri
    parts = urlsplit(uri)
    host = f"[{origin.host}]" if ":" in origin.host else origin.host
    netloc = host if origin.port == DEFAULT_PORTS[origin.scheme] else f"{host}:{origin.port}"
    if "@" in parts.netloc:
        netloc = parts.netloc.rsplit("@", 1)[0] + "@" + netloc
    return urlunsplit((origin.scheme, netloc, parts.path or "/", parts.query, parts.fragment))


def credentials_in(uri: str) -> bool:
    """Whether ``uri`` has a userinfo part (``user[:password]@`` before its host)."""
    return "@" in urlsplit(uri).netloc


def stored_uri(uri: str) -> str:
    """``uri`` as a record's body keeps it: without its userinfo and query (module docstring,
    "Record")."""
    parts = urlsplit(uri)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path, "", parts.fragment))


def record_key(kind: str, uri: str, qualifiers: tuple[tuple[str, str], ...]) -> str:
    """The artifact key of the record of ``kind`` (``blob`` or ``directory``) for ``uri`` and
    the (sorted) key qualifiers: ``asset/<64 hex digits>``."""
    material = json.dumps([kind, canonical_uri(uri), [list(q) for q in qualifiers]])
    return "asset/" + hashlib.sha256(material.encode()).hexdigest()


@dataclass(frozen=True)
class AssetRecord:
    """One stored association (module docstring). Digests are (hex, size)."""

    kind: str
    uri: str
    qualifiers: tuple[tuple[str, str], ...]
    digest: Digest
    references: tuple[Digest, ...] = ()
    expire_at_ms: int | None = None
    sri: str | None = None

    def encode(self) -> bytes:
        return json.dumps(
            {
                "v": 1,
                "kind": self.kind,
                "uri": stored_uri(self.uri),
                "qualifiers": [[n, None if is_secret(n) else v] for n, v in self.qualifiers],
                "digest": list(self.digest),
                "references": [list(d) for d in self.references],
                "expire_at_ms": self.expire_at_ms,
                "sri": self.sri,
            },
            separators=(",", ":"),
            sort_keys=True,
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> AssetRecord:
        """The record in ``data``; ``ValueError`` when it is not one (a damaged or foreign row:
        the caller treats it as a miss)."""
        raw = json.loads(data)
        if not isinstance(raw, dict) or raw.get("v") != 1:
            raise ValueError("not an asset record of version 1")
        digest = _digest(raw["digest"])
        return cls(
            kind=str(raw["kind"]),
            uri=str(raw["uri"]),
            qualifiers=tuple((str(n), "" if v is None else str(v)) for n, v in raw["qualifiers"]),
            digest=digest,
            references=tuple(_digest(d) for d in raw["references"]),
            expire_at_ms=None if raw["expire_at_ms"] is None else int(raw["expire_at_ms"]),
            sri=None if raw["sri"] is None else str(raw["sri"]),
        )


def _digest(value: object) -> Digest:
    if not (isinstance(value, list) and len(value) == 2):
        raise ValueError("a digest is [hex, size]")
    return str(value[0]), int(value[1])


@dataclass(frozen=True)
class Origin:
    """Where a URI is downloaded from: scheme, host (lower-case, IPv6 without brackets), port."""

    scheme: str
    host: str
    port: int


def origin_of(uri: str) -> Origin | None:
    """The origin of an ``http``/``https`` URI with a host, else None (not downloadable)."""
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    try:
        port = parts.port
    except ValueError:
        return None
    return Origin(scheme, parts.hostname.lower().rstrip("."), port or DEFAULT_PORTS[scheme])


@dataclass(frozen=True)
class AllowedHosts:
    """The parsed allow-list (module docstring); empty: downloads are off."""

    entries: tuple[tuple[str, int | None], ...] = ()

    @classmethod
    def parse(cls, items: Iterable[str]) -> AllowedHosts:
        """``ValueError`` names the first entry that is not ``host``, ``host:port``, ``[v6]``,
        ``[v6]:port``, ``*.suffix`` or ``*`` (an IPv6 address without brackets included)."""
        entries = []
        for item in items:
            text = item.strip().lower()
            host, port = text, None
            if text.startswith("["):
                close = text.find("]")
                if close < 0:
                    raise ValueError(f"{item!r}: an IPv6 address needs its closing ']'")
                host, rest = text[1:close], text[close + 1 :]
                if rest:
                    port = _port(item, rest.removeprefix(":") if rest.startswith(":") else "x")
            elif text.count(":") == 1:
                host, _, p = text.partition(":")
                port = _port(item, p)
            elif ":" in text:
                raise ValueError(
                    f"{item!r}: write an IPv6 address in brackets, [v6] (any port) or [v6]:port"
                )
            if not host or (host.startswith("*") and host != "*" and not host.startswith("*.")):
                raise ValueError(f"{item!r}: expected host, host:port, *.domain or *")
            entries.append((host.rstrip("."), port))
        return cls(tuple(entries))

    def __bool__(self) -> bool:
        return bool(self.entries)

    def match(self, origin: Origin) -> bool | None:
        """None: not allowed; True: allowed explicitly (named without ``*``, with its port);
        False: allowed by a wildcard or a host entry without a port only (then it must resolve
        to global addresses)."""
        verdict: bool | None = None
        for host, port in self.entries:
            if port is not None and port != origin.port:
                continue
            if host == origin.host and port is not None:
                return True
            if host in (origin.host, "*") or (
                host.startswith("*.") and origin.host.endswith(host[1:])
            ):
                verdict = False
        return verdict


def _port(item: str, text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"{item!r}: the port must be 1-65535")
    return int(text)
