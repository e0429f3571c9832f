"""Each azure-cosmos / azure-core error maps to one error of our family, chained to the original."""

from __future__ import annotations

import logging

import pytest
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    ServiceRequestError,
    ServiceRequestTimeoutError,
    ServiceResponseError,
    ServiceResponseTimeoutError,
)
from azure.cosmos.exceptions import (
    CosmosAccessConditionFailedError,
    CosmosBatchOperationError,
    CosmosClientTimeoutError,
    CosmosHttpResponseError,
    CosmosResourceExistsError,
    CosmosResourceNotFoundError,
)

from shared.adapters.cosmos import ignored_proxy_variables, translate_errors
from shared.errors import (
    AlreadyExists,
    BatchFailed,
    NotFound,
    PreconditionFailed,
    StoreError,
    TransientStoreError,
)
from shared.settings import Settings


def translated(error: Exception) -> StoreError:
    with pytest.raises(StoreError) as caught, translate_errors("op on ord-1"):
        raise error
    assert caught.value.__cause__ is error
    return caught.value


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (CosmosResourceExistsError(status_code=409, message="conflict"), AlreadyExists),
        (CosmosResourceNotFoundError(status_code=404, message="missing"), NotFound),
        (CosmosAccessConditionFailedError(status_code=412, message="etag"), PreconditionFailed),
        (CosmosHttpResponseError(status_code=408, message="timeout"), TransientStoreError),
        (CosmosHttpResponseError(status_code=429, message="throttled"), TransientStoreError),
        (CosmosHttpResponseError(status_code=449, message="retry with"), TransientStoreError),
        (CosmosHttpResponseError(status_code=500, message="server"), TransientStoreError),
        (CosmosHttpResponseError(status_code=502, message="gateway"), TransientStoreError),
        (CosmosHttpResponseError(status_code=503, message="unavailable"), TransientStoreError),
        (CosmosHttpResponseError(status_code=504, message="gateway timeout"), TransientStoreError),
        (CosmosClientTimeoutError(), TransientStoreError),
        (ServiceRequestError("connection refused"), TransientStoreError),
        (ServiceRequestTimeoutError("connect timeout"), TransientStoreError),
        (ServiceResponseError("connection reset"), TransientStoreError),
        (ServiceResponseTimeoutError("read timeout"), TransientStoreError),
    ],
)
def test_sdk_error_maps_to_our_error(error: Exception, expected: type[StoreError]) -> None:
    assert type(translated(error)) is expected


@pytest.mark.parametrize("status", [400, 401, 403, 413])
def test_other_statuses_are_plain_store_errors(status: int) -> None:
    mapped = translated(CosmosHttpResponseError(status_code=status, message="no"))
    assert type(mapped) is StoreError
    assert mapped.status == status


def test_authentication_failure_is_a_plain_store_error() -> None:
    assert type(translated(ClientAuthenticationError("no token"))) is StoreError


def test_any_other_azure_error_is_a_store_error() -> None:
    assert type(translated(AzureError("odd"))) is StoreError


def test_status_and_context_are_kept_without_payload() -> None:
    mapped = translated(CosmosHttpResponseError(status_code=429, message="throttled"))
    assert mapped.status == 429
    assert "op on ord-1" in str(mapped)


def batch_error(index: int, statuses: list[int]) -> CosmosBatchOperationError:
    responses = [{"statusCode": status} for status in statuses]
    return CosmosBatchOperationError(
        error_index=index, headers={}, status_code=statuses[index], message="batch failed",
        operation_responses=responses,
    )


@pytest.mark.parametrize(("index", "status"), [(0, 409), (1, 412), (2, 404), (1, 400)])
def test_failed_batch_operation_maps_to_batch_failed_with_its_index_and_status(index: int, status: int) -> None:
    statuses = [424, 424, 424]
    statuses[index] = status
    mapped = translated(batch_error(index, statuses))
    assert type(mapped) is BatchFailed
    assert (mapped.index, mapped.status) == (index, status)


@pytest.mark.parametrize("status", [408, 429, 503])
def test_batch_failing_on_a_transient_status_is_transient(status: int) -> None:
    assert type(translated(batch_error(1, [424, status]))) is TransientStoreError


def test_proxy_variables_the_clients_ignore_are_named_in_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    off = Settings(cosmos_endpoint="http://127.0.0.1:1", fulfillment_url="http://x")
    on = Settings(cosmos_endpoint="http://127.0.0.1:1", fulfillment_url="http://x", http_proxy_from_environment=True)
    environ = {"HTTPS_PROXY": "http://proxy:3128", "PATH": "/bin"}
    with caplog.at_level(logging.WARNING):
        assert ignored_proxy_variables(off, environ) == ["HTTPS_PROXY"]
        assert ignored_proxy_variables(on, environ) == []
        assert ignored_proxy_variables(off, {"PATH": "/bin"}) == []
    assert [r.getMessage() for r in caplog.records] == [
        "HTTPS_PROXY set, but HTTP_PROXY_FROM_ENVIRONMENT is false: the Cosmos DB and fulfilment clients ignore"
        " them; set it to true behind a proxy"]


def test_ca_bundle_variables_are_named_whatever_the_setting(caplog: pytest.LogCaptureFixture) -> None:
    # requests read them; aiohttp never does, so a proxy's CA set there would go unused without a word.
    on = Settings(cosmos_endpoint="http://127.0.0.1:1", fulfillment_url="http://x", http_proxy_from_environment=True)
    with caplog.at_level(logging.WARNING):
        assert ignored_proxy_variables(on, {"REQUESTS_CA_BUNDLE": "/etc/proxy-ca.pem"}) == ["REQUESTS_CA_BUNDLE"]
    assert [r.getMessage() for r in caplog.records] == [
        "REQUESTS_CA_BUNDLE set, but the Cosmos DB and fulfilment clients (aiohttp) never read it; put the CA in"
        " SSL_CERT_FILE"]
