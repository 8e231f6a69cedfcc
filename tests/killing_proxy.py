"""A TCP relay on loopback in front of a real registry server (SeaweedFS's S3, docker-registry) that counts every
byte each way and, when armed, SIGKILLs a client process the moment the bytes it has relayed cross a chosen offset:
a kill at a random byte of the traffic, mid-request and mid-part as often as not, never at a moment the client
chose.

It is not a test double: the bytes pass unchanged (TLS and SigV4 signatures included); it only watches and kills.
``received`` is what the server was sent (up) and what it sent (down), over every connection since the start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from dataclasses import dataclass, field
from typing import Literal

RELAY_BYTES = 64 * 1024
Direction = Literal["up", "down"]


@dataclass
class _Trigger:
    direction: Direction
    after_bytes: int
    pid: int
    counted: int = 0
    fired: threading.Event = field(default_factory=threading.Event)


class KillingProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.received: dict[Direction, int] = {"up": 0, "down": 0}
        self._lock = threading.Lock()
        self._trigger: _Trigger | None = None
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def arm(self, pid: int, direction: Direction, after_bytes: int) -> threading.Event:
        """Kill ``pid`` when ``after_bytes`` more bytes have gone ``direction``; the event is set as the signal is sent
        (a process that ended on its own first is told apart by its exit code)."""
        with self._lock:
            self._trigger = _Trigger(direction, after_bytes, pid)
            return self._trigger.fired

    def disarm(self) -> None:
        with self._lock:
            self._trigger = None

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            for source, sink, direction in ((client, server, "up"), (server, client, "down")):
                threading.Thread(target=self._relay, args=(source, sink, direction), daemon=True).start()

    def _relay(self, source: socket.socket, sink: socket.socket, direction: Direction) -> None:
        try:
            while True:
                data = source.recv(RELAY_BYTES)
                if not data:
                    break
                sink.sendall(data)
                self._count(direction, len(data))
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()

    def _count(self, direction: Direction, count: int) -> None:
        with self._lock:
            self.received[direction] += count
            trigger = self._trigger
            if trigger is None or trigger.direction != direction:
                return
            trigger.counted += count
            if trigger.counted < trigger.after_bytes:
                return
            self._trigger = None
            # Set before the signal, under the lock: the waiting test must never see the process dead but the
            # event clear (stop 69's CI: a killed run read as a failed one).
            trigger.fired.set()
        with contextlib.suppress(ProcessLookupError):
            os.kill(trigger.pid, signal.SIGKILL)
