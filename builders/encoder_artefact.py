"""The encoder build stage: the recipe's ONNX graph to an artefact directory of kind ``onnx`` (the graph, the
tokenizer and ``embedding_config.json``, served by onnxruntime's CPU provider) or ``tensorrt-engine`` (the same
beside a TensorRT engine that trtexec builds on a GPU of the SKU).

As for LLM artefacts: work happens in ``<out>.partial``, ``artefact.json`` (every file's sha256) is written last
and the directory renamed into place, so nothing half-built looks finished.
"""

from __future__ import annotations

import shutil
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel

from builders.stage import finished_artefact
from enginesmith.core.artefacts import ARTEFACT_FILE, Artefact, GpuInfo, Lineage, ServeRecipe, artefact_record_bytes
from enginesmith.core.checkpoints.digest import file_sha256
from enginesmith.core.checkpoints.models import CheckpointFile
from enginesmith.core.encoder_graph import (
    GRAPH_FILE,
    EmbeddingServeConfig,
    EncoderGraph,
    OnnxExportResult,
    check_encoder_tools,
)
from enginesmith.core.errors import UserError
from enginesmith.core.locks import output_lock
from enginesmith.core.serving import ENGINESMITH_PYTHON
from enginesmith.core.specs import EncoderKind, TargetSpec, Toolchains
from enginesmith.core.staging import staged_output

TOKENIZER_FILE = "tokenizer.json"
ONNX_RUNTIME = "onnxruntime"
TENSORRT_RUNTIME = "tensorrt"
MAX_ENGINE_BATCH = 64


class EncoderBuildRequest(BaseModel):
    graph: EncoderGraph
    model_id: str
    target: TargetSpec
    kind: EncoderKind
    key: str
    out_dir: str
    toolchains: Toolchains = Toolchains()


def onnx_serve_recipe() -> ServeRecipe:
    """The artefact behind ``/v1/embeddings`` with enginesmith's onnxruntime server (installed with the
    ``onnx`` extra), in the interpreter that runs ``enginesmith serve``."""
    return ServeRecipe(runtime=ONNX_RUNTIME, argv=[
        ENGINESMITH_PYTHON, "-m", "validation.embeddings_server", "--artefact", "{artefact_dir}", "--host", "{host}",
        "--port", "{port}", "--served-model-name", "{model_name}"])


def build_encoder_artefact(request: EncoderBuildRequest, *, build_gpu: GpuInfo | None = None) -> Artefact:
    """Build (or find already built) the encoder artefact. A tensorrt-engine build needs ``build_gpu``: the GPU of
    the SKU it runs on, which the caller has detected."""
    out_dir = Path(request.out_dir)
    with output_lock(out_dir, "build"):
        existing = finished_artefact(out_dir, request.key)
        if existing is not None:
            return existing
        if request.kind == "tensorrt-engine" and build_gpu is None:
            raise UserError(f"a tensorrt-engine for {request.target.id} is built on a GPU of that SKU; none was "
                            "found here", where=request.target.id,
                            hint=f"run this cell on a node of the gpu-{request.target.id} pool")
        what = f"building the {request.kind} artefact of {request.model_id} for {request.target.id}"
        # The artefact holds the graph (an engine built from it is about its size) and the tokenizer.
        with staged_output(out_dir, what=what, need_bytes=Path(request.graph.graph_path).stat().st_size) as staging:
            return _build_into(request, staging, build_gpu)


def _build_into(request: EncoderBuildRequest, staging: Path, build_gpu: GpuInfo | None) -> Artefact:
    graph = request.graph
    checkpoint_dir = Path(graph.checkpoint.local_path)
    tokenizer = checkpoint_dir / TOKENIZER_FILE
    if not tokenizer.is_file():
        raise UserError(f"the encoder has no {TOKENIZER_FILE} (a fast tokenizer); the artefact's server needs it",
                        where=str(checkpoint_dir), hint="save the tokenizer with tokenizers' fast format")
    shutil.copyfile(graph.graph_path, staging / GRAPH_FILE)
    shutil.copyfile(tokenizer, staging / TOKENIZER_FILE)
    EmbeddingServeConfig(max_seq_length=graph.max_seq_length, pooling="in_graph",
                         normalize=graph.layout.normalize).write(staging)
    versions = {**graph.versions, "onnx": request.toolchains.encoder.onnx}
    build_config: dict[str, object] = {"opset": graph.opset, "precision": graph.precision,
                                       "pooling": graph.layout.pooling, "max_seq_length": graph.max_seq_length}
    if graph.quantization is not None:
        build_config["quantization"] = graph.quantization.model_dump(mode="json", exclude={"output_path"})
    if graph.agreement is not None:
        build_config["agreement_with_fp32"] = graph.agreement.model_dump(mode="json")
    serve: list[ServeRecipe] = []
    runtimes: list[str] = []
    if request.kind == "tensorrt-engine":
        from builders.tensorrt_encoder import build_tensorrt_encoder

        export = OnnxExportResult.model_validate_json((Path(graph.export_path).parent / "export.json").read_text())
        # The log goes beside the artefact, not into it: a failed build deletes the staging directory, and the log
        # is what the error points at.
        built = build_tensorrt_encoder(staging / GRAPH_FILE, staging, input_names=export.input_names,
                                       max_batch=MAX_ENGINE_BATCH, max_seq_length=graph.max_seq_length,
                                       expected_tensorrt=request.toolchains.encoder.tensorrt,
                                       log_path=Path(request.out_dir + ".trtexec.log"))
        versions.update(built.versions)
        build_config["engine"] = {"file": built.engine_file, **built.build_config}
        runtimes = [TENSORRT_RUNTIME]
    else:
        check_encoder_tools({"onnxruntime": request.toolchains.encoder.onnxruntime})  # what serves and validates it
        versions["onnxruntime"] = request.toolchains.encoder.onnxruntime
        runtimes = [ONNX_RUNTIME]
        serve = [onnx_serve_recipe()]
    if build_gpu is not None:
        versions["driver"] = build_gpu.driver_version
    source = graph.checkpoint
    artefact = Artefact(
        key=request.key, kind=request.kind, target=request.target.id, target_sm=request.target.sm,
        lineage=Lineage(model_id=request.model_id, repo_id=source.repo_id, commit_sha=source.commit_sha,
                        checkpoint_key=source.key, recipe=graph.recipe, quantize_key=graph.key,
                        calibration_dataset="builtin:embeddings-calibration" if graph.calibration_sha256 else None,
                        calibration_sha256=graph.calibration_sha256),
        versions=versions, build_gpu=build_gpu, build_config=build_config, runtimes=runtimes, serve=serve,
        files=[CheckpointFile(path=str(p.relative_to(staging)), size=p.stat().st_size, sha256=file_sha256(p))
               for p in sorted(staging.rglob("*")) if p.is_file()],
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    (staging / ARTEFACT_FILE).write_bytes(artefact_record_bytes(artefact))
    return artefact
