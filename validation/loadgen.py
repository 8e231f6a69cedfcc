"""Our load generator: asyncio, streamed completions, vLLM's metric definitions (validation.metrics).

It sends only standard OpenAI fields unless the server has shown it takes vLLM's extensions (``ignore_eos``
for fixed output lengths): strict servers answer unknown fields with HTTP 422.

The streams are read with aiohttp, not httpx: httpx's async stack (httpcore, anyio, h11) spent about three
times aiohttp's CPU per streamed token here (1.0 s against 0.35 s for 64 requests of 32 tokens), which caps
the tokens per second one client can count on a GPU and, on a CPU host, takes cores from the server being
measured. The one-off requests (probe, health, accuracy) stay on httpx.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import aiohttp
import httpx

from enginesmith.core.errors import UserError
from enginesmith.core.reports.measures import ServerCapabilities
from enginesmith.core.slo import Slo
from enginesmith.core.specs import WorkloadSpec
from validation.metrics import BenchmarkResult, RequestRecord, summarize
from validation.server import Endpoint
from validation.sse import record_from_stream

REQUEST_TIMEOUT_S = 600

log = logging.getLogger(__name__)


Api = Literal["completions", "chat"]
API_PATHS: dict[str, str] = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


def completion_payload(endpoint: Endpoint, prompt: str, max_tokens: int, *, stream: bool,
                       capabilities: ServerCapabilities | None, api: Api = "completions") -> dict[str, object]:
    """A greedy request for ``prompt``: as text (completions) or as one user message (chat, the server applies the
    chat template; ``max_completion_tokens`` as ``vllm bench serve --backend openai-chat`` sends it)."""
    payload: dict[str, object] = {"model": endpoint.model, "temperature": 0.0, "stream": stream}
    if api == "chat":
        # max_tokens too: transformers serve ignores max_completion_tokens (and would generate to its default).
        payload.update(messages=[{"role": "user", "content": prompt}], max_completion_tokens=max_tokens,
                       max_tokens=max_tokens)
    else:
        payload.update(prompt=prompt, max_tokens=max_tokens)
    if stream:
        payload["stream_options"] = {"include_usage": True}
    if capabilities is not None and capabilities.vllm_extensions:
        payload["ignore_eos"] = True
    return payload


def rejected_field_message(status: int, body: str) -> str:
    """A 4xx names what the server rejected (transformers serve: 'Unexpected fields: {...}')."""
    return f"HTTP {status}: {body.strip()[:300]}"


async def send_one(session: aiohttp.ClientSession, endpoint: Endpoint, payload: dict[str, object],
                   prompt_len: int, bench_start: float, request_id: str, api: Api = "completions") -> RequestRecord:
    """One streamed completion sent with ``x-request-id: request_id``; each SSE line is stamped with the arrival
    time of the bytes that ended it. Chat streams are read by the same rules (vLLM's openai-chat backend counts
    choices-bearing chunks alike). Never raises for what the server or the network did: that fails this request
    alone, with its reason and id in the record."""
    start = time.perf_counter()
    lines: list[tuple[float, str]] = []
    pending = b""

    def failed(reason: str) -> RequestRecord:
        return RequestRecord(success=False, prompt_len=prompt_len, start_s=start - bench_start,
                             request_id=request_id, error=reason[:300])

    try:
        async with session.post(f"{endpoint.base_url}{API_PATHS[api]}", json=payload,
                                headers={"x-request-id": request_id}) as response:
            if response.status != 200:
                body = (await response.read()).decode(errors="replace")
                return failed(rejected_field_message(response.status, body))
            async for chunk in response.content.iter_any():
                elapsed = time.perf_counter() - start
                *complete, pending = (pending + chunk).split(b"\n")
                lines.extend((elapsed, line.decode(errors="replace")) for line in complete)
        if pending:
            lines.append((time.perf_counter() - start, pending.decode(errors="replace")))
        return record_from_stream(lines, prompt_len=prompt_len, start_s=start - bench_start, request_id=request_id)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        # ValueError: chunks that parse but hold values no record can take (a token count that is not a number).
        return failed(f"{type(exc).__name__}: {exc}")


@dataclass(frozen=True)
class LevelPlan:
    """One load level: how many requests in flight (and, optionally, at what rate), how long it measures, and
    the warm-up before it. The defaults send each prompt once with no warm-up."""

    concurrency: int
    min_requests: int | None = None  # None: each prompt once
    min_duration_s: float = 0.0
    timeout_s: float = 900.0
    request_rate: float | None = None
    burstiness: float = 1.0
    warmup_requests: int = 0
    warmup_max_s: float = 60.0
    warmup_tolerance: float = 0.1
    # The output throughput this server measured at this level in an earlier round: a first warm-up batch within the
    # tolerance of it is steady already (the server was warm at this level; one batch brings it back).
    warmup_steady_at: float | None = None
    api: Api = "completions"
    # A time budget for sending: once it has passed and every slot has had a request, no new one starts, and the
    # level ends with what it sent (min_requests then does not apply). The warm-up's batches run under it: a slow
    # server's batch must not run far past warmup_max_s.
    send_budget_s: float | None = None

    @classmethod
    def from_workload(cls, workload: WorkloadSpec, concurrency: int) -> LevelPlan:
        return cls(concurrency=concurrency, api=workload.api, min_requests=workload.min_requests,
                   min_duration_s=workload.min_duration_s, timeout_s=workload.level_timeout_s,
                   request_rate=workload.request_rate, burstiness=workload.burstiness,
                   warmup_requests=workload.warmup_requests, warmup_max_s=workload.warmup_max_s,
                   warmup_tolerance=workload.warmup_tolerance)


class LevelIncompleteError(UserError):
    """A level did not finish its minimum number of requests within its timeout."""


class ArrivalSchedule:
    """Send times (seconds after the level starts) drawn from one seeded generator: all at once without a rate;
    Poisson (burstiness 1) or gamma otherwise, with the mean gap 1/rate (shape = burstiness,
    scale = 1/(rate·burstiness)), as vLLM."""

    def __init__(self, request_rate: float | None, burstiness: float, seed: int) -> None:
        self.request_rate, self.burstiness = request_rate, burstiness
        self._rng = random.Random(seed)
        self._next_s = 0.0

    def next_send_s(self) -> float:
        if self.request_rate is None:
            return 0.0
        self._next_s += self._rng.gammavariate(self.burstiness, 1.0 / (self.request_rate * self.burstiness))
        return self._next_s


def arrival_times_s(request_rate: float, burstiness: float, seed: int, *, min_requests: int,
                    min_duration_s: float) -> list[float]:
    """A request-rate level's whole send schedule, computed before its first send: at least ``min_requests``
    times, and the first time past ``min_duration_s`` (the level stops sending once both are met, so it never
    runs off the end)."""
    schedule = ArrivalSchedule(request_rate, burstiness, seed)
    times_s = [schedule.next_send_s()]
    while len(times_s) < min_requests or times_s[-1] < min_duration_s:
        times_s.append(schedule.next_send_s())
    return times_s


async def send_on_schedule(send_times_s: Iterable[float], start_request: Callable[[int], None], *,
                           slots: asyncio.Semaphore, stop: Callable[[int], bool], origin_s: float,
                           clock: Callable[[], float] = time.perf_counter,
                           sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> int:
    """Start request ``i`` at ``origin_s + send_times_s[i]`` on ``clock`` (or as soon after as one of ``slots`` is
    free), until ``stop(requests started)``; returns how many were started. Each request is held to its absolute
    time, not to a gap after the one before, so a late wake-up or a stalled start does not push back the ones
    after it. ``start_request`` must not block; whatever it starts releases its slot when done."""
    started = 0
    for send_at_s in send_times_s:
        if stop(started):
            break
        await slots.acquire()
        if stop(started):
            slots.release()
            break
        delay_s = origin_s + send_at_s - clock()
        if delay_s > 0:
            await sleep(delay_s)
        start_request(started)
        started += 1
    return started


async def _send_for(client: aiohttp.ClientSession, endpoint: Endpoint, prompts: Sequence[tuple[str, int, int]],
                    plan: LevelPlan, capabilities: ServerCapabilities, *, seed: int, id_prefix: str,
                    on_done: Callable[[], None] | None, first_index: int = 0) -> tuple[list[RequestRecord], float]:
    """Send requests, cycling through ``prompts``, until at least ``plan.min_requests`` have been sent and
    ``plan.min_duration_s`` has passed; then wait for those in flight. Request ``i`` is sent with
    ``x-request-id: <id_prefix>-<first_index + i>``. Returns the records and the duration (first send to last
    completion)."""
    target = plan.min_requests if plan.min_requests is not None else len(prompts)
    slots = asyncio.Semaphore(plan.concurrency)
    send_times_s: Iterable[float] = itertools.repeat(0.0)
    if plan.request_rate is not None:
        send_times_s = arrival_times_s(plan.request_rate, plan.burstiness, seed, min_requests=target,
                                       min_duration_s=plan.min_duration_s)
    records: list[RequestRecord] = []
    failed = 0
    tasks: list[asyncio.Task[None]] = []
    bench_start = time.perf_counter()

    async def one(index: int) -> None:
        nonlocal failed
        text, prompt_len, output_len = prompts[index % len(prompts)]
        try:
            payload = completion_payload(endpoint, text, output_len, stream=True, capabilities=capabilities,
                                         api=plan.api)
            record = await send_one(client, endpoint, payload, prompt_len, bench_start,
                                    request_id=f"{id_prefix}-{first_index + index}", api=plan.api)
        finally:
            slots.release()
        records.append(record)
        if not record.success:
            failed += 1
            log.warning("request %s failed: %s", record.request_id, record.error)
        if on_done:
            on_done()

    budget_spent = False

    def stop(sent: int) -> bool:
        nonlocal budget_spent
        elapsed_s = time.perf_counter() - bench_start
        # Every request failing fast must not flood the server for the whole minimum duration.
        enough = sent >= target and (elapsed_s >= plan.min_duration_s or failed >= target)
        if plan.send_budget_s is not None and sent >= plan.concurrency and elapsed_s >= plan.send_budget_s:
            budget_spent = True
        return enough or budget_spent or elapsed_s > plan.timeout_s

    def start_request(index: int) -> None:
        tasks.append(asyncio.create_task(one(index)))

    await send_on_schedule(send_times_s, start_request, slots=slots, stop=stop, origin_s=bench_start)
    remaining_s = max(1.0, plan.timeout_s - (time.perf_counter() - bench_start))
    done, pending = await asyncio.wait(tasks, timeout=remaining_s) if tasks else (set(), set())
    for task in pending:
        task.cancel()
    duration = time.perf_counter() - bench_start
    if pending or (len(tasks) < target and not budget_spent):
        completed = sum(r.success for r in records)
        raise LevelIncompleteError(
            f"{id_prefix} at concurrency {plan.concurrency}: {len(records)} of {max(target, len(tasks))} "
            f"requests finished ({completed} completed) in {duration:.0f} s",
            where=f"workload.level_timeout_s ({plan.timeout_s:g} s)",
            hint="raise level_timeout_s, or lower min_requests, min_duration_s or output_len")
    for task in done:
        task.result()
    return records, duration


@dataclass(frozen=True)
class WarmUp:
    requests: int = 0
    seconds: float = 0.0
    steady: bool | None = None  # None: no warm-up asked for


async def _warm_up(client: aiohttp.ClientSession, endpoint: Endpoint, prompts: Sequence[tuple[str, int, int]],
                   plan: LevelPlan, capabilities: ServerCapabilities, run_id: str) -> WarmUp:
    """Batches at the level's concurrency until two batches' output throughputs agree within the tolerance (or
    ``warmup_max_s`` has passed); the first batch is compared with ``warmup_steady_at`` where the level was
    measured before. Warm-up request ids are ``<run_id>-warmup-<i>``, counted across batches.

    No request starts after ``warmup_max_s`` once each slot has had one: a batch is cut short there (on a slow
    server one batch of ``4 × concurrency`` requests could otherwise take many times the budget)."""
    batch = LevelPlan(concurrency=plan.concurrency, min_requests=max(plan.warmup_requests, 4 * plan.concurrency),
                      timeout_s=plan.timeout_s, api=plan.api)
    started = time.perf_counter()
    previous: float | None = plan.warmup_steady_at
    sent = 0
    while True:
        left_s = max(0.0, plan.warmup_max_s - (time.perf_counter() - started))
        records, duration = await _send_for(client, endpoint, prompts, replace(batch, send_budget_s=left_s),
                                            capabilities, seed=0, id_prefix=f"{run_id}-warmup", first_index=sent,
                                            on_done=None)
        sent += len(records)
        throughput = sum(r.output_tokens for r in records if r.success) / duration
        if previous is not None and abs(throughput - previous) <= plan.warmup_tolerance * previous:
            return WarmUp(sent, time.perf_counter() - started, True)
        if time.perf_counter() - started >= plan.warmup_max_s:
            return WarmUp(sent, time.perf_counter() - started, False)
        previous = throughput


async def _run_level(endpoint: Endpoint, prompts: Sequence[tuple[str, int, int]], plan: LevelPlan, *,
                     capabilities: ServerCapabilities, seed: int, slo: Slo | None, run_id: str,
                     on_done: Callable[[], None] | None) -> BenchmarkResult:
    connector = aiohttp.TCPConnector(limit=max(plan.concurrency, 1) + 4)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:
        warmup = WarmUp()
        if plan.warmup_requests:
            warmup = await _warm_up(client, endpoint, prompts, plan, capabilities, run_id)
        records, duration = await _send_for(client, endpoint, prompts, plan, capabilities, seed=seed,
                                            id_prefix=run_id, on_done=on_done)
    result = summarize(records, duration, concurrency=plan.concurrency, request_rate=plan.request_rate, slo=slo)
    return result.model_copy(update={"warmup_requests": warmup.requests, "warmup_s": warmup.seconds,
                                     "warmup_steady": warmup.steady})


def run_level(endpoint: Endpoint, prompts: Sequence[tuple[str, int, int]], plan: LevelPlan, *,
              capabilities: ServerCapabilities, seed: int = 0, slo: Slo | None = None, label: str = "",
              on_done: Callable[[], None] | None = None) -> BenchmarkResult:
    """One load level of ``prompts`` ``(text, prompt_len, output_len)``: the warm-up, then the measurement.

    Every request carries ``x-request-id: <run>-<index>`` (warm-up: ``<run>-warmup-<index>``), where the run is
    ``label`` or, without one, a fresh 8-hex-digit id; failed requests are logged and summarised in the result's
    ``errors`` with their ids, so each can be found in the server's log."""
    return asyncio.run(_run_level(endpoint, prompts, plan, capabilities=capabilities, seed=seed, slo=slo,
                                  run_id=label or uuid.uuid4().hex[:8], on_done=on_done))


