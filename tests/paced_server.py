"""TEST DOUBLE: an OpenAI-compatible completions server on loopback whose decoding speed is set per measurement
round, to inject what no real server does on demand: a machine that slows down in some rounds and not others.

It streams ``max_tokens`` tokens, one SSE message each, ``seconds_per_token(round)`` apart (with ``by_level``,
``seconds_per_token(round, concurrency)``); the round and level are read from the request's ``x-request-id`` (the
load generator sends ``<run>-<role>-r<round>-c<concurrency>-<index>``). It records the order in which rounds reached
it, so a test can check that sides were interleaved, and the (round, concurrency) of every measured request. With
``answer``, a greedy (non-streamed) request whose prompt it answers (not None) gets that text, and the prompt is kept
in ``questions_asked``: how many accuracy questions a side was asked."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROUND = re.compile(r"-r(\d+)-c(\d+)-")


class PacedServer:
    def __init__(self, name: str, seconds_per_token: Callable[..., float], port: int = 0, *,
                 by_level: bool = False, max_num_seqs: int | None = None,
                 answer: Callable[[str], str | None] | None = None) -> None:
        self.name, self.seconds_per_token, self.by_level, self.answer = name, seconds_per_token, by_level, answer
        self.questions_asked: list[str] = []  # the prompts ``answer`` answered, in arrival order
        # Like a server's --max-num-seqs: at most this many streams decode at once, the others wait for a slot.
        self.slots = threading.Semaphore(max_num_seqs) if max_num_seqs else None
        self.rounds_seen: list[tuple[float, int]] = []  # (arrival time, round) of each measured request
        self.levels_seen: list[tuple[int, int]] = []  # (round, concurrency) of each measured request
        self.server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        double = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # small SSE writes go out at once, as a real server's do

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _send(self, body: bytes, content_type: str = "application/json") -> None:
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._send(json.dumps({"data": [{"id": double.name}]}).encode())

            def do_POST(self) -> None:
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                tokens = int(payload.get("max_tokens", 1))
                usage = {"prompt_tokens": 4, "completion_tokens": tokens}
                if not payload.get("stream"):
                    prompts = payload.get("prompt", "")
                    # lm-eval's local-completions may send its prompts as a list (one choice each)
                    texts = [double._answer(str(prompt), tokens)
                             for prompt in (prompts if isinstance(prompts, list) else [prompts])]
                    choices = [{"text": text, "index": index} for index, text in enumerate(texts)]
                    self._send(json.dumps({"choices": choices, "usage": usage}).encode())
                    return
                match = ROUND.search(self.headers.get("x-request-id", ""))
                round_number, concurrency = (int(match.group(1)), int(match.group(2))) if match else (0, 1)
                if match and "warmup" not in self.headers.get("x-request-id", ""):
                    double.rounds_seen.append((time.monotonic(), round_number))
                    double.levels_seen.append((round_number, concurrency))
                pace = double.seconds_per_token(round_number, concurrency) if double.by_level else \
                    double.seconds_per_token(round_number)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                events = [{"choices": [{"text": " 7", "index": 0}]} for _ in range(tokens)]
                events.append({"choices": [], "usage": usage})
                if double.slots is not None:
                    double.slots.acquire()
                try:
                    for index, event in enumerate(events):
                        if 0 < index < tokens:
                            time.sleep(pace)
                        self._chunk(f"data: {json.dumps(event)}\n\n".encode())
                    self._chunk(b"data: [DONE]\n\n")
                    self._chunk(b"")
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (a level's timeout)
                    self.close_connection = True
                finally:
                    if double.slots is not None:
                        double.slots.release()

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

        return Handler

    def _answer(self, prompt: str, tokens: int) -> str:
        answered = self.answer(prompt) if self.answer is not None else None
        if answered is None:
            return " 7" * tokens
        self.questions_asked.append(prompt)  # list.append is atomic: the handler threads may race here
        return answered

    def __enter__(self) -> PacedServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def main() -> None:
    """Serve at one pace in the foreground, as an artefact's serve recipe starts a server (``--port`` given)."""
    import argparse

    parser = argparse.ArgumentParser(description="TEST DOUBLE: a paced completions server")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seconds-per-token", type=float, required=True)
    parser.add_argument("--name", default="paced")
    parser.add_argument("--max-num-seqs", type=int, default=None)
    args = parser.parse_args()
    PacedServer(args.name, lambda _round: args.seconds_per_token, port=args.port,
                max_num_seqs=args.max_num_seqs).server.serve_forever()


if __name__ == "__main__":
    main()
