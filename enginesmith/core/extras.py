"""Which optional extra of the distribution brings a module, read from the installed distribution's own metadata
(its ``Requires-Dist`` lines and their ``extra == "..."`` markers), so a command run without the extra it needs
says which one in one line instead of a raw ``ModuleNotFoundError``."""

from __future__ import annotations

from functools import cache
from importlib import metadata, util

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
    return extra_of_distribution(DISTRIBUTION_OF_MODULE.get(top, top))


def require_modules(*modules: str) -> None:
    """Raise the ``ModuleNotFoundError`` of the first of ``modules`` not importable here, before any work is done:
    the CLI turns it into one line naming the extra that brings it (``main``), as for an import that fails later."""
    for module in modules:
        if util.find_spec(module) is None:
            raise ModuleNotFoundError(f"No module named {module!r}", name=module)


def extra_of_distribution(distribution: str) -> str | None:
    """The extra (not an environment of its own) that requires ``distribution``; None where none does."""
    wanted = _canonical(distribution)
    for extra, requirements in extras_requirements().items():
        if extra not in SEPARATE_ENVIRONMENTS and any(_canonical(r.name) == wanted for r in requirements):
            return extra
    return None


def unmet_requirements(extra: str) -> list[str]:
    """What of ``extra``'s requirements this environment lacks, each in a few words ("nvidia-modelopt not
    installed", "transformers 5.19.0 where the extra needs ==4.57.6"); empty where the extra is installed."""
    unmet = []
    for requirement in extras_requirements().get(extra, []):
        try:
            found = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            unmet.append(f"{requirement.name} not installed")
            continue
        if not requirement.specifier.contains(found, prereleases=True):
            unmet.append(f"{requirement.name} {found} where the extra needs {requirement.specifier}")
    return unmet


def installed_extras() -> dict[str, bool]:
    """Each extra, and whether every one of its requirements is installed here, at a version it allows."""
    return {extra: not unmet_requirements(extra) for extra in extras_requirements()}
