"""Parse human-written quantities ("16GiB", "25GB/s", "125TFLOP/s") into base units.

Inside mcdla every quantity is in base units: bytes, seconds, FLOP, FLOP/s and bytes/s. Strings with units
are accepted only at the boundary (config files, CLI options) and converted here, once.
"""

from __future__ import annotations

import math
import re

from mcdla.errors import ConfigError, brief

__all__ = ["parse_bytes", "parse_bytes_per_s", "parse_flops_per_s", "parse_seconds", "parse_count", "format_bytes",
           "format_count", "format_duration", "format_seconds"]

_DECIMAL = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}
_BINARY = {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40, "pi": 2**50}
_NUMBER = r"(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"
_INFINITE = {"inf", "infinity", "unlimited"}


def _prefix_factor(prefix: str) -> float | None:
    p = prefix.lower()
    if p in _BINARY:
        return float(_BINARY[p])
    if p in _DECIMAL:
        return float(_DECIMAL[p])
    return None


def _parse(
    value: str | float | int, field: str, suffixes: tuple[str, ...], kind: str, example: str, *, require_unit: bool = False
) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"{field}: got {brief(value)}; must be a number or a string like {example!r}")
    if isinstance(value, (int, float)):
        if require_unit:
            raise ConfigError(f"{field}: got {brief(value)}; must be {kind} with a unit, like {example!r}")
        try:
            number = float(value)
        except OverflowError:
            raise ConfigError(f"{field}: got {brief(value)}; too large, must be a finite {kind.removeprefix('a ')}") from None
    elif isinstance(value, str):
        text = value.strip().replace(" ", "").replace("_", "")
        if text.lower() in _INFINITE:
            return math.inf
        if len(text) > 400:
            raise ConfigError(f"{field}: got {brief(value)}; must be {kind} like {example!r}")
        suffix_alt = "|".join(re.escape(s) for s in sorted(suffixes, key=len, reverse=True))
        m = re.fullmatch(_NUMBER + r"(?P<prefix>[kKmMgGtTpP]i?)?(?P<suffix>" + suffix_alt + r")?", text)
        if m is None:
            raise ConfigError(f"{field}: got {brief(value)}; must be {kind} like {example!r}")
        if require_unit and not (m.group("prefix") or m.group("suffix")):
            bare = f" (or {text + suffixes[0]!r} for bytes)" if len(text) <= 20 else ""
            raise ConfigError(
                f"{field}: got {brief(value)}; a bare number is ambiguous, must be {kind} with a unit, "
                f"like {example!r}{bare}"
            )
        factor = _prefix_factor(m.group("prefix") or "")
        if factor is None:  # pragma: no cover - regex only admits known prefixes
            raise ConfigError(f"{field}: got {brief(value)}; unknown unit prefix")
        number = float(m.group("num")) * factor
        if math.isinf(number):
            raise ConfigError(f"{field}: got {brief(value)}; too large, must be finite (or 'inf' for unlimited)")
    else:
        raise ConfigError(f"{field}: got {brief(value)}; must be a number or a string like {example!r}")
    if math.isnan(number) or number < 0:
        raise ConfigError(f"{field}: got {brief(value)}; must be >= 0")
    return number


def parse_bytes(value: str | float | int, field: str = "bytes", *, require_unit: bool = False) -> float:
    """Parse a size: ``"16GiB"`` -> 17179869184.0, ``"1.5GB"`` -> 1.5e9, ``4096`` -> 4096.0, ``"inf"``.

    With ``require_unit`` a bare number (``"12"``, ``12``) is refused as ambiguous: write ``"12B"`` or ``"12GiB"``.
    """
    return _parse(value, field, ("B", "bytes", "byte"), "a size", "16GiB", require_unit=require_unit)


def parse_bytes_per_s(value: str | float | int, field: str = "bandwidth") -> float:
    """Parse a bandwidth in bytes/s: ``"25GB/s"`` -> 25e9, ``"900GiB/s"``; bits are not accepted."""
    return _parse(value, field, ("B/s", "Bps", "bytes/s"), "a bandwidth in bytes/s", "25GB/s")


def parse_flops_per_s(value: str | float | int, field: str = "compute") -> float:
    """Parse a compute rate: ``"125TFLOP/s"`` -> 1.25e14, ``"15.7TFLOPS"``."""
    return _parse(value, field, ("FLOP/s", "FLOPS", "flop/s", "flops"), "a compute rate", "125TFLOP/s")


def parse_count(value: str | float | int, field: str = "count", *, noun: str = "tokens") -> float:
    """Parse a count with a decimal prefix: ``"1T"`` -> 1e12, ``"2.5G"``, ``"300B"`` refused (B reads as bytes: 300G),
    ``"15Ttokens"``; ``noun`` is the optional suffix (``tokens``)."""
    return _parse(value, field, (noun,), f"a number of {noun}", f"1T{noun}")


def parse_seconds(value: str | float | int, field: str = "time") -> float:
    """Parse a duration: ``"2us"`` -> 2e-6, ``"1.5ms"``, ``"3s"``, ``"500ns"``, plain numbers are seconds."""
    if isinstance(value, str):
        text = value.strip().replace(" ", "")
        m = re.fullmatch(_NUMBER + r"(?P<unit>ns|us|µs|ms|s)?", text) if len(text) <= 400 else None
        if m is None:
            raise ConfigError(f"{field}: got {brief(value)}; must be a duration like '2us'")
        scale = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, None: 1.0}[m.group("unit")]
        number = float(m.group("num")) * scale
        if not math.isfinite(number):
            raise ConfigError(f"{field}: got {brief(value)}; too large, must be a finite duration")
        if number < 0:
            raise ConfigError(f"{field}: got {brief(value)}; must be >= 0")
        return number
    number = _parse(value, field, ("s",), "a duration", "2us")
    if math.isinf(number):
        raise ConfigError(f"{field}: got {brief(value)}; must be a finite duration")
    return number


def format_bytes(n: float) -> str:
    """Render a byte count with a binary prefix: 17179869184 -> '16.00 GiB'."""
    if math.isinf(n):
        return "inf"
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= factor:
            return f"{n / factor:.2f} {unit}"
    return f"{n:.0f} B"


def format_seconds(t: float) -> str:
    """Render a duration with a suitable unit: 0.0123 -> '12.30 ms'."""
    if math.isinf(t):
        return "inf"
    for unit, factor in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(t) >= factor:
            return f"{t / factor:.2f} {unit}"
    return f"{t / 1e-9:.1f} ns"


def format_duration(seconds: float) -> str:
    """A long duration in the largest unit that keeps it >= 1 (years, days, hours, minutes), else
    :func:`format_seconds`: 3.2e7 -> '1.0 years' (a time to train)."""
    for unit, factor in (("years", 365.25 * 86400.0), ("days", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= factor:
            return f"{seconds / factor:.1f} {unit}"
    return format_seconds(seconds)


def format_count(n: float) -> str:
    """A count with a decimal prefix, as :func:`parse_count` reads it: 3e11 -> '300G', 1.5e12 -> '1.5T'."""
    for prefix, factor in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= factor:
            return f"{n / factor:.4g}{prefix}"
    return f"{n:.4g}"
