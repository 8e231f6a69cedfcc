"""The encoder kind's stages as plain functions: export the checkpoint to ONNX, quantise the graph, build the
artefact, validate it against vLLM's embeddings. Each keeps its output in the work directory under its stage key."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from builders.encoder_artefact import EncoderBuildRequest, build_encoder_artefact
from enginesmith.core.artefacts import ARTEFACT_FILE, Artefact, GpuInfo
from enginesmith.core.checkpoints.models import Checkpoint
from enginesmith.core.errors import UserError
from enginesmith.core.specs import PipelineConfig
from pipeline.common import steps
from pipeline.kinds.encoder_plan import EncoderCell
from quantization.encoder_stage import EncoderGraph, export_stage, quantize_stage
from quantization.onnx_export import OnnxExportResult

EXPORT_DIR, ENCODER_QUANTIZED_DIR = "encoder-export", "encoder-quantized"

log = logging.getLogger(__name__)


def export_dir(cell: EncoderCell, work: Path) -> Path:
    return work / EXPORT_DIR / cell.stage_keys.export[:16]


def encoder_graph_dir(cell: EncoderCell, work: Path) -> Path:
    return work / ENCODER_QUANTIZED_DIR / cell.stage_keys.quantize[:16]


def export(cell: EncoderCell, checkpoint: Checkpoint, work: Path, config: PipelineConfig) -> OnnxExportResult:
    tools = config.toolchains
    result = export_stage(checkpoint, cell.recipe.opset, export_dir(cell, work), expected_versions={
        "torch": tools.quantize.torch, "transformers": tools.quantize.transformers, "onnx": tools.encoder.onnx})
    log.info("exported %s to ONNX opset %d (%s)", cell.model.id, result.opset, result.exporter)
    return result


def quantize_versions(config: PipelineConfig, cell: EncoderCell) -> dict[str, str]:
    tools = config.toolchains
    versions = {"torch": tools.quantize.torch, "transformers": tools.quantize.transformers,
                "onnx": tools.encoder.onnx}
    if cell.recipe.quantize:
        versions["modelopt"] = tools.quantize.modelopt
    return versions


def quantize(cell: EncoderCell, checkpoint: Checkpoint, exported: OnnxExportResult, work: Path,
             config: PipelineConfig) -> EncoderGraph:
    graph = quantize_stage(cell.model, cell.recipe, checkpoint, exported, cell.stage_keys.quantize,
                           encoder_graph_dir(cell, work), versions=quantize_versions(config, cell))
    if graph.agreement is not None:
        log.info("%s vs the FP32 graph on %d held-out sentences: cosine min %.4f, mean %.4f", cell.recipe.id,
                 graph.agreement.sentences, graph.agreement.min_cosine, graph.agreement.mean_cosine)
    return graph


def build(cell: EncoderCell, graph: EncoderGraph, work: Path, config: PipelineConfig) -> Path:
    out_dir = work / steps.ARTEFACTS_DIR / cell.stage_keys.build[:16]
    build_encoder_artefact(EncoderBuildRequest(graph=graph, model_id=cell.model.id, target=cell.target,
                                               kind=cell.kind, key=cell.stage_keys.build, out_dir=str(out_dir),
                                               toolchains=config.toolchains),
                           build_gpu=engine_build_gpu(cell) if cell.kind == "tensorrt-engine" else None)
    return out_dir


def engine_build_gpu(cell: EncoderCell) -> GpuInfo | None:
    """The GPU of the cell's SKU that trtexec builds on (CUDA device 0 must be one); None when there is none."""
    from enginesmith.core.gpus import build_gpu_info, detect

    gpus = detect([cell.target])
    if not gpus or gpus[0].match.target_id != cell.target.id:
        return None
    return build_gpu_info(gpus[0].gpu)


def validate(cell: EncoderCell, artefact_dir: Path, graph: EncoderGraph, config: PipelineConfig,
             work: Path) -> dict[str, Any]:
    from validation.encoder_stage import validate_encoder
    from validation.report import write_report

    if cell.kind == "tensorrt-engine":
        raise UserError(f"cell {cell.id}: a TensorRT engine is validated by running it on its GPU, which this "
                        "pipeline does not do yet (the onnx kind is validated on onnxruntime); nothing is published",
                        where=cell.id, hint="build the onnx kind for the cpu, or publish the engine by hand after "
                                            "checking it")
    artefact = Artefact.model_validate_json((artefact_dir / ARTEFACT_FILE).read_text())
    reports = work / steps.REPORTS_DIR / cell.stage_keys.validation[:16]
    report = validate_encoder(
        cell=cell.id, key=cell.key, artefact_key=artefact.key, recipe=cell.recipe.id, artefact_dir=artefact_dir,
        fp32_graph=Path(graph.export_path), checkpoint_dir=Path(graph.checkpoint.local_path), work=reports,
        workload=config.encoder_workload, gates=config.encoder_gates,
        describe=f"{cell.recipe.id} ONNX on onnxruntime ({cell.target.id})")
    write_report(report, reports)
    return report.model_dump(mode="json")
