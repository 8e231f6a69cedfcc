"""The two export formats, the fixes ModelOpt 0.47's exports need, and the checks run before the stage
declares itself done.

- unified HF checkpoint (``hf/``): what TensorRT-LLM's PyTorch backend and vLLM load.
- TensorRT-LLM checkpoint (``trtllm/``): ``config.json`` + ``rank{r}.safetensors``, what ``trtllm-build`` reads.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from enginesmith.core.checkpoints.files import TOKENIZER_FILES
from enginesmith.core.families import trtllm_checkpoint_problems
from enginesmith.core.specs import RecipeSpec

if TYPE_CHECKING:
    import torch


GENERATION_CONFIG = "generation_config.json"


class ExportCheckError(Exception):
    """What was written does not say what the recipe asked for."""


FP8_E4M3 = (4, 3)


def snap_fp8_weights(model: torch.nn.Module) -> int:
    """Replace each FP8 per-tensor weight by its fake-quantised value, in the weight's own dtype; returns how many.

    ModelOpt 0.47's exporters divide a BF16 weight by its scale in BF16 and cast the quotient to FP8, so the quotient
    is rounded twice (to BF16's 8 bits, then to FP8's 4): about one value in sixteen lands on the midpoint of two FP8
    steps and goes to the even one, a step away from the nearest that calibration chose (Gemma 3 270M: 6 % of
    values, the dequantised export's logits 0.10 away from the calibrated weights'). A weight that already is an FP8
    value times its scale divides back exactly, so the export then holds what calibration chose."""
    import torch
    from modelopt.torch.quantization.nn import TensorQuantizer

    snapped = 0
    with torch.no_grad():
        for module in model.modules():
            quantizer = getattr(module, "weight_quantizer", None)
            if not (isinstance(quantizer, TensorQuantizer) and quantizer.is_enabled
                    and quantizer.num_bits == FP8_E4M3 and not quantizer.block_sizes):
                continue
            weight = module.weight
            weight.data = quantizer(weight.float()).to(weight.dtype)
            snapped += 1
    return snapped


def export_hf(model: torch.nn.Module, export_dir: Path, source_dir: Path) -> None:
    import torch
    from modelopt.torch.export import export_hf_checkpoint

    with torch.inference_mode():
        export_hf_checkpoint(model, dtype=torch.bfloat16, export_dir=str(export_dir))
    copy_tokenizer(source_dir, export_dir)
    keep_generation_config(source_dir, export_dir)


def export_trtllm(model: torch.nn.Module, export_dir: Path, *, decoder_type: str, tp: int, pp: int,
                  hf_config: dict[str, Any]) -> None:
    import warnings

    import torch
    from modelopt.torch.export import export_tensorrt_llm_checkpoint

    with torch.inference_mode(), warnings.catch_warnings():
        # Without tensorrt_llm installed ModelOpt builds the config by hand and says so; we fix that config below.
        warnings.filterwarnings("ignore", message="Cannot export tensorrt_llm checkpoint config")
        export_tensorrt_llm_checkpoint(model, decoder_type, dtype=torch.bfloat16, export_dir=str(export_dir),
                                       inference_tensor_parallel=tp, inference_pipeline_parallel=pp)
    fix_trtllm_config(export_dir / "config.json", hf_config)


def copy_tokenizer(source_dir: Path, export_dir: Path) -> None:
    """ModelOpt exports no tokenizer; serving needs one next to the weights."""
    for name in TOKENIZER_FILES:
        if (source_dir / name).is_file():
            shutil.copyfile(source_dir / name, export_dir / name)


def keep_generation_config(source_dir: Path, export_dir: Path) -> None:
    """The checkpoint's generation settings as it had them, or none where it had none. ModelOpt's export saves the
    model's generation config after setting ``do_sample: true`` wherever top_k or top_p is set, and transformers'
    defaults set both: an export of a checkpoint that decodes greedily would otherwise say it samples."""
    source, exported = source_dir / GENERATION_CONFIG, export_dir / GENERATION_CONFIG
    if source.is_file():
        shutil.copyfile(source, exported)
    else:
        exported.unlink(missing_ok=True)


def fix_trtllm_config(config_path: Path, hf_config: dict[str, Any]) -> dict[str, Any]:
    """Repair ModelOpt 0.47's hand-built TensorRT-LLM config from the HF config.

    - ``head_size`` is derived from the packed INT4 weight, so INT4/W4A8 AWQ exports carry half the real value.
    - With transformers ≥ 5 the RoPE fields (``rotary_base``, ``rotary_scaling``) are missing (they moved into
      ``rope_parameters``), and TensorRT-LLM would silently use its defaults.
    """
    config = json.loads(config_path.read_text())
    head_dim = hf_config.get("head_dim") or hf_config["hidden_size"] // hf_config["num_attention_heads"]
    config["head_size"] = head_dim
    rope = hf_config.get("rope_parameters") or {}
    rope_theta = hf_config.get("rope_theta", rope.get("rope_theta"))
    if rope_theta is not None:
        config["rotary_base"] = float(rope_theta)
    scaling = hf_config.get("rope_scaling") or ({k: v for k, v in rope.items() if k != "rope_theta"} or None)
    if scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
        config["rotary_scaling"] = scaling
    config_path.write_text(json.dumps(config, indent=2))
    return dict(config)


def check_hf_export(export_dir: Path, recipe: RecipeSpec, group_size: int | None) -> dict[str, Any]:
    """The HF export's ``hf_quant_config.json`` says what the recipe asked for; returns its quantization block."""
    quant_path = export_dir / "hf_quant_config.json"
    if not quant_path.is_file():
        raise ExportCheckError(f"{quant_path} was not written")
    quantization = json.loads(quant_path.read_text())["quantization"]
    _expect(quantization, recipe, group_size, where=str(quant_path))
    config = json.loads((export_dir / "config.json").read_text())
    if config.get("quantization_config", {}).get("quant_method") != "modelopt":
        raise ExportCheckError(f"{export_dir / 'config.json'} has no modelopt quantization_config")
    if not list(export_dir.glob("*.safetensors")):
        raise ExportCheckError(f"{export_dir} has no safetensors weights")
    if not (export_dir / "tokenizer_config.json").is_file() and not (export_dir / "tokenizer.json").is_file():
        raise ExportCheckError(f"{export_dir} has no tokenizer")
    return dict(quantization)


