"""AMQP decimals on their own: IEEE BID in from senders, Service Bus's decimal128 layout out."""

from __future__ import annotations

from decimal import Decimal

import pytest
from azure.servicebus._pyamqp._decode import _decode_decimal128  # the pinned SDK's decoder
from proton import decimal32, decimal64, decimal128

from devservers.servicebus import decimals

DOTNET_MAX = Decimal(2**96 - 1)  # decimal.MaxValue (built from an int: Decimal arithmetic would round it)


def test_ieee_bid_decimals_of_every_width_are_read() -> None:
    # 1.5 = 15 x 10^-1: biased exponents 6175, 397 and 100; the coefficient in the low bits
    assert decimals.from_amqp(decimal128(bytes.fromhex("303e000000000000000000000000000f"))) == Decimal("1.5")
    assert decimals.from_amqp(decimal64((397 << 53) | 15)) == Decimal("1.5")
    assert decimals.from_amqp(decimal32((100 << 23) | 15)) == Decimal("1.5")
    assert decimals.from_amqp(decimal32((1 << 31) | (101 << 23) | 7)) == Decimal("-7")
    # a decimal32 coefficient of 2^23 or more uses the second form ("11" after the sign)
    large = (0b11 << 29) | (101 << 21) | (9_000_000 - (0b100 << 21))
    assert decimals.from_amqp(decimal32(large)) == Decimal(9_000_000)


@pytest.mark.parametrize(
    "raw",
    [
        decimal32(0x7C00_0000),  # NaN
        decimal64(0x7800_0000_0000_0000),  # +infinity
        decimal32((0b11 << 29) | (101 << 21) | (10_000_000 - (0b100 << 21))),  # 8 digits: not canonical
        decimal128(b"\x00" * 15),  # too short
    ],
)
def test_nan_infinity_and_non_canonical_encodings_are_refused(raw: decimal32 | decimal64 | decimal128) -> None:
    with pytest.raises(decimals.UnrepresentableDecimal):
        decimals.from_amqp(raw)


def test_service_bus_layout_shifts_the_exponent_by_nine_as_microsoft_azure_amqp_did() -> None:
    assert decimals.to_service_bus(Decimal("1.5")) == bytes.fromhex("0c3e0000" + "00" * 11 + "0f")
    assert decimals.to_service_bus(Decimal("-1.5"))[0] == 0x8C
    assert decimals.to_service_bus(DOTNET_MAX)[:2] == b"\x0c\x40"  # IEEE BID would start 0x30 0x40
    assert decimals.to_service_bus(Decimal("1E+2")) == decimals.to_service_bus(Decimal("100"))  # scale 0


@pytest.mark.parametrize(
    "value",
    [
        Decimal("1.5"),
        Decimal("-2.25"),
        Decimal("0"),
        Decimal("1E-28"),
        Decimal("1.50"),
        DOTNET_MAX,
        Decimal(-(2**96 - 1)),
    ],
)
def test_service_bus_layout_reads_back_exactly(value: Decimal) -> None:
    encoded = decimals.to_service_bus(value)
    assert decimals.from_service_bus(encoded) == value
    assert decimals.from_service_bus(encoded).as_tuple().exponent == min(0, int(value.as_tuple().exponent))


@pytest.mark.parametrize("value", [Decimal("1.5"), Decimal("-2.25"), Decimal("1E-28"), Decimal("4294967.295")])
def test_the_pinned_sdk_decodes_the_service_bus_layout(value: Decimal) -> None:
    _, decoded = _decode_decimal128(memoryview(decimals.to_service_bus(value)))
    assert decoded == value


@pytest.mark.parametrize(
    "value",
    [Decimal("1E-29"), Decimal("1.50000000000000000000000000000"), Decimal(2**96), Decimal("NaN"), Decimal("-Inf")],
)
def test_values_system_decimal_cannot_hold_are_refused(value: Decimal) -> None:
    with pytest.raises(decimals.UnrepresentableDecimal):
        decimals.to_service_bus(value)
