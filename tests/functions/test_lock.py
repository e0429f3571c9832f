"""A delivery decides its leases and its waits on the lock as the host keeps it, renewal included.

The Functions host renews a message's lock while its function runs, for up to
``maxAutoLockRenewalDuration`` (host.json: 5 minutes). A delivery whose lock, as it came, ran out a
moment ago still holds it: it must not call it lost, abandon, and so spend a delivery. Where the host
renews nothing (the duration 0), the same delivery does find its lock gone.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import azure.functions as func
import pytest

from consumers.triggers import make_blueprint
from devservers.fulfilment import FulfilmentServer
from idempotent_consumer.errors import ConfigurationError
from idempotent_consumer.functions import lock_renewal
from shared.adapters.http import HttpFulfilment
from shared.settings import Settings
from tests.functions.conftest import Deliverer, Harness, Root, user_functions
from tests.functions.test_reservation import CrashAfterCall, record
from tests.support.fake_host import FakeHost
from tests.support.orders import encode, order_body

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def real(fulfilment: FulfilmentServer, loop: asyncio.Runner) -> Iterator[HttpFulfilment]:
    """The real HTTP adapter, closed on the loop at the end."""
    adapter = HttpFulfilment(fulfilment.url, connect_timeout=2, read_timeout=2)
    yield adapter
    loop.run(adapter.close())


def _functions(root: Root, monkeypatch: pytest.MonkeyPatch, renewal: str | None) -> dict[str, Callable[..., Any]]:
    """The functions as the host indexes them, with host.json's renewal, or the app setting's override."""
    if renewal is not None:
        monkeypatch.setenv(lock_renewal.OVERRIDE, renewal)
    app = func.FunctionApp()
    app.register_functions(make_blueprint(Settings(), root))
    return user_functions(app)


@pytest.mark.parametrize(("renewal", "settled"), [(None, "complete"), ("00:00:00", "abandon")],
                         ids=["host.json renews for 5 minutes", "no renewal"])
def test_a_redelivery_whose_lock_as_received_ran_out_takes_its_claim_over_while_the_host_renews_it(
    app_on_cosmos: Harness, fake_host: FakeHost, root: Root, loop: asyncio.Runner, monkeypatch: pytest.MonkeyPatch,
    real: HttpFulfilment, renewal: str | None, settled: str,
) -> None:
    deliver = Deliverer(fake_host, _functions(root, monkeypatch, renewal), "process_order", loop)
    order_id = f"ord-{uuid.uuid4()}"
    body = encode(order_body(order_id))
    app_on_cosmos.reconfigure(fulfilment=CrashAfterCall(real))
    assert deliver(body, message_id=order_id, sequence_number=7)[0].action == "abandon"  # claimed, then crashed
    app_on_cosmos.reconfigure(fulfilment=real)
    ran_out = datetime.now(UTC) - timedelta(seconds=1)  # its lock as received: gone, unless the host renews it
    [settlement] = deliver(body, message_id=order_id, sequence_number=7, locked_until=ran_out)
    assert settlement.action == settled
    assert record(app_on_cosmos, order_id)["status"] == ("completed" if settled == "complete" else "in_progress")


def test_the_renewal_is_read_from_host_json_and_the_app_setting_overrides_it() -> None:
    assert lock_renewal.renewal_seconds({lock_renewal.SCRIPT_ROOT: str(ROOT)}) == 300.0  # host.json: 00:05:00
    assert lock_renewal.renewal_seconds({lock_renewal.OVERRIDE: "00:00:30"}) == 30.0
    assert lock_renewal.renewal_seconds({lock_renewal.OVERRIDE: "1.00:00:00"}) == 86400.0
    assert lock_renewal.renewal_seconds({lock_renewal.OVERRIDE: "-00:00:00.0010000"}) == float("inf")
    with pytest.raises(ConfigurationError, match=f"{lock_renewal.OVERRIDE}: .*not a TimeSpan"):
        lock_renewal.renewal_seconds({lock_renewal.OVERRIDE: "five minutes"})
    with pytest.raises(ConfigurationError, match="negative"):
        lock_renewal.renewal_seconds({lock_renewal.OVERRIDE: "-00:01:00"})


def test_a_message_lock_is_held_until_the_later_of_its_own_end_and_the_renewals_end() -> None:
    now = datetime.now(UTC)
    soon, later = now + timedelta(seconds=60), now + timedelta(seconds=600)
    assert lock_renewal.held_until(soon, now, 300) == now + timedelta(seconds=300)
    assert lock_renewal.held_until(later, now, 300) == later
    assert lock_renewal.held_until(soon, now, 0) == soon
    assert lock_renewal.held_until(None, now, 300) is None


def test_host_json_is_read_from_the_script_root_not_from_beside_the_library(tmp_path: Path) -> None:
    (tmp_path / "host.json").write_text(json.dumps(
        {"version": "2.0", "extensions": {"serviceBus": {"maxAutoLockRenewalDuration": "00:01:00"}}}))
    assert lock_renewal.script_root({lock_renewal.SCRIPT_ROOT: str(tmp_path)}) == tmp_path
    assert lock_renewal.renewal_seconds({lock_renewal.SCRIPT_ROOT: str(tmp_path)}) == 60.0
    assert not (Path(lock_renewal.__file__).parent / "host.json").exists()
    assert lock_renewal.renewal_seconds({lock_renewal.SCRIPT_ROOT: str(tmp_path / "none")}) == 300.0  # the default

