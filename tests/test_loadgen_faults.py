"""The load generator under faults: one malformed stream fails one request (named by its x-request-id), warm-up
runs at the level's concurrency, and request-rate levels send at times computed once, each held to its own
absolute time."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import pairwise

import pytest

from validation.loadgen import LevelPlan, ServerCapabilities, arrival_times_s, run_level, send_on_schedule
from validation.server import Endpoint
from validation.sse import record_from_stream

CAPABILITIES = ServerCapabilities(vllm_extensions=True, prompt_logprobs=False)
# A safety net for a double waiting on the client: reached only when the behaviour under test is broken.
NEVER_IN_A_PASSING_RUN_S = 60.0


class _RoomyServer(ThreadingHTTPServer):
    request_queue_size = 64  # the default 5 drops SYNs from 32 clients connecting at once (retried a second later)


class RecordingStreamServer:
    """TEST DOUBLE for an OpenAI-compatible streaming completions server on loopback (no model behind it).

    It streams ``max_tokens`` tokens, one SSE message each, then usage and ``[DONE]``, and records what a test
    needs to see from the server's side: the ``x-request-id`` of every POST in arrival order, and the most
    warm-up requests in flight at once. ``malformed_arrival`` (0-based) makes that arrival's stream carry one malformed
    ``data:`` line after its first token, and records that request's id. ``hold_warmup_until`` holds every
    warm-up request (its id names ``warmup``) until that many are in flight together, so a client that warms up
    at that concurrency is observed doing it, whatever the machine's speed."""

    def __init__(self, *, malformed_arrival: int | None = None, hold_warmup_until: int | None = None) -> None:
        self.malformed_arrival, self.hold_warmup_until = malformed_arrival, hold_warmup_until
        self.request_ids: list[str] = []
        self.malformed_request_id: str | None = None
        self.warmup_in_flight = self.max_warmup_in_flight = 0
        self._changed = threading.Condition()
        self.server = _RoomyServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(base_url=f"http://127.0.0.1:{self.server.server_address[1]}", model="double")

    def _arrive(self, request_id: str) -> tuple[bool, bool]:
        """Count the request in; (is it the malformed one, is it a warm-up request)."""
        warmup = "warmup" in request_id
        with self._changed:
            malformed = len(self.request_ids) == self.malformed_arrival
            self.request_ids.append(request_id)
            if malformed:
                self.malformed_request_id = request_id
            if warmup:
                self.warmup_in_flight += 1
                self.max_warmup_in_flight = max(self.max_warmup_in_flight, self.warmup_in_flight)
            self._changed.notify_all()
            if warmup and self.hold_warmup_until is not None:
                self._changed.wait_for(lambda: self.max_warmup_in_flight >= (self.hold_warmup_until or 0),
                                       timeout=NEVER_IN_A_PASSING_RUN_S)
        return malformed, warmup

    def _leave(self, warmup: bool) -> None:
        with self._changed:
            self.warmup_in_flight -= warmup

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        double = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                malformed, warmup = double._arrive(self.headers.get("x-request-id", ""))
                try:
                    tokens = int(payload.get("max_tokens", 1))
                    lines = [f"data: {json.dumps({'choices': [{'text': ' 7', 'index': 0}]})}" for _ in range(tokens)]
                    if malformed:
                        lines.insert(1, 'data: {"choices": [{"text": " 7", "ind')
                    lines.append(f"data: {json.dumps({'choices': [], 'usage': {'prompt_tokens': 4, 'completion_tokens': tokens}})}")  # noqa: E501
                    lines.append("data: [DONE]")
                    body = "".join(f"{line}\n\n" for line in lines).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                finally:
                    double._leave(warmup)

        return Handler

    def __enter__(self) -> RecordingStreamServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[..., RecordingStreamServer]]:
    started: list[RecordingStreamServer] = []

    def start(**options: int) -> RecordingStreamServer:
        double = RecordingStreamServer(**options).__enter__()
        started.append(double)
        return double

    yield start
    for double in started:
        double.__exit__()


def test_one_malformed_stream_fails_only_its_request_and_names_it_by_the_id_the_server_saw(serve, caplog):
    double = serve(malformed_arrival=17)
    prompts = [(f"prompt {i}", 4, 3) for i in range(32)]
    with caplog.at_level(logging.WARNING, logger="validation.loadgen"):
        result = run_level(double.endpoint, prompts, LevelPlan(concurrency=32), capabilities=CAPABILITIES)

    assert result.completed == 31 and result.failed == 1
    assert len(double.request_ids) == 32
    matches = [re.fullmatch(r"([0-9a-f]{8})-(\d+)", request_id) for request_id in double.request_ids]
    assert all(matches), double.request_ids  # every request carried x-request-id: <run>-<index>
    assert len({m.group(1) for m in matches if m}) == 1  # one run id for the level
    assert sorted(int(m.group(2)) for m in matches if m) == list(range(32))
    failed_id = double.malformed_request_id
    assert failed_id is not None
    [summary] = result.errors
    assert "malformed SSE data line 3" in summary and "1 request" in summary
    assert summary.endswith(f": {failed_id}")
    assert [r.getMessage() for r in caplog.records] == [f"request {failed_id} failed: {summary.split(' — ')[0]}"]


