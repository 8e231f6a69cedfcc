"""Transfer plumbing: the bandwidth limit, and the units users write for rates and durations."""

from __future__ import annotations

import time

import pytest

from registry.gc import parse_duration
from registry.transfer import RateLimiter, parse_rate


@pytest.mark.parametrize(
    ("text", "expected"),
    [("500K", 500 * 1024), ("20M", 20 * 1024**2), ("20MiB", 20 * 1024**2), ("1G", 1024**3), ("2.5M/s", 2621440),
     ("4096", 4096)],
)
def test_rates_parse(text: str, expected: int) -> None:
    assert parse_rate(text) == expected


@pytest.mark.parametrize("text", ["fast", "-1M", "0", ""])
def test_bad_rates_say_what_to_write(text: str) -> None:
    with pytest.raises(ValueError, match=r"rate|positive"):
        parse_rate(text)


@pytest.mark.parametrize(("text", "seconds"), [("0", 0), ("90", 90), ("90s", 90), ("30m", 1800), ("1h", 3600),
                                              ("2d", 172800)])
def test_durations_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_a_bad_duration_says_what_to_write() -> None:
    with pytest.raises(ValueError, match="30m"):
        parse_duration("soon")


def test_the_rate_limiter_holds_the_average() -> None:
    limiter = RateLimiter(8 * 1024 * 1024)
    start = time.monotonic()
    for _ in range(16):
        limiter.consume(256 * 1024)  # 4 MiB in all, 2 MiB of it beyond the initial burst
    elapsed = time.monotonic() - start
    assert 0.2 <= elapsed < 2.0