def probe_capabilities(endpoint: Endpoint, probe_prompt: str = "Hello", api: Api = "completions") -> ServerCapabilities:
    """Does the server take ``ignore_eos`` on the workload's endpoint, and does ``/v1/completions`` with ``echo`` +
    ``logprobs`` give prompt-token logprobs (what perplexity and log-likelihood tasks need)?"""
    base = {"model": endpoint.model, "prompt": probe_prompt, "temperature": 0.0}
    probe = {**completion_payload(endpoint, probe_prompt, 1, stream=False, capabilities=None, api=api),
             "ignore_eos": True}
    extensions = httpx.post(f"{endpoint.base_url}{API_PATHS[api]}", json=probe, timeout=120)
    detail = "" if extensions.status_code == 200 else rejected_field_message(extensions.status_code, extensions.text)
    echo = httpx.post(f"{endpoint.base_url}/v1/completions",
                      json={**base, "max_tokens": 1, "echo": True, "logprobs": 1}, timeout=120)
    prompt_logprobs = False
    if echo.status_code == 200:
        choice = echo.json()["choices"][0]
        token_logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
        usage = echo.json().get("usage") or {}
        # A log-likelihood score needs one logprob per prompt token (+1 generated); anything less scores at chance.
        prompt_logprobs = len(token_logprobs) >= usage.get("prompt_tokens", 1) + 1
    return ServerCapabilities(vllm_extensions=extensions.status_code == 200, prompt_logprobs=prompt_logprobs,
                              detail=detail)
