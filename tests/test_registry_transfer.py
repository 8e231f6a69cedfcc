"""Transfer plumbing: the bandwidth limit, and the units users write for rates and durations."""

from __future__ import annotations

import hashlib
import io
import time

import pytest

from registry.gc import parse_duration
from registry.transfer import RateLimiter, parse_rate, rechunk, write_hashing

MIB = 1024 * 1024


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


class FakeClock:
    """Time that passes only when the limiter sleeps: what it asks for is exact, however busy the machine."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_the_rate_limiter_holds_the_average() -> None:
    clock = FakeClock()
    limiter = RateLimiter(8 * MIB, clock=clock.monotonic, sleep=clock.sleep)
    for _ in range(16):
        limiter.consume(256 * 1024)  # 4 MiB in all, 2 MiB of it beyond the initial burst of a quarter second
    assert sum(clock.sleeps) == pytest.approx(2 * MIB / (8 * MIB))  # the 2 MiB beyond the burst, at 8 MiB/s
    assert clock.sleeps == pytest.approx([256 * 1024 / (8 * MIB)] * 8)  # evenly, one slice at a time


def test_the_rate_limiter_never_lets_bytes_through_early_on_the_real_clock() -> None:
    limiter = RateLimiter(8 * MIB)
    start = time.monotonic()
    for _ in range(16):
        limiter.consume(256 * 1024)
    assert time.monotonic() - start >= 0.2  # at least the 2 MiB beyond the burst at 8 MiB/s (0.25 s); no upper bound


class RecordingFile(io.BytesIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[int] = []

    def write(self, data) -> int:  # type: ignore[no-untyped-def, override]
        self.writes.append(len(data))
        return super().write(data)


def test_a_limited_copy_writes_in_small_slices_so_a_partial_file_grows_steadily() -> None:
    clock = FakeClock()
    limiter = RateLimiter(2 * MIB, clock=clock.monotonic, sleep=clock.sleep)
    body = bytes(range(256)) * (3 * MIB // 256)
    chunks = [body[: 2 * MIB], body[2 * MIB:]]  # as read from disk: chunks far larger than a slice
    destination, digest = RecordingFile(), hashlib.sha256()

    written = write_hashing(chunks, destination, digest, limit_bytes=len(body), limiter=limiter)

    assert written == len(body) and destination.getvalue() == body and digest.digest() == hashlib.sha256(body).digest()
    assert max(destination.writes) == limiter.slice_bytes < 2 * MIB // 16  # each write waits ~50 ms, not a second
    assert sum(clock.sleeps) == pytest.approx((len(body) - 2 * MIB / 4) / (2 * MIB))  # the limit still holds


def test_an_unlimited_copy_writes_whole_chunks() -> None:
    destination = RecordingFile()
    write_hashing([b"a" * MIB, b"b" * MIB], destination, hashlib.sha256(), limit_bytes=2 * MIB)
    assert destination.writes == [MIB, MIB]


@pytest.mark.parametrize("sizes", [[], [5], [3, 3, 3, 3], [10], [1, 9, 0, 2], [4, 4]])
def test_rechunk_yields_fixed_size_chunks_of_the_same_bytes(sizes: list[int]) -> None:
    pieces = [bytes([index]) * size for index, size in enumerate(sizes)]
    out = list(rechunk(iter(pieces), 4))
    assert b"".join(out) == b"".join(pieces)
    assert all(len(chunk) == 4 for chunk in out[:-1]) and all(0 < len(chunk) <= 4 for chunk in out[-1:])
