"""AMQP decimals in application properties, as Service Bus carries them.

Service Bus holds application properties as .NET values: an AMQP decimal becomes a ``System.Decimal``
(a 96-bit coefficient and a scale of 0 to 28) and goes back out as a ``decimal128`` written by
Microsoft.Azure.Amqp's encoder. That encoder puts the biased exponent's high bits in the first byte
shifted right by 9 where IEEE 754-2008 (BID, which AMQP names) shifts by 7 (Azure/azure-amqp PR #316,
2026, fixed it in the library), and azure-servicebus 7.15's decoder reads exactly that layout: it was
written against what Service Bus delivers (azure-sdk-for-python #38717, PR #39511). Its *encoder*
writes IEEE BID, which Service Bus decodes correctly and re-encodes.

So a broker that passes the sender's bytes through hands the SDK a decimal it cannot decode: it
raises ValueError for ``Decimal("1.5")``, which its receive loop takes for a timeout, and the message
is never returned (locked, redelivered, dead-lettered). The broker does what Service Bus does: it
reads the sender's decimal (IEEE BID: decimal32, decimal64 or decimal128), and keeps it in Service
Bus's layout. A positive exponent is multiplied out (scale 0), as Microsoft.Azure.Amqp's decoder does.
A value ``System.Decimal`` cannot hold is refused on send: a scale above 28 (.NET's decimal
constructor throws; trailing zeros are not dropped, .NET keeps them), a coefficient of 2**96 or more
(Microsoft.Azure.Amqp reads only the low 96 bits: Service Bus would corrupt it silently, the broker
refuses it), NaN or infinity.
"""

from __future__ import annotations

from decimal import Decimal

from proton import decimal32, decimal64, decimal128

__all__ = ["AMQP_DECIMALS", "UnrepresentableDecimal", "from_amqp", "from_service_bus", "to_service_bus"]

AMQP_DECIMALS = (decimal32, decimal64, decimal128)

# width: (exponent bits, exponent bias, largest canonical coefficient), IEEE 754-2008 BID
_FORMATS = {32: (8, 101, 10**7 - 1), 64: (10, 398, 10**16 - 1), 128: (14, 6176, 10**34 - 1)}
_MAX_SCALE = 28  # System.Decimal
_COEFFICIENT_LIMIT = 2**96  # System.Decimal
_BIAS_128 = 6176


class UnrepresentableDecimal(ValueError):
    """A decimal that Service Bus (System.Decimal) cannot hold, or not a number at all."""


def from_amqp(value: decimal32 | decimal64 | decimal128) -> Decimal:
    """The value of an AMQP decimal as its sender encoded it (IEEE 754-2008, binary integer decimal)."""
    if isinstance(value, decimal128):
        if len(value) != 16:
            raise UnrepresentableDecimal("a decimal128 has 16 bytes")
        return _from_bid(int.from_bytes(value, "big"), 128)
    return _from_bid(int(value), 64 if isinstance(value, decimal64) else 32)


def _from_bid(bits: int, width: int) -> Decimal:
    exponent_bits, bias, largest = _FORMATS[width]
    coefficient_bits = width - 1 - exponent_bits
    sign = bits >> (width - 1)
    if (bits >> (width - 3)) & 0b11 == 0b11:
        if (bits >> (width - 5)) & 0b11 == 0b11:
            raise UnrepresentableDecimal("NaN and infinity are not numbers Service Bus can hold")
        exponent = (bits >> (coefficient_bits - 2)) & ((1 << exponent_bits) - 1)
        coefficient = (0b100 << (coefficient_bits - 2)) | (bits & ((1 << (coefficient_bits - 2)) - 1))
    else:
        exponent = (bits >> coefficient_bits) & ((1 << exponent_bits) - 1)
        coefficient = bits & ((1 << coefficient_bits) - 1)
    if coefficient > largest:
        raise UnrepresentableDecimal(f"the coefficient {coefficient} is not a canonical decimal{width}")
    return _decimal(sign, coefficient, exponent - bias)


def _decimal(sign: int, coefficient: int, exponent: int) -> Decimal:
    return Decimal((sign, tuple(int(digit) for digit in str(coefficient)), exponent))


def to_service_bus(value: Decimal) -> decimal128:
    """``value`` as Service Bus sends a System.Decimal; raises UnrepresentableDecimal if it cannot be one."""
    if not value.is_finite():
        raise UnrepresentableDecimal(f"{value} is not a number Service Bus can hold")
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)  # finite
    coefficient = int("".join(map(str, digits)) or "0")
    if exponent > 0:
        coefficient, scale = coefficient * 10**exponent, 0
    else:
        scale = -exponent
    if scale > _MAX_SCALE:
        raise UnrepresentableDecimal(f"{value} has {scale} decimal places; Service Bus (System.Decimal) holds 28")
    if coefficient >= _COEFFICIENT_LIMIT:
        raise UnrepresentableDecimal(f"{value} is out of the range of Service Bus's decimal (System.Decimal)")
    exponent_field = _BIAS_128 - scale
    first = (0x80 if sign else 0) | (exponent_field >> 9)  # Microsoft.Azure.Amqp's shift (IEEE: >> 7)
    second = (exponent_field & 0x7F) << 1
    return decimal128(bytes([first, second, 0, 0]) + coefficient.to_bytes(12, "big"))


def from_service_bus(value: decimal128) -> Decimal:
    """The value of a decimal128 in Service Bus's layout (what :func:`to_service_bus` wrote)."""
    exponent_field = ((value[0] & 0x7F) << 9) | (value[1] >> 1)
    return _decimal(value[0] >> 7, int.from_bytes(value[4:16], "big"), exponent_field - _BIAS_128)
