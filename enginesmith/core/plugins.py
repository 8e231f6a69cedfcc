"""Modules that add cell kinds (and their report models) from outside this package: a config names them under
``plugins``; a process that reads the registry without a config (the catalogue, ``history``, ``report``) finds them
in ``ENGINESMITH_PLUGINS`` (comma-separated module names)."""

from __future__ import annotations

import importlib
import os

from enginesmith.core.errors import ConfigError

PLUGINS_ENV = "ENGINESMITH_PLUGINS"


def load_plugins(modules: list[str], *, field: str = "plugins") -> None:
    """Import each module (it registers its kinds and report models); a module that cannot be imported is an error
    naming where it was asked for."""
    for index, module in enumerate(modules):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(f"plugin module {module!r} could not be imported: {exc}", field=f"{field}[{index}]",
                              hint="install the package that provides it, or remove it from the list") from None


def env_plugins() -> list[str]:
    return [name.strip() for name in os.environ.get(PLUGINS_ENV, "").split(",") if name.strip()]


def load_env_plugins() -> None:
    load_plugins(env_plugins(), field=PLUGINS_ENV)
