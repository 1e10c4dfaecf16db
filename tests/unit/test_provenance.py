"""Who writes (issue 29 item 4, ``kura.core.provenance``): each kind of credential's writer
identity, decided where the credential is checked (``TokenAuth.view``), and every refusal
logged once per writer, right and reason by that identity, never the token. Without a server:
the writes through every route and RPC are in tests/integration/test_rights.py."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kura.api.auth import TokenAuth
from kura.api.jwt_auth import JwtVerifier
from kura.api.token_file import TokenFile, parse_credentials
from kura.core.errors import Forbidden
from kura.core.manifest import MAX_WRITER_CHARS, Manifest
from kura.core.overlay import Asked
from kura.core.provenance import of_jwt, of_token
from kura.core.rights import READ_WRITE, Access
from tests.integration import jwt_keys

SECRET = "s3cr3t-t0ken-abcdefghijklmnop"
KEY = jwt_keys.rsa_key()


def fingerprint(token: str) -> str:
    """What an operator computes from a token they hold: ``printf %s TOKEN | sha256sum``."""
    return hashlib.sha256(token.encode()).hexdigest()[:12]


def test_a_static_token_is_its_name_or_else_its_fingerprint_never_itself() -> None:
    assert of_token("ci-main", SECRET) == "token:ci-main"
    assert of_token(None, SECRET) == f"token:#{fingerprint(SECRET)}"
    assert SECRET not in of_token(None, SECRET)


def test_a_jwt_is_its_sub_in_visible_ascii_or_else_its_fingerprint() -> None:
    assert of_jwt("repo:acme/app:ref:refs/heads/main", SECRET) == (
        "jwt:repo:acme/app:ref:refs/heads/main"
    )
    assert of_jwt("ci bot\n/é%", SECRET) == "jwt:ci%20bot%0A/%C3%A9%25"
    for no_subject in (None, "", 42, ["a"]):
        assert of_jwt(no_subject, SECRET) == f"jwt:#{fingerprint(SECRET)}"
    assert len(of_jwt("x" * 1000, SECRET)) == MAX_WRITER_CHARS
    # Found by a hostile test: two long subjects that differ only past the cut (a branch name
    # an attacker picks), and a subject that reads as another JWT's fingerprint.
    long = "repo:acme/app:ref:refs/heads/" + "x" * 180
    assert of_jwt(long + "-victim", SECRET) != of_jwt(long + "-attacker", SECRET)
    assert len(of_jwt(long + "-victim", SECRET)) == MAX_WRITER_CHARS
    assert of_jwt(f"#{fingerprint(SECRET)}", "another-token") != of_jwt(None, SECRET)
    assert of_jwt("#x", SECRET) == "jwt:%23x"


def valid_writer(writer: str) -> bool:
    """Whether a manifest takes ``writer`` (its rule: visible ASCII, at most 200)."""
    data = Manifest("a", "nx", "", "k", "t", 0, "e3b0", 1, 1, writer=writer).to_json()
    return Manifest.from_json(data).writer == writer


@given(st.text(max_size=300), st.text(max_size=300))
def test_every_identity_is_a_manifests_writer_and_two_subjects_never_share_one(
    subject: str, other: str
) -> None:
    assert valid_writer(of_jwt(subject, SECRET))
    if subject != other:  # one-to-one, and a cut one ends with its whole subject's fingerprint
        assert of_jwt(subject, SECRET) != of_jwt(other, SECRET)


def test_a_token_file_line_may_name_its_token() -> None:
    (named, bare) = parse_credentials(f"{SECRET} name=ci-main\nother-token\n", READ_WRITE)
    assert (named.name, named.writer) == ("ci-main", "token:ci-main")
    assert (bare.name, bare.writer) == (None, f"token:#{fingerprint('other-token')}")
    for bad in (f"{SECRET} name=a b\n", f"{SECRET} rights=read\n", f"{SECRET} name=a/b\n"):
        with pytest.raises(ValueError, match="line 1") as refused:
            parse_credentials(bad, READ_WRITE)
        assert SECRET not in str(refused.value)
    with pytest.raises(ValueError, match=r"follows name=: .* a name being one word"):
        parse_credentials(f"{SECRET} name=ci main\n", READ_WRITE)  # the name, not the token


def jwt_auth(*files: TokenFile, plain: tuple[str, ...] = ()) -> TokenAuth:
    verifier = JwtVerifier(
        issuer=jwt_keys.ISSUER, audience=jwt_keys.AUDIENCE, public_key=KEY.public_key()
    )
    return TokenAuth(plain, (), files=files, jwt=verifier)


def test_each_credential_carries_its_writer_into_what_the_request_writes(tmp_path: Path) -> None:
    credentials = tmp_path / "credentials"
    credentials.write_text(
        f"named-{SECRET} name=pr-123 rights=read,write read=pr-123,main write=pr-123\n"
        f"unnamed-{SECRET} rights=write\n"
    )
    listed = tmp_path / "rw-tokens"
    listed.write_text(f"file-{SECRET} name=ci-main\n")
    auth = jwt_auth(TokenFile(credentials), TokenFile(listed, READ_WRITE), plain=("plain-tok",))
    signed = jwt_keys.token(KEY, sub="ci/main bot")
    unsigned_sub = jwt_keys.token(KEY, sub=None)
    for token, writer, write_namespace in (
        (f"named-{SECRET}", "token:pr-123", "pr-123"),
        (f"unnamed-{SECRET}", f"token:#{fingerprint(f'unnamed-{SECRET}')}", "nx"),
        (f"file-{SECRET}", "token:ci-main", "nx"),
        ("plain-tok", f"token:#{fingerprint('plain-tok')}", "nx"),
        (signed, "jwt:ci/main%20bot", "nx"),
        (unsigned_sub, f"jwt:#{fingerprint(unsigned_sub)}", "nx"),
    ):
        view = auth.view(f"Bearer {token}", Access.WRITE, lambda: Asked(None, "nx"))
        assert view is not None
        assert (view.write, view.writer) == (write_namespace, writer), token
    open_node = TokenAuth((), ())
    view = open_node.view(None, Access.WRITE, lambda: Asked(None, "nx"))
    assert view is not None
    assert view.writer == "anonymous"


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused:")]


def test_every_refusal_is_logged_once_per_writer_and_reason_never_the_token(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A listed credential's missing right, a JWT's missing right, a namespace-limited JWT
    naming another namespace, an overlay asked to write where it only reads: one WARNING line
    each, naming the writer and the reason; the same refusals again log nothing."""
    caplog.set_level(logging.WARNING, "kura.api.auth")
    credentials = tmp_path / "credentials"
    credentials.write_text(
        f"cas-{SECRET} name=pr-cas rights=read,write:cas\n"
        f"ovl-{SECRET} name=pr-7 rights=read,write read=pr-7,main write=pr-7\n"
    )
    auth = jwt_auth(TokenFile(credentials))
    cas_jwt = jwt_keys.token(KEY, scope="cache:write:cas", sub="pr-bot")
    team_jwt = jwt_keys.token(KEY, sub="team-bot", namespaces=["team"])
    cases = (
        (f"cas-{SECRET}", Asked(None, "nx"), "writer 'token:pr-cas', asking for 'write'"),
        (cas_jwt, Asked(None, "nx"), "writer 'jwt:pr-bot', asking for 'write'"),
        (team_jwt, Asked("main", ""), "writer 'jwt:team-bot', asking for 'write': this token is"),
        (f"ovl-{SECRET}", Asked("main", ""), "writer 'token:pr-7', asking for 'write': this cred"),
    )
    for _round in range(3):
        for token, asked, _line in cases:
            with pytest.raises(Forbidden):
                auth.view(f"Bearer {token}", Access.WRITE, lambda asked=asked: asked)
    lines = refusals(caplog)
    assert len(lines) == len(cases), lines
    for (_token, _asked, wanted), line in zip(cases, lines, strict=True):
        assert line.startswith(f"refused: {wanted}"), line
    assert auth.refusals_total["forbidden"] == 3 * len(cases)
    for token, _asked, _line in cases:
        assert not any(token in r.getMessage() for r in caplog.records)
        assert token.split(".")[-1] not in caplog.text  # not even a JWT's signature
