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


# Why ModelOpt's TensorRT-LLM checkpoint export does not take a family, read from ModelOpt 0.47.0's own code and
# tried on CPU with small checkpoints of each family (a session's research, 2026-12-04).
TRTLLM_EXPORT_REFUSALS: dict[str, str] = {
    "gemma3_text": "ModelOpt 0.47's export_tensorrt_llm_checkpoint builds the TensorRT-LLM config itself for "
                   "gpt/gemma/llama/qwen decoders only and raises NotImplementedError for gemma3 "
                   "(modelopt/torch/export/tensorrt_llm_utils.py)",
    "phi3": "ModelOpt 0.47's export_tensorrt_llm_checkpoint raises NotImplementedError for decoder type phi3 "
            "(modelopt/torch/export/tensorrt_llm_utils.py)",
    "qwen3_moe": "ModelOpt 0.47's export asserts the MoE decoder type is one of llama, dbrx, phi3, deepseek, qwen, and "
                 "Qwen3-MoE's is qwen3moe (modelopt/torch/export/layer_utils.py)",
    "qwen2_moe": "ModelOpt 0.47's export writes the expert weights but no moe block in the TensorRT-LLM config (its "
                 "hf_config_map reads num_local_experts; Qwen-MoE's field is num_experts), so the engine would be "
                 "built dense",
    "mixtral": "ModelOpt 0.47 exports it (decoder llama, with a moe block) but warns that TensorRT-LLM may not "
               "support quantised MoE layers other than FP8, and no engine of it has been built with "
               "trtllm-build 1.2.1 here",
}


def no_trtllm_export(model_type: str) -> str | None:
    """Why a ``trtllm-engine`` cell of ``model_type`` cannot be exported (naming the upstream reason where one is
    known); None where it can."""
    if model_type in TRTLLM_DECODER_TYPES:
        return None
    upstream = TRTLLM_EXPORT_REFUSALS.get(model_type, "no decoder type for it")
    return (f"no TensorRT-LLM checkpoint export for model_type {model_type!r}: {upstream} (the export takes: "
            f"{', '.join(TRTLLM_DECODER_TYPES)}); build kind hf-quantized, which TensorRT-LLM's PyTorch backend and "
            "vLLM serve")
