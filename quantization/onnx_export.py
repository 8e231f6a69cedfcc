"""Export a sentence-transformers encoder (transformer + pooling + optional L2 normalisation) to one ONNX graph.

The graph takes the tokenizer's ``input_ids``, ``attention_mask`` (and ``token_type_ids`` when the model's forward
takes them), all int64 ``[batch, sequence]`` with both axes dynamic, and returns ``sentence_embedding``
``[batch, hidden]`` with the pooling and normalisation inside the graph, so a runtime needs nothing but the tokenizer.
The layout is read from the directory (``modules.json``, ``1_Pooling/config.json``, ``sentence_bert_config.json``),
never assumed.

Exporter: torch.onnx's TorchScript-based exporter (``dynamo=False``) of torch 2.13.0, not the dynamo exporter nor
optimum-onnx 0.1.0. Measured on all-MiniLM-L6-v2: the dynamo exporter implements opset 18 and up only; asked for 13 it
tries onnx's version converter, which fails on this graph ("axes_input_to_attribute ... No initializer or constant
input") and it then *silently keeps opset 18* (LayerNormalization in the graph), so the int8 path's opset 13 cannot
come from it. The TorchScript exporter writes opsets 9 to 20 natively and says which operator an opset cannot express
(``UnsupportedOperatorError``); opset 21 (fp8) is its opset-20 graph moved up by ``onnx.version_converter``, which has
no adapters to apply from 20 to 21 for the operators a BERT uses. optimum-onnx would add a dependency that drives the
same TorchScript exporter underneath. The TorchScript exporter is deprecated since torch 2.9 (a DeprecationWarning);
when torch removes it, this module switches to dynamo and the int8 floor moves to opset 18.

Attention is traced in its ``eager`` form by default (explicit MatMul, Softmax, MatMul): opset 13 expresses it and it
is the pattern ModelOpt's ONNX PTQ places Q/DQ around. ``attention="sdpa"`` exports ``scaled_dot_product_attention``,
which needs opset 14.
"""

from __future__ import annotations

import inspect
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from enginesmith.core.checkpoints.encoder_layout import EncoderLayout, read_layout
from enginesmith.core.encoder_graph import OnnxExportResult
from enginesmith.core.errors import UserError

if TYPE_CHECKING:
    import torch

OUTPUT_NAME = "sentence_embedding"
# The TorchScript exporter's newest opset (torch.onnx._constants.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET in torch 2.13).
TORCHSCRIPT_MAX_OPSET = 20
MAX_OPSET = 21
EXPORTER = "torch.onnx TorchScript exporter (dynamo=False)"
class OnnxExportRequest(BaseModel):
    model_config = ConfigDict(frozen=True)

    model_dir: Path
    onnx_path: Path
    opset: int = Field(13, ge=9, le=MAX_OPSET)  # 13 for int8, 21 for fp8
    attention: Literal["eager", "sdpa"] = "eager"


def _pooled_encoder_class() -> type:
    import torch

    class PooledEncoder(torch.nn.Module):
        """The transformer followed by the directory's pooling and normalisation, as sentence-transformers does."""

        def __init__(self, backbone: torch.nn.Module, layout: EncoderLayout, input_names: list[str]) -> None:
            super().__init__()
            self.backbone = backbone
            self.layout = layout
            self.input_names = input_names

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
            extra = {"token_type_ids": token_type_ids} if "token_type_ids" in self.input_names else {}
            hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            if self.layout.pooling == "cls":
                pooled = hidden[:, 0]
            elif self.layout.pooling == "max":
                pooled = hidden.masked_fill(mask == 0, -1e9).max(dim=1).values
            else:
                summed = (hidden * mask).sum(dim=1)
                counts = mask.sum(dim=1).clamp(min=1e-9)
                pooled = summed / (counts if self.layout.pooling == "mean" else counts.sqrt())
            if self.layout.normalize:
                pooled = torch.nn.functional.normalize(pooled, p=2.0, dim=1)
            return pooled

    return PooledEncoder


