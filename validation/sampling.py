"""Memory and KV-cache usage, sampled in the background while a server is under load."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import httpx

# vLLM v1 exports the KV-cache fill as vllm:kv_cache_usage_perc (older: vllm:gpu_cache_usage_perc), 0..1.
KV_USAGE_METRIC = re.compile(r"^vllm:(?:kv|gpu)_cache_usage_perc(?:\{[^}]*\})?\s+([0-9.eE+-]+)", re.MULTILINE)


def process_tree_pids(root_pid: int) -> set[int]:
    """A process and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for status in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = status.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(status.parent.name))
    found, stack = set(), [root_pid]
    while stack:
        pid = stack.pop()
        found.add(pid)
        stack.extend(children.get(pid, []))
    return found


def process_tree_rss_bytes(root_pid: int) -> int:
    """Resident memory of a process and all its descendants, from /proc."""
    total = 0
    for pid in process_tree_pids(root_pid):
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def gpu_memory_used_bytes(pids: set[int] | None = None) -> int | None:
    """GPU memory in use: by the processes ``pids`` (NVML's compute processes, every GPU), or on the whole node
    when ``pids`` is None (other jobs included). None without a driver, and where none of ``pids`` shows among
    NVML's processes although some do (a container whose PIDs NVML reports from the host's namespace)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver: not a GPU run
        return None
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        if pids is None:
            return sum(int(pynvml.nvmlDeviceGetMemoryInfo(handle).used) for handle in handles)
        processes = [p for handle in handles for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        ours = [int(p.usedGpuMemory or 0) for p in processes if p.pid in pids]
        if processes and not ours:
            return None
        return sum(ours)
    finally:
        pynvml.nvmlShutdown()


def scrape_kv_usage(base_url: str) -> float | None:
    try:
        text = httpx.get(f"{base_url}/metrics", timeout=2).text
    except httpx.HTTPError:
        return None
    return kv_usage_from_metrics(text)


def kv_usage_from_metrics(text: str) -> float | None:
    """The highest KV-cache fill (0..1) in a ``/metrics`` answer: vLLM's Prometheus text, or trtllm-serve's JSON
    list of iteration stats (``kvCacheStats.usedNumBlocks / maxNumBlocks``; the list holds the iterations since
    the last call, so an idle server answers ``[]``)."""
    if text.lstrip().startswith("["):
        try:
            iterations: Any = json.loads(text)
        except ValueError:
            return None
        fills = [_block_fill(stats.get("kvCacheStats")) for stats in iterations if isinstance(stats, dict)]
        known = [fill for fill in fills if fill is not None]
        return max(known) if known else None
    values = [float(v) for v in KV_USAGE_METRIC.findall(text)]
    return max(values) if values else None


def _block_fill(kv_stats: Any) -> float | None:
    if not isinstance(kv_stats, dict):
        return None
    used, total = kv_stats.get("usedNumBlocks"), kv_stats.get("maxNumBlocks")
    if not isinstance(used, int | float) or not isinstance(total, int | float) or total <= 0:
        return None
    return float(used) / float(total)


class UsageSampler:
    """Peak memory and peak KV-cache usage. Memory: on GPUs, what the server's own process tree holds
    (``nvml-process``), or the node's total where NVML cannot tell its processes apart (``nvml``: other jobs
    included); on the CPU, the process tree's resident memory (``process-rss``)."""

    def __init__(self, base_url: str, server_pid: int | None, interval_s: float = 0.5) -> None:
        self.base_url, self.server_pid, self.interval_s = base_url, server_pid, interval_s
        self.peak_memory_bytes: int | None = None
        self.kv_cache_usage_max: float | None = None
        self.memory_source = "process-rss"
        if gpu_memory_used_bytes() is not None:
            tree = process_tree_pids(server_pid) if server_pid else None
            self.memory_source = "nvml-process" if tree and gpu_memory_used_bytes(tree) is not None else "nvml"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        memory: int | None = None
        if self.memory_source == "nvml-process" and self.server_pid:
            memory = gpu_memory_used_bytes(process_tree_pids(self.server_pid))
        elif self.memory_source == "nvml":
            memory = gpu_memory_used_bytes()
        elif self.server_pid:
            memory = process_tree_rss_bytes(self.server_pid)
        if memory is not None:
            self.peak_memory_bytes = max(self.peak_memory_bytes or 0, memory)
        usage = scrape_kv_usage(self.base_url)
        if usage is not None:
            self.kv_cache_usage_max = max(self.kv_cache_usage_max or 0.0, usage)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval_s)

    def __enter__(self) -> UsageSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sample()
