"""What ``enginesmith env`` reports about this installation: versions, which extras are installed, where each
runtime environment is and whether it is there, and the directories state lives in (``enginesmith.core.state``)."""

from __future__ import annotations

import platform
import sys
from importlib import metadata

from pydantic import BaseModel

from enginesmith import __version__
from enginesmith.core.config import config_dir
from enginesmith.core.extras import installed_extras
from enginesmith.core.state import CACHE_ENV, MODELS_ENV, REGISTRY_ENV, WORK_ENV, StatePlace, state_place

# The distributions whose versions decide keys and behaviour, as ``enginesmith env`` lists them.
KEY_DISTRIBUTIONS = ("pydantic", "huggingface-hub", "nvidia-ml-py", "torch", "nvidia-modelopt", "transformers",
                     "onnx", "onnxruntime", "prefect", "boto3", "model-signing", "lm-eval")


class RuntimeFound(BaseModel):
    name: str
    where: str  # a directory, or "PATH"
    chosen_by: str
    present: bool


class Installation(BaseModel):
    enginesmith: str
    python: str
    platform: str
    distributions: dict[str, str | None]  # None: not installed
    extras: dict[str, bool]
    runtimes: list[RuntimeFound]
    catalogue: str
    state: list[StatePlace]


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def describe_installation() -> Installation:
    from enginesmith.core.runtimes import default_registry, locate

    runtimes = []
    for env in default_registry().environments:
        location = locate(env)
        where = "PATH" if location.prefix is None else str(location.prefix)
        present = location.prefix is None or (location.prefix / "bin").is_dir()
        runtimes.append(RuntimeFound(name=env.name, where=where, chosen_by=location.chosen_by, present=present))
    return Installation(
        enginesmith=__version__, python=sys.version.split()[0], platform=platform.platform(),
        distributions={name: _version(name) for name in KEY_DISTRIBUTIONS}, extras=installed_extras(),
        runtimes=runtimes, catalogue=str(config_dir()),
        state=[state_place("models", MODELS_ENV), state_place("work", WORK_ENV), state_place("cache", CACHE_ENV),
               state_place("registry", REGISTRY_ENV)])
