"""The quantize stage: a ``Checkpoint`` and a recipe to a ``QuantizedCheckpoint`` on disk.

It writes through ``enginesmith.core.staging`` (``<out>.partial``, renamed into place once the metadata and the
completion marker are written last), so an interrupted run leaves nothing that looks finished. An output directory
holding another key is never overwritten.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from enginesmith.core.artefacts import (
    COMPLETE_MARKER,
    METADATA_FILE,
    ExportFormat,
    QualityReport,
    QuantizedCheckpoint,
)
from enginesmith.core.assets import read_task
from enginesmith.core.checkpoints.digest import file_sha256
from enginesmith.core.checkpoints.inspect import read_config
from enginesmith.core.checkpoints.models import Checkpoint, CheckpointFile
from enginesmith.core.encoder_graph import check_versions
from enginesmith.core.errors import UserError
from enginesmith.core.families import TRTLLM_DECODER_TYPES, no_trtllm_export
from enginesmith.core.locks import output_lock
from enginesmith.core.memory import GPU_CALIBRATION_FACTOR, dtype_bytes, quality_logits_bytes, quantize_need
from enginesmith.core.specs import RecipeSpec
from enginesmith.core.staging import PARTIAL_SUFFIX, staged_output
from quantization.export import (
    ExportCheckError,
    check_hf_export,
    check_trtllm_export,
    copy_tokenizer,
    export_hf,
    export_trtllm,
    snap_fp8_weights,
)
from quantization.upstream_warnings import UpstreamWarnings, recording

DECODER_TYPES = TRTLLM_DECODER_TYPES


class QuantizeRequest(BaseModel):
    checkpoint: Checkpoint
    recipe: RecipeSpec
    key: str
    out_dir: str
    formats: list[ExportFormat] = ["hf", "trtllm"]
    tp: int = 1
    pp: int = 1
    device: str = "auto"
    calibration_dataset: str = "builtin:addition"
    samples: int = 64
    seq_len: int = 32
    batch_size: int = 16
    awq_block_size: int | None = None
    task: str | None = None
    # The versions the key was computed with (a planned cell's exporter); None: whatever is installed (ad hoc runs).
    expected_versions: dict[str, str] | None = None


def read_completed(out_dir: Path) -> QuantizedCheckpoint | None:
    """The finished stage output in ``out_dir``, or None if there is no completion marker."""
    if not (out_dir / COMPLETE_MARKER).is_file():
        return None
    return QuantizedCheckpoint.model_validate_json((out_dir / METADATA_FILE).read_text())


def installed_versions() -> dict[str, str]:
    import modelopt
    import torch
    import transformers

    return {"modelopt": modelopt.__version__, "torch": torch.__version__.split("+")[0],
            "transformers": transformers.__version__}


def quantize_checkpoint(request: QuantizeRequest) -> QuantizedCheckpoint:
    with output_lock(Path(request.out_dir), "quantize"):
        return _quantize_once(request)


def _quantize_once(request: QuantizeRequest) -> QuantizedCheckpoint:
    out_dir = Path(request.out_dir)
    done = read_completed(out_dir)
    if done is not None:
        if done.key == request.key:
            return done
        raise UserError(f"{out_dir} holds another quantised checkpoint (key {done.key[:12]}, not "
                        f"{request.key[:12]}); it is not overwritten", where=str(out_dir),
                        hint="choose another --out, or delete that directory yourself")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise UserError(f"{out_dir} exists and is not a finished quantize output; it is not overwritten",
                        where=str(out_dir), hint="choose another --out, or delete that directory yourself")
    if request.tp * request.pp > 1 and "trtllm" not in request.formats:
        raise UserError("tp/pp > 1 applies to the TensorRT-LLM export only", where="--formats",
                        hint="add trtllm to --formats")
    if "hf-bf16" in request.formats and ("hf" not in request.formats or request.recipe.is_passthrough):
        raise UserError("hf-bf16 folds the HF export of a quantised model", where="--formats",
                        hint="add hf to --formats, and use a recipe other than bf16")
    check_versions(request.expected_versions or {}, installed_versions())
    what = f"quantising {request.checkpoint.repo_id} ({request.recipe.id})"
    with staged_output(out_dir, what=what, need_bytes=output_bytes(request)) as staging:
        # ModelOpt prints progress to stdout; keep stdout for results (``--json``).
        with contextlib.redirect_stdout(sys.stderr):
            result = _run(request, staging)
        (staging / METADATA_FILE).write_text(result.model_dump_json(indent=2))
        (staging / COMPLETE_MARKER).write_text(request.key + "\n")
    return result


def output_bytes(request: QuantizeRequest) -> int:
    """About what the exports take on disk: each format holds every weight at the recipe's width (a passthrough
    copies the checkpoint; ``hf-bf16`` is 16-bit)."""
    checkpoint = request.checkpoint
    parameters = checkpoint.parameters
    quantised_bytes = parameters * request.recipe.weight_bytes_per_param
    per_format = {
        "hf": checkpoint.total_bytes if request.recipe.is_passthrough else quantised_bytes,
        "trtllm": quantised_bytes,
        "hf-bf16": parameters * 2,
    }
    return int(sum(per_format[fmt] for fmt in request.formats))


@contextmanager
def _timed(timings: dict[str, float], name: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    timings[name] = round(timings.get(name, 0.0) + time.perf_counter() - start, 3)  # a step timed in parts adds up


def _run(request: QuantizeRequest, staging: Path) -> QuantizedCheckpoint:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = Path(request.checkpoint.local_path)
    hf_config = read_config(source)
    group_size = request.awq_block_size or request.recipe.awq_block_size
    _check_block_size(hf_config, request.recipe, group_size, tp=request.tp, where=str(source / "config.json"))
    if "trtllm" in request.formats:
        _decoder_type(hf_config)  # before any weights are loaded
    device = _pick_device(request.device)
    if device == "cpu":
        torch.set_num_threads(int(os.environ.get("ENGINESMITH_CPU_THREADS", "1")))
    _check_memory(request.checkpoint, device, hf_config, seq_len=request.seq_len,
                  passthrough=request.recipe.is_passthrough)
    recipe = request.recipe
    timings: dict[str, float] = {}
    versions = installed_versions()
    hf_dir, trtllm_dir = staging / "hf", staging / "trtllm"

    model_name = request.checkpoint.repo_id
    load_hint = (f"check that the checkpoint loads with transformers {versions['transformers']} "
                 "(config.json, weights)")
    with _timed(timings, "load_s"), _upstream_errors("load", model_name, "transformers", load_hint):
        tokenizer = AutoTokenizer.from_pretrained(source)
    data = None
    if not recipe.is_passthrough:
        from quantization.calibration import load_calibration

        # Before the weights: a set too short or missing is refused without loading a model (minutes for a 70B).
        data = load_calibration(request.calibration_dataset, tokenizer, samples=request.samples,
                                seq_len=request.seq_len, batch_size=request.batch_size)
    with _timed(timings, "load_s"), _upstream_errors("load", model_name, "transformers", load_hint):
        model: Any
        if device == "cpu":
            # Calibrate in fp32: bf16 matmuls are far slower on CPUs without AVX-512-BF16.
            model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
        else:
            # The checkpoint's own dtype, spread over the visible GPUs (how ModelOpt's hf_ptq loads), so a model
            # larger than one GPU still calibrates.
            model = AutoModelForCausalLM.from_pretrained(
                source, dtype="auto", device_map="auto" if device == "cuda" else {"": device},
                max_memory=_weights_memory_per_gpu() if device == "cuda" else None).eval()
            refuse_offloaded(model, model_name)

    calibration = quality = None
    warned = UpstreamWarnings()
    if recipe.is_passthrough:
        if "hf" in request.formats:
            hf_dir.mkdir()
            for file in request.checkpoint.files:
                shutil.copyfile(source / file.path, hf_dir / file.path)
    else:
        import modelopt.torch.quantization as mtq
        from modelopt.torch.export.unified_export_hf import requantize_resmooth_fused_llm_layers

        from quantization.quality import held_out_logits, logits_rel_err, top1_agreement, weight_quantizers_only
        from quantization.recipes import modelopt_config

        assert data is not None
        calibration = data.record
        with _timed(timings, "reference_s"):
            reference_logits = held_out_logits(model, data.held_out)
            task_reference = _task_exact_match(model, tokenizer, request.task)

        def forward_loop(calibrated: torch.nn.Module) -> None:
            with torch.no_grad():
                for batch in data.batches:
                    calibrated(input_ids=batch.to(device))

        config = modelopt_config(recipe, awq_block_size=group_size)
        with _timed(timings, "calibrate_s"), recording(warned), _upstream_errors(
                "calibrate", model_name, "ModelOpt", f"recipe {recipe.id} may not support this architecture "
                f"({hf_config.get('model_type')}); try fp8, or report it with the traceback (--debug)"):
            model = mtq.quantize(model, config, forward_loop)
            # What the export does first: layers that share an input (q/k/v, gate/up) get one input scale and
            # AWQ pre-quant scale, and are re-quantised; for a mixture of experts, experts calibration never
            # routed a token to get their input scales, and each expert's gate/up pair one weight scale. Doing it
            # here makes the quality report describe the weights that are exported, not an intermediate state.
            prepare_experts_as_exported(model)
            requantize_resmooth_fused_llm_layers(model)
            sync_experts_as_exported(model)
        # On CUDA the first fake-quantised forward also compiles ModelOpt's extensions (cached afterwards).
        with _timed(timings, "quality_s"):
            quantized_logits = held_out_logits(model, data.held_out)
            quality = QualityReport(
                held_out_samples=int(data.held_out.shape[0]),
                logits_rel_err=logits_rel_err(quantized_logits, reference_logits),
                top1_agreement=top1_agreement(quantized_logits, reference_logits),
                task=request.task,
                task_exact_match_reference=task_reference,
                task_exact_match_quantized=_task_exact_match(model, tokenizer, request.task),
            )
            del quantized_logits, reference_logits  # the memory model counts two sets of held-out logits at once
            # Round weights and scales to BF16 as the export will hold them, and keep the logits of those
            # weights alone (activation quantizers off): what the dequantised export must reproduce. On the CPU
            # they are computed in fp32 again (fast there); on GPUs the model stays in BF16 (no fp32 copy).
            model = model.to(torch.bfloat16)
            if device == "cpu":
                model = model.float()
            with weight_quantizers_only(model):
                weight_only_logits = held_out_logits(model, data.held_out)
        # Export casts only the quantised layers; cast the rest so the export is BF16 throughout.
        model = model.to(torch.bfloat16)
        snap_fp8_weights(model)

    with _timed(timings, "export_s"), recording(warned), _upstream_errors(
            "export", model_name, "ModelOpt", f"the {recipe.id} export does not support this model's layers; "
            "run with --debug for the traceback"):
        try:
            if "hf" in request.formats and not recipe.is_passthrough:
                hf_dir.mkdir()
                export_hf(model, hf_dir, source)
                check_hf_export(hf_dir, recipe, group_size)
            elif "hf" in request.formats:
                copy_tokenizer(source, hf_dir)
            if "trtllm" in request.formats:
                trtllm_dir.mkdir()
                export_trtllm(model, trtllm_dir, decoder_type=_decoder_type(hf_config), tp=request.tp,
                              pp=request.pp, hf_config=hf_config)
                if not recipe.is_passthrough:
                    check_trtllm_export(trtllm_dir, recipe, group_size, tp=request.tp, pp=request.pp,
                                        hf_config=hf_config)
        except ExportCheckError as exc:
            raise UserError(f"the {recipe.id} export failed its check: {exc}", where=str(staging)) from None

    if "hf-bf16" in request.formats:
        from quantization.dequant import write_folded_bf16

        with _timed(timings, "fold_s"):
            write_folded_bf16(hf_dir, source, staging / "hf-bf16")

    if quality is not None and data is not None and "hf" in request.formats:
        from quantization.dequant import load_dequantized_model
        from quantization.quality import held_out_logits, logits_rel_err

        with _timed(timings, "verify_s"):
            dequantized = load_dequantized_model(hf_dir, source).to(device)
            quality.export_dequant_rel_err = logits_rel_err(held_out_logits(dequantized, data.held_out),
                                                            weight_only_logits)
        bound = recipe.max_export_dequant_rel_err
        if bound is not None and quality.export_dequant_rel_err > bound:
            raise UserError(f"the {recipe.id} export of {model_name} does not hold the weights calibration chose: "
                            f"dequantised, its logits differ from the calibrated weights' by "
                            f"{quality.export_dequant_rel_err:.4f} (relative), over the recipe's bound {bound}",
                            where=str(staging / "hf"), hint="report it with --debug: the exporter re-scaled or "
                            "re-quantised weights after calibration (ModelOpt "
                            f"{versions.get('modelopt', '?')}, model_type {hf_config.get('model_type')})")

    if quality is not None:
        quality.upstream_warnings = warned.messages()
    files = [CheckpointFile(path=str(p.relative_to(staging)), size=p.stat().st_size, sha256=file_sha256(p))
             for p in sorted(staging.rglob("*")) if p.is_file()]
    return QuantizedCheckpoint(
        key=request.key, recipe=recipe.id, source=request.checkpoint,
        out_dir=str(staging.with_name(staging.name.removesuffix(PARTIAL_SUFFIX)).resolve()),
        formats=request.formats, tp=request.tp, pp=request.pp, device=device, quant_algo=recipe.quant_algo,
        kv_cache_quant_algo=recipe.kv_cache_quant_algo, group_size=group_size, calibration=calibration,
        quality=quality, versions=versions, timings_s=timings, files=files,
    )


@contextmanager
def _upstream_errors(stage: str, model: str, library: str, hint: str) -> Iterator[None]:
    """An exception from transformers or ModelOpt inside a stage step, re-raised as a UserError that names the
    step, the model and what to do (the original stays chained for --debug)."""
    try:
        yield
    except UserError:
        raise
    except (NotImplementedError, ValueError, RuntimeError, AssertionError, KeyError, TypeError, OSError) as exc:
        if _out_of_resources(exc):
            raise  # the machine, not the model: the caller's retry and memory policy decide
        raise UserError(f"quantize/{stage} of {model} failed in {library}: {type(exc).__name__}: {exc}",
                        where=f"quantize/{stage}", hint=hint) from exc


def _out_of_resources(exc: BaseException) -> bool:
    """Out of device memory, disk or quota: not something the model or recipe can fix."""
    if type(exc).__name__ == "OutOfMemoryError":  # torch.OutOfMemoryError (CUDA), a RuntimeError subclass
        return True
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.ENOMEM, errno.EIO)


def _check_block_size(hf_config: dict[str, Any], recipe: RecipeSpec, group_size: int | None, *, tp: int,
                      where: str) -> None:
    """Refuse, before any weights are loaded, a block size that some quantised linear's input width does not
    divide by (ModelOpt would find out only at export, after calibration)."""
    if group_size is None or recipe.is_passthrough:
        return
    from enginesmith.core.shapes import ModelShape

    try:
        widths = ModelShape.from_config(hf_config).quantized_input_widths(tp)
    except (KeyError, ValueError, TypeError):
        return  # not a Llama-style config: ModelOpt's export is the check
    misfits = {name: width for name, width in widths.items() if width % group_size}
    if misfits:
        listed = ", ".join(f"{name} {width}" for name, width in misfits.items())
        raise UserError(f"{recipe.id} with block size {group_size}: input widths {listed} do not divide by it",
                        where=where, hint="plan the cell with enginesmith (it picks a block size that divides them, "
                                          "e.g. 64), or pass --awq-block-size with one that divides every width")


def prepare_experts_as_exported(model: Any) -> None:
    """ModelOpt 0.47's unified HF export's own first step for mixtures of experts (``_prepare_moe_inputs``): input
    scales for the experts calibration never routed a token to. A no-op on dense models."""
    import torch
    from modelopt.torch.export import unified_export_hf

    prepare = getattr(unified_export_hf, "_prepare_moe_inputs", None)
    if prepare is not None:
        prepare(model, torch.bfloat16, False)


def sync_experts_as_exported(model: Any) -> None:
    """ModelOpt 0.47's export's gate/up weight-scale sync for experts the re-smoothing did not reach
    (``sync_moe_gate_up_amax``). A no-op on dense models."""
    from modelopt.torch.export import layer_utils

    sync = getattr(layer_utils, "sync_moe_gate_up_amax", None)
    if sync is not None:
        sync(model)


def _task_exact_match(model: Any, tokenizer: Any, task: str | None) -> float | None:
    if task is None:
        return None
    from quantization.quality import exact_match

    return exact_match(model, tokenizer, read_task(task))


def _decoder_type(hf_config: dict[str, Any]) -> str:
    model_type = str(hf_config.get("model_type", ""))
    refused = no_trtllm_export(model_type)
    if refused is not None:
        raise UserError(refused, where="config.json", hint="export only the HF format (--formats hf)")
    return DECODER_TYPES[model_type]


def _pick_device(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for but torch sees no CUDA device", where="--device",
                        hint="use --device cpu, or install a CUDA build of torch on a GPU node")
    return requested


def _weights_memory_per_gpu() -> dict[int | str, int]:
    """What ``device_map="auto"`` may place on each visible GPU: its free memory less the calibration headroom the
    memory model counts (so activations fit beside the weights), and nothing on the CPU."""
    import torch

    return {index: int(torch.cuda.mem_get_info(index)[0] / GPU_CALIBRATION_FACTOR)
            for index in range(torch.cuda.device_count())}


def refuse_offloaded(model: Any, model_name: str) -> None:
    """A model accelerate spread onto the CPU or disk (its weights left on the meta device) cannot be cast or
    exported by ModelOpt's TensorRT-LLM exporter: refuse it here, by name, rather than fail after calibration."""
    offloaded = {name: where for name, where in (getattr(model, "hf_device_map", None) or {}).items()
                 if where in ("cpu", "disk")}
    if offloaded:
        worst_first = sorted(offloaded.items(), key=lambda item: item[1] != "disk")
        listed = ", ".join(f"{name} on {where}" for name, where in worst_first[:4])
        raise UserError(f"{model_name} does not fit in the visible GPUs' free memory: {len(offloaded)} module(s) "
                        f"were offloaded ({listed}{', …' if len(offloaded) > 4 else ''}), and ModelOpt cannot "
                        "export an offloaded model", where="quantize/load",
                        hint="quantise on a node with more GPU memory (the config's quantize_on names its SKU), or "
                             "free the GPUs (CUDA_VISIBLE_DEVICES) other processes hold")


def _free_bytes_per_device(device: str) -> tuple[int, int]:
    """How many devices the model is spread over, and the free bytes of the emptiest one."""
    if device.startswith("cuda"):
        import torch

        indices = range(torch.cuda.device_count()) if device == "cuda" else [torch.device(device).index or 0]
        return len(indices), min(int(torch.cuda.mem_get_info(i)[0]) for i in indices)
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return 1, int(line.split()[1]) * 1024
    return 1, os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _check_memory(checkpoint: Checkpoint, device: str, hf_config: dict[str, Any], *, seq_len: int,
                  passthrough: bool) -> None:
    parameters = checkpoint.parameters
    devices, free = _free_bytes_per_device(device)
    vocab = hf_config.get("vocab_size")
    logits = quality_logits_bytes(vocab, seq_len) if isinstance(vocab, int) and not passthrough else 0
    need = quantize_need(parameters, on_gpu=device.startswith("cuda"), devices=devices, device_bytes=free,
                         checkpoint_dtype_bytes=dtype_bytes(hf_config), logits_bytes=logits)
    if not need.fits:
        raise UserError(f"quantising on {device}: {need.describe()} free", where=checkpoint.repo_id,
                        hint="quantise on a node with more memory (a GPU node: --device cuda)")
