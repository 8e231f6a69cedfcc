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


# TensorRT-LLM's engine-backend model map (``MODEL_MAP``, tensorrt_llm/models/__init__.py), for the architectures of
# these families: trtllm-build looks the checkpoint's ``architecture`` up there (``PretrainedConfig.from_dict``, then
# an assert in commands/build.py). Read from upstream's code at the 1.x line (Qwen3 dense and MoE were added to the
# engine backend in 1.0: PRs #5650 and #6470); a session's research, 2026-12-04.
TRTLLM_MODEL_MAP: dict[str, str] = {
    "LlamaForCausalLM": "LLaMAForCausalLM", "MistralForCausalLM": "LLaMAForCausalLM",
    "MixtralForCausalLM": "LLaMAForCausalLM", "Qwen2ForCausalLM": "QWenForCausalLM",
    "Qwen3ForCausalLM": "QWenForCausalLM", "Qwen2MoeForCausalLM": "QWenForCausalLM",
    "Qwen3MoeForCausalLM": "QWenForCausalLM", "Gemma3ForCausalLM": "GemmaForCausalLM",
    "Phi3ForCausalLM": "Phi3ForCausalLM",
}
# Fields a checkpoint's config.json must carry for trtllm-build 1.2.1: ``PretrainedConfig``'s keyword-only ones, those
# whose defaults are wrong for these decoders (the vocabulary, the activation, rope), and per TensorRT-LLM class what
# its model reads without a default (QWen's ``qwen_type`` and ``seq_length``, tensorrt_llm/models/qwen/).
TRTLLM_REQUIRED_FIELDS: tuple[str, ...] = ("architecture", "dtype", "hidden_size", "num_hidden_layers",
                                           "num_attention_heads", "vocab_size", "hidden_act",
                                           "position_embedding_type")
TRTLLM_CLASS_FIELDS: dict[str, tuple[str, ...]] = {"QWenForCausalLM": ("qwen_type", "seq_length")}


def trtllm_checkpoint_problems(config: dict[str, object]) -> list[str]:
    """What in a TensorRT-LLM checkpoint's config.json trtllm-build 1.2.1 would not load: an architecture outside its
    model map, or a field its config or model class needs that is missing. Empty where none."""
    architecture = str(config.get("architecture", ""))
    trtllm_class = TRTLLM_MODEL_MAP.get(architecture)
    if trtllm_class is None:
        return [f"architecture {architecture!r} is not in TensorRT-LLM 1.2.1's model map (known here: "
                f"{', '.join(TRTLLM_MODEL_MAP)})"]
    missing = [name for name in (*TRTLLM_REQUIRED_FIELDS, *TRTLLM_CLASS_FIELDS.get(trtllm_class, ()))
               if config.get(name) in (None, "")]
    if missing:
        return [f"{', '.join(missing)} missing: TensorRT-LLM 1.2.1's {trtllm_class} ({architecture}) reads "
                f"{'them' if len(missing) > 1 else 'it'} without a default"]
    return []
