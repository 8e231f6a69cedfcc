"""The encoder's export and quantise stages: a sentence-transformers checkpoint to the ONNX graph its recipe asks
for (FP32 export, then ModelOpt ONNX int8/fp8 quantisation or an FP16 cast, or nothing), with the quality report
(cosine of the recipe's embeddings to the FP32 graph's on the held-out sentences).

Each stage writes into ``<dir>.partial`` and renames it into place with a completion marker last, as the LLM
quantize stage does: a stage killed half-way leaves nothing that looks finished, and a finished one is reused by key.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from enginesmith.core.artefacts import COMPLETE_MARKER
from enginesmith.core.checkpoints.encoder_layout import EncoderLayout
from enginesmith.core.checkpoints.models import Checkpoint
from enginesmith.core.encoder_graph import GRAPH_FILE, STAGE_RECORD, EncoderGraph, check_encoder_tools
from enginesmith.core.errors import ConfigError, UserError
from enginesmith.core.locks import output_lock
from enginesmith.core.specs import EncoderModelSpec, EncoderRecipeSpec
from enginesmith.core.staging import staged_output
from quantization.onnx_export import OnnxExportResult

FP16_IO_NOTE = "inputs and outputs stay int64/fp32 (keep_io_types)"


def served_layout(model: EncoderModelSpec, checkpoint_dir: Path) -> tuple[EncoderLayout, int]:
    """The checkpoint's pooling and normalisation, checked against what the config says it expects, and the
    sequence length to serve (the config's ``max_length`` where it is shorter than the checkpoint's)."""
    from enginesmith.core.checkpoints.encoder_layout import read_layout

    layout = read_layout(checkpoint_dir)
    for field, expected, found in (("pooling", model.pooling, layout.pooling),
                                   ("normalize", model.normalize, layout.normalize)):
        if expected is not None and expected != found:
            raise ConfigError(f"encoder {model.id}: the config expects {field} {expected!r}, the checkpoint's "
                              f"modules say {found!r}", field=f"encoders.{model.id}.{field}",
                              hint=f"remove {field} from the config to take the checkpoint's, or point repo at the "
                                   "model you meant")
    limit = layout.max_seq_length or 512
    if model.max_length is not None and model.max_length > limit:
        raise ConfigError(f"encoder {model.id}: max_length {model.max_length} is beyond the checkpoint's "
                          f"{limit}", field=f"encoders.{model.id}.max_length", hint=f"use at most {limit}")
    return layout, min(model.max_length or limit, limit)


def export_stage(checkpoint: Checkpoint, opset: int, out_dir: Path, *,
                 expected_versions: dict[str, str] | None = None) -> OnnxExportResult:
    """The FP32 graph at ``opset`` in ``out_dir`` (reused when it is there, complete)."""
    from quantization.onnx_export import OnnxExportRequest, export_encoder

    record = out_dir / "export.json"
    if (out_dir / COMPLETE_MARKER).is_file():
        return OnnxExportResult.model_validate_json(record.read_text())
    check_encoder_tools(expected_versions or {})
    with output_lock(out_dir, "export"):
        if (out_dir / COMPLETE_MARKER).is_file():  # another process finished it while this one waited
            return OnnxExportResult.model_validate_json(record.read_text())
        _refuse_unfinished(out_dir)
        # The FP32 graph holds the checkpoint's weights at about their size.
        with staged_output(out_dir, what=f"exporting {checkpoint.repo_id} to ONNX",
                           need_bytes=sum(f.size for f in checkpoint.files)) as staging:
            result = export_encoder(OnnxExportRequest(model_dir=Path(checkpoint.local_path),
                                                      onnx_path=staging / GRAPH_FILE, opset=opset))
            result = result.model_copy(update={"onnx_path": out_dir / GRAPH_FILE})
            (staging / "export.json").write_text(result.model_dump_json(indent=2))
            (staging / COMPLETE_MARKER).write_text("")
    return result


def quantize_stage(model: EncoderModelSpec, recipe: EncoderRecipeSpec, checkpoint: Checkpoint,
                   export: OnnxExportResult, key: str, out_dir: Path, *, calibration_file: Path | None = None,
                   versions: dict[str, str] | None = None) -> EncoderGraph:
    """The recipe's graph in ``out_dir``: the export quantised (int8/fp8), cast (fp16) or copied (fp32)."""
    from quantization.embedding_quality import onnx_agreement
    from quantization.onnx_quantize import (
        CALIBRATION_FILE,
        HELD_OUT_FILE,
        OnnxQuantizeRequest,
        quantize_encoder,
        read_sentences,
    )

    done = read_encoder_graph(out_dir)
    if done is not None and done.key == key:
        return done
    checkpoint_dir = Path(checkpoint.local_path)
    layout, max_seq_length = served_layout(model, checkpoint_dir)
    if export.opset < recipe.opset:
        raise UserError(f"recipe {recipe.id} needs opset {recipe.opset}; the export is opset {export.opset}",
                        where=str(export.onnx_path), hint="export again at the recipe's opset")
    check_encoder_tools(versions or {})
    with output_lock(out_dir, "quantize"):
        done = read_encoder_graph(out_dir)  # another process finished it while this one waited
        if done is not None and done.key == key:
            return done
        _refuse_unfinished(out_dir)
        # The recipe's graph is at most the FP32 export's size (a copy; int8, fp8 and fp16 are smaller).
        with staged_output(out_dir, what=f"the {recipe.id} graph of {model.id}",
                           need_bytes=Path(export.onnx_path).stat().st_size) as staging:
            graph = staging / GRAPH_FILE
            quantization = None
            calibration_sha256 = None
            if recipe.quantize is not None:
                calibration = calibration_file or CALIBRATION_FILE
                quantization = quantize_encoder(OnnxQuantizeRequest(
                    onnx_path=export.onnx_path, model_dir=checkpoint_dir, output_path=graph, mode=recipe.quantize,
                    calibration_file=calibration, sequence_length=min(128, max_seq_length)))
                quantization = quantization.model_copy(update={"output_path": out_dir / GRAPH_FILE})
                from enginesmith.core.checkpoints.digest import file_sha256

                calibration_sha256 = file_sha256(calibration)
            elif recipe.precision == "fp16":
                cast_to_fp16(export.onnx_path, graph)
            else:
                shutil.copyfile(export.onnx_path, graph)
            agreement = None
            if recipe.quantize is not None:  # an FP32 copy agrees with itself; an FP16 graph does not run on the CPU
                agreement = onnx_agreement(export.onnx_path, graph, checkpoint_dir, read_sentences(HELD_OUT_FILE),
                                           optimize_candidate=recipe.quantize != "fp8")
            result = EncoderGraph(key=key, recipe=recipe.id, checkpoint=checkpoint, out_dir=str(out_dir),
                                  export_path=str(export.onnx_path), opset=export.opset, layout=layout,
                                  max_seq_length=max_seq_length, quantization=quantization, precision=recipe.precision,
                                  agreement=agreement, calibration_sha256=calibration_sha256,
                                  versions=versions or {})
            (staging / STAGE_RECORD).write_text(result.model_dump_json(indent=2))
            (staging / COMPLETE_MARKER).write_text("")
    return result


def cast_to_fp16(source: Path, dest: Path) -> None:
    """The graph's weights and arithmetic in FP16 (for TensorRT, which since TensorRT 11 builds strongly typed
    networks only: the graph's types are the engine's)."""
    import onnx
    from onnxconverter_common import float16

    converted = float16.convert_float_to_float16(onnx.load(str(source)), keep_io_types=True)
    onnx.save(converted, str(dest))


def read_encoder_graph(out_dir: Path) -> EncoderGraph | None:
    if not (out_dir / COMPLETE_MARKER).is_file():
        return None
    return EncoderGraph.model_validate_json((out_dir / STAGE_RECORD).read_text())


def _refuse_unfinished(out_dir: Path) -> None:
    if out_dir.exists():
        raise UserError(f"{out_dir} exists without a completion marker; it is not overwritten", where=str(out_dir),
                        hint="delete it: a stage killed half-way leaves its work in <dir>.partial, never here")
