"""Server-sent events of an OpenAI-compatible streaming completion → one ``RequestRecord``. Pure: takes the
arrival time of each ``data:`` line, so recorded streams can be replayed in tests."""

from __future__ import annotations

import json
from collections.abc import Iterable
from itertools import pairwise

from validation.metrics import RequestRecord


def record_from_stream(
    lines: Iterable[tuple[float, str]], *, prompt_len: int, start_s: float = 0.0, request_id: str = ""
) -> RequestRecord:
    """Build a record from ``(seconds since the request was sent, raw SSE line)`` pairs.

    Choices-bearing messages set TTFT, ITL and E2EL; a message with ``usage`` gives the output token count
    (and the server's prompt length). ``[DONE]`` and blank or comment lines are ignored. A ``data:`` line that
    is not a JSON object fails the request, naming the line: never raises on what the server sent.
    """
    def failed(reason: str) -> RequestRecord:
        return RequestRecord(success=False, prompt_len=prompt_len, start_s=start_s, request_id=request_id,
                             error=reason)

    chunk_times: list[float] = []
    output_tokens: int | None = None
    for line_number, (elapsed, raw) in enumerate(lines, start=1):
        line = raw.strip()
        if not line.startswith("data:"):
            continue
        payload = line[len("data:"):].strip()
        if payload == "[DONE]":
            continue
        try:
            message = json.loads(payload)
        except json.JSONDecodeError as exc:
            return failed(f"malformed SSE data line {line_number} ({exc.msg}): {payload[:80]!r}")
        usage = message.get("usage") if isinstance(message, dict) else None
        if not isinstance(message, dict) or not isinstance(usage, dict | None):
            return failed(f"malformed SSE data line {line_number} (not an OpenAI stream chunk): {payload[:80]!r}")
        if "error" in message and not message.get("choices"):
            return failed(str(message["error"])[:200])
        if message.get("choices"):
            chunk_times.append(elapsed)
        if usage:
            output_tokens = usage.get("completion_tokens", output_tokens)
            prompt_len = usage.get("prompt_tokens", prompt_len)
    if not chunk_times:
        return failed("no choices in the stream")
    return RequestRecord(
        success=True, prompt_len=prompt_len, request_id=request_id,
        # Without a usage chunk, count chunks: servers stream one token per chunk unless they batch.
        output_tokens=output_tokens if output_tokens is not None else len(chunk_times),
        ttft_s=chunk_times[0], itl_s=[b - a for a, b in pairwise(chunk_times)],
        latency_s=chunk_times[-1], start_s=start_s,
    )
