"""The HTTP adapter of the fulfilment port: requests with explicit connect and read timeouts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import requests

from shared.errors import DownstreamUnavailable
from shared.ports.fulfilment import IDEMPOTENCY_HEADER, RESERVATIONS_PATH, Reply


class HttpFulfilment:
    """POST {base_url}/reservations; one pooled session per process."""

    def __init__(self, base_url: str, *, connect_timeout: float, read_timeout: float,
                 proxy_from_environment: bool = False) -> None:
        self._url = base_url.rstrip("/") + RESERVATIONS_PATH
        self._timeout = (connect_timeout, read_timeout)
        self._session = requests.Session()
        self._session.trust_env = proxy_from_environment  # HTTP_PROXY_FROM_ENVIRONMENT

    def reserve(self, idempotency_key: str, request: Mapping[str, Any]) -> Reply:
        """Send the reservation; timeouts and connection errors raise DownstreamUnavailable."""
        try:
            response = self._session.post(
                self._url, json=dict(request), headers={IDEMPOTENCY_HEADER: idempotency_key}, timeout=self._timeout
            )
        except (requests.Timeout, requests.ConnectionError) as exc:
            raise DownstreamUnavailable(f"fulfilment call failed: {type(exc).__name__}") from exc
        try:
            body = response.json()
        except ValueError:
            body = {}
        return Reply(response.status_code, body if isinstance(body, dict) else {})
