"""A queue's duplicate detection: whether it is on, and how long the queue drops a MessageId it has seen.

Service Bus accepts a message whose MessageId it saw within the window and then drops it: the sender
cannot tell. sbctl reads the window from the queue itself with ``ServiceBusAdministrationClient``
where the namespace has an administration endpoint (Azure; the emulator, over plain HTTP on port
5300). The local broker has none; there the window is ``--detection-window``, by default Bicep's
``duplicateDetectionWindow`` (PT10M).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.core.pipeline.transport import RequestsTransport
from azure.servicebus.management import ServiceBusAdministrationClient
from requests.adapters import HTTPAdapter

from sbctl.connection import Target
from sbctl.failures import Cause, cause_of, first_line

DEFAULT_WINDOW = timedelta(minutes=10)  # infra/main.bicep: duplicateDetectionWindow
EMULATOR_MANAGEMENT_PORT = 5300
READ = "the queue's properties"
# Added to every window: the broker's clock and ours may differ by a little, and at the edge of the
# window a resubmission would be dropped; a few seconds late costs nothing.
CLOCK_MARGIN = timedelta(seconds=5)
_DURATION = re.compile(
    r"P(?:(?P<w>\d+)W)?(?:(?P<d>\d+)D)?(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?"
)


@dataclass(frozen=True)
class Detection:
    """A queue's duplicate detection as sbctl knows it; ``window`` None means the queue has none."""

    window: timedelta | None
    #: Where the window came from: the queue's properties, --detection-window, or the default.
    source: str
    #: Why the queue's properties could not be read, when the window is the default, assumed.
    unread: str | None = None

    @property
    def on(self) -> bool:
        return self.window is not None and self.window > timedelta(0)

    def drops_until(self, first_sent: datetime) -> datetime | None:
        """Until when the queue drops a copy of a message first sent at ``first_sent``; None if it never does."""
        if self.window is None or not self.on:
            return None
        return first_sent + self.window + CLOCK_MARGIN

    def describe(self) -> str:
        """The window and its source, e.g. ``PT10M (the queue's properties)``."""
        return f"{iso_duration(self.window) if self.on and self.window else 'none'} ({self.source})"


def parse_window(text: str) -> timedelta:
    """An ISO 8601 duration (PT10M, P1D, PT0.5S) or a number of seconds; at least 0. Raises ValueError."""
    text = text.strip()
    match = _DURATION.fullmatch(text.upper())
    if match and any(match.groupdict().values()) and not text.upper().endswith("T"):
        parts = {k: float(v) if v else 0.0 for k, v in match.groupdict().items()}
        return timedelta(weeks=parts["w"], days=parts["d"], hours=parts["h"], minutes=parts["m"], seconds=parts["s"])
    try:
        seconds = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is neither an ISO 8601 duration (PT10M) nor a number of seconds") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{text!r}: a window is a finite number of seconds, at least 0")
    return timedelta(seconds=seconds)


def iso_duration(value: timedelta) -> str:
    """``timedelta(minutes=10)`` -> ``PT10M``; ``timedelta(0)`` -> ``PT0S``."""
    days, rest = divmod(value.total_seconds(), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    time = "".join(f"{int(n)}{unit}" for n, unit in ((hours, "H"), (minutes, "M")) if n)
    time += f"{seconds:g}S" if seconds or not (days or time) else ""
    return "P" + (f"{int(days)}D" if days else "") + (f"T{time}" if time else "")


def detection(target: Target, queue: str, given: timedelta | None) -> Detection:
    """The queue's duplicate detection: read from the queue if possible, else ``given``, else the default."""
    try:
        properties = _queue_properties(target, queue)
    except Exception as exc:  # failing to read only means falling back; ``unread`` says why
        if given is not None:
            return Detection(given, "--detection-window")
        return Detection(DEFAULT_WINDOW, "infra/main.bicep's default", _why(target, exc))
    window = properties.duplicate_detection_history_time_window
    return Detection(_as_timedelta(window) if properties.requires_duplicate_detection else None, READ)


def note(found: Detection, queue: str, given: timedelta | None) -> str | None:
    """A line for stderr when the window was assumed, or when the queue's own overrules --detection-window."""
    if found.unread is not None:
        return (f"cannot read the duplicate detection of {queue!r} ({found.unread}); assuming a window of "
                f"{found.describe()}; give --detection-window for another (0: none)")
    if found.source == READ and given is not None and (found.window or timedelta(0)) != given:
        return f"{queue!r} has duplicate detection {found.describe()}; that is used, not --detection-window"
    return None


def _queue_properties(target: Target, queue: str) -> Any:
    """The queue's properties from the namespace's administration endpoint."""
    transport = RequestsTransport(session=_session(target), session_owner=True, connection_timeout=5,
                                  read_timeout=10)
    options: dict[str, Any] = {"retry_total": 0, "transport": transport}
    if target.namespace:
        from azure.identity import DefaultAzureCredential  # noqa: PLC0415 - only for --namespace

        client = ServiceBusAdministrationClient(target.host, DefaultAzureCredential(), **options)
    else:
        assert target.connection_string is not None
        client = ServiceBusAdministrationClient.from_connection_string(target.connection_string, **options)
    with client:
        return client.get_queue(queue)


def _session(target: Target) -> requests.Session:
    session = requests.Session()
    if target.emulator:
        session.mount("https://", _PlainHttp(EMULATOR_MANAGEMENT_PORT))
    return session


class _PlainHttp(HTTPAdapter):
    """Sends ``https://<host>/...`` to ``http://<host>:<port>/...``.

    The emulator serves the administration API over plain HTTP on its own port, and the client of
    azure-servicebus 7.15 always asks ``https://<namespace>``.
    """

    def __init__(self, port: int) -> None:
        super().__init__()
        self._port = port

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> requests.Response:
        parts = urlsplit(request.url or "")
        host = parts.hostname or ""
        host = f"[{host}]" if ":" in host else host
        request.url = urlunsplit(("http", f"{host}:{self._port}", parts.path, parts.query, parts.fragment))
        return super().send(request, *args, **kwargs)


def _why(target: Target, exc: BaseException) -> str:
    where = f"{target.host}:{EMULATOR_MANAGEMENT_PORT}" if target.emulator else f"https://{target.host}"
    if isinstance(exc, ResourceNotFoundError):
        return f"the administration endpoint at {where} does not know it"
    if isinstance(exc, HttpResponseError) and exc.status_code in (401, 403):
        return (f"{exc.status_code} from {where}: reading it takes Manage rights, or the Azure Service Bus Data "
                "Owner role")
    cause = cause_of(exc)
    if cause is Cause.REFUSED:
        return f"no administration endpoint at {where}: {cause.value}"
    return f"administration endpoint at {where}: {cause.value if cause else first_line(exc)}"


def _as_timedelta(value: timedelta | str | None) -> timedelta | None:
    if value is None or isinstance(value, timedelta):
        return value
    return parse_window(value)
