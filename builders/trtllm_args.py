"""BuildProfile → ``trtllm-build`` arguments (the flags of TensorRT-LLM 1.2.x's ``trtllm-build``). Pure."""

from __future__ import annotations

from pathlib import Path

from enginesmith.core.specs import BuildProfile

# Checkpoints whose quantisation gives FP8 context FMHA something to do (it takes effect only on SM >= 89).
FP8_CONTEXT_FMHA_ALGOS = {"FP8", "W4A8_AWQ", "NVFP4"}


def _toggle(value: bool) -> str:
    return "enable" if value else "disable"


def trtllm_build_argv(
    checkpoint_dir: Path,
    output_dir: Path,
    profile: BuildProfile,
    *,
    quant_algo: str | None,
    sm: int,
    world_size: int,
    executable: str = "trtllm-build",
) -> list[str]:
    """The ``trtllm-build`` command line for one engine. Unset profile fields are left to TensorRT-LLM's defaults.

    tp/pp are not flags: they come from the checkpoint's ``mapping``; ``--workers`` builds ranks in parallel.
    """
    argv = [executable, "--checkpoint_dir", str(checkpoint_dir), "--output_dir", str(output_dir)]
    for flag in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens"):
        value = getattr(profile, flag)
        if value is not None:
            argv += [f"--{flag}", str(value)]
    if profile.kv_cache_type is not None:
        argv += ["--kv_cache_type", profile.kv_cache_type]
    if profile.gemm_plugin is not None:
        argv += ["--gemm_plugin", profile.gemm_plugin]
    if profile.use_paged_context_fmha is not None:
        argv += ["--use_paged_context_fmha", _toggle(profile.use_paged_context_fmha)]
    fp8_fmha = profile.use_fp8_context_fmha
    if fp8_fmha is None:
        fp8_fmha = quant_algo in FP8_CONTEXT_FMHA_ALGOS and sm >= 89
    if fp8_fmha and (quant_algo not in FP8_CONTEXT_FMHA_ALGOS or sm < 89):
        fp8_fmha = False  # trtllm-build would switch it off with a warning; say what is built instead
    argv += ["--use_fp8_context_fmha", _toggle(fp8_fmha)]
    if profile.multiple_profiles is not None:
        argv += ["--multiple_profiles", _toggle(profile.multiple_profiles)]
    if profile.gather_context_logits:
        argv.append("--gather_context_logits")
    argv += ["--workers", str(profile.workers or world_size)]
    return argv
