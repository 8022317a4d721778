"""Sizes: parse `2MiB`, `8TiB`, `536870912`; print with binary units."""

from __future__ import annotations

import re

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40

_FACTORS = {
    "": 1,
    "b": 1,
    "k": KiB,
    "kb": 1000,
    "kib": KiB,
    "m": MiB,
    "mb": 1000**2,
    "mib": MiB,
    "g": GiB,
    "gb": 1000**3,
    "gib": GiB,
    "t": TiB,
    "tb": 1000**4,
    "tib": TiB,
    "p": 1 << 50,
    "pb": 1000**5,
    "pib": 1 << 50,
}

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


class SizeParseError(ValueError):
    pass


def parse_size(value: str | int) -> int:
    """Return a byte count. Integers pass through; strings take an optional unit suffix.

    Decimal units (MB, GB) mean powers of ten, binary ones (MiB, GiB) and bare letters (M, G)
    powers of two, as ndctl and the kernel's memparse do for the bare letters.
    """
    if isinstance(value, bool):
        raise SizeParseError(f"expected a size such as 2MiB or 536870912, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise SizeParseError(f"a size cannot be negative: {value}")
        return value
    if not isinstance(value, str):
        raise SizeParseError(f"expected a size such as 2MiB or 536870912, got {value!r}")
    match = _SIZE_RE.match(value)
    if not match:
        raise SizeParseError(f"expected a size such as 2MiB, 8TiB or 536870912, got {value!r}")
    number, unit = match.groups()
    factor = _FACTORS.get(unit.lower())
    if factor is None:
        raise SizeParseError(f"unknown size unit {unit!r} in {value!r} (use B, KiB, MiB, GiB, TiB)")
    if "." in number:
        whole = float(number) * factor
        if whole != int(whole):
            raise SizeParseError(f"{value!r} is not a whole number of bytes")
        return int(whole)
    return int(number) * factor


def format_size(n: int) -> str:
    """Binary units, exact where the number allows it (2 MiB, 8 TiB, 1.5 GiB), else two decimals."""
    if n < 0:
        return "-" + format_size(-n)
    for unit, factor in (("PiB", 1 << 50), ("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= factor:
            value = n / factor
            if n % factor == 0:
                return f"{n // factor} {unit}"
            return f"{value:.2f} {unit}"
    return f"{n} B"


def align_up(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def align_down(n: int, align: int) -> int:
    return n // align * align


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0
