"""Bearer-token access control.

Every route and RPC needs one right (``Access``, ``kura.core.rights``: ``read``, ``write:cas``,
``write``, ``clean``); a credential grants a set of them. With no credentials configured the
node is open (the zero-configuration default). Credentials are accepted as
``Authorization: Bearer <token>`` (Nx, Turborepo, ccache, sccache) or as the password of HTTP
Basic auth (Gradle sends Basic preemptively; sccache can use a username and password).

Rules (clients.md): no credentials → 401; unknown token → 401; a credential without the right a
route needs → 403, the message naming the right, which Nx treats as "read-only, skip the
upload" rather than an error.

Plain tokens come from ``KURA_READ_WRITE_TOKENS`` (rights ``read write clean``) and
``KURA_READ_ONLY_TOKENS`` (``read``), from the token files ``KURA_READ_WRITE_TOKENS_FILE``/
``KURA_READ_ONLY_TOKENS_FILE`` (the same rights), and from the credentials file
``KURA_TOKENS_FILE`` (each token with the rights its line names). The files are re-read on
change (``kura.api.token_file``) by ``TokenAuth.run`` in every process of the node (see
``share``). A token is listed in one place only: one in two sources (the two lists, the files)
is refused at start, and a re-read that would list one twice is a failed re-read (the last
good set kept), so narrowing a token's rights in one place cannot leave it wider in another;
a refused request is logged once per (writer, right, reason) with the credential's identity
(``kura.core.provenance``: ``token:NAME``, ``token:#fingerprint``, ``jwt:SUB``), never its
token (``TokenAuth.log_refusal``), and the same identity is the writer a request's writes
record (``NamespaceView.writer``). A bearer
token that is not a listed plain token but has the JWT shape goes to the ``JwtVerifier`` when
one is configured (``kura.api.jwt_auth``: its ``scope`` names the rights): a bad token → 401;
a grant without the right asked for, or for another namespace → 403.

A credential (a credentials-file line's ``read=``/``write=``, a JWT's ``read_namespaces``/
``write_namespace``) may carry an overlay: ``view`` resolves it, with the right, into what the
request reads and writes (``kura.core.overlay``), once, for every HTTP route (``kura.api.http.
endpoint``, ``kura.api.expect``) and every RPC (``kura.grpc.common.GrpcContext.authorize``).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from kit.backoff import every
from kit.log_limit import LogLimit
from kura.api.token_file import STAT_INTERVAL_SECONDS, Credential, TokenFile
from kura.core.errors import Forbidden, Unauthenticated
from kura.core.overlay import Asked, NamespaceView, Overlay, view_of
from kura.core.provenance import ANONYMOUS
from kura.core.rights import READ_ONLY, READ_WRITE, Rights
from kura.core.rights import Access as Access  # the routes declare their right from here
from kura.settings import Settings
from kura.storage.hot_generation import SharedGeneration

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # PyJWT and cryptography cost each process ~10 MiB: loaded only with JWT on
    from kura.api.jwt_auth import JwtVerifier

TOKEN_GENERATION = ".kura.token-generation"  # in the data dir, with KURA_WORKERS > 1
# Refusals remembered as logged (``TokenAuth.log_refusal``): a bound on memory, since a
# reason may name a namespace the client chose.
REFUSALS_REMEMBERED = 4096

# The request's namespace for a namespace-limited grant: None = the route has none.
NamespaceOf = Callable[[], str | None]


class TokenAuth:
    """Checks a request's ``Authorization`` header against configured credentials:
    ``read_write`` and ``read_only`` tokens, the credentials of ``files`` (token files and the
    credentials file, ``kura.api.token_file``) and JWTs (``jwt``)."""

    def __init__(
        self,
        read_write: tuple[str, ...],
        read_only: tuple[str, ...],
        *,
        files: Sequence[TokenFile] = (),
        jwt: JwtVerifier | None = None,
    ) -> None:
        self._lists = (
            ("KURA_READ_WRITE_TOKENS", tuple(Credential(t, READ_WRITE) for t in read_write)),
            ("KURA_READ_ONLY_TOKENS", tuple(Credential(t, READ_ONLY) for t in read_only)),
        )
        self._listed = self._lists[0][1] + self._lists[1][1]
        self._files = tuple(files)
        _refuse_overlap([*self._lists, *((str(f.path), f.credentials()) for f in self._files)])
        self._refusals_logged: set[tuple[str, Access, str]] = set()
        self._refusal_log = LogLimit(lines=10, interval_seconds=60.0)
        self.jwt = jwt
        self.enabled = bool(self._listed or self._files or jwt is not None)
        self.refusals_total = dict.fromkeys(("missing", "invalid", "forbidden"), 0)
        self._shared: SharedGeneration | None = None
        self._follow = False
        self._seen = 0  # the shared counter's value last caught up with (a follower)

    @property
    def token_file_reloads_total(self) -> int:
        return sum(f.reloads_total for f in self._files)

    @property
    def token_file_failing(self) -> int:
        """1 while a token file's last re-read failed (its last good set still in use)."""
        return int(any(f.failing for f in self._files))

    def warnings(self) -> list[str]:
        """A /ready warning per token file whose last re-read failed, naming the file."""
        return [
            f"token file {f.path}: the last re-read failed, its previous tokens are in use"
            for f in self._files
            if f.failing
        ]

    def _check_file(self, changed: TokenFile, credentials: tuple[Credential, ...]) -> None:
        """Refuse (``ValueError``) a re-read of ``changed`` that would list a token that
        another source lists too."""
        _refuse_overlap(
            [
                *self._lists,
                *(
                    (str(f.path), credentials if f is changed else f.credentials())
                    for f in self._files
                ),
            ]
        )

    def share(self, shared: SharedGeneration, *, follow: bool) -> None:
        """Follow the token files as one node with the other processes (``kura.workers``).
        The primary (``follow=False``) bumps ``shared`` right after it takes in a change; a
        worker (``follow=True``) re-reads its files, before its next check, once the counter
        moved, and looks at them only then. So a process refuses a removed token (or accepts
        an added one) only once the primary does, and every process does from then on; a
        worker can be ahead only when the file changed again since the primary last looked
        (for at most ``STAT_INTERVAL_SECONDS``)."""
        self._shared, self._follow, self._seen = shared, follow, shared.value
        if follow:  # a change the primary took in while this process was reading the files
            self._catch_up()

    async def run(self) -> None:
        """Every ``STAT_INTERVAL_SECONDS`` until cancelled, re-read changed token files (a
        worker: catch up with the primary, ``share``). Every process of the node runs it; it
        returns at once without token files."""
        if not self._files:
            return

        async def refresh() -> None:
            self.refresh()

        await every(refresh, STAT_INTERVAL_SECONDS, what="token file check", log=log)

    def refresh(self) -> None:
        """One look at the token files (``run``); never raises."""
        if self._follow:
            self._catch_up()
            return
        changed = [
            f.reload_if_changed(self._check_file) for f in self._files
        ]  # each file, not just the first
        if any(changed) and self._shared is not None:
            self._shared.bump()

    def _catch_up(self) -> None:
        assert self._shared is not None
        value = self._shared.value  # before the files: a bump while reading is seen next time
        if value == self._seen:
            return
        for f in self._files:
            f.reload_if_changed(self._check_file)
        if not any(f.failing for f in self._files):  # else: tried again on the next check
            self._seen = value

    def check(
        self, authorization: str | None, access: Access, namespace: NamespaceOf | None = None
    ) -> None:
        """Return if allowed; raise ``Unauthenticated`` (401) or ``Forbidden`` (403), counted
        in ``refusals_total`` by reason (missing, invalid, forbidden). ``namespace`` is asked
        only for a namespace-limited JWT grant. For a route that touches a namespace, ``view``."""
        if not self.enabled:
            return
        if self._follow:
            self._catch_up()  # one read of shared memory when nothing changed
        try:
            self._check(authorization, access, namespace, log_refusal=True)
        except (Unauthenticated, Forbidden) as exc:
            self._count(exc, authorization)
            raise

    def view(
        self, authorization: str | None, access: Access, asked: Callable[[], Asked]
    ) -> NamespaceView | None:
        """``check``, then what the request reads and writes (``kura.core.overlay.view_of``,
        through the credential's overlay if it has one) and who it is (``NamespaceView.writer``,
        ``kura.core.provenance``: ``anonymous`` with access control off); None when it touches
        no namespace. ``asked`` is called once, after the rights check (it may raise its route's
        own ``KuraError``). A refusal of the overlay's rules is a ``Forbidden`` counted and
        logged as one."""
        if not self.enabled:
            return view_of(None, asked(), access, ANONYMOUS)
        if self._follow:
            self._catch_up()
        once: Asked | None = None

        def named() -> str | None:  # a JWT limited to namespaces asks first
            nonlocal once
            once = asked()
            return once.namespace

        try:
            overlay, writer = self._check(authorization, access, named, log_refusal=True)
            try:
                return view_of(overlay, asked() if once is None else once, access, writer)
            except Forbidden as exc:
                self.log_refusal(writer, access, exc.message)
                raise
        except (Unauthenticated, Forbidden) as exc:
            self._count(exc, authorization)
            raise

    def _count(self, refusal: Unauthenticated | Forbidden, authorization: str | None) -> None:
        """Count ``refusal`` in ``refusals_total`` by reason."""
        if isinstance(refusal, Forbidden):
            self.refusals_total["forbidden"] += 1
        else:
            self.refusals_total["missing" if _token_from(authorization) is None else "invalid"] += 1

    def allows(
        self, authorization: str | None, access: Access, namespace: NamespaceOf | None = None
    ) -> bool:
        """Whether ``check`` would pass, asked to describe the caller (REAPI capabilities: a
        read-only token is told ``update_enabled: false``), not to guard a call: a ``False``
        is not counted in ``refusals_total``."""
        if not self.enabled:
            return True
        if self._follow:
            self._catch_up()
        try:
            self._check(authorization, access, namespace, log_refusal=False)
        except (Unauthenticated, Forbidden):
            return False
        return True

    def _check(
        self,
        authorization: str | None,
        access: Access,
        namespace: NamespaceOf | None,
        *,
        log_refusal: bool,
    ) -> tuple[Overlay | None, str]:
        """Raise unless allowed (a ``Forbidden`` logged when ``log_refusal``: not for
        ``allows``, describing a caller refuses nothing); the credential's overlay (None: none)
        and its writer identity (``kura.core.provenance``)."""
        token = _token_from(authorization)
        if token is None:
            raise Unauthenticated("missing credentials: send Authorization: Bearer <token>")
        credential = self._listing_of(token)
        if credential is not None:
            if access not in credential.rights:
                reason = _lacking(access, credential.rights)
                raise self._refused(credential.writer, access, reason, log_refusal)
            return credential.overlay, credential.writer
        if self.jwt is not None and self.jwt.looks_like_jwt(token):
            grant = self.jwt.verify(token)
            if access not in grant.rights:
                reason = f"{_lacking(access, grant.rights)} ({grant.scopes_granting(access)})"
                raise self._refused(grant.writer, access, reason, log_refusal)
            if grant.namespaces is not None and namespace is not None:
                wanted = namespace()
                if wanted is not None and wanted not in grant.namespaces:
                    reason = f"this token is not valid for namespace {wanted!r}"
                    raise self._refused(grant.writer, access, reason, log_refusal)
            return grant.overlay, grant.writer
        raise Unauthenticated("invalid token")

    def _refused(self, writer: str, access: Access, reason: str, log_refusal: bool) -> Forbidden:
        """The ``Forbidden`` of ``reason``, logged (``log_refusal``) by ``log_refusal``."""
        if log_refusal:
            self.log_refusal(writer, access, reason)
        return Forbidden(reason)

    def _listing_of(self, token: str) -> Credential | None:
        """The listed credential of ``token`` (a token is listed once, ``_refuse_overlap``),
        None when it is not listed. Compared with every listed token, in constant time each."""
        found: Credential | None = None
        # surrogateescape: a header with non-UTF-8 bytes compares unequal instead of raising.
        presented = token.encode("utf-8", "surrogateescape")
        for credential in self._credentials():
            if hmac.compare_digest(presented, credential.token.encode("utf-8", "surrogateescape")):
                found = credential
        return found

    def writable(self, view: NamespaceView, access: Access, refusal: str | None = None) -> str:
        """The namespace ``view`` writes, for a request whose right let it through and which
        stores (an HTTP route's ``write_ref``; SplitBlob's chunks, a verified download over
        gRPC); else ``Forbidden`` (its message ``refusal`` when given), logged as a refusal of
        ``access`` (``log_refusal``) like every other."""
        try:
            return view.writable
        except Forbidden as exc:
            refused = exc if refusal is None else Forbidden(refusal)
            self.log_refusal(view.writer, access, refused.message)
            raise refused from None

    def log_refusal(self, writer: str, access: Access, reason: str) -> None:
        """Log a refusal (issue 29 item 4: every refused write, and every other refusal of a
        credential this node believes) as one WARNING line naming ``writer`` (the credential's
        identity, ``kura.core.provenance``: its name, ``sub`` or fingerprint, never its token),
        the right asked for and ``reason`` (a ``Forbidden``'s message, which names no token).
        Each (writer, right, reason) is logged once per process (``REFUSALS_REMEMBERED`` of
        them at most, then forgotten all at once), and all of them within a ``LogLimit``: a
        client can cause refusals at will. Every refusal is counted in ``refusals_total``
        whether logged or not. Call it for a refusal decided outside this class too."""
        seen = (writer, access, reason)
        if seen in self._refusals_logged:
            return
        left_out = self._refusal_log.admit()
        if left_out is None:
            return
        if len(self._refusals_logged) >= REFUSALS_REMEMBERED:
            self._refusals_logged.clear()
        self._refusals_logged.add(seen)
        log.warning(
            "refused: writer %r, asking for %r: %s (logged once per writer, right and reason; "
            "%d refusal lines left out before this one)",
            writer,
            access.value,
            reason,
            left_out,
        )

    def _credentials(self) -> tuple[Credential, ...]:
        if not self._files:
            return self._listed
        return self._listed + tuple(c for f in self._files for c in f.credentials())


