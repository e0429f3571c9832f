"""Each azure-cosmos / azure-core error maps to one error of our family, chained to the original."""

from __future__ import annotations

import logging

import pytest
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
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
from azure.identity import CredentialUnavailableError
from azure.servicebus.exceptions import ServiceBusError

from idempotent_consumer.adapters.cosmos import ignored_proxy_variables, translate_errors
from idempotent_consumer.adapters.credentials import TokenFailure, managed_identity, token_failure
from idempotent_consumer.errors import (
    AlreadyExists,
    BatchFailed,
    ConfigurationError,
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


def with_status(error: HttpResponseError, status: int) -> HttpResponseError:
    """A token endpoint's answer as azure-identity raises it: the error keeps the endpoint's status."""
    error.status_code = status
    return error


def caused(error: BaseException, cause: BaseException) -> BaseException:
    error.__cause__ = cause
    return error


def contextual(error: BaseException, context: BaseException) -> BaseException:
    error.__context__ = context
    return error


def inner(error: ServiceBusError, wrapped: BaseException) -> ServiceBusError:
    error.inner_exception = wrapped
    return error


# The failures azure-identity 1.27 raises when a token cannot be got (read from its source, probed against a
# stand-in endpoint), as ManagedIdentityCredential raises them on the App Service path and the IMDS path, and as
# Service Bus wraps them (a plain ServiceBusError whose inner_exception is the credential's).
TOKEN_FAILURES = [
    (with_status(ClientAuthenticationError("token endpoint 503"), 503), TokenFailure.TRANSIENT),
    (with_status(ClientAuthenticationError("token endpoint 429"), 429), TokenFailure.TRANSIENT),
    (with_status(CredentialUnavailableError("an HTML 502 page"), 502), TokenFailure.TRANSIENT),
    (caused(CredentialUnavailableError("no response from the IMDS endpoint"), ServiceRequestError("refused")),
     TokenFailure.TRANSIENT),
    (inner(ServiceBusError("Handler failed"), with_status(ClientAuthenticationError("503"), 503)),
     TokenFailure.TRANSIENT),
    (with_status(ClientAuthenticationError("Unable to load the proper Managed Identity."), 400),
     TokenFailure.CONFIGURATION),
    (with_status(ClientAuthenticationError("forbidden"), 403), TokenFailure.CONFIGURATION),
    (caused(CredentialUnavailableError("IMDS"), with_status(ClientAuthenticationError("400"), 400)),
     TokenFailure.CONFIGURATION),
    (CredentialUnavailableError("No managed identity endpoint found."), TokenFailure.CONFIGURATION),
    (ClientAuthenticationError("DefaultAzureCredential failed to retrieve a token"), TokenFailure.CONFIGURATION),
    (ServiceRequestError("connection refused"), None),
    (contextual(CredentialUnavailableError("No managed identity endpoint found."), OSError("reset")),
     TokenFailure.CONFIGURATION),  # an error that was only being handled says nothing of this one
    (CosmosHttpResponseError(status_code=403, message="RBAC"), None),
]


@pytest.mark.parametrize(("error", "kind"), TOKEN_FAILURES)
def test_a_token_failure_reads_as_an_outage_or_as_a_wrong_credential(error: BaseException,
                                                                    kind: TokenFailure | None) -> None:
    assert token_failure(error) is kind


@pytest.mark.parametrize(("error", "kind"), [(e, k) for e, k in TOKEN_FAILURES if k is not None])
def test_a_token_endpoint_outage_is_transient_and_a_refused_identity_fails_loudly(error: Exception,
                                                                                 kind: TokenFailure) -> None:
    if kind is TokenFailure.TRANSIENT:
        assert type(translated(error)) is TransientStoreError
        return
    with pytest.raises(ConfigurationError, match="the app's identity") as caught, translate_errors("op on ord-1"):
        raise error
    assert caught.value.__cause__ is error


def test_the_app_takes_its_managed_identity_in_azure_and_the_developers_sign_in_elsewhere() -> None:
    assert type(managed_identity({"IDENTITY_ENDPOINT": "http://127.0.0.1:41741/msi/token"})).__name__ == \
        "ManagedIdentityCredential"
    assert type(managed_identity({})).__name__ == "DefaultAzureCredential"


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
