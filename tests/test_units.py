"""Unit parsing at the boundary."""

import math

import pytest

from mcdla.errors import ConfigError
from mcdla.units import format_bytes, format_seconds, parse_bytes, parse_bytes_per_s, parse_count, parse_flops_per_s, parse_seconds


@pytest.mark.parametrize(
    ("text", "expected"),
    [("16GiB", 16 * 2**30), ("1.5GB", 1.5e9), ("4096", 4096), (4096, 4096), ("2 MiB", 2 * 2**20), ("1.3TB", 1.3e12), ("inf", math.inf)],
)
def test_parse_bytes(text, expected) -> None:
    """Sizes parse with decimal and binary prefixes."""
    assert parse_bytes(text) == pytest.approx(expected)


def test_parse_rates_and_times() -> None:
    """Bandwidth, compute rate and duration parse to base units."""
    assert parse_bytes_per_s("25GB/s") == 25e9
    assert parse_flops_per_s("15.7TFLOP/s") == pytest.approx(15.7e12)
    assert parse_seconds("2us") == pytest.approx(2e-6)
    assert parse_seconds("1.5ms") == pytest.approx(1.5e-3)


@pytest.mark.parametrize("bad", ["-3GB", "16 GBB", "lots", True])
def test_bad_sizes_name_the_field(bad) -> None:
    """A bad size raises a one-line ConfigError naming the field and the value."""
    with pytest.raises(ConfigError) as info:
        parse_bytes(bad, "budget")
    msg = str(info.value)
    assert msg.startswith("budget: got ") and "\n" not in msg


def test_format_bytes_round_trips_magnitude() -> None:
    """format_bytes renders with a binary prefix that parse_bytes reads back."""
    assert parse_bytes(format_bytes(16 * 2**30)) == 16 * 2**30


def test_bare_number_refused_when_a_unit_is_required() -> None:
    """require_unit refuses '12' and 12 (ambiguous) and takes '12B' as 12 bytes."""
    for bare in ("12", 12):
        with pytest.raises(ConfigError, match="--budget: got .*12.*unit"):
            parse_bytes(bare, "--budget", require_unit=True)
    assert parse_bytes("12B", "--budget", require_unit=True) == 12
    assert parse_bytes("1.5GiB", "--budget", require_unit=True) == 1.5 * 2**30


@pytest.mark.parametrize("huge", [10**400, "1e999GB", "9" * 400])
def test_overflowing_sizes_are_refused_with_a_short_message(huge) -> None:
    """A 400-digit integer or an overflowing string is a one-line ConfigError, not inf or OverflowError."""
    with pytest.raises(ConfigError) as info:
        parse_bytes(huge, "hbm")
    assert "hbm: got" in str(info.value) and len(str(info.value)) < 200


def test_infinite_latency_is_refused() -> None:
    """A duration must be finite: 'inf' and 1e999 seconds are refused."""
    for bad in ("inf", float("inf"), "1e999s"):
        with pytest.raises(ConfigError, match="latency: got"):
            parse_seconds(bad, "latency")


def test_field_path_renders_locations_on_one_bounded_line() -> None:
    """Plain keys are dotted, indices bracketed, anything else quoted and cut (errors.field_path)."""
    from mcdla.errors import field_path

    assert field_path(("devices", 0, "name")) == "devices[0].name"
    assert field_path(("decisions", 2, "layer"), "plan") == "plan.decisions[2].layer"
    assert field_path(()) == "(top level)"
    assert field_path(("a\nb",)) == "['a\\nb']"
    long = field_path(("x" * 5000, 1))
    assert len(long) < 80 and long.endswith("...][1]")


def test_parse_count_takes_decimal_prefixes_and_refuses_bytes():
    """Token counts: 1T is 10**12 and 2.5G 2.5 * 10**9 (with or without 'tokens'); 300B is refused, B is bytes."""
    assert parse_count("1T") == 10**12 and parse_count("2.5G") == 2.5 * 10**9 and parse_count("15Ttokens") == 15 * 10**12
    with pytest.raises(ConfigError, match=r"^--train-tokens: got '300B'; must be a number of tokens"):
        parse_count("300B", "--train-tokens")


@pytest.mark.parametrize("n", [7.0, 2048.0, 3e11, 1.5e12, 15e12, 2.5e15])
def test_format_count_reads_back_through_parse_count(n):
    """A count written with a decimal prefix parses back to the same number (to its 4 significant digits)."""
    from mcdla.units import format_count

    assert parse_count(format_count(n)) == pytest.approx(n, rel=5e-4)


def test_format_duration_picks_the_largest_whole_unit():
    """Years, days, hours and minutes are used from one of them up; shorter times are format_seconds'."""
    from mcdla.units import format_duration

    year = 365.25 * 86400
    assert format_duration(2.5 * year) == "2.5 years"
    assert format_duration(3 * 86400) == "3.0 days"
    assert format_duration(5400) == "1.5 h"
    assert format_duration(90) == "1.5 min"
    assert format_duration(0.5) == format_seconds(0.5)