def _refuse_overlap(sources: Sequence[tuple[str, tuple[Credential, ...]]]) -> None:
    """``ValueError`` naming where (source and line, never the token) for a token that two
    sources list: its rights would be the union, so narrowing it in one place would not."""
    where: dict[str, str] = {}
    for label, credentials in sources:
        here: dict[str, str] = {}
        for c in credentials:
            here.setdefault(c.token, f"{label} line {c.line}" if c.line else label)
        for token, place in here.items():
            if token in where:
                raise ValueError(
                    f"{place}: this token is also listed in {where[token]}; list each token "
                    "in one place only"
                )
            where[token] = place


def _lacking(access: Access, rights: Rights) -> str:
    """A refusal's message: the right missing (the read-only wording Nx users know)."""
    if rights == READ_ONLY:
        return f"this token is read-only: it lacks the right {access.value!r}"
    return f"this token lacks the right {access.value!r}"


def _token_from(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer" and value:
        return value
    if scheme.lower() == "basic" and value:
        try:
            decoded = base64.b64decode(value, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
        _user, sep, password = decoded.partition(":")
        return password if sep and password else None
    return None


def token_auth_from(settings: Settings) -> TokenAuth:
    """The node's ``TokenAuth``: listed tokens, token files and JWT verification as configured.
    Raises ``RuntimeError`` naming the setting for a token file or public key that cannot be
    read or parsed (the CLI prints it and exits 1)."""
    verifier = None
    if settings.auth_jwt:
        from kura.api.jwt_auth import JwtVerifier, load_public_key

        # validate_settings requires both with a key.
        assert settings.auth_jwt_issuer is not None
        assert settings.auth_jwt_audience is not None
        key = settings.auth_jwt_public_key
        try:
            public_key = load_public_key(key) if key else None
        except (OSError, ValueError) as exc:
            raise RuntimeError(f"KURA_AUTH_JWT_PUBLIC_KEY: not a usable public key: {exc}") from exc
        verifier = JwtVerifier(
            issuer=settings.auth_jwt_issuer,
            audience=settings.auth_jwt_audience,
            public_key=public_key,
            jwks_url=settings.auth_jwt_jwks_url,
            jwks_refresh_seconds=settings.auth_jwt_jwks_refresh_seconds,
        )
    files = []
    for name, path, rights in (
        ("KURA_READ_WRITE_TOKENS_FILE", settings.read_write_tokens_file, READ_WRITE),
        ("KURA_READ_ONLY_TOKENS_FILE", settings.read_only_tokens_file, READ_ONLY),
        ("KURA_TOKENS_FILE", settings.tokens_file, None),
    ):
        try:
            files += [TokenFile(path, rights)] if path else []
        except (OSError, ValueError) as exc:
            raise RuntimeError(f"{name} {path}: {exc}") from exc
    try:
        return TokenAuth(
            settings.read_write_tokens, settings.read_only_tokens, files=files, jwt=verifier
        )
    except ValueError as exc:
        raise RuntimeError(f"token sources overlap: {exc}") from exc
