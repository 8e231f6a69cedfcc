"""The model families the pipeline takes, by the ``model_type`` of a checkpoint's ``config.json``, and what each
export supports: checked at plan time, so a family a stage cannot handle is refused before any model is loaded.

- Every family here goes through ModelOpt's unified HF export (``export_hf_checkpoint``, which finds the layers by
  their modules, not by a name table) and vLLM's model registry: dense Llama, Mistral, Qwen2, Qwen3, Gemma 3 text,
  Phi-3, and the mixtures of experts Mixtral, Qwen2-MoE and Qwen3-MoE.
- The TensorRT-LLM checkpoint export (``trtllm-engine`` cells) goes through ModelOpt's
  ``export_tensorrt_llm_checkpoint``, which takes a ``decoder_type``; this table names the one ModelOpt's own
  ``get_model_type`` table (``MODEL_NAME_TO_TYPE``, modelopt/torch/export/model_utils.py) gives each architecture,
  for the families whose export the quantize stage has been run with. The others are refused at plan time naming
  the export, instead of failing at export after loading and calibration (#49).
"""

from __future__ import annotations

# model_type → ModelOpt's decoder_type for the TensorRT-LLM checkpoint export (``Mistral`` maps to ``llama`` and
# ``QWen`` matches every Qwen dense architecture in ModelOpt's table).
TRTLLM_DECODER_TYPES: dict[str, str] = {"llama": "llama", "mistral": "llama", "qwen2": "qwen", "qwen3": "qwen"}
# The families the whole chain takes (unified HF export, vLLM serving).
KNOWN_MODEL_TYPES: tuple[str, ...] = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text", "phi3", "mixtral",
                                      "qwen2_moe", "qwen3_moe")


def unknown_family(model_type: str) -> str | None:
    """Why no cell of ``model_type`` can be planned; None where the family is known."""
    if model_type in KNOWN_MODEL_TYPES:
        return None
    return (f"model_type {model_type!r} is no family this pipeline knows (known: {', '.join(KNOWN_MODEL_TYPES)}): "
            "no stage has been run on its layers")


def no_trtllm_export(model_type: str) -> str | None:
    """Why a ``trtllm-engine`` cell of ``model_type`` cannot be exported; None where it can."""
    if model_type in TRTLLM_DECODER_TYPES:
        return None
    return (f"the TensorRT-LLM checkpoint export (ModelOpt export_tensorrt_llm_checkpoint) has no decoder type for "
            f"model_type {model_type!r} here (it takes: {', '.join(TRTLLM_DECODER_TYPES)}); build kind hf-quantized, "
            "which TensorRT-LLM's PyTorch backend and vLLM serve")
