"""Imported first by every entry point (``python -m enginesmith``, the console script, the Prefect flows): the
distribution's other top-level packages are named as the design names its components (``pipeline``, ``flows``,
``builders``, ``quantization``, ``validation``, ``registry``), common folder names in ML and Prefect repositories.
Python puts the working directory first on ``sys.path`` (``-m``, and Prefect while it loads a flow's file), so a
user's ``registry/`` there would be imported in place of ours. Importing this module installs a finder that takes
those names from the directory this distribution is installed in (site-packages, or a checkout) and nowhere else."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

COMPONENTS = ("pipeline", "flows", "builders", "quantization", "validation", "registry")
INSTALLED_ROOT = Path(__file__).resolve().parents[1]  # the directory holding enginesmith/ and the components


class OwnComponents(importlib.abc.MetaPathFinder):
    """Finds the component packages in ``root`` only."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in COMPONENTS:
            return None  # a submodule is found through its package's __path__, which is ours
        return importlib.machinery.PathFinder.find_spec(fullname, [str(self.root)])


def install() -> None:
    """Put the finder first (once); drop a component a user's folder already supplied, so it is imported again."""
    if any(isinstance(finder, OwnComponents) for finder in sys.meta_path):
        return
    sys.meta_path.insert(0, OwnComponents(INSTALLED_ROOT))
    for name in COMPONENTS:
        module = sys.modules.get(name)
        origin = getattr(module, "__file__", None) if module is not None else None
        if module is not None and (origin is None or not Path(origin).resolve().is_relative_to(INSTALLED_ROOT)):
            for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
                del sys.modules[loaded]


install()
