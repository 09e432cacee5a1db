"""Human units: parse, format back, and say what went wrong."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dualpath import units


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80GiB", 80 * 2**30),
        ("500GB", 500e9),
        ("64KiB", 65536),
        ("4096", 4096),
        ("1.5 TB", 1.5e12),
        (512, 512),
    ],
)
def test_parse_bytes(text: str, expected: float) -> None:
    assert units.parse_bytes(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("400Gbps", 50e9),
        ("8Gbit/s", 1e9),
        ("8Gb/s", 1e9),
        ("50GB/s", 50e9),
        ("3.35TB/s", 3.35e12),
        ("64GiB/s", 64 * 2**30),
        ("50GBps", 50e9),
        (1e9, 1e9),
    ],
)
def test_parse_bandwidth_tells_bits_from_bytes(text: str, expected: float) -> None:
    assert units.parse_bandwidth(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("300ms", 0.3),
        ("5s", 5.0),
        ("2us", 2e-6),
        ("2µs", 2e-6),
        ("1.5min", 90.0),
        ("250ns", 250e-9),
        ("2h", 7200),
    ],
)
def test_parse_duration(text: str, expected: float) -> None:
    assert units.parse_duration(text) == pytest.approx(expected)


def test_parse_flops_rate() -> None:
    assert units.parse_flops_rate("989TFLOPS") == pytest.approx(989e12)
    assert units.parse_flops_rate("1.979PFLOP/s") == pytest.approx(1.979e15)


@pytest.mark.parametrize(
    ("text", "expected"), [("64K", 64000), ("16Ki", 16384), ("1M", 10**6), ("429", 429), (7, 7)]
)
def test_parse_tokens_k_is_1000_and_ki_is_1024(text: str, expected: int) -> None:
    assert units.parse_tokens(text) == expected


@pytest.mark.parametrize(
    ("parse", "text", "fragment"),
    [
        (units.parse_bytes, "80GiBs", "unknown unit 'GiBs'"),
        (units.parse_bytes, "lots", "80GiB"),
        (units.parse_bandwidth, "400Gbs", "400Gbps"),
        (units.parse_bandwidth, "50GB", "unknown unit 'GB'"),
        (units.parse_duration, "-5s", ">= 0"),
        (units.parse_tokens, "1.5", "whole number"),
        (units.parse_flops_rate, float("nan"), "finite"),
        (units.parse_flops_rate, "1e999TFLOPS", "finite"),
    ],
)
def test_errors_name_the_value_and_give_an_example(parse: object, text: str | float, fragment: str) -> None:
    with pytest.raises(units.UnitError) as error:
        parse(text)  # type: ignore[operator]
    assert repr(text) in str(error.value) or str(text) in str(error.value)
    assert fragment in str(error.value)


def test_bool_is_not_a_number() -> None:
    with pytest.raises(units.UnitError):
        units.parse_bytes(True)


def test_formatters() -> None:
    assert units.format_bytes(80 * 2**30) == "80 GiB"
    assert units.format_bytes(500e9, binary=False) == "500 GB"
    assert units.format_rate(50e9) == "50 GB/s"
    assert units.format_duration(0.3) == "300 ms"
    assert units.format_duration(90) == "1.5 min"
    assert units.format_flops_rate(989e12) == "989 TFLOPS"
    assert units.format_tokens(16384) == "16Ki"
    assert units.format_tokens(64000) == "64K"
    assert units.format_tokens(429) == "429"


_positive = st.floats(min_value=1e-3, max_value=1e17, allow_nan=False, allow_infinity=False)


@given(_positive, st.booleans())
def test_bytes_round_trip(x: float, binary: bool) -> None:
    assert units.parse_bytes(units.format_bytes(x, binary=binary)) == pytest.approx(x, rel=1e-3)


@given(_positive)
def test_rate_round_trip(x: float) -> None:
    assert units.parse_bandwidth(units.format_rate(x)) == pytest.approx(x, rel=1e-3)


@given(st.floats(min_value=1e-9, max_value=1e6, allow_nan=False))
def test_duration_round_trip(x: float) -> None:
    assert units.parse_duration(units.format_duration(x)) == pytest.approx(x, rel=1e-3)


@given(_positive)
def test_flops_round_trip(x: float) -> None:
    assert units.parse_flops_rate(units.format_flops_rate(x)) == pytest.approx(x, rel=1e-3)


@given(st.integers(min_value=0, max_value=10**9))
def test_tokens_round_trip_exactly(n: int) -> None:
    assert units.parse_tokens(units.format_tokens(n)) == n
