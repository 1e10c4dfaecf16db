"""Which peer answers drop a copy from the outbox for good (kura.mesh.shipper.refusal_reason)."""

from __future__ import annotations

import pytest

from kura.mesh.shipper import refusal_reason


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (400, "bad_request"),
        (403, "forbidden"),
        (404, "not_found"),
        (409, "conflict"),
        (413, "payload_too_large"),
        (422, "unprocessable_entity"),
        (507, "insufficient_storage"),
        (410, "other_4xx"),
        (451, "other_4xx"),
    ],
)
def test_a_permanent_refusal_names_its_reason(status: int, reason: str) -> None:
    assert refusal_reason(status) == reason


@pytest.mark.parametrize("status", [None, 200, 204, 301, 401, 408, 429, 500, 502, 503, 504])
def test_transient_answers_and_unreached_peers_are_retried(status: int | None) -> None:
    assert refusal_reason(status) is None


def test_every_reason_comes_from_a_closed_set() -> None:
    reasons = {refusal_reason(s) for s in range(100, 600)} - {None}
    assert reasons == {
        "bad_request",
        "forbidden",
        "not_found",
        "conflict",
        "payload_too_large",
        "unprocessable_entity",
        "insufficient_storage",
        "other_4xx",
    }
