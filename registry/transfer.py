"""What every transfer shares: a bandwidth limit, progress reporting, and the copy loop that hashes as it writes."""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import BinaryIO, Protocol, cast

# Big enough that per-chunk Python overhead vanishes next to hashing and I/O; small enough to stay in cache.
LOCAL_CHUNK_BYTES = 4 * 1024 * 1024
# Network reads as small as boto3's own: with a deep read-ahead queue the socket never waits on the disk.
NETWORK_CHUNK_BYTES = 256 * 1024
READER_JOIN_S = 5.0
# A rate-limited transfer passes this many seconds' worth of bytes at a time (at least MIN_SLICE_BYTES): the limit
# then holds smoothly instead of sleeping for a whole chunk and writing it at once, and a partial file grows
# steadily while the transfer runs.
RATE_SLICE_S = 0.05
MIN_SLICE_BYTES = 4 * 1024


class TransferProgress(Protocol):
    """Receives progress from concurrent transfers (called from worker threads)."""

    def started(self, name: str, total_bytes: int, done_bytes: int) -> None: ...

    def advanced(self, name: str, bytes_count: int) -> None: ...

    def finished(self, name: str) -> None: ...


class TransferCancelled(Exception):
    """Another part of the same transfer failed (or the user interrupted it): stop, keeping what was written."""


class NoProgress:
    def started(self, name: str, total_bytes: int, done_bytes: int) -> None:
        pass

    def advanced(self, name: str, bytes_count: int) -> None:
        pass

    def finished(self, name: str) -> None:
        pass


