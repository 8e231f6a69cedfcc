"""Files shipped with the package: the tiny model, its task's eval set, calibration text."""

from __future__ import annotations

from pathlib import Path

from enginesmith.errors import ConfigError

ASSETS_DIR = Path(__file__).resolve().parent / "assets"
BUILTIN_PREFIX = "builtin:"


def builtin_calibration_names() -> list[str]:
    return sorted(p.name.removesuffix("-calib.txt") for p in (ASSETS_DIR / "calibration").glob("*-calib.txt"))


def builtin_calibration_path(name: str) -> Path:
    path = ASSETS_DIR / "calibration" / f"{name}-calib.txt"
    if not path.is_file():
        raise ConfigError(
            f"no built-in calibration set {name!r}",
            field="calibration.dataset",
            hint=f"built-in sets: {', '.join(BUILTIN_PREFIX + n for n in builtin_calibration_names()) or 'none'}",
        )
    return path


def task_eval_path(task: str) -> Path:
    path = ASSETS_DIR / "tasks" / f"{task}-eval.jsonl"
    if not path.is_file():
        known = sorted(p.name.removesuffix("-eval.jsonl") for p in (ASSETS_DIR / "tasks").glob("*-eval.jsonl"))
        raise ConfigError(f"no eval set for task {task!r}", field="task", hint=f"known tasks: {', '.join(known)}")
    return path
