"""The ``build-encoder-cell`` flow: pull → export → quantise → build → validate → publish for one encoder cell
(an embedding model's ONNX road), each a task whose result is reused by its stage key while its files are on disk.

A failed gate publishes nothing and leaves the run Failed with the verdict, as for LLM cells.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.context import TaskRunContext
from pydantic import BaseModel, Field

from enginesmith.artefacts import ARTEFACT_FILE, COMPLETE_MARKER, Artefact, GpuInfo
from enginesmith.checkpoints.models import Checkpoint
from enginesmith.config import default_catalogue, load_pipeline_config
from enginesmith.encoder_plan import EncoderCell
from enginesmith.errors import ConfigError, UserError
from enginesmith.specs import PipelineConfig
from flows.cell import RETRY_DELAYS_S, GateFailed, key_if, retry_transient, worker_name
from flows.history import record_cell
from flows.params import CellSummary
from pipeline import steps
from pipeline.plan_sources import plan_encoders_loaded
from quantization.encoder_stage import EncoderGraph
from quantization.onnx_export import OnnxExportResult

EXPORT_DIR, ENCODER_QUANTIZED_DIR = "encoder-export", "encoder-quantized"


class BuildEncoderCellParams(BaseModel):
    """Build, validate and publish one encoder cell of a config: an embedding model through ONNX."""

    config: str = Field("configs/examples/minilm-cpu.yaml", description="Matrix config (path in the checkout)")
    cell: str = Field("all-minilm-l6-v2/int8/cpu/onnx", description="Encoder cell id: model/recipe/target/kind")


def encoder_cell_for(params: BuildEncoderCellParams) -> tuple[PipelineConfig, EncoderCell]:
    config_path = Path(params.config)
    catalogue = default_catalogue()
    config = load_pipeline_config(config_path, catalogue)
    cells = plan_encoders_loaded(config, config_path.parent, catalogue)
    for cell in cells:
        if cell.id == params.cell:
            return config, cell
    raise ConfigError(f"no encoder cell {params.cell!r} in {config_path}", field="params.cell",
                      hint="cells there: " + (", ".join(c.id for c in cells) or "none (no encoder_matrix)"))


def export_dir(cell: EncoderCell, work: Path) -> Path:
    return work / EXPORT_DIR / cell.stage_keys.export[:16]


def encoder_graph_dir(cell: EncoderCell, work: Path) -> Path:
    return work / ENCODER_QUANTIZED_DIR / cell.stage_keys.quantize[:16]


def _export_key(context: TaskRunContext, parameters: dict[str, Any]) -> str | None:
    cell: EncoderCell = parameters["cell"]
    return key_if(export_dir(cell, parameters["work"]) / COMPLETE_MARKER, cell.stage_keys.export)


def _quantize_key(context: TaskRunContext, parameters: dict[str, Any]) -> str | None:
    cell: EncoderCell = parameters["cell"]
    return key_if(encoder_graph_dir(cell, parameters["work"]) / COMPLETE_MARKER, cell.stage_keys.quantize)


def _build_key(context: TaskRunContext, parameters: dict[str, Any]) -> str | None:
    cell: EncoderCell = parameters["cell"]
    artefact_json = parameters["work"] / steps.ARTEFACTS_DIR / cell.stage_keys.build[:16] / ARTEFACT_FILE
    return key_if(artefact_json, cell.stage_keys.build)


@task(name="pull-encoder", retries=len(RETRY_DELAYS_S), retry_delay_seconds=RETRY_DELAYS_S,
      retry_condition_fn=retry_transient)
def pull_encoder_task(config_path: Path, cell: EncoderCell) -> Checkpoint:
    return steps.pull(config_path, cell)


@task(name="export-onnx", cache_key_fn=_export_key, persist_result=True)
def export_task(cell: EncoderCell, checkpoint: Checkpoint, work: Path, config: PipelineConfig) -> OnnxExportResult:
    from quantization.encoder_stage import export_stage

    tools = config.toolchains
    result = export_stage(checkpoint, cell.recipe.opset, export_dir(cell, work), expected_versions={
        "torch": tools.quantize.torch, "transformers": tools.quantize.transformers, "onnx": tools.encoder.onnx})
    get_run_logger().info("exported %s to ONNX opset %d (%s)", cell.model.id, result.opset, result.exporter)
    return result


@task(name="quantize-onnx", cache_key_fn=_quantize_key, persist_result=True)
def quantize_encoder_task(cell: EncoderCell, checkpoint: Checkpoint, export: OnnxExportResult, work: Path,
                          versions: dict[str, str]) -> EncoderGraph:
    from quantization.encoder_stage import quantize_stage

    graph = quantize_stage(cell.model, cell.recipe, checkpoint, export, cell.stage_keys.quantize,
                           encoder_graph_dir(cell, work), versions=versions)
    if graph.agreement is not None:
        get_run_logger().info("%s vs the FP32 graph on %d held-out sentences: cosine min %.4f, mean %.4f",
                              cell.recipe.id, graph.agreement.sentences, graph.agreement.min_cosine,
                              graph.agreement.mean_cosine)
    return graph


@task(name="build-encoder", cache_key_fn=_build_key, persist_result=True)
def build_encoder_task(cell: EncoderCell, graph: EncoderGraph, work: Path, config: PipelineConfig) -> Path:
    from builders.encoder_artefact import EncoderBuildRequest, build_encoder_artefact

    out_dir = work / steps.ARTEFACTS_DIR / cell.stage_keys.build[:16]
    build_encoder_artefact(EncoderBuildRequest(graph=graph, model_id=cell.model.id, target=cell.target,
                                               kind=cell.kind, key=cell.stage_keys.build, out_dir=str(out_dir),
                                               toolchains=config.toolchains),
                           build_gpu=engine_build_gpu(cell) if cell.kind == "tensorrt-engine" else None)
    return out_dir


def engine_build_gpu(cell: EncoderCell) -> GpuInfo | None:
    """The GPU of the cell's SKU that trtexec builds on (CUDA device 0 must be one); None when there is none."""
    from enginesmith.gpus import build_gpu_info, detect

    gpus = detect([cell.target])
    if not gpus or gpus[0].match.target_id != cell.target.id:
        return None
    return build_gpu_info(gpus[0].gpu)


