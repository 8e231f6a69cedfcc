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


def text_path(source: str) -> Path:
    """A held-out text: ``builtin:<name>`` (``assets/text/<name>-heldout.txt``) or a file path."""
    if source.startswith(BUILTIN_PREFIX):
        name = source.removeprefix(BUILTIN_PREFIX)
        path = ASSETS_DIR / "text" / f"{name}-heldout.txt"
        if not path.is_file():
            known = sorted(p.name.removesuffix("-heldout.txt") for p in (ASSETS_DIR / "text").glob("*-heldout.txt"))
            raise ConfigError(f"no built-in text {name!r}", field="workload.perplexity_text",
                              hint=f"built-in texts: {', '.join(BUILTIN_PREFIX + n for n in known)}")
        return path
    path = Path(source).expanduser()
    if not path.is_file():
        raise ConfigError("perplexity text not found", path=path, field="workload.perplexity_text",
                          hint="give a text file with one paragraph a line, or builtin:pydocs")
    return path


def read_paragraphs(source: str) -> list[str]:
    return [line for line in text_path(source).read_text(encoding="utf-8").splitlines() if line.strip()]


def task_eval_path(task: str) -> Path:
    path = ASSETS_DIR / "tasks" / f"{task}-eval.jsonl"
    if not path.is_file():
        known = sorted(p.name.removesuffix("-eval.jsonl") for p in (ASSETS_DIR / "tasks").glob("*-eval.jsonl"))
        raise ConfigError(f"no eval set for task {task!r}", field="task", hint=f"known tasks: {', '.join(known)}")
    return path
