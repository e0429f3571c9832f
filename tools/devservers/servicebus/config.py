"""Load the Service Bus emulator's ``Config.json`` into typed, validated settings.

The format is the official emulator's (``{"UserConfig": {"Namespaces": [...]}}``) so that one file can
drive both the emulator (in Docker, on a workstation) and this test broker (in CI). Missing
properties take the emulator's documented defaults. The emulator's upper limits (lock duration at
most 5 minutes, TTL at least 5 minutes, ...) are deliberately not enforced: tests need short
durations such as a 2 s lock or a 1 s TTL. Formats are checked strictly, and every error names the
JSON path of the offending value, because a typo in a test config should fail loudly at start-up
rather than turn into a silently different entity.

One property is this broker's own, not the emulator's: ``MaxMessageSizeInKilobytes`` on a queue or
topic stands for the Premium tier's per-entity message size (ARM's ``maxMessageSizeInKilobytes``) and
is held to ARM's range: an entity Service Bus cannot have would test nothing real.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ConfigError",
    "CorrelationFilter",
    "NamespaceConfig",
    "QueueConfig",
    "ReceiverSettings",
    "RuleConfig",
    "SubscriptionConfig",
    "TopicConfig",
    "load_config",
    "parse_config",
    "parse_duration",
]


class ConfigError(ValueError):
    """The configuration is not valid; the message names the offending JSON path."""


# Emulator defaults (https://learn.microsoft.com/azure/service-bus-messaging/overview-emulator).
DEFAULT_LOCK_DURATION = 60.0
DEFAULT_MESSAGE_TTL = 3600.0
DEFAULT_DUPLICATE_WINDOW = 20.0
DEFAULT_MAX_DELIVERY_COUNT = 3
#: Service Bus Standard's (and the emulator's) message size, header and properties included.
DEFAULT_MAX_MESSAGE_SIZE = 256 * 1024
#: ARM's range for a Premium entity's maxMessageSizeInKilobytes.
MAX_MESSAGE_SIZE_KB_RANGE = (1024, 102400)


@dataclass(frozen=True)
class ReceiverSettings:
    """Settings of an entity that messages are received from: a queue or a subscription.

    Durations are in seconds. ``forward_to`` and ``forward_dead_lettered_to`` are entity names, or
    None when the config leaves them empty (the emulator's examples write ``""``).
    """

    lock_duration: float = DEFAULT_LOCK_DURATION
    max_delivery_count: int = DEFAULT_MAX_DELIVERY_COUNT
    default_message_ttl: float = DEFAULT_MESSAGE_TTL
    dead_lettering_on_message_expiration: bool = False
    requires_session: bool = False
    forward_to: str | None = None
    forward_dead_lettered_to: str | None = None


@dataclass(frozen=True)
class QueueConfig:
    name: str
    settings: ReceiverSettings = field(default_factory=ReceiverSettings)
    requires_duplicate_detection: bool = False
    duplicate_detection_window: float = DEFAULT_DUPLICATE_WINDOW
    #: The largest encoded message (or batch transfer) the queue takes, in bytes.
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE


@dataclass(frozen=True)
class CorrelationFilter:
    """A correlation filter: every field that is set must equal the message's (AND of all of them).

    ``label`` is the message's subject; ``properties`` are compared with application properties.
    """

    correlation_id: str | None = None
    message_id: str | None = None
    to: str | None = None
    reply_to: str | None = None
    label: str | None = None
    session_id: str | None = None
    reply_to_session_id: str | None = None
    content_type: str | None = None
    properties: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RuleConfig:
    name: str
    filter: CorrelationFilter


@dataclass(frozen=True)
class SubscriptionConfig:
    name: str
    settings: ReceiverSettings = field(default_factory=ReceiverSettings)
    #: None means the config had no Rules: the subscription receives every message (Service Bus's
    #: ``$Default`` rule with a true filter).
    rules: tuple[RuleConfig, ...] | None = None


@dataclass(frozen=True)
class TopicConfig:
    name: str
    default_message_ttl: float = DEFAULT_MESSAGE_TTL
    requires_duplicate_detection: bool = False
    duplicate_detection_window: float = DEFAULT_DUPLICATE_WINDOW
    #: The largest encoded message (or batch transfer) the topic takes, in bytes.
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    subscriptions: tuple[SubscriptionConfig, ...] = ()


@dataclass(frozen=True)
class NamespaceConfig:
    name: str
    queues: tuple[QueueConfig, ...] = ()
    topics: tuple[TopicConfig, ...] = ()


_DURATION = re.compile(
    r"P(?!$)(?:(?P<years>\d+(?:\.\d+)?)Y)?(?:(?P<months>\d+(?:\.\d+)?)M)?(?:(?P<weeks>\d+(?:\.\d+)?)W)?"
    r"(?:(?P<days>\d+(?:\.\d+)?)D)?"
    r"(?:T(?!$)(?:(?P<hours>\d+(?:\.\d+)?)H)?(?:(?P<minutes>\d+(?:\.\d+)?)M)?(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?"
)
# Years and months have no fixed length; .NET's XmlConvert.ToTimeSpan, which Service Bus uses for
# these properties, counts 365 and 30 days.
_DURATION_UNITS = {
    "years": 365 * 86400.0,
    "months": 30 * 86400.0,
    "weeks": 7 * 86400.0,
    "days": 86400.0,
    "hours": 3600.0,
    "minutes": 60.0,
    "seconds": 1.0,
}


def parse_duration(text: str) -> float:
    """Seconds in an ISO 8601 duration such as ``PT1M``, ``PT2S``, ``PT0.5S`` or ``P1DT2H``."""
    match = _DURATION.fullmatch(text.strip().upper()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"{text!r} is not an ISO 8601 duration (e.g. 'PT1M', 'PT30S', 'P1D')")
    return sum(float(value) * _DURATION_UNITS[unit] for unit, value in match.groupdict().items() if value)


_RECEIVER_PROPERTIES = {
    "DeadLetteringOnMessageExpiration",
    "DefaultMessageTimeToLive",
    "ForwardDeadLetteredMessagesTo",
    "ForwardTo",
    "LockDuration",
    "MaxDeliveryCount",
    "RequiresSession",
}
_SENDABLE_PROPERTIES = {
    "DuplicateDetectionHistoryTimeWindow",
    "MaxMessageSizeInKilobytes",  # this broker's own (see the module docstring)
    "RequiresDuplicateDetection",
}
_QUEUE_PROPERTIES = _RECEIVER_PROPERTIES | _SENDABLE_PROPERTIES
_TOPIC_PROPERTIES = {"DefaultMessageTimeToLive"} | _SENDABLE_PROPERTIES
_CORRELATION_FIELDS = {
    "CorrelationId": "correlation_id",
    "MessageId": "message_id",
    "To": "to",
    "ReplyTo": "reply_to",
    "Label": "label",
    "Subject": "label",
    "SessionId": "session_id",
    "ReplyToSessionId": "reply_to_session_id",
    "ContentType": "content_type",
}


class _Reader:
    """Typed access to one JSON object, with errors that name the path."""

    def __init__(self, value: Any, path: str) -> None:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected an object, got {_json_type(value)}")
        self.value: dict[str, Any] = value
        self.path = path

    def child(self, key: str) -> _Reader:
        return _Reader(self.value.get(key, {}), f"{self.path}.{key}")

    def items(self, key: str) -> list[_Reader]:
        raw = self.value.get(key, [])
        if raw is None:
            return []
        if not isinstance(raw, list):
            raise ConfigError(f"{self.path}.{key}: expected a list, got {_json_type(raw)}")
        return [_Reader(item, f"{self.path}.{key}[{index}]") for index, item in enumerate(raw)]

    def check_keys(self, allowed: set[str]) -> None:
        unknown = sorted(set(self.value) - allowed)
        if unknown:
            raise ConfigError(
                f"{self.path}: unknown propert{'ies' if len(unknown) > 1 else 'y'} {', '.join(unknown)}; "
                f"known: {', '.join(sorted(allowed))}"
            )

    def name(self) -> str:
        value = self.value.get("Name")
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{self.path}.Name: expected a non-empty string")
        if "/" in value or "$" in value:
            raise ConfigError(f"{self.path}.Name: {value!r} may not contain '/' or '$' in this broker")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.value.get(key, default)
        if not isinstance(value, bool):
            raise ConfigError(f"{self.path}.{key}: expected true or false, got {value!r}")
        return value

    def duration(self, key: str, default: float) -> float:
        value = self.value.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise ConfigError(f"{self.path}.{key}: expected an ISO 8601 duration string, got {value!r}")
        try:
            seconds = parse_duration(value)
        except ValueError as err:
            raise ConfigError(f"{self.path}.{key}: {err}") from None
        if seconds <= 0:
            raise ConfigError(f"{self.path}.{key}: {value!r} must be longer than zero")
        return seconds

    def positive_int(self, key: str, default: int) -> int:
        value = self.value.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{self.path}.{key}: expected an integer >= 1, got {value!r}")
        return value

    def max_message_size(self, key: str) -> int:
        """Bytes from a size in kilobytes within ARM's range; the Standard tier's size when absent."""
        value = self.value.get(key)
        if value is None:
            return DEFAULT_MAX_MESSAGE_SIZE
        low, high = MAX_MESSAGE_SIZE_KB_RANGE
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ConfigError(
                f"{self.path}.{key}: expected an integer from {low} to {high} (the Premium tier's range; leave it "
                f"out for the Standard tier's 256 KB), got {value!r}"
            )
        return value * 1024

    def optional_name(self, key: str) -> str | None:
        value = self.value.get(key)
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            raise ConfigError(f"{self.path}.{key}: expected an entity name (string), got {value!r}")
        return value

    def optional_string(self, key: str) -> str | None:
        value = self.value.get(key)
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{self.path}.{key}: expected a string, got {value!r}")
        return value


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def _receiver_settings(props: _Reader) -> ReceiverSettings:
    return ReceiverSettings(
        lock_duration=props.duration("LockDuration", DEFAULT_LOCK_DURATION),
        max_delivery_count=props.positive_int("MaxDeliveryCount", DEFAULT_MAX_DELIVERY_COUNT),
        default_message_ttl=props.duration("DefaultMessageTimeToLive", DEFAULT_MESSAGE_TTL),
        dead_lettering_on_message_expiration=props.boolean("DeadLetteringOnMessageExpiration", False),
        requires_session=props.boolean("RequiresSession", False),
        forward_to=props.optional_name("ForwardTo"),
        forward_dead_lettered_to=props.optional_name("ForwardDeadLetteredMessagesTo"),
    )


def _rule(reader: _Reader) -> RuleConfig:
    name = reader.name()
    reader.check_keys({"Name", "Properties"})
    props = reader.child("Properties")
    filter_type = props.value.get("FilterType", "Correlation")
    if not isinstance(filter_type, str) or filter_type.lower() != "correlation":
        raise ConfigError(
            f"{props.path}.FilterType: {filter_type!r} is not supported; this test broker evaluates "
            "only Correlation filters (SQL filters and rule actions are not implemented)"
        )
    unsupported = sorted(set(props.value) - {"FilterType", "CorrelationFilter"})
    if unsupported:
        raise ConfigError(
            f"{props.path}: {', '.join(unsupported)} not supported; only FilterType 'Correlation' with a "
            "CorrelationFilter is implemented"
        )
    raw = props.child("CorrelationFilter")
    raw.check_keys({*_CORRELATION_FIELDS, "Properties"})
    fields: dict[str, Any] = {attr: raw.optional_string(key) for key, attr in _CORRELATION_FIELDS.items()}
    fields["label"] = raw.optional_string("Label") or raw.optional_string("Subject")
    user_properties = raw.value.get("Properties") or {}
    if not isinstance(user_properties, dict):
        raise ConfigError(f"{raw.path}.Properties: expected an object, got {_json_type(user_properties)}")
    for key, value in user_properties.items():
        if isinstance(value, dict | list) or value is None:
            raise ConfigError(f"{raw.path}.Properties.{key}: expected a string, number or boolean")
    return RuleConfig(name=name, filter=CorrelationFilter(**fields, properties=dict(user_properties)))


def parse_config(document: Any) -> NamespaceConfig:
    """Validate a parsed ``Config.json`` document; raises ConfigError naming the bad value."""
    root = _Reader(document, "$")
    user = root.child("UserConfig")
    namespaces = user.items("Namespaces")
    if len(namespaces) != 1:
        raise ConfigError(
            f"{user.path}.Namespaces: expected exactly one namespace (as the emulator), got {len(namespaces)}"
        )
    ns = namespaces[0]
    seen: dict[str, str] = {}

    def register(name: str, path: str) -> None:
        key = name.lower()  # Service Bus entity names are case-insensitive
        if key in seen:
            raise ConfigError(f"{path}.Name: {name!r} is already used by {seen[key]}")
        seen[key] = path

    queues = []
    for reader in ns.items("Queues"):
        name = reader.name()
        register(name, reader.path)
        reader.check_keys({"Name", "Properties"})
        props = reader.child("Properties")
        props.check_keys(_QUEUE_PROPERTIES)
        queues.append(
            QueueConfig(
                name=name,
                settings=_receiver_settings(props),
                requires_duplicate_detection=props.boolean("RequiresDuplicateDetection", False),
                duplicate_detection_window=props.duration(
                    "DuplicateDetectionHistoryTimeWindow", DEFAULT_DUPLICATE_WINDOW
                ),
                max_message_size=props.max_message_size("MaxMessageSizeInKilobytes"),
            )
        )
    topics = []
    for reader in ns.items("Topics"):
        name = reader.name()
        register(name, reader.path)
        reader.check_keys({"Name", "Properties", "Subscriptions"})
        props = reader.child("Properties")
        props.check_keys(_TOPIC_PROPERTIES)
        subscriptions = []
        sub_names: set[str] = set()
        for sub_reader in reader.items("Subscriptions"):
            sub_name = sub_reader.name()
            if sub_name.lower() in sub_names:
                raise ConfigError(f"{sub_reader.path}.Name: duplicate subscription {sub_name!r}")
            sub_names.add(sub_name.lower())
            sub_reader.check_keys({"Name", "Properties", "Rules"})
            sub_props = sub_reader.child("Properties")
            sub_props.check_keys(_RECEIVER_PROPERTIES)
            rules: tuple[RuleConfig, ...] | None = None
            if "Rules" in sub_reader.value:
                rules = tuple(_rule(rule) for rule in sub_reader.items("Rules"))
                rule_names = [rule.name.lower() for rule in rules]
                if len(set(rule_names)) != len(rule_names):
                    raise ConfigError(f"{sub_reader.path}.Rules: rule names must be unique")
            subscriptions.append(SubscriptionConfig(name=sub_name, settings=_receiver_settings(sub_props), rules=rules))
        topics.append(
            TopicConfig(
                name=name,
                default_message_ttl=props.duration("DefaultMessageTimeToLive", DEFAULT_MESSAGE_TTL),
                requires_duplicate_detection=props.boolean("RequiresDuplicateDetection", False),
                duplicate_detection_window=props.duration(
                    "DuplicateDetectionHistoryTimeWindow", DEFAULT_DUPLICATE_WINDOW
                ),
                max_message_size=props.max_message_size("MaxMessageSizeInKilobytes"),
                subscriptions=tuple(subscriptions),
            )
        )
    config = NamespaceConfig(name=ns.name(), queues=tuple(queues), topics=tuple(topics))
    _check_forwarding(config)
    return config


def _check_forwarding(config: NamespaceConfig) -> None:
    """Forwarding targets must exist; a queue may not forward to itself."""
    names = {q.name.lower() for q in config.queues} | {t.name.lower() for t in config.topics}
    owners: list[tuple[str, str, ReceiverSettings]] = [(f"queue {q.name!r}", q.name, q.settings) for q in config.queues]
    owners += [(f"subscription {t.name}/{s.name!r}", "", s.settings) for t in config.topics for s in t.subscriptions]
    for label, own_name, settings in owners:
        for prop, target in (
            ("ForwardTo", settings.forward_to),
            ("ForwardDeadLetteredMessagesTo", settings.forward_dead_lettered_to),
        ):
            if target is None:
                continue
            if target.lower() not in names:
                raise ConfigError(f"{label}: {prop} names {target!r}, which is not a queue or topic in the config")
            if target.lower() == own_name.lower():
                raise ConfigError(f"{label}: {prop} may not name the entity itself")


def load_config(source: str | Path | dict[str, Any]) -> NamespaceConfig:
    """Read and validate a Config.json file (path) or an already-parsed document (dict)."""
    if isinstance(source, dict):
        return parse_config(source)
    path = Path(source)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as err:
        raise ConfigError(f"cannot read {path}: {err.strerror or err}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path}: not valid JSON: {err}") from None
    try:
        return parse_config(document)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
