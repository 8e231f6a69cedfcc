"""Modules that add cell kinds (and their report models) from outside this package: a config names them under
``plugins``; a process that reads the registry without a config (the catalogue, ``history``, ``report``) finds them
in ``ENGINESMITH_PLUGINS`` (comma-separated module names)."""

from __future__ import annotations

import importlib
import os
import re

from enginesmith.core.errors import ConfigError

PLUGINS_ENV = "ENGINESMITH_PLUGINS"
# Module paths of enginesmith 0.1 that moved (#48), and where each is now: a plug-in (or a config's plugins list)
# naming one is told the new path instead of seeing a bare ImportError.
_VOCABULARY = ("artefacts", "assets", "calibration", "checkpoints", "compat", "config", "console", "diskspace",
               "errors", "factcache", "gpus", "keys", "locks", "memory", "plan", "plugins", "process",
               "reports", "runtimes", "secrets", "shapes", "slo", "specs", "staging", "tasks", "tuning", "yamlio")
MOVED_MODULES = {
    **{f"enginesmith.{name}": f"enginesmith.core.{name}" for name in _VOCABULARY},
    "enginesmith.cli_registry": "enginesmith.cli.registry_commands",
    "enginesmith.encoder_plan": "pipeline.kinds.encoder_plan",
    "builders.serve": "enginesmith.core.serving",
    "builders.vllm_argcheck": "enginesmith.core.in_runtime.vllm_argcheck",
    **{f"pipeline.{name}": f"pipeline.common.{name}" for name in ("steps", "params", "verdicts", "plan_sources")},
}
# Names that left ``pipeline.kinds`` (now the kinds' own package) for the layer below the kinds or above them.
MOVED_NAMES = {
    **{("pipeline.kinds", name): "pipeline.common.protocol" for name in (
        "CellContext", "CellFilter", "CellKind", "CellRun", "Dispatch", "KindPreflight", "PlainStages", "PlannedCell",
        "StageRunner", "kind_section")},
    **{("pipeline.kinds", name): "pipeline.kind_registry" for name in (
        "KINDS", "register_kind", "kinds_of", "find_planned")},
}
_CANNOT_IMPORT = re.compile(r"cannot import name '(?P<name>\w+)' from '(?P<module>[\w.]+)'")


def moved_to(exc: ImportError) -> str | None:
    """Where the module (or name) an import failed on lives now, as a hint; None where it did not move."""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        for old, new in MOVED_MODULES.items():
            if exc.name == old or exc.name.startswith(old + "."):
                return f"{exc.name} moved to {new + exc.name[len(old):]}: import it from there"
        return None
    found = _CANNOT_IMPORT.search(str(exc))
    if found:
        moved = MOVED_NAMES.get((found["module"], found["name"]))
        if moved:
            return f"{found['name']} moved from {found['module']} to {moved}: import it from there"
    return None


def load_plugins(modules: list[str], *, field: str = "plugins") -> None:
    """Import each module (it registers its kinds and report models); a module that cannot be imported is an error
    naming where it was asked for."""
    for index, module in enumerate(modules):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            moved = moved_to(exc)
            raise ConfigError(f"plugin module {module!r} could not be imported: {exc}", field=f"{field}[{index}]",
                              hint=moved or "install the package that provides it, or remove it from the list") \
                from None


def env_plugins() -> list[str]:
    return [name.strip() for name in os.environ.get(PLUGINS_ENV, "").split(",") if name.strip()]


def load_env_plugins() -> None:
    load_plugins(env_plugins(), field=PLUGINS_ENV)
