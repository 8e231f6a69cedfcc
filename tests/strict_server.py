"""TEST DOUBLE: a strict OpenAI-compatible completions server on loopback, standing in for `transformers
serve` (not installable next to our pinned transformers): it answers HTTP 422 naming any vLLM-only field
(ignore_eos, repetition_penalty, top_k, min_tokens), streams like an OpenAI server otherwise, and returns no
logprobs (as transformers serve ignores them)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VLLM_ONLY_FIELDS = {"ignore_eos", "repetition_penalty", "top_k", "min_tokens"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, b"{}")
        elif self.path == "/v1/models":
            self._send(200, json.dumps({"data": [{"id": "strict-model"}]}).encode())
        else:
            self._send(404, b"{}")

    def do_POST(self) -> None:
        payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        unexpected = sorted(VLLM_ONLY_FIELDS & payload.keys())
        if unexpected:
            self._send(422, json.dumps({"detail": f"Unexpected fields: {set(unexpected)}"}).encode())
            return
        tokens = ["4", "2"][: payload.get("max_tokens", 2)]
        if not payload.get("stream"):
            self._send(200, json.dumps({"choices": [{"text": "".join(tokens), "index": 0}],
                                        "usage": {"prompt_tokens": 3, "completion_tokens": len(tokens)}}).encode())
            return
        chunks = [f'data: {json.dumps({"choices": [{"text": t, "index": 0}]})}\n\n' for t in tokens]
        # Usage arrives on the final chunk with an empty choice, and there is no [DONE] (like transformers serve).
        chunks.append(f'data: {json.dumps({"choices": [{"text": "", "index": 0, "finish_reason": "length"}], "usage": {"prompt_tokens": 3, "completion_tokens": len(tokens)}})}\n\n')  # noqa: E501
        self._send(200, "".join(chunks).encode(), content_type="text/event-stream")


class StrictServer:
    def __init__(self) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> StrictServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