def test_a_malformed_or_non_object_data_line_fails_the_record_naming_the_line():
    truncated = record_from_stream([(0.1, 'data: {"choices": [{"text": "a"}]}'), (0.2, ""), (0.3, "data: {nope")],
                                   prompt_len=5, request_id="r-7")
    assert not truncated.success and truncated.request_id == "r-7"
    assert truncated.error.startswith("malformed SSE data line 3") and "{nope" in truncated.error
    for payload in ("42", '["choices"]', '{"choices": [], "usage": 3}'):
        record = record_from_stream([(0.1, f"data: {payload}")], prompt_len=5)
        assert not record.success and "not an OpenAI stream chunk" in record.error, payload


def test_warm_up_runs_at_the_levels_concurrency(serve):
    concurrency = 8
    double = serve(hold_warmup_until=concurrency)
    plan = LevelPlan(concurrency=concurrency, min_requests=concurrency, warmup_requests=concurrency,
                     warmup_max_s=60.0, warmup_tolerance=100.0)  # any second batch agrees with the first
    result = run_level(double.endpoint, [("x", 4, 2)], plan, capabilities=CAPABILITIES, label="run1")

    assert double.max_warmup_in_flight == concurrency  # all at once, and never more than the level's concurrency
    warmup_ids = [i for i in double.request_ids if "warmup" in i]
    assert sorted(warmup_ids) == sorted(f"run1-warmup-{i}" for i in range(2 * 4 * concurrency))  # two batches
    assert result.warmup_requests == 2 * 4 * concurrency and result.warmup_steady
    assert result.completed == concurrency
    assert sorted(i for i in double.request_ids if "warmup" not in i) == sorted(f"run1-{i}" for i in range(concurrency))


def test_a_spent_warm_up_budget_starts_no_request_once_each_slot_has_had_one(serve):
    """#32: the warm-up's time budget holds inside a batch. Here it is spent before the first request ends (a zero
    budget), so the warm-up is one request per slot, not a batch of 4 × concurrency: on a slow server (transformers
    serve on two cores, about 16 s a warm-up request) that batch ran 254 s over a 10-s budget."""
    concurrency = 4
    double = serve(hold_warmup_until=concurrency)
    plan = LevelPlan(concurrency=concurrency, min_requests=concurrency, warmup_requests=concurrency,
                     warmup_max_s=0.0)
    result = run_level(double.endpoint, [("x", 4, 2)], plan, capabilities=CAPABILITIES, label="run2")

    assert double.max_warmup_in_flight == concurrency
    warmup_ids = [i for i in double.request_ids if "warmup" in i]
    assert sorted(warmup_ids) == sorted(f"run2-warmup-{i}" for i in range(concurrency))
    assert result.warmup_requests == concurrency and result.warmup_steady is False
    assert result.completed == concurrency
    assert sorted(i for i in double.request_ids if "warmup" not in i) == sorted(f"run2-{i}" for i in range(concurrency))


def test_request_rate_schedule_is_computed_once_monotone_and_at_the_asked_rate():
    times = arrival_times_s(20.0, 1.0, seed=1, min_requests=4000, min_duration_s=0.0)
    assert len(times) == 4000 and times == arrival_times_s(20.0, 1.0, seed=1, min_requests=4000, min_duration_s=0.0)
    assert all(b >= a for a, b in pairwise(times))
    assert len(times) / times[-1] == pytest.approx(20.0, rel=0.05)
    bursty = arrival_times_s(20.0, 0.25, seed=1, min_requests=4000, min_duration_s=0.0)
    assert len(bursty) / bursty[-1] == pytest.approx(20.0, rel=0.1)
    # A duration-bound level: the schedule runs one send past the minimum duration, where the level stops.
    long = arrival_times_s(20.0, 1.0, seed=2, min_requests=5, min_duration_s=30.0)
    assert long[-2] < 30.0 <= long[-1] and len(long) > 5


def test_sends_keep_to_their_absolute_times_despite_late_wake_ups_and_a_stalled_send():
    """A fake clock: every sleep wakes 5 ms late and starting request 3 stalls the loop for a whole second. Gaps
    slept after each send would drift by both; absolute times drift by neither."""
    overshoot_s, stall_s, stalled = 0.005, 1.0, 3
    now = [100.0]
    schedule = arrival_times_s(10.0, 1.0, seed=3, min_requests=50, min_duration_s=0.0)
    sent_at: list[float] = []

    async def late_sleep(delay_s: float) -> None:
        now[0] += delay_s + overshoot_s
        await asyncio.sleep(0)

    async def run() -> int:
        slots = asyncio.Semaphore(4)

        def start_request(index: int) -> None:
            sent_at.append(now[0] - 100.0)
            if index == stalled:
                now[0] += stall_s
            slots.release()

        return await send_on_schedule(schedule, start_request, slots=slots, stop=lambda sent: False,
                                      origin_s=100.0, clock=lambda: now[0], sleep=late_sleep)

    assert asyncio.run(run()) == len(schedule)
    stall_ends = sent_at[stalled] + stall_s
    assert schedule[-1] > stall_ends  # the schedule runs on past the stall
    for index, (planned, actual) in enumerate(zip(schedule, sent_at, strict=True)):
        due = max(planned, stall_ends) if index > stalled else planned  # overdue ones go at once
        assert due - 1e-9 <= actual <= due + overshoot_s + 1e-9, (index, planned, actual)