def load_sentence_encoder(model_dir: Path, *, attention: Literal["eager", "sdpa"] = "eager"
                          ) -> tuple[torch.nn.Module, list[str], EncoderLayout]:
    """The FP32 PyTorch encoder with pooling (eval mode), the input names it takes, and the layout it applies."""
    from transformers import AutoModel, AutoTokenizer

    layout = read_layout(model_dir)
    try:
        backbone = AutoModel.from_pretrained(model_dir, attn_implementation=attention).eval()
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError) as exc:
        raise UserError(f"transformers could not load the encoder: {exc}", where=str(model_dir)) from None
    accepted = inspect.signature(backbone.forward).parameters
    input_names = [name for name in ("input_ids", "attention_mask", "token_type_ids")
                   if name in accepted and name in tokenizer.model_input_names]
    if input_names[:2] != ["input_ids", "attention_mask"]:
        raise UserError(f"the model takes {input_names}, not input_ids and attention_mask", where=str(model_dir))
    return _pooled_encoder_class()(backbone, layout, input_names), input_names, layout


def check_onnx_file(onnx_path: Path) -> None:
    """``onnx.checker.check_model`` with ``full_check`` (shape inference too). Raises a UserError naming the file."""
    import onnx
    from google.protobuf.message import DecodeError

    if not onnx_path.is_file():
        raise UserError("no such ONNX file", where=str(onnx_path))
    try:
        onnx.checker.check_model(str(onnx_path), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError, DecodeError, ValueError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"not a valid ONNX model: {first_line}", where=str(onnx_path),
                        hint="export it again; a truncated or hand-edited graph is not quantised") from None


def default_opset(model_path: Path) -> int:
    """The graph's opset in the default ONNX domain."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    return next(entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx"))


def _unsupported_operator(exc: Exception) -> str:
    match = re.search(r"operator '([^']+)'", str(exc))
    return match.group(1) if match else type(exc).__name__


def export_encoder(request: OnnxExportRequest) -> OnnxExportResult:
    """Export ``request.model_dir`` to ``request.onnx_path`` at ``request.opset`` and check the graph.

    Raises a UserError naming the operator when the opset cannot express one, and naming the file when the written
    graph fails ``onnx.checker`` (the file is then removed).
    """
    import onnx
    import torch
    from torch.onnx.errors import UnsupportedOperatorError

    started = time.perf_counter()
    encoder, input_names, layout = load_sentence_encoder(request.model_dir, attention=request.attention)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(request.model_dir)
    # Two sentences of different length, so the trace sees padding and neither axis is specialised to 1.
    sample = tokenizer(["A short one.", "A somewhat longer sentence to pad against."], padding=True,
                       return_tensors="pt")
    args = tuple(sample[name] for name in input_names)
    export_opset = min(request.opset, TORCHSCRIPT_MAX_OPSET)
    dynamic_axes = {name: {0: "batch", 1: "sequence"} for name in input_names} | {OUTPUT_NAME: {0: "batch"}}
    request.onnx_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with torch.no_grad():
            torch.onnx.export(encoder, args, str(request.onnx_path), input_names=input_names,
                              output_names=[OUTPUT_NAME], opset_version=export_opset, dynamo=False,
                              dynamic_axes=dynamic_axes, do_constant_folding=True)
    except UnsupportedOperatorError as exc:
        request.onnx_path.unlink(missing_ok=True)
        raise UserError(f"opset {request.opset} cannot express operator {_unsupported_operator(exc)}: "
                        f"{str(exc).splitlines()[0]}", where=str(request.model_dir),
                        hint="export at a higher opset, or with attention='eager' (plain MatMul/Softmax)") from None
    exported = onnx.load(str(request.onnx_path))
    # The tracer leaves the hidden axis symbolic ("Divsentence_embedding_dim_1"); the layout says what it is.
    hidden_axis = exported.graph.output[0].type.tensor_type.shape.dim[1]
    hidden_axis.Clear()
    hidden_axis.dim_value = layout.hidden_size
    if request.opset > export_opset:
        exported = onnx.version_converter.convert_version(exported, request.opset)
    onnx.save(exported, str(request.onnx_path))
    try:
        check_onnx_file(request.onnx_path)
        written_opset = default_opset(request.onnx_path)
        if written_opset != request.opset:
            raise UserError(f"the exporter wrote opset {written_opset}, not the requested {request.opset}",
                            where=str(request.onnx_path))
    except UserError:
        request.onnx_path.unlink(missing_ok=True)
        raise
    return OnnxExportResult(onnx_path=request.onnx_path, opset=request.opset, input_names=input_names,
                            output_name=OUTPUT_NAME, hidden_size=layout.hidden_size, layout=layout,
                            exporter=f"{EXPORTER}, torch {torch.__version__}",
                            export_seconds=round(time.perf_counter() - started, 3))
