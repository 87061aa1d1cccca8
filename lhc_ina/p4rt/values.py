"""P4Runtime values: ints, dotted IPv4 and colon MAC strings to and from the canonical byte strings
P4Runtime requires (big-endian, shortest form, zero as one byte), checked against the P4Info width."""

from __future__ import annotations

import ipaddress
import re

#: What a caller may pass where a P4 value is expected: an int, "10.0.0.1", "02:00:00:00:00:01", or bytes.
Value = int | str | bytes | ipaddress.IPv4Address

_MAC = re.compile(r"^[0-9a-fA-F]{1,2}(:[0-9a-fA-F]{1,2}){5}$")


class P4RuntimeValueError(ValueError):
    """A value that cannot be encoded for a field or parameter (too wide, wrong form)."""


def value_to_int(value: Value) -> int:
    """An int from an int, bytes (big-endian), an IPv4 address or a MAC address string."""
    if isinstance(value, bool):
        raise P4RuntimeValueError(f"a P4 value cannot be a bool ({value!r})")
    if isinstance(value, int):
        return value
    if isinstance(value, ipaddress.IPv4Address):
        return int(value)
    if isinstance(value, bytes):
        return int.from_bytes(value, "big")
    if isinstance(value, str):
        if _MAC.match(value):
            return int("".join(f"{int(part, 16):02x}" for part in value.split(":")), 16)
        try:
            return int(ipaddress.IPv4Address(value))
        except ipaddress.AddressValueError:
            pass
        raise P4RuntimeValueError(f"{value!r} is neither an IPv4 address nor a MAC address")
    raise P4RuntimeValueError(f"cannot encode {value!r} ({type(value).__name__}) as a P4 value")


def encode_value(value: Value, bitwidth: int, what: str = "value") -> bytes:
    """The canonical P4Runtime byte string of ``value``: big-endian, no leading zero bytes, zero as b"\\0".

    P4Runtime (since 1.3) reads values in this shortest form and servers answer reads in it, so entries
    written and read back compare equal. ``what`` names the field in the error when the value does not fit.
    """
    number = value_to_int(value)
    if number < 0:
        raise P4RuntimeValueError(f"{what}: {value!r} is negative")
    if number >= 1 << bitwidth:
        raise P4RuntimeValueError(f"{what}: {value!r} does not fit in {bitwidth} bits")
    return canonical(number)


def canonical(number: int) -> bytes:
    """The shortest big-endian byte string of a non-negative ``number``, zero as b"\\0": the form P4Runtime
    servers answer reads in."""
    return number.to_bytes(max(1, (number.bit_length() + 7) // 8), "big")


def decode_value(data: bytes) -> int:
    """The unsigned int a P4Runtime byte string encodes (any length, leading zeros allowed)."""
    return int.from_bytes(data, "big")


