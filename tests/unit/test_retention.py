"""Markers must outlive every way a message can come back; the app refuses to start otherwise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from idempotent_consumer.errors import ConfigurationError
from shared.settings import Retention, Settings

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_satisfy_the_rule() -> None:
    retention = Settings.from_env({}).retention
    assert retention.check() is retention
    assert retention.required_seconds == 60 * 10 + 14400 + 86400 + 604800


def test_window_adds_redeliveries_delayed_retries_message_ttl_and_resubmit_grace() -> None:
    retention = Retention(lock_duration_seconds=30, max_delivery_count=4, message_ttl_seconds=1000,
                          resubmit_grace_seconds=500, dedup_ttl_seconds=1820, retry_total_seconds=200)
    assert retention.required_seconds == 30 * 4 + 200 + 1000 + 500
    retention.check()


def test_without_delayed_retries_their_limit_does_not_count() -> None:
    retention = Settings.from_env({"DELAYED_RETRIES": "false"}).retention
    assert retention.required_seconds == 60 * 10 + 86400 + 604800


def test_short_dedup_ttl_is_refused_with_the_computation() -> None:
    retention = Retention(60, 10, 3600, 600, 4799)
    with pytest.raises(ConfigurationError) as caught:
        retention.check()
    message = str(caught.value)
    assert "DEDUP_TTL_SECONDS" in message
    assert ("lock 60 s x 10 deliveries + delayed retries 0 s + message TTL 3600 s + resubmit grace 600 s = 4800 s"
            in message)


@pytest.mark.parametrize("setting", ["SERVICEBUS_MAX_DELIVERY_COUNT", "DEDUP_TTL_SECONDS"])
def test_malformed_numbers_name_the_setting(setting: str) -> None:
    with pytest.raises(ConfigurationError, match=setting):
        Settings.from_env({setting: "ten"})


def test_app_refuses_to_start_when_markers_would_expire_too_soon() -> None:
    env = {"PATH": "/usr/bin:/bin", "DEDUP_TTL_SECONDS": "3600"}
    run = subprocess.run([sys.executable, "-c", "import function_app"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode != 0
    assert "DEDUP_TTL_SECONDS" in run.stderr
    assert "= 706200 s" in run.stderr


def test_the_refusal_names_the_queue_the_consumers_prefix_and_the_computation() -> None:
    with pytest.raises(ConfigurationError) as caught:
        Retention(60, 10, 3600, 600, 4799).check("payments", "PAYMENTS_")
    assert caught.value.setting == "PAYMENTS_DEDUP_TTL_SECONDS"
    assert str(caught.value).startswith("setting PAYMENTS_DEDUP_TTL_SECONDS: for queue payments, 4799 s is shorter")


def test_the_app_checks_the_rule_for_each_of_its_queues(monkeypatch: pytest.MonkeyPatch) -> None:
    from consumers.triggers import make_blueprint  # noqa: PLC0415 - the app's wiring, imported by this test only

    checked: list[str | None] = []
    real = Retention.check

    def check(self: Retention, queue: str | None = None, prefix: str = "") -> Retention:
        checked.append(queue)
        return real(self, queue, prefix)

    monkeypatch.setattr(Retention, "check", check)
    make_blueprint(Settings.from_env({"ORDERS_QUEUE": "o-1", "ORDER_EVENTS_QUEUE": "e-1"}), lambda: None)  # type: ignore[arg-type,return-value]
    assert checked == ["o-1", "e-1"]
