"""How long the Functions host keeps a delivery's lock: host.json's ``maxAutoLockRenewalDuration``.

The Service Bus extension renews a message's lock while its function runs, from just before the
function is called until ``maxAutoLockRenewalDuration`` has passed (Azure.Messaging.ServiceBus
``ReceiverManager``: ``CancelAfter(MaxAutoLockRenewalDuration)``, then a renewal 10 s before each
expiry, or at half the time left when less than 20 s are left). So a message's lock holds at least
until its start plus that duration, and at least until the lock it came with ends. A session's lock
is renewed from the session's acceptance, for the same duration counted once, which a delivery does
not see: for a session's message only the lock it came with is known to hold.

The value is host.json's (``extensions.serviceBus.maxAutoLockRenewalDuration``, default 5 minutes, 0 for
no renewal), unless the app setting ``AzureFunctionsJobHost__extensions__serviceBus__maxAutoLockRenewalDuration``
overrides it, as it overrides host.json for the host. host.json is the app's, read from the script root
(``script_root``), not from beside this module, which a library installed as a package is not.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path

from idempotent_consumer.errors import ConfigurationError

SCRIPT_ROOT = "AzureWebJobsScriptRoot"
OVERRIDE = "AzureFunctionsJobHost__extensions__serviceBus__maxAutoLockRenewalDuration"
DEFAULT = "00:05:00"  # ServiceBusOptions.MaxAutoLockRenewalDuration, in the extension's source
# A .NET TimeSpan as host.json spells it: [-][d.]hh:mm:ss[.fffffff]; "-00:00:00.001" is Timeout.InfiniteTimeSpan.
_TIMESPAN = re.compile(r"^(?P<sign>-)?(?:(?P<days>\d+)\.)?(?P<hours>\d+):(?P<minutes>\d+):(?P<seconds>\d+(?:\.\d+)?)$")


def script_root(environ: Mapping[str, str] = os.environ) -> Path:
    """The Functions app's root, where its host.json is: ``AzureWebJobsScriptRoot``, which the Linux images set
    (``/home/site/wwwroot``) as Core Tools and the local host do, else the working directory, which the host
    starts the worker in."""
    return Path(environ.get(SCRIPT_ROOT, "").strip() or os.getcwd())


def renewal_seconds(environ: Mapping[str, str] = os.environ, host_json: Path | None = None) -> float:
    """How long the host renews a message's lock while its function runs, in seconds (inf: for ever), from
    ``host_json`` (default: the script root's). ConfigurationError naming where it came from when it is not a
    TimeSpan (the host would not start)."""
    text, source = environ.get(OVERRIDE, "").strip(), OVERRIDE
    if host_json is None:
        host_json = script_root(environ) / "host.json"
    if not text:
        try:
            section = json.loads(host_json.read_text()).get("extensions", {}).get("serviceBus", {})
        except (OSError, ValueError):
            section = {}
        text = str(section.get("maxAutoLockRenewalDuration", DEFAULT))
        source = "host.json extensions.serviceBus.maxAutoLockRenewalDuration"
    try:
        return timespan_seconds(text)
    except ValueError as exc:
        raise ConfigurationError(source, str(exc)) from None


def timespan_seconds(text: str) -> float:
    """A host.json TimeSpan in seconds; the infinite TimeSpan (-1 ms) is inf. ValueError otherwise."""
    match = _TIMESPAN.match(text.strip())
    if match is None:
        raise ValueError(f"maxAutoLockRenewalDuration {text!r} is not a TimeSpan such as 00:05:00")
    hours = int(match["days"] or 0) * 24 + int(match["hours"])
    seconds = (hours * 60 + int(match["minutes"])) * 60 + float(match["seconds"])
    if match["sign"]:
        # The extension takes no negative duration but Timeout.InfiniteTimeSpan (-1 ms): renewal for ever.
        if abs(seconds - 0.001) > 1e-9:
            raise ValueError(f"maxAutoLockRenewalDuration {text!r} is negative; only -00:00:00.001 (for ever) is")
        return math.inf
    return seconds


def held_until(locked_until: datetime | None, started: datetime, renewal: float) -> datetime | None:
    """Until when the host keeps a message's lock: the lock it came with, or its start plus the renewal
    duration, whichever is later. None when the lock is not known."""
    if locked_until is None:
        return None
    if renewal <= 0:
        return locked_until
    if math.isinf(renewal):
        return datetime.max.replace(tzinfo=locked_until.tzinfo)
    return max(locked_until, started + timedelta(seconds=renewal))
