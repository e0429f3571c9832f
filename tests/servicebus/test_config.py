"""Config.json loading: the emulator's format, its defaults, and clear errors for what is wrong or unsupported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from devservers.servicebus.config import ConfigError, load_config, parse_duration

REPO_ROOT = Path(__file__).resolve().parents[2]


def _config(queues: list[dict[str, Any]] | None = None, topics: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"UserConfig": {"Namespaces": [{"Name": "ns", "Queues": queues or [], "Topics": topics or []}]}}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("PT1M", 60), ("PT2S", 2), ("PT0.5S", 0.5), ("PT1H", 3600), ("P1D", 86400), ("P1DT2H3M4S", 93784), ("pt5m", 300)],
)
def test_parse_duration_reads_iso_8601(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["1m", "PT", "P", "60", "PT1X", "00:01:00", ""])
def test_parse_duration_rejects_other_formats(text: str) -> None:
    with pytest.raises(ValueError, match="ISO 8601"):
        parse_duration(text)


def test_missing_properties_take_the_emulator_defaults() -> None:
    config = load_config(_config(queues=[{"Name": "q"}], topics=[{"Name": "t", "Subscriptions": [{"Name": "s"}]}]))
    [queue] = config.queues
    assert queue.settings.lock_duration == 60
    assert queue.settings.max_delivery_count == 3
    assert queue.settings.default_message_ttl == 3600
    assert queue.settings.dead_lettering_on_message_expiration is False
    assert queue.settings.requires_session is False
    assert queue.requires_duplicate_detection is False and queue.duplicate_detection_window == 20
    assert queue.max_message_size == 256 * 1024  # the Standard tier's
    [topic] = config.topics
    assert topic.default_message_ttl == 3600
    assert topic.max_message_size == 256 * 1024
    assert topic.subscriptions[0].rules is None  # no Rules: every message matches


def test_the_repository_example_config_loads() -> None:
    config = load_config(REPO_ROOT / "infra" / "local" / "servicebus" / "Config.json")
    assert {q.name for q in config.queues} >= {"orders"}
    orders = next(q for q in config.queues if q.name == "orders")
    assert orders.settings.max_delivery_count == 10 and orders.requires_duplicate_detection


def test_max_message_size_in_kilobytes_sets_a_queues_and_a_topics_limit_in_bytes() -> None:
    config = load_config(
        _config(
            queues=[{"Name": "q", "Properties": {"MaxMessageSizeInKilobytes": 1024}}],
            topics=[{"Name": "t", "Properties": {"MaxMessageSizeInKilobytes": 102400}}],
        )
    )
    assert config.queues[0].max_message_size == 1024 * 1024
    assert config.topics[0].max_message_size == 100 * 1024 * 1024


@pytest.mark.parametrize("value", [256, 1023, 102401, "1024", 1024.0, True])
def test_max_message_size_outside_the_premium_range_is_refused_at_start_up(value: object) -> None:
    document = _config(queues=[{"Name": "q", "Properties": {"MaxMessageSizeInKilobytes": value}}])
    path = r"Queues\[0\]\.Properties\.MaxMessageSizeInKilobytes"
    with pytest.raises(ConfigError, match=path + ": expected an integer from 1024 to 102400"):
        load_config(document)


def test_a_subscription_has_no_max_message_size_of_its_own() -> None:
    subscription = {"Name": "s", "Properties": {"MaxMessageSizeInKilobytes": 1024}}
    with pytest.raises(ConfigError, match="unknown property MaxMessageSizeInKilobytes"):
        load_config(_config(topics=[{"Name": "t", "Subscriptions": [subscription]}]))


def test_correlation_filter_fields_are_read() -> None:
    rule = {
        "Name": "r",
        "Properties": {
            "FilterType": "Correlation",
            "CorrelationFilter": {"CorrelationId": "c", "Label": "invoice", "Properties": {"region": "eu", "n": 2}},
        },
    }
    config = load_config(_config(topics=[{"Name": "t", "Subscriptions": [{"Name": "s", "Rules": [rule]}]}]))
    rules = config.topics[0].subscriptions[0].rules
    assert rules is not None
    [loaded] = rules
    assert loaded.filter.correlation_id == "c" and loaded.filter.label == "invoice"
    assert loaded.filter.properties == {"region": "eu", "n": 2}


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (_config(queues=[{"Name": "q", "Properties": {"LockDuration": 60}}]), r"Queues\[0\]\.Properties\.LockDuration"),
        (
            _config(queues=[{"Name": "q", "Properties": {"MaxDeliveryCount": 0}}]),
            "MaxDeliveryCount: expected an integer",
        ),
        (_config(queues=[{"Name": "q", "Properties": {"RequiresSession": "yes"}}]), "expected true or false"),
        (_config(queues=[{"Name": "q", "Properties": {"LockDurations": "PT1M"}}]), "unknown property LockDurations"),
        (_config(queues=[{"Name": "q"}, {"Name": "Q"}]), "already used"),
        (_config(queues=[{"Name": "q", "Properties": {"ForwardTo": "nowhere"}}]), "ForwardTo names 'nowhere'"),
        ({"UserConfig": {"Namespaces": []}}, "exactly one namespace"),
        ({"UserConfig": []}, "expected an object"),
    ],
)
def test_invalid_values_are_reported_with_their_path(document: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(document)


def test_sql_filters_are_rejected_at_start_up() -> None:
    rule = {"Name": "r", "Properties": {"FilterType": "Sql", "SqlFilter": {"SqlExpression": "region = 'eu'"}}}
    with pytest.raises(ConfigError, match="only Correlation filters"):
        load_config(_config(topics=[{"Name": "t", "Subscriptions": [{"Name": "s", "Rules": [rule]}]}]))


def test_unreadable_file_and_bad_json_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.json")
    broken = tmp_path / "Config.json"
    broken.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(broken)
    valid = tmp_path / "ok.json"
    valid.write_text(json.dumps(_config(queues=[{"Name": "q"}])))
    assert load_config(valid).queues[0].name == "q"
