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
import random
import time
from collections.abc import Callable, Sequence

import aiohttp
import httpx
from pydantic import BaseModel

from validation.metrics import SLO, BenchmarkResult, RequestRecord, summarize
from validation.server import Endpoint
from validation.sse import record_from_stream

REQUEST_TIMEOUT_S = 600


class ServerCapabilities(BaseModel):
    """What a server has shown it accepts (probed, never assumed)."""

    vllm_extensions: bool  # ignore_eos and friends
    prompt_logprobs: bool  # echo + logprobs returns a logprob per prompt token
    detail: str = ""


def completion_payload(endpoint: Endpoint, prompt: str, max_tokens: int, *, stream: bool,
                       capabilities: ServerCapabilities | None) -> dict[str, object]:
    payload: dict[str, object] = {"model": endpoint.model, "prompt": prompt, "max_tokens": max_tokens,
                                  "temperature": 0.0, "stream": stream}
    if stream:
        payload["stream_options"] = {"include_usage": True}
    if capabilities is not None and capabilities.vllm_extensions:
        payload["ignore_eos"] = True
    return payload


def rejected_field_message(status: int, body: str) -> str:
    """A 4xx names what the server rejected (transformers serve: 'Unexpected fields: {...}')."""
    return f"HTTP {status}: {body.strip()[:300]}"


async def send_one(session: aiohttp.ClientSession, endpoint: Endpoint, payload: dict[str, object],
                   prompt_len: int, bench_start: float) -> RequestRecord:
    """One streamed completion; each SSE line is stamped with the arrival time of the bytes that ended it."""
    start = time.perf_counter()
    lines: list[tuple[float, str]] = []
    pending = b""
    try:
        async with session.post(f"{endpoint.base_url}/v1/completions", json=payload) as response:
            if response.status != 200:
                body = (await response.read()).decode(errors="replace")
                return RequestRecord(success=False, prompt_len=prompt_len, start_s=start - bench_start,
                                     error=rejected_field_message(response.status, body))
            async for chunk in response.content.iter_any():
                elapsed = time.perf_counter() - start
                *complete, pending = (pending + chunk).split(b"\n")
                lines.extend((elapsed, line.decode(errors="replace")) for line in complete)
        if pending:
            lines.append((time.perf_counter() - start, pending.decode(errors="replace")))
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        return RequestRecord(success=False, prompt_len=prompt_len, start_s=start - bench_start,
                             error=f"{type(exc).__name__}: {exc}"[:300])
    return record_from_stream(lines, prompt_len=prompt_len, start_s=start - bench_start)


def arrival_gaps(count: int, request_rate: float | None, burstiness: float, seed: int) -> list[float]:
    """Inter-arrival times: all at once without a rate; Poisson (burstiness 1) or gamma otherwise, with the
    mean gap 1/rate (shape = burstiness, scale = 1/(rate·burstiness)), as vLLM does."""
    if request_rate is None:
        return [0.0] * count
    rng = random.Random(seed)
    return [rng.gammavariate(burstiness, 1.0 / (request_rate * burstiness)) for _ in range(count)]


async def _run_level(endpoint: Endpoint, prompts: Sequence[tuple[str, int, int]], *, concurrency: int,
                     request_rate: float | None, burstiness: float, capabilities: ServerCapabilities,
                     warmup_requests: int, seed: int, slo: SLO | None,
                     on_done: Callable[[], None] | None) -> BenchmarkResult:
    connector = aiohttp.TCPConnector(limit=max(concurrency, 1) + 4)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:
        for text, prompt_len, output_len in list(prompts)[:warmup_requests]:
            await send_one(client, endpoint, completion_payload(endpoint, text, output_len, stream=True,
                                                                capabilities=capabilities), prompt_len,
                           time.perf_counter())
        semaphore = asyncio.Semaphore(concurrency)
        bench_start = time.perf_counter()

        async def limited(text: str, prompt_len: int, output_len: int) -> RequestRecord:
            async with semaphore:
                record = await send_one(client, endpoint, completion_payload(
                    endpoint, text, output_len, stream=True, capabilities=capabilities), prompt_len, bench_start)
            if on_done:
                on_done()
            return record

        tasks = []
        for (text, prompt_len, output_len), gap in zip(prompts, arrival_gaps(len(prompts), request_rate, burstiness,
                                                                             seed), strict=True):
            if gap:
                await asyncio.sleep(gap)
            tasks.append(asyncio.create_task(limited(text, prompt_len, output_len)))
        records = await asyncio.gather(*tasks)
        duration = time.perf_counter() - bench_start
    return summarize(records, duration, concurrency=concurrency, request_rate=request_rate, slo=slo)


def run_level(endpoint: Endpoint, prompts: Sequence[tuple[str, int, int]], *, concurrency: int,
              capabilities: ServerCapabilities, request_rate: float | None = None, burstiness: float = 1.0,
              warmup_requests: int = 0, seed: int = 0, slo: SLO | None = None,
              on_done: Callable[[], None] | None = None) -> BenchmarkResult:
    """One load level: every prompt ``(text, prompt_len, output_len)`` sent with at most ``concurrency`` in flight."""
    return asyncio.run(_run_level(endpoint, prompts, concurrency=concurrency, request_rate=request_rate,
                                  burstiness=burstiness, capabilities=capabilities, warmup_requests=warmup_requests,
                                  seed=seed, slo=slo, on_done=on_done))


def probe_capabilities(endpoint: Endpoint, probe_prompt: str = "Hello") -> ServerCapabilities:
    """Does the server take ``ignore_eos``, and does ``echo`` + ``logprobs`` give prompt-token logprobs?"""
    base = {"model": endpoint.model, "prompt": probe_prompt, "temperature": 0.0}
    extensions = httpx.post(f"{endpoint.base_url}/v1/completions", json={**base, "max_tokens": 1, "ignore_eos": True},
                            timeout=120)
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