def check_trtllm_export(export_dir: Path, recipe: RecipeSpec, group_size: int | None, *, tp: int, pp: int,
                        hf_config: dict[str, Any]) -> dict[str, Any]:
    """The TensorRT-LLM export has the mapping, one rank file per rank, the true head size and the RoPE base."""
    config = json.loads((export_dir / "config.json").read_text())
    mapping = config.get("mapping", {})
    if (mapping.get("world_size"), mapping.get("tp_size"), mapping.get("pp_size")) != (tp * pp, tp, pp):
        raise ExportCheckError(f"mapping {mapping} is not tp={tp}, pp={pp}")
    missing = [f"rank{r}.safetensors" for r in range(tp * pp) if not (export_dir / f"rank{r}.safetensors").is_file()]
    if missing:
        raise ExportCheckError(f"{export_dir} lacks {', '.join(missing)}")
    head_dim = hf_config.get("head_dim") or hf_config["hidden_size"] // hf_config["num_attention_heads"]
    if config.get("head_size") != head_dim:
        raise ExportCheckError(f"head_size {config.get('head_size')} is not the model's {head_dim}")
    if "rope_theta" in hf_config and config.get("rotary_base") != float(hf_config["rope_theta"]):
        raise ExportCheckError(f"rotary_base {config.get('rotary_base')} is not rope_theta {hf_config['rope_theta']}")
    _expect(config.get("quantization", {}), recipe, group_size, where=str(export_dir / "config.json"))
    problems = trtllm_checkpoint_problems(config)
    if problems:
        # ModelOpt builds this config with TensorRT-LLM's own from_hugging_face where tensorrt_llm imports, and by
        # hand otherwise (a config without Qwen's qwen_type, and without its attention bias).
        raise ExportCheckError(f"{'; '.join(problems)}; ModelOpt {config.get('producer', {}).get('version', '?')} "
                               "wrote this config by hand because tensorrt_llm was not importable where it ran: "
                               "quantise engine cells where TensorRT-LLM is installed (its image)")
    return dict(config)


def _expect(quantization: dict[str, Any], recipe: RecipeSpec, group_size: int | None, *, where: str) -> None:
    checks = {"quant_algo": recipe.quant_algo, "kv_cache_quant_algo": recipe.kv_cache_quant_algo}
    if group_size is not None:
        checks["group_size"] = group_size  # type: ignore[assignment]
    for field, expected in checks.items():
        if quantization.get(field) != expected:
            raise ExportCheckError(f"{where}: {field} is {quantization.get(field)!r}, expected {expected!r}")
