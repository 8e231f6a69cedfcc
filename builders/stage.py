"""The build stage: a ``QuantizedCheckpoint`` to an ``Artefact`` directory for one target SKU and kind.

It writes through ``enginesmith.core.staging``: ``artefact.json`` (with every file's sha256) is written last in
``<out>.partial`` and the directory renamed into place, so a build killed half-way leaves nothing that looks
complete.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel

from builders.hf_quantized import build_hf_quantized
from builders.trtllm_engine import DEFAULT_BUILD_TIMEOUT_S, EngineToolchain, build_engine, engine_toolchain
from enginesmith.core.artefacts import (
    ARTEFACT_FILE,
    COMPLETE_MARKER,
    Artefact,
    GpuInfo,
    Lineage,
    QuantizedCheckpoint,
    ServeRecipe,
    artefact_record_bytes,
    artefact_runtimes,
    read_artefact,
)
from enginesmith.core.checkpoints.digest import file_sha256
from enginesmith.core.checkpoints.models import CheckpointFile
from enginesmith.core.compat import CellRequest, describe_violations, violations
from enginesmith.core.errors import IncompatibleError, UserError
from enginesmith.core.gpus import VISIBLE_ENV, DetectedGpu, build_gpu_info, detect
from enginesmith.core.locks import output_lock
from enginesmith.core.memory import GIB
from enginesmith.core.serving import (
    ServedMemory,
    trtllm_engine_recipe,
    trtllm_pytorch_recipe,
    vllm_cpu_recipe,
    vllm_recipe,
)
from enginesmith.core.specs import ArtefactKind, BuildProfile, ModelSpec, RecipeSpec, TargetSpec, Toolchains
from enginesmith.core.staging import staged_output


class BuildRequest(BaseModel):
    quantized: QuantizedCheckpoint
    recipe: RecipeSpec
    target: TargetSpec
    kind: ArtefactKind
    profile: BuildProfile  # already merged over the target's build defaults
    key: str
    out_dir: str
    model_id: str
    toolchains: Toolchains = Toolchains()
    # The GPUs an hf-quantized artefact is served over (an engine's come from its TensorRT-LLM checkpoint).
    tp: int = 1
    pp: int = 1
    skip_gpu_check: bool = False
    timeout_s: float = DEFAULT_BUILD_TIMEOUT_S

    @property
    def parallel(self) -> tuple[int, int]:
        """The artefact's (tp, pp): an engine's are its TensorRT-LLM checkpoint's, an HF checkpoint's the request's."""
        if self.kind == "trtllm-engine":
            return self.quantized.tp, self.quantized.pp
        return self.tp, self.pp


def tokenizer_dir(artefact_dir: Path, kind: str) -> Path:
    """Where an LLM artefact keeps its tokenizer: beside the engine (``tokenizer/``), or in the checkpoint
    (``model/``)."""
    return artefact_dir / ("tokenizer" if kind == "trtllm-engine" else "model")


def finished_artefact(out_dir: Path, key: str) -> Artefact | None:
    """The artefact already built into ``out_dir`` under ``key``, or None when there is nothing there; a
    directory holding another artefact, or something unfinished, is refused rather than overwritten."""
    existing = read_artefact(out_dir)
    if existing is not None:
        if existing.key == key:
            return existing
        raise UserError(f"{out_dir} holds another artefact (key {existing.key[:12]}); it is not overwritten",
                        where=str(out_dir), hint="choose another --out, or delete that directory yourself")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise UserError(f"{out_dir} exists and is not a finished artefact; it is not overwritten", where=str(out_dir))
    return None


def build_artefact(request: BuildRequest, *, gpus: list[DetectedGpu] | None = None) -> Artefact:
    """Build (or find already built) the artefact; ``gpus`` defaults to what NVML sees here."""
    with output_lock(Path(request.out_dir), "build"):
        return _build_once(request, gpus)


def _build_once(request: BuildRequest, gpus: list[DetectedGpu] | None) -> Artefact:
    out_dir = Path(request.out_dir)
    existing = finished_artefact(out_dir, request.key)
    if existing is not None:
        return existing
    quantized = request.quantized
    if not (Path(quantized.out_dir) / COMPLETE_MARKER).is_file():
        raise UserError("the quantised checkpoint is incomplete (no completion marker)", where=quantized.out_dir,
                        hint="re-run the quantize stage; it starts clean")
    _refuse_incompatible(request)
    build_gpu = None
    toolchain = None
    if request.kind == "trtllm-engine":
        build_gpu = _check_build_gpus(request, detect(_targets(request)) if gpus is None else gpus)
        # Before the staging directory exists: a build refused for its environment leaves nothing behind.
        toolchain = engine_toolchain(quantized, expected_trtllm_version=request.toolchains.trtllm.tensorrt_llm,
                                     expected_tensorrt_version=request.toolchains.trtllm.tensorrt)

    what = f"building the {request.kind} artefact of {request.model_id} for {request.target.id}"
    with staged_output(out_dir, what=what, need_bytes=_input_bytes(request)) as staging:
        return _build_into(request, staging, build_gpu, toolchain)


def _input_bytes(request: BuildRequest) -> int:
    """What the build writes is about the size of what it reads: the engine or the HF checkpoint it copies."""
    source = Path(request.quantized.out_dir) / ("trtllm" if request.kind == "trtllm-engine" else "hf")
    return sum(p.stat().st_size for p in source.rglob("*") if p.is_file())


