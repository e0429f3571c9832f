"""Why a connection failed, in one line: the endpoint, and the cause an operator can act on.

The SDKs wrap socket and TLS errors several layers deep (azure-core's ``inner_exception``, requests
and urllib3, the AMQP stack's own errors), and often keep only their text; :func:`cause_of` walks
the chain and recognises the few causes that have a remedy. Used by sbctl for Service Bus and Cosmos
DB, and by ``devservers.cosmos_setup``.
"""

from __future__ import annotations

import binascii
import enum
import socket
import ssl
from urllib.parse import urlsplit

from azure.core.exceptions import HttpResponseError

__all__ = ["Cause", "cause_of", "cosmos_failure", "first_line"]


class Cause(enum.Enum):
    """A cause of a failed connection that has a remedy."""

    REFUSED = "connection refused"
    UNTRUSTED = "the server's TLS certificate is not trusted"
    TLS_TO_PLAIN = "TLS handshake failed: the server does not speak TLS"
    RESET = "the server closed the connection"
    UNRESOLVED = "the host name does not resolve"
    TIMEOUT = "timed out"
    NOT_AMQP = "the server does not speak AMQP"


# Text the SDKs keep when they drop the exception itself; lower case, checked in this order.
_TEXT: list[tuple[Cause, tuple[str, ...]]] = [
    (Cause.REFUSED, ("connection refused", "actively refused", "errno 111", "errno 61]")),
    (Cause.UNTRUSTED, ("certificate_verify_failed", "certificate verify failed")),
    (Cause.TLS_TO_PLAIN, ("wrong_version_number", "wrong version number", "record layer failure",
                          "packet length too long", "unexpected eof while reading")),
    (Cause.UNRESOLVED, ("name or service not known", "nodename nor servname", "getaddrinfo failed",
                        "temporary failure in name resolution", "failed to resolve", "no address associated")),
    (Cause.RESET, ("connection reset", "connection aborted", "remote end closed connection", "broken pipe")),
    (Cause.TIMEOUT, ("timed out",)),
    (Cause.NOT_AMQP, ("invalid frame type", "protocol header")),
]
_TYPES: list[tuple[Cause, tuple[type[BaseException], ...]]] = [
    (Cause.REFUSED, (ConnectionRefusedError,)),
    (Cause.UNTRUSTED, (ssl.SSLCertVerificationError,)),
    (Cause.UNRESOLVED, (socket.gaierror,)),
    (Cause.RESET, (ConnectionResetError, ConnectionAbortedError, BrokenPipeError)),
    (Cause.TIMEOUT, (TimeoutError,)),
]


def chain(exc: BaseException) -> list[BaseException]:
    """The exception and every exception behind it: causes, contexts and azure-core's inner exceptions."""
    found: list[BaseException] = []
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop(0)
        if current is None or any(current is seen for seen in found):
            continue
        found.append(current)
        inner = getattr(current, "inner_exception", None)
        pending += [current.__cause__, current.__context__, inner if isinstance(inner, BaseException) else None]
    return found


def cause_of(exc: BaseException) -> Cause | None:
    """The recognised cause of a connection failure, or None."""
    errors = chain(exc)
    for cause, types in _TYPES:
        if any(isinstance(error, types) for error in errors):
            return cause
    text = " ".join(f"{type(error).__name__}: {error}" for error in errors).lower()
    for cause, needles in _TEXT:
        if any(needle in text for needle in needles):
            return cause
    return None


def first_line(exc: BaseException) -> str:
    """``Type: message`` on one line, for errors no rule recognises."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def cosmos_failure(url: str, exc: BaseException, *, key_option: str, tls_option: str = "--no-verify-tls") -> str:
    """One line for a failed call to Cosmos DB at ``url``: what happened and what to change."""
    where = f"Cosmos DB at {url}"
    plain = urlsplit(url).scheme.lower() == "http"
    if any(isinstance(error, binascii.Error) for error in chain(exc)):
        return f"{where}: the account key ({key_option}) is not valid base64"
    answered = next((e for e in chain(exc) if isinstance(e, HttpResponseError) and e.status_code), None)
    if isinstance(answered, HttpResponseError):
        if answered.status_code == 401:
            return f"{where}: the account key was refused (401 Unauthorized); check {key_option}"
        if answered.status_code == 403:
            return f"{where}: forbidden (403); with Entra ID, the identity needs a Cosmos DB data-plane role"
        return f"{where}: {answered.status_code} {first_line(answered).split(': ', 1)[-1]}"
    cause = cause_of(exc)
    if cause is Cause.REFUSED:
        return (f"{where}: connection refused, nothing listens there; start the local server "
                "(make run, or python -m devservers.cosmos --port 8081) or the emulator, or check the port")
    if cause is Cause.TLS_TO_PLAIN:
        return (f"{where}: {cause.value}; the server speaks plain HTTP (the local Cosmos server, or the "
                f"emulator with PROTOCOL=http): use {_with_scheme(url, 'http')}")
    if cause is Cause.UNTRUSTED:
        return f"{where}: {cause.value} (the emulator's is self-signed); pass {tls_option} for a local emulator"
    if cause is Cause.RESET and plain:
        return (f"{where}: {cause.value} without answering; if it serves HTTPS (the Cosmos DB emulator does "
                f"by default), use {_with_scheme(url, 'https')} with {tls_option}")
    if cause is not None:
        return f"{where}: {cause.value}"
    return f"{where}: {first_line(exc)}"


def _with_scheme(url: str, scheme: str) -> str:
    parts = urlsplit(url)
    return parts._replace(scheme=scheme).geturl()
