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
from kura.core.errors import Forbidden, Unauthenticated
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
        "pr-tok rights=read,write:cas name=pr-builds\n"
        "\tmain-tok   name=main.ci_1   rights=read,write,clean  \n"
        "writer rights=write\n"  # write implies write:cas, and not read
        "cleaner rights=clean\n"
        "YWJj== rights=read\n"  # a base64 token may end in '='
        "pr-tok name=pr-builds rights=write:cas,read\n"  # the same again: one credential
    )
    got = {c.token: (c.rights, c.name) for c in parse_credentials(text)}
    assert got == {
        "pr-tok": (frozenset({R, WC}), "pr-builds"),
        "main-tok": (READ_WRITE, "main.ci_1"),
        "writer": (frozenset({W, WC}), None),
        "cleaner": (frozenset({C}), None),
        "YWJj==": (frozenset({R}), None),
    }
    assert parse_credentials("# none yet\n\n") == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ok rights=read\nsecret\n", "line 2: key 'rights' is required"),
        ("secret name=ci\n", "line 1: key 'rights' is required"),
        ("secret rights=\n", "line 1: key 'rights': no rights given"),
        ("secret rights=read,admin\n", "line 1: key 'rights': unknown right 'admin'"),
        ("secret rights=read,,write\n", "line 1: key 'rights': unknown right ''"),
        ("secret rights=read read=main\n", "line 1: unknown key 'read'"),
        ("secret rights=write write=pr-1\n", "line 1: unknown key 'write'"),
        ("secret rights=read rights=write\n", "line 1: key 'rights' given twice"),
        ("secret rights=read name=a/b\n", "line 1: key 'name': a name is letters"),
        ("secret rights=read name=\n", "line 1: key 'name': a name is letters"),
        ("secret rights=read secret2\n", "line 1: field 3 is not key=value"),
        ("secret =read\n", "line 1: field 2 is not key=value"),
        (
            "secret rights=read\nb rights=read\nsecret rights=read,write\n",
            "line 3: the token of line 1 again, with other rights or name",
        ),
        (
            "secret rights=read name=a\nsecret rights=read name=b\n",
            "line 2: the token of line 1 again",
        ),
    ],
)
def test_a_bad_credentials_line_is_refused_naming_the_line_never_the_token(
    text: str, message: str
) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message)) as info:
        parse_credentials(text)
    assert "secret" not in str(info.value)


def test_a_credential_passes_for_its_rights_only_and_the_refusal_names_the_right_missing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "credentials"
    path.write_text("cas rights=read,write:cas\nw rights=write\n")
    auth = TokenAuth(("rw",), ("ro",), files=[TokenFile(path)])
    for token, granted in (
        ("rw", {R, WC, W, C}),  # KURA_READ_WRITE_TOKENS: read write clean, as before
        ("ro", {R}),
        ("cas", {R, WC}),
        ("w", {WC, W}),
    ):
        for access in Access:
            assert auth.allows(f"Bearer {token}", access) is (access in granted), (token, access)
    with pytest.raises(Forbidden, match=r"lacks the right 'write'$"):
        auth.check("Bearer cas", Access.WRITE)
    with pytest.raises(Forbidden, match="read-only: it lacks the right 'clean'"):
        auth.check("Bearer ro", Access.CLEAN)
    assert auth.refusals_total["forbidden"] == 2


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