def _build_into(request: BuildRequest, staging: Path, build_gpu: GpuInfo | None,
                toolchain: EngineToolchain | None) -> Artefact:
    quantized = request.quantized
    versions = {k: v for k, v in quantized.versions.items()}
    build_config: dict[str, object] = {"profile": request.profile.model_dump(exclude_none=True)}
    if request.kind == "trtllm-engine":
        assert toolchain is not None
        trtllm_versions, engine_build_config = build_engine(
            quantized, request.target, request.profile, staging, toolchain, timeout_s=request.timeout_s)
        versions.update(trtllm_versions)
        build_config["engine"] = engine_build_config
    else:
        build_hf_quantized(quantized, request.recipe, request.target, request.profile, staging)
    runtimes = artefact_runtimes(request.kind, request.recipe, request.target)
    if build_gpu is not None:
        versions["driver"] = build_gpu.driver_version
        if build_gpu.cuda_driver_version:
            versions["cuda_driver"] = str(build_gpu.cuda_driver_version)

    source = quantized.source
    artefact = Artefact(
        key=request.key, kind=request.kind, target=request.target.id, target_sm=request.target.sm,
        tp=request.parallel[0], pp=request.parallel[1],
        lineage=Lineage(
            model_id=request.model_id, repo_id=source.repo_id, commit_sha=source.commit_sha,
            checkpoint_key=source.key, recipe=request.recipe.id, quantize_key=quantized.key,
            calibration_dataset=quantized.calibration.dataset if quantized.calibration else None,
            calibration_sha256=quantized.calibration.content_sha256 if quantized.calibration else None,
        ),
        versions=versions, build_gpu=build_gpu, build_config=build_config, runtimes=runtimes,
        serve=serve_recipes(request.kind, request.recipe, request.profile, runtimes, tp=request.parallel[0],
                            pp=request.parallel[1], memory=None if request.target.is_cpu else ServedMemory(
                                weight_bytes=_input_bytes(request), device_bytes=int(request.target.memory_gib * GIB))),
        quality=quantized.quality,
        files=[CheckpointFile(path=str(p.relative_to(staging)), size=p.stat().st_size, sha256=file_sha256(p))
               for p in sorted(staging.rglob("*")) if p.is_file()],
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    (staging / ARTEFACT_FILE).write_bytes(artefact_record_bytes(artefact))
    return artefact


def serve_recipes(kind: ArtefactKind, recipe: RecipeSpec, profile: BuildProfile, runtimes: list[str], *,
                  tp: int = 1, pp: int = 1, memory: ServedMemory | None = None) -> list[ServeRecipe]:
    """How each runtime serves the artefact; an engine's parallelism is in the engine, an HF checkpoint's is a
    flag of its server. ``memory``: the weights and the SKU's GPU memory, for vLLM's memory flag."""
    if kind == "trtllm-engine":
        return [trtllm_engine_recipe()]
    recipes = []
    for runtime in runtimes:
        if runtime == "trtllm-pytorch":
            recipes.append(trtllm_pytorch_recipe(tp=tp, pp=pp))
        elif runtime == "vllm":
            recipes.append(vllm_recipe("{artefact_dir}/model", profile, kv_cache_fp8=recipe.kv_cache == "fp8",
                                       tp=tp, pp=pp, memory=memory))
        elif runtime == "vllm-cpu":
            recipes.append(vllm_cpu_recipe("{artefact_dir}/model", profile))
    return recipes


def _targets(request: BuildRequest) -> list[TargetSpec]:
    from enginesmith.core.config import default_catalogue

    return list(default_catalogue().targets.values())


def _refuse_incompatible(request: BuildRequest) -> None:
    source = request.quantized.source
    model = ModelSpec(id=request.model_id, repo=source.repo_id,
                      params_b=(source.parameter_count / 1e9) if source.parameter_count else None)
    found = violations(CellRequest(model=model, recipe=request.recipe, target=request.target, kind=request.kind,
                                   tp=request.parallel[0], pp=request.parallel[1],
                                   toolchains=request.toolchains))
    if found:
        raise IncompatibleError(describe_violations(found),
                                where=f"{request.recipe.id} → {request.target.id} ({request.kind})",
                                hint="`enginesmith recipes` lists which SMs each recipe supports")


def _check_build_gpus(request: BuildRequest, gpus: list[DetectedGpu]) -> GpuInfo | None:
    """trtllm-build tunes for, and reads the SM of, the GPU it runs on: build on the target SKU, with tp×pp GPUs."""
    target = request.target
    matching = [d for d in gpus if d.match.target_id == target.id]
    needed = request.quantized.tp * request.quantized.pp
    first = gpus[0].gpu if gpus else None
    build_gpu = build_gpu_info(first) if first else None
    if request.skip_gpu_check:
        return build_gpu
    if not matching:
        seen = ", ".join(f"{d.gpu.name} ({d.match.target_id or 'unknown'})" for d in gpus) or "no NVIDIA GPU"
        if os.environ.get(VISIBLE_ENV) is not None:
            seen += f" ({VISIBLE_ENV}={os.environ[VISIBLE_ENV]})"
        raise UserError(
            f"no {target.id} GPU ({target.name}, SM {target.sm_label}) on this machine; found: {seen}",
            where=f"--target {target.id}",
            hint=f"build on a {target.id} node (an engine runs only on the SM it was built for), or pass "
                 "--skip-gpu-check to build anyway")
    if gpus[0].match.target_id != target.id:
        first_seen = gpus[0].gpu
        raise UserError(f"CUDA device 0 is {first_seen.name} (NVML index {first_seen.index}, {first_seen.uuid}), not "
                        f"a {target.id}: trtllm-build reads the SM of CUDA device 0", where=VISIBLE_ENV,
                        hint=f"put a {target.id} first in {VISIBLE_ENV} (an index or its GPU-… UUID)")
    if len(matching) < needed:
        raise UserError(f"tp×pp = {needed} needs {needed} {target.id} GPUs; this machine has {len(matching)}",
                        where=f"--target {target.id}", hint="build on a node with enough GPUs")
    return build_gpu