class RateLimiter:
    """A token bucket shared by all threads of one transfer: at most ``bytes_per_second`` on average."""

    def __init__(self, bytes_per_second: int, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if bytes_per_second <= 0:
            raise ValueError("the rate limit must be positive")
        self.bytes_per_second = bytes_per_second
        self._clock, self._sleep = clock, sleep
        # A burst of a quarter second keeps the average honest without stalling on every chunk.
        self._capacity = max(bytes_per_second / 4, 64 * 1024)
        self._tokens = self._capacity
        self._last = clock()
        self._lock = threading.Lock()

    @property
    def slice_bytes(self) -> int:
        """The most bytes a transfer should pass in one ``consume`` (``RATE_SLICE_S`` worth)."""
        return max(MIN_SLICE_BYTES, int(self.bytes_per_second * RATE_SLICE_S))

    def consume(self, bytes_count: int) -> None:
        """Block until ``bytes_count`` bytes may pass."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self._capacity, self._tokens + (now - self._last) * self.bytes_per_second)
            self._last = now
            self._tokens -= bytes_count
            deficit = -self._tokens
        if deficit > 0:
            self._sleep(deficit / self.bytes_per_second)


def parse_rate(text: str) -> int:
    """``500K``, ``20M``, ``1G`` (bytes per second, binary multiples) or a plain number → bytes per second."""
    units = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}
    cleaned = text.strip().upper().removesuffix("/S").removesuffix("B").removesuffix("I")
    suffix = cleaned[-1:] if cleaned[-1:] in units else ""
    number = cleaned[: len(cleaned) - len(suffix)] if suffix else cleaned
    try:
        value = float(number) * units[suffix]
    except ValueError:
        raise ValueError(f"{text!r} is not a rate; write e.g. 500K, 20M or 1G (bytes per second)") from None
    if value <= 0:
        raise ValueError(f"{text!r}: the rate must be positive")
    return int(value)


def write_hashing(
    chunks: Iterable[bytes | memoryview],
    destination: BinaryIO,
    digest: hashlib._Hash,
    *,
    limit_bytes: int,
    limiter: RateLimiter | None = None,
    progress: TransferProgress | None = None,
    name: str = "",
    cancel: threading.Event | None = None,
) -> int:
    """Write ``chunks`` to ``destination`` and feed them to ``digest`` in the same pass; returns bytes written.

    Stops early (returning more than ``limit_bytes``) once the source has sent more than expected, so a wrong
    or hostile source cannot fill the disk. Raises ``TransferCancelled`` soon after ``cancel`` is set. With a
    ``limiter``, chunks are written in slices of ``limiter.slice_bytes``, each let through by the limiter.
    """
    written = 0
    slice_bytes = None if limiter is None else limiter.slice_bytes
    for chunk in chunks:
        for piece in _slices(chunk, slice_bytes):
            if cancel is not None and cancel.is_set():
                raise TransferCancelled(name)
            if limiter is not None:
                limiter.consume(len(piece))
            digest.update(piece)
            destination.write(piece)
            written += len(piece)
            if progress is not None:
                progress.advanced(name, len(piece))
            if written > limit_bytes:
                return written
    return written


def _slices(chunk: bytes | memoryview, slice_bytes: int | None) -> Iterator[bytes | memoryview]:
    """``chunk`` in views of at most ``slice_bytes`` (no copies); the whole chunk when ``None``."""
    if slice_bytes is None or len(chunk) <= slice_bytes:
        yield chunk
        return
    view = memoryview(chunk)
    for start in range(0, len(view), slice_bytes):
        yield view[start:start + slice_bytes]


def file_chunks(handle: BinaryIO, chunk_bytes: int = LOCAL_CHUNK_BYTES,
                limit: int | None = None) -> Iterator[memoryview]:
    """Read ``handle`` to its end (or ``limit`` bytes) into one reused buffer; each view is valid until the next
    one is produced."""
    buffer = bytearray(chunk_bytes)
    view = memoryview(buffer)
    remaining = limit
    while remaining is None or remaining > 0:
        count = handle.readinto(view if remaining is None else view[: min(remaining, chunk_bytes)])  # type: ignore[attr-defined]
        if not count:
            return
        if remaining is not None:
            remaining -= count
        yield view[:count]


def owned_chunks(handle: BinaryIO, chunk_bytes: int = LOCAL_CHUNK_BYTES, limit: int | None = None) -> Iterator[bytes]:
    """Read ``handle`` to its end (or ``limit`` bytes) in chunks the caller may keep (unlike ``file_chunks``)."""
    remaining = limit
    while remaining is None or remaining > 0:
        chunk = handle.read(chunk_bytes if remaining is None else min(remaining, chunk_bytes))
        if not chunk:
            return
        if remaining is not None:
            remaining -= len(chunk)
        yield chunk


def rechunk(chunks: Iterable[bytes], chunk_bytes: int) -> Iterator[bytes]:
    """``chunks`` (of any sizes) as chunks of ``chunk_bytes`` each, the last one shorter; holds one chunk at most."""
    pending = bytearray()
    for chunk in chunks:
        pending += chunk
        while len(pending) >= chunk_bytes:
            yield bytes(pending[:chunk_bytes])
            del pending[:chunk_bytes]
    if pending:
        yield bytes(pending)


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()


def read_ahead(chunks: Iterator[bytes], depth: int) -> Generator[bytes, None, None]:
    """Iterate ``chunks`` in a background thread, up to ``depth`` chunks ahead of the consumer.

    A network stream then keeps flowing while the consumer hashes and writes the previous chunk (in one thread
    the socket would wait for both). Errors reach the consumer in order; closing this generator stops the reader
    and closes ``chunks``.
    """
    handoff: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def hand_over(item: object) -> bool:
        while not stop.is_set():
            try:
                handoff.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for chunk in chunks:
                if not hand_over(chunk):
                    return
            hand_over(_END)
        except BaseException as error:  # handed to the consumer, who raises it
            hand_over(_Failure(error))
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    reader = threading.Thread(target=produce, name="read-ahead", daemon=True)
    reader.start()
    try:
        while True:
            item = handoff.get()
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.error
            yield cast(bytes, item)
    finally:
        stop.set()
        # A reader blocked on a stalled server gives up by itself when its read returns (it sees ``stop``).
        reader.join(timeout=READER_JOIN_S)


def sha256_file(path_handle: BinaryIO, length: int | None = None) -> hashlib._Hash:
    """A sha256 object fed with the first ``length`` bytes of ``path_handle`` (all of it when ``None``)."""
    digest = hashlib.sha256()
    remaining = length
    for chunk in file_chunks(path_handle):
        if remaining is not None:
            if remaining <= 0:
                break
            chunk = chunk[:remaining]
            remaining -= len(chunk)
        digest.update(chunk)
    return digest
