"""Which statuses may turn into success if asked again: for every downstream, and under an idempotency key."""

from __future__ import annotations

import pytest

from idempotent_consumer.outcomes import KEY_IN_USE, is_transient, is_transient_under_key, is_unavailable


@pytest.mark.parametrize("status", [408, 429, 449, 500, 502, 503, 504])
def test_a_transient_status_is_transient_everywhere(status: int) -> None:
    assert is_transient(status) and is_transient_under_key(status)


def test_409_is_transient_only_under_an_idempotency_key() -> None:
    # Cosmos DB's 409 says an id is taken, for good; a service under the IETF Idempotency-Key draft answers 409
    # while another request holds the key, and asked again later it answers the first request's reply.
    assert KEY_IN_USE == 409
    assert not is_transient(409) and is_transient_under_key(409)


@pytest.mark.parametrize("status", [400, 404, 410, 412, 422, 501, 505])
def test_other_failures_refuse_for_good(status: int) -> None:
    assert not is_transient(status) and not is_transient_under_key(status) and not is_unavailable(status)


@pytest.mark.parametrize("status", [401, 403])
def test_a_caller_not_allowed_is_a_service_out_of_reach_not_a_refusal(status: int) -> None:
    # The same answer for every message: not transient of itself, but the service is unavailable to us.
    assert not is_transient(status) and is_unavailable(status) and is_transient_under_key(status)
