"""The app's identity in Azure, and how a failure to get a token reads: a wrong credential, or an outage.

In Azure (Functions sets ``IDENTITY_ENDPOINT``) the clients authenticate with ``ManagedIdentityCredential``,
which raises its token endpoint's failures as they are (azure-identity 1.27, read from its source and
probed against a stand-in endpoint): unreachable is a ``ServiceRequestError`` (or, on the IMDS path, a
``CredentialUnavailableError`` caused by one); an answer is a ``ClientAuthenticationError`` that keeps its
``status_code``. ``DefaultAzureCredential`` would hide them: when every credential of its chain fails, it
raises one ``ClientAuthenticationError`` with no status and no cause, only a message. Elsewhere (a
developer's workstation against an account) it is ``DefaultAzureCredential``, which finds their sign-in.

``token_failure`` tells the two kinds apart, by the exception types and their status codes, along what an error
wraps (``inner_exception``, ``__cause__``):

- **transient** (the token endpoint unreachable or failing for now, once the cached token has expired):
  in the chain of causes, a status of 408, 429 or 5xx, or a transport error (``ServiceRequestError``,
  ``ServiceResponseError``, ``OSError``, a timeout). The delivery is an outage's, handed on like any.
- **configuration** (the identity refused: a client id not assigned to the app, no identity enabled): a
  status of another 4xx, or a credential failure with neither status nor transport cause. No retry can
  mend it: the app fails loudly (``ConfigurationError``), and the delivery is abandoned, never handed on.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator, Mapping
from enum import StrEnum
from typing import Any

from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ServiceRequestError,
    ServiceResponseError,
)

# Set by App Service and Functions for the managed identity's token endpoint.
IDENTITY_ENDPOINT = "IDENTITY_ENDPOINT"
CLIENT_ID = "AZURE_CLIENT_ID"  # a user-assigned identity's client id, when the app uses one
_TRANSPORT = (ServiceRequestError, ServiceResponseError, OSError, asyncio.TimeoutError)


class TokenFailure(StrEnum):
    """What a failure to get a token says."""

    TRANSIENT = "transient"
    CONFIGURATION = "configuration"


def managed_identity(environ: Mapping[str, str] = os.environ) -> Any:
    """The async credential of the app: its managed identity in Azure, the developer's sign-in elsewhere."""
    if environ.get(IDENTITY_ENDPOINT):
        from azure.identity.aio import ManagedIdentityCredential  # noqa: PLC0415 - only needed in Azure

        return ManagedIdentityCredential(client_id=environ.get(CLIENT_ID) or None)
    from azure.identity.aio import DefaultAzureCredential  # noqa: PLC0415

    return DefaultAzureCredential()


def token_failure(error: BaseException) -> TokenFailure | None:
    """What ``error`` says of the app's identity, or None when no credential failure is in its chain."""
    chain = list(_causes(error))
    if not any(isinstance(link, ClientAuthenticationError) for link in chain):
        return None
    for link in chain:
        status = getattr(link, "status_code", None) if isinstance(link, HttpResponseError) else None
        if isinstance(status, int):
            return TokenFailure.TRANSIENT if status in (408, 429) or status >= 500 else TokenFailure.CONFIGURATION
    if any(isinstance(link, _TRANSPORT) for link in chain):
        return TokenFailure.TRANSIENT
    return TokenFailure.CONFIGURATION


def _causes(error: BaseException) -> Iterator[BaseException]:
    """``error`` and what it wraps: the SDKs' ``inner_exception`` and ``__cause__``. Not ``__context__``: an error
    that was merely being handled when this one was raised (a 5xx, a reset) says nothing of this one."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        link = pending.pop(0)
        if link is None or id(link) in seen:
            continue
        seen.add(id(link))
        yield link
        inner = getattr(link, "inner_exception", None)
        pending += [inner if isinstance(inner, BaseException) else None, link.__cause__]
