"""The rules under token auth, without a server: token-file parsing, re-reading and how a
worker follows the primary's re-reads, the JWT grant claims, the key-type/algorithm fit, and
which namespace each protocol's request touches. The end-to-end behaviour is in tests/integration/test_jwt_auth.py
and test_token_files.py."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from aiohttp.test_utils import make_mocked_request
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from kura.api.auth import TOKEN_GENERATION, Access, TokenAuth
from kura.api.grant_scope import request_namespace
from kura.api.jwt_auth import Grant, algorithms_for, grant_from, looks_like_jwt
from kura.api.token_file import TokenFile, parse_credentials
from kura.core.errors import Forbidden, InvalidRequest, Unauthenticated
from kura.core.overlay import Asked, NamespaceView, Overlay, view_of
from kura.core.rights import READ_ONLY, READ_WRITE
from kura.storage.hot_generation import SharedGeneration

R, C, W, WC = Access.READ, Access.CLEAN, Access.WRITE, Access.WRITE_CAS


def tokens(text: str) -> tuple[str, ...]:
    return tuple(c.token for c in parse_credentials(text, READ_ONLY))


def test_token_files_skip_comments_blank_lines_and_surrounding_space() -> None:
    assert tokens("# c\n\n  a  \n#b\nc\n") == ("a", "c")
    assert tokens("") == ()
    with pytest.raises(ValueError, match="line 2"):
        tokens("ok\nnot ok\n")
    with pytest.raises(ValueError, match="line 1"):  # a token file takes no fields
        tokens("tok rights=read\n")


def test_credentials_file_lines_give_each_token_its_rights_and_name() -> None:
    text = (
        "# pull requests\n"
        "pr-tok-0123456789 rights=read,write:cas name=pr-builds\n"
        "\tmain-tok-0123456789   name=main.ci_1   rights=read,write,clean  \n"
        "writer-0123456789 rights=write\n"  # write implies write:cas, and not read
        "cleaner-0123456789 rights=clean\n"
        "YWJjZGVmZ2hpamtsbW5v== rights=read\n"  # a base64 token may end in '='
        "pr-tok-0123456789 name=pr-builds rights=write:cas,read\n"  # the same: one credential
    )
    got = {c.token: (c.rights, c.name) for c in parse_credentials(text)}
    assert got == {
        "pr-tok-0123456789": (frozenset({R, WC}), "pr-builds"),
        "main-tok-0123456789": (READ_WRITE, "main.ci_1"),
        "writer-0123456789": (frozenset({W, WC}), None),
        "cleaner-0123456789": (frozenset({C}), None),
        "YWJjZGVmZ2hpamtsbW5v==": (frozenset({R}), None),
    }
    assert parse_credentials("# none yet\n\n") == ()


SECRET = "secret-0123456789"  # long enough: the refusals below are for something else
LEAKY = "c2VjcmV0LXRva2VuLXZhbHVl=="  # base64, '=' padded: it must not leak as a "key"
OVERLAY = "line 1: keys 'read' and 'write':"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"ok-token-0123456789 rights=read\n{SECRET}\n", "line 2: key 'rights' is required"),
        ("S name=ci\n", "line 1: key 'rights' is required"),
        ("S rights=\n", "line 1: key 'rights': no rights given"),
        ("S rights=read,admin\n", "line 1: key 'rights': unknown right 'admin'"),
        ("S rights=read,,write\n", "line 1: key 'rights': unknown right (known"),
        (f"S rights=read,{SECRET}\n", "line 1: key 'rights': unknown right (known"),
        ("S rights=read read=main write=pr-1\n", f"{OVERLAY} the write namespace must be one"),
        (f"S rights=write write={SECRET}/x\n", f"{OVERLAY} a namespace is 0-128 characters"),
        (f"S rights=read read=main,{SECRET}/x\n", f"{OVERLAY} a namespace is 0-128 characters"),
        ("S rights=read read=main,,pr\n", f"{OVERLAY} an overlay names no empty namespace"),
        ("S rights=read read=main,pr,main\n", f"{OVERLAY} a namespace is listed twice"),
        ("S rights=read read=a read=b\n", "line 1: key 'read' given twice"),
        (f"S rights=read {LEAKY}\n", "line 1: field 3: unknown key (known"),
        (f"name=pr rights=read {LEAKY}\n", "line 1: the token is missing"),
        ("rights=read,write\n", "line 1: the token is missing"),
        ("short rights=read\n", "line 1: the token is shorter than 16 characters"),
        ("S rights=read rights=write\n", "line 1: key 'rights' given twice"),
        ("S rights=read name=a/b\n", "line 1: key 'name': a name is letters"),
        ("S rights=read name=\n", "line 1: key 'name': a name is letters"),
        ("S rights=read secret2\n", "line 1: field 3 is not key=value"),
        ("S =read\n", "line 1: field 2 is not key=value"),
        (
            "S rights=read\nb-token-0123456789 rights=read\nS rights=read,write\n",
            "line 3: the token of line 1 again, with other rights, name or namespaces",
        ),
        ("S rights=read name=a\nS rights=read name=b\n", "line 2: the token of line 1 again"),
    ],
)
def test_a_bad_credentials_line_is_refused_naming_the_line_never_the_token(
    text: str, message: str
) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message)) as info:
        parse_credentials(text.replace("S ", SECRET + " "))
    assert "secret" not in str(info.value)
    assert "c2VjcmV0" not in str(info.value)  # no part of LEAKY either


@pytest.mark.parametrize(
    ("fields", "reads", "write"),
    [
        ("read=pr-123,main write=pr-123", ("pr-123", "main"), "pr-123"),
        ("write=main", ("main",), "main"),
        ("read=main", ("main",), None),
        ("read=org~team,main write=main", ("org~team", "main"), "main"),
    ],
)
def test_a_credentials_line_carries_its_overlay_in_order(
    fields: str, reads: tuple[str, ...], write: str | None
) -> None:
    (credential,) = parse_credentials(f"{SECRET} rights=read,write {fields}\n")
    assert credential.overlay == Overlay(reads, write)
    (plain,) = parse_credentials(f"{SECRET} rights=read\n")
    assert plain.overlay is None


def test_a_credentials_repr_never_shows_its_token() -> None:
    (credential,) = parse_credentials(f"{SECRET} name=ci rights=read\n")
    assert SECRET not in repr(credential)
    assert "ci" in repr(credential)


def test_two_tokens_sharing_a_name_are_warned_about_naming_the_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "credentials"
    path.write_text(f"{SECRET}-a name=ci rights=read\n{SECRET}-b name=ci rights=write\n")
    TokenFile(path)
    assert "line 2: name 'ci' is also the name of line 1's token" in caplog.text
    assert SECRET not in caplog.text


def test_a_credential_passes_for_its_rights_only_and_the_refusal_names_the_right_missing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "credentials"
    path.write_text(f"cas-{SECRET} name=pr rights=read,write:cas\nw-{SECRET} rights=write\n")
    auth = TokenAuth(("rw",), ("ro",), files=[TokenFile(path)])
    for token, granted in (
        ("rw", {R, WC, W, C}),  # KURA_READ_WRITE_TOKENS: read write clean, as before
        ("ro", {R}),
        (f"cas-{SECRET}", {R, WC}),
        (f"w-{SECRET}", {WC, W}),
    ):
        for access in Access:
            assert auth.allows(f"Bearer {token}", access) is (access in granted), (token, access)
    assert "refused" not in caplog.text  # allows() describes a caller, it refuses nothing
    with pytest.raises(Forbidden, match=r"lacks the right 'write'$"):
        auth.check(f"Bearer cas-{SECRET}", Access.WRITE)
    with pytest.raises(Forbidden, match="read-only: it lacks the right 'clean'"):
        auth.check("Bearer ro", Access.CLEAN)
    assert auth.refusals_total["forbidden"] == 2
    for _ in range(3):  # a refusal is logged by name, once per credential and right
        with pytest.raises(Forbidden):
            auth.check(f"Bearer cas-{SECRET}", Access.WRITE)
    assert (
        caplog.text.count("refused: writer 'token:pr', asking for 'write': this token lacks") == 1
    )
    assert SECRET not in caplog.text


def test_a_token_listed_in_two_sources_is_refused_at_start_naming_where(tmp_path: Path) -> None:
    """Its rights would be the union: narrowing it in one place would leave it wide in the
    other (a PR token narrowed in KURA_TOKENS_FILE but still in KURA_READ_WRITE_TOKENS)."""
    narrowed = tmp_path / "credentials"
    narrowed.write_text(f"# PRs\n{SECRET} name=pr rights=read\n")
    other = tmp_path / "ro"
    other.write_text(f"{SECRET}\n")
    with pytest.raises(ValueError, match=r"^KURA_READ_ONLY_TOKENS: .* also listed in KURA_READ_WR"):
        TokenAuth((SECRET,), (SECRET,))
    with pytest.raises(ValueError, match=f"^{re.escape(str(narrowed))} line 2: .* KURA_READ_WRITE"):
        TokenAuth((SECRET,), (), files=[TokenFile(narrowed)])
    with pytest.raises(
        ValueError, match=f"line 2: .* also listed in {re.escape(str(other))} line 1"
    ):
        TokenAuth((), (), files=[TokenFile(other, READ_ONLY), TokenFile(narrowed)])
    TokenAuth((SECRET, SECRET), (), files=[])  # twice in one list: one source, no overlap


def test_a_re_read_that_lists_a_token_twice_keeps_the_last_good_set(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "credentials"
    path.write_text(f"pr-{SECRET} name=pr rights=read\n")
    auth = TokenAuth((f"rw-{SECRET}",), (), files=[TokenFile(path)])
    path.write_text(f"pr-{SECRET} name=pr rights=read\nrw-{SECRET} rights=read\n")
    os.utime(path, ns=(1, 1))
    auth.refresh()
    assert auth.allows(f"Bearer rw-{SECRET}", Access.CLEAN)  # not narrowed, not widened
    assert auth.token_file_failing == 1
    assert auth.warnings() == [
        f"token file {path}: the last re-read failed, its previous tokens are in use"
    ]
    assert f"{path} line 2: this token is also listed in KURA_READ_WRITE_TOKENS" in caplog.text
    assert SECRET not in caplog.text
    path.write_text(f"pr-{SECRET} name=pr rights=read,write\n")
    os.utime(path, ns=(2, 2))
    auth.refresh()
    assert auth.allows(f"Bearer pr-{SECRET}", Access.WRITE)
    assert auth.token_file_failing == 0
    assert auth.warnings() == []


def test_a_re_read_of_a_file_without_its_final_newline_is_a_failed_read(tmp_path: Path) -> None:
    """A rewrite in place read half-way: ``rights=read,write:cas`` cut to ``rights=read,write``
    would widen the rights; it is retried on the next look, taken once whole."""
    path = tmp_path / "credentials"
    path.write_text("pr-tok-0123456789 rights=read\n")
    f = TokenFile(path)
    path.write_text("pr-tok-0123456789 rights=read,write")  # ...:cas\n not written yet
    os.utime(path, ns=(1, 1))
    assert not f.reload_if_changed()
    assert f.failing
    assert next(iter(f.credentials())).rights == {R}
    path.write_text("pr-tok-0123456789 rights=read,write:cas\n")
    os.utime(path, ns=(2, 2))
    assert f.reload_if_changed()
    assert next(iter(f.credentials())).rights == {R, WC}
    assert not f.failing


def test_a_token_file_is_re_read_only_when_it_changed(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("one\n")
    f = TokenFile(path, READ_WRITE)
    assert not f.reload_if_changed()
    path.write_text("two\n")
    os.utime(path, ns=(1, 1))  # a changed mtime even on a coarse clock
    assert [c.token for c in f.credentials()] == ["one"]  # a request never looks at the file
    assert f.reload_if_changed()
    assert [c.token for c in f.credentials()] == ["two"]
    assert f.reloads_total == 1
    path.unlink()
    assert not f.reload_if_changed()
    assert [c.token for c in f.credentials()] == ["two"]  # a failed re-read keeps the last set
    assert f.failing


def allowed(auth: TokenAuth, token: str) -> bool:
    try:
        auth.check(f"Bearer {token}", Access.READ)
    except Unauthenticated:
        return False
    return True


def test_a_worker_takes_in_a_token_file_change_only_once_the_primary_has(tmp_path: Path) -> None:
    """Two processes' TokenAuth over one file and one shared counter (a real MAP_SHARED
    mapping, as kura.workers uses): the follower changes its mind exactly when the primary
    does, not when it could have seen the file first."""
    path = tmp_path / "tokens"
    path.write_text("old\n")
    primary = TokenAuth((), (), files=[TokenFile(path, READ_WRITE)])
    primary.share(SharedGeneration.create(tmp_path, TOKEN_GENERATION), follow=False)
    worker = TokenAuth((), (), files=[TokenFile(path, READ_WRITE)])
    worker.share(SharedGeneration.open(tmp_path, TOKEN_GENERATION), follow=True)
    path.with_suffix(".new").write_text("new\n")
    os.replace(path.with_suffix(".new"), path)
    assert allowed(worker, "old")  # the file changed, the primary has not looked yet
    assert not allowed(worker, "new")
    primary.refresh()
    assert not allowed(primary, "old")
    assert allowed(worker, "new")  # the very next check, no look of its own needed
    assert not allowed(worker, "old")
    assert primary.token_file_reloads_total == worker.token_file_reloads_total == 1
    worker.refresh()  # nothing moved: nothing re-read
    assert worker.token_file_reloads_total == 1


@pytest.mark.parametrize(
    ("claims", "grant"),
    [
        ({"scope": "cache:read"}, Grant(frozenset({R}), None)),
        ({"scope": "openid cache:write"}, Grant(frozenset({R, W, WC, C}), None)),
        ({"scope": "cache:write:cas"}, Grant(frozenset({R, WC}), None)),
        ({"scope": "cache:clean"}, Grant(frozenset({C}), None)),
        ({"scope": "cache:write:cas cache:clean"}, Grant(frozenset({R, WC, C}), None)),
        ({"scope": "cache:cas cache:admin"}, Grant(frozenset(), None)),  # unknown: ignored
        ({}, Grant(frozenset(), None)),
        ({"scope": "cache:read", "namespaces": ["a", "b"]}, Grant(frozenset({R}), frozenset("ab"))),
        ({"scope": "cache:read", "namespaces": []}, Grant(frozenset({R}), frozenset())),
    ],
)
def test_grants_come_from_scope_and_namespaces(claims: dict[str, object], grant: Grant) -> None:
    assert grant_from(claims) == grant


@pytest.mark.parametrize(
    "claims", [{"scope": ["cache:read"]}, {"scope": "cache:read", "namespaces": "a"}]
)
def test_a_malformed_grant_claim_is_refused(claims: dict[str, object]) -> None:
    with pytest.raises(Unauthenticated):
        grant_from(claims)


def test_each_key_type_verifies_only_its_algorithms() -> None:
    assert algorithms_for(rsa.generate_private_key(65537, 2048).public_key()) == {
        "RS256", "RS384", "RS512", "PS256", "PS384", "PS512"
    }  # fmt: skip
    assert algorithms_for(ec.generate_private_key(ec.SECP384R1()).public_key()) == {"ES384"}
    assert algorithms_for(ed25519.Ed25519PrivateKey.generate().public_key()) == {"EdDSA"}
    assert algorithms_for(b"a shared secret") == frozenset()


def test_only_the_jws_compact_shape_goes_to_jwt_verification() -> None:
    assert looks_like_jwt("eyJhbGciOiJub25lIn0.e30.")
    assert not looks_like_jwt("plain-token")
    assert not looks_like_jwt("a.b.c")  # three parts, but no JSON header


@pytest.mark.parametrize(
    ("protocol", "query", "namespace"),
    [
        ("turbo", "slug=team1", "team1"),
        ("turbo", "teamId=t2&slug=x", "t2"),
        ("turbo", "", None),  # /v8/artifacts/status without a team
        ("gradle", "tenant_id=a&namespace_id=ns", "ns"),
        ("xcode", "tenant_id=a&project_handle=p", "p"),
        ("keyvalue", "tenant_id=a", ""),
        ("nx", "namespace_id=ignored", "nx"),
        ("metro", "", "metro"),
        ("bazel", "", ""),
        ("http_cache", "", ""),
        ("webdav", "", ""),
        ("probe", "namespace_id=x", None),
    ],
)
def test_each_protocol_names_the_namespace_it_stores_under(
    protocol: str, query: str, namespace: str | None
) -> None:
    request = make_mocked_request("GET", f"/x?{query}")
    assert request_namespace(request, protocol) == namespace


def test_plain_tokens_are_checked_before_the_jwt_shape() -> None:
    auth = TokenAuth(("a.b.c",), ("ro",))
    auth.check("Bearer a.b.c", Access.WRITE)
    with pytest.raises(Forbidden):
        auth.check("Bearer ro", Access.WRITE)
    with pytest.raises(Unauthenticated):  # no verifier: a JWT is just an unknown token
        auth.check("Bearer eyJhbGciOiJub25lIn0.e30.", Access.READ)


def test_a_workers_jwt_verifier_defers_a_kid_it_has_not_got_to_the_primary() -> None:
    import jwt

    from kura.api.jwt_auth import JwtVerifier
    from kura.core.errors import ForwardToPrimary

    key = rsa.generate_private_key(65537, 2048)
    token = jwt.encode({"iss": "i", "aud": "a"}, key, "RS256", headers={"kid": "new"})
    primary = JwtVerifier(issuer="i", audience="a", jwks_url="https://issuer.test/jwks")
    with pytest.raises(Unauthenticated, match="kid"):
        primary.verify(token)
    worker = JwtVerifier(issuer="i", audience="a", jwks_url="https://issuer.test/jwks")
    worker.follow("http://primary/jwks", session=lambda: pytest.fail("no fetch here"))
    with pytest.raises(ForwardToPrimary):
        worker.verify(token)


def test_a_re_read_of_a_file_that_changed_while_it_was_read_is_a_failed_read(
    tmp_path: Path,
) -> None:
    """A writer appending while the node reads: what was read may be neither version."""
    path = tmp_path / "credentials"
    path.write_text("pr-tok-0123456789 rights=read\n")
    f = TokenFile(path)
    appended = []

    class WrittenWhileRead(type(path)):  # type: ignore[misc]
        def read_text(self, *args: object, **kwargs: object) -> str:
            text = super().read_text(*args, **kwargs)  # type: ignore[arg-type]
            if not appended:  # a writer's second line lands right after the read
                appended.append(True)
                with open(self, "a") as out:
                    out.write("other-tok-0123456789 rights=read\n")
            return text

    f.path = WrittenWhileRead(path)
    path.write_text("pr-tok-0123456789 rights=read,write:cas\n")
    os.utime(path, ns=(1, 1))
    assert not f.reload_if_changed()
    assert f.failing
    assert [c.rights for c in f.credentials()] == [{R}]
    assert f.reload_if_changed()  # tried again: the whole file now
    assert {c.token for c in f.credentials()} == {"pr-tok-0123456789", "other-tok-0123456789"}


PR = Overlay(("pr-123", "main"), "pr-123")
R, WC, W, C = Access.READ, Access.WRITE_CAS, Access.WRITE, Access.CLEAN


@pytest.mark.parametrize(
    ("overlay", "asked", "access", "view"),
    [
        # no overlay: the namespace named, or the protocol's default, as before overlays
        (None, Asked(None, "nx"), W, NamespaceView(("nx",), "nx")),
        (None, Asked("team", ""), R, NamespaceView(("team",), "team")),
        (None, Asked(None, None), R, None),  # Turborepo's status: no team, no namespace
        # naming none, or the write namespace: read through the list, write the write one
        (PR, Asked(None, "nx"), R, NamespaceView(("pr-123", "main"), "pr-123")),
        (PR, Asked(None, None), W, NamespaceView(("pr-123", "main"), "pr-123")),
        (PR, Asked("pr-123", ""), C, NamespaceView(("pr-123", "main"), "pr-123")),
        # a namespace it only reads: that one alone, and no write
        (PR, Asked("main", ""), R, NamespaceView(("main",), None)),
        (Overlay(("main",), None), Asked(None, ""), R, NamespaceView(("main",), None)),
    ],
)
def test_an_overlay_decides_what_a_request_reads_and_writes(
    overlay: Overlay | None, asked: Asked, access: Access, view: NamespaceView | None
) -> None:
    assert view_of(overlay, asked, access) == view


@pytest.mark.parametrize(
    ("overlay", "asked", "access", "message"),
    [
        (PR, Asked("main", ""), W, "writes only its write namespace, not 'main'"),
        (PR, Asked("main", ""), WC, "writes only its write namespace, not 'main'"),
        (PR, Asked("main", ""), C, "writes only its write namespace, not 'main'"),
        (PR, Asked("other", ""), R, "not valid for namespace 'other'"),
        (PR, Asked("other", ""), W, "not valid for namespace 'other'"),
        (Overlay(("main",), None), Asked(None, ""), W, "writes no namespace"),
    ],
)
def test_an_overlay_refuses_a_write_outside_its_write_namespace(
    overlay: Overlay, asked: Asked, access: Access, message: str
) -> None:
    with pytest.raises(Forbidden, match=re.escape(message)) as info:
        view_of(overlay, asked, access)
    assert "reads 'pr-123', 'main' and writes 'pr-123'" in str(info.value) or overlay != PR


def test_a_malformed_named_namespace_without_an_overlay_is_invalid() -> None:
    with pytest.raises(InvalidRequest, match="invalid team"):
        view_of(None, Asked("a/b", None, "team"), R)


def test_a_jwt_carries_an_overlay_and_refuses_one_with_namespaces_too() -> None:
    claims = {
        "scope": "cache:write",
        "read_namespaces": ["pr-1", "main"],
        "write_namespace": "pr-1",
    }
    assert grant_from(claims).overlay == Overlay(("pr-1", "main"), "pr-1")
    assert grant_from({"scope": "cache:write", "write_namespace": "main"}).overlay == Overlay(
        ("main",), "main"
    )
    assert grant_from({"scope": "cache:write"}).overlay is None
    for bad, message in (
        ({**claims, "namespaces": ["main"]}, "either namespaces or read_namespaces"),
        ({**claims, "read_namespaces": "main"}, "read_namespaces must be an array"),
        ({**claims, "write_namespace": ["pr-1"]}, "write_namespace must be a string"),
        ({**claims, "write_namespace": "other"}, "must be one of the read namespaces"),
    ):
        with pytest.raises(Unauthenticated, match=message):
            grant_from(bad)


def test_an_overlay_refusal_is_logged_once_by_name_with_its_reason_never_the_token(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "credentials"
    path.write_text(f"{SECRET} name=pr-123 rights=read,write read=pr-123,main write=pr-123\n")
    auth = TokenAuth((), (), files=[TokenFile(path)])
    header = f"Bearer {SECRET}"
    assert auth.view(header, W, lambda: Asked(None, "nx")) == NamespaceView(
        ("pr-123", "main"), "pr-123", "token:pr-123"
    )
    for _ in range(2):
        with pytest.raises(Forbidden, match="writes only its write namespace, not 'main'"):
            auth.view(header, W, lambda: Asked("main", ""))
    assert auth.refusals_total["forbidden"] == 2
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 1, lines
    assert (
        "refused: writer 'token:pr-123', asking for 'write': this credential writes only"
        in lines[0]
    )
    assert SECRET not in caplog.text
