"""A local HTTP receiver for webhook notifications: it records every POST (path, query, JSON body) and answers the
status it is told to (200, or 500 for a receiver that fails). The real thing a chat service would be, on loopback."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    path: str
    body: dict[str, Any]


@dataclass
class Receiver:
    url: str
    status: int = 200
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def messages(self) -> list[Received]:
        with self.lock:
            return list(self.received)


@contextmanager
def webhook_receiver(path: str = "/hooks/enginesmith") -> Iterator[Receiver]:
    """A receiver on 127.0.0.1 at a free port; yields it with its URL (``path`` appended)."""
    receiver = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw or b"{}")
            except json.JSONDecodeError:
                body = {"raw": raw.decode(errors="replace")}
            with receiver.lock:
                receiver.received.append(Received(path=self.path, body=body))
            self.send_response(receiver.status)
            self.end_headers()
            self.wfile.write(b"ok" if receiver.status < 400 else b"failing on purpose")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}{path}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