@task(name="validate-encoder", retries=1, retry_delay_seconds=10, retry_condition_fn=retry_transient)
def validate_encoder_task(cell: EncoderCell, artefact_dir: Path, graph: EncoderGraph, config: PipelineConfig,
                          work: Path) -> dict[str, Any]:
    from validation.encoder_stage import render_encoder_report, validate_encoder, write_encoder_plot

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
    markdown = render_encoder_report(report)
    (reports / "report.md").write_text(markdown)
    (reports / "report.json").write_text(report.model_dump_json(indent=2))
    write_encoder_plot(report, reports)
    create_markdown_artifact(markdown=markdown, key=f"report-{cell.key[:12]}", description=f"validation of {cell.id}")
    create_table_artifact(key=f"gates-{cell.key[:12]}", description=f"gates of {cell.id}",
                          table=[g.model_dump(include={"name", "measured", "limit", "passed", "detail"})
                                 for g in report.gates])
    return report.model_dump(mode="json")


@task(name="publish-encoder", retries=len(RETRY_DELAYS_S), retry_delay_seconds=RETRY_DELAYS_S,
      retry_condition_fn=retry_transient)
def publish_encoder_task(cell: EncoderCell, artefact_dir: Path, report: dict[str, Any],
                         config: PipelineConfig) -> str:
    result = steps.publish(cell.key, artefact_dir, report, config)
    get_run_logger().info("published %s/%s (%d new blobs, %d reused) to %s", result.model, result.key[:12],
                          result.uploaded_blobs, result.reused_blobs, result.registry)
    return result.key


def quantize_versions(config: PipelineConfig, cell: EncoderCell) -> dict[str, str]:
    tools = config.toolchains
    versions = {"torch": tools.quantize.torch, "transformers": tools.quantize.transformers,
                "onnx": tools.encoder.onnx}
    if cell.recipe.quantize:
        versions["modelopt"] = tools.quantize.modelopt
    return versions


@flow(name="build-encoder-cell", persist_result=True)
def build_encoder_cell(params: BuildEncoderCellParams = BuildEncoderCellParams()) -> CellSummary:
    logger = get_run_logger()
    config, cell = encoder_cell_for(params)
    if cell.status == "invalid":
        raise ConfigError(f"cell {cell.id} cannot be built: {cell.reason}", field="params.cell")
    if steps.published(config, cell.model.id, cell.key):
        logger.info("cell %s (key %s) is already in the registry: nothing to do", cell.id, cell.key[:12])
        return CellSummary(cell=cell.id, status="cached", key=cell.key, worker=worker_name())
    try:
        return build_validate_publish_encoder(params, cell, config)
    except GateFailed:
        raise  # recorded with its report
    except Exception as exc:
        record_cell(config, cell, "failed", reason=exc.render() if isinstance(exc, UserError) else repr(exc))
        raise


def build_validate_publish_encoder(params: BuildEncoderCellParams, cell: EncoderCell,
                                   config: PipelineConfig) -> CellSummary:
    logger = get_run_logger()
    work = steps.workdir(config)
    checkpoint = pull_encoder_task(Path(params.config), cell)
    export = export_task(cell, checkpoint, work, config)
    graph = quantize_encoder_task(cell, checkpoint, export, work, quantize_versions(config, cell))
    artefact_dir = build_encoder_task(cell, graph, work, config)
    report = validate_encoder_task(cell, artefact_dir, graph, config, work)
    if not report["passed"]:
        failed = [g for g in report["gates"] if not g["passed"]]
        verdict = "; ".join(f"{g['name']} = {g['measured']} (limit {g['limit']})" for g in failed)
        record_cell(config, cell, "gate-failed", report=report, artefact_dir=artefact_dir, reason=verdict)
        raise GateFailed(f"cell {cell.id} failed its gates: {verdict}. Nothing was published.")
    publish_encoder_task(cell, artefact_dir, report, config)
    record_cell(config, cell, "built", report=report, artefact_dir=artefact_dir)
    logger.info("cell %s built and published", cell.id)
    return CellSummary(cell=cell.id, status="built", key=cell.key,
                       throughput_ratio=report["throughput_ratio"]["median"], worker=worker_name())
