"""Which optional extra of the distribution brings a module, read from the installed distribution's own metadata
(its ``Requires-Dist`` lines and their ``extra == "..."`` markers), so a command run without the extra it needs
says which one in one line instead of a raw ``ModuleNotFoundError``."""

from __future__ import annotations

from functools import cache
from importlib import metadata

from packaging.requirements import Requirement

DISTRIBUTION = "enginesmith"
EXTRA_HINT = "pip install 'enginesmith[{extra}]'"
# Import names whose distribution is named otherwise (the rest import under their distribution's name).
DISTRIBUTION_OF_MODULE = {
    "modelopt": "nvidia-modelopt",
    "model_signing": "model-signing",
    "OpenSSL": "pyopenssl",
    "lm_eval": "lm-eval",
    "botocore": "boto3",
    "tensorrt_llm": "tensorrt-llm",
    "onnx_graphsurgeon": "onnx-graphsurgeon",
    "yaml": "pyyaml",
}
# Extras that are environments of their own, never named as the fix for a module the pipeline imports.
SEPARATE_ENVIRONMENTS = ("vllm-cpu", "dev")


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


@cache
def extras_requirements() -> dict[str, list[Requirement]]:
    """Each extra's requirements, as the installed distribution declares them (empty where it is not installed)."""
    try:
        lines = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return {}
    extras: dict[str, list[Requirement]] = {}
    for extra in metadata.metadata(DISTRIBUTION).get_all("Provides-Extra") or []:
        extras[extra] = [r for r in map(Requirement, lines)
                         if r.marker is not None and r.marker.evaluate({"extra": extra})]
    return extras


def extra_providing(module: str | None) -> str | None:
    """The extra whose requirements bring ``module`` (a dotted import name); None where none does."""
    if not module:
        return None
    top = module.split(".")[0]
    wanted = _canonical(DISTRIBUTION_OF_MODULE.get(top, top))
    for extra, requirements in extras_requirements().items():
        if extra not in SEPARATE_ENVIRONMENTS and any(_canonical(r.name) == wanted for r in requirements):
            return extra
    return None


def installed_extras() -> dict[str, bool]:
    """Each extra, and whether every one of its requirements is installed here."""
    found: dict[str, bool] = {}
    for extra, requirements in extras_requirements().items():
        installed = True
        for requirement in requirements:
            try:
                metadata.version(requirement.name)
            except metadata.PackageNotFoundError:
                installed = False
                break
        found[extra] = installed
    return found
