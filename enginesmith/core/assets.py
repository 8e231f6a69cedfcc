"""Files shipped with the package: the tiny model, the tasks' eval sets, calibration and held-out text; and the one
reader of task files."""

from __future__ import annotations

import hashlib
import json
import shutil
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ValidationError

from enginesmith.core.errors import ConfigError, UserError

ASSETS_DIR = Path(str(resources.files("enginesmith") / "assets"))
# The sentences an encoder is calibrated on (its quantize key digests this file) and the held-out ones it is checked on.
EMBEDDING_CALIBRATION_FILE = ASSETS_DIR / "embeddings" / "calibration.txt"
EMBEDDING_HELD_OUT_FILE = ASSETS_DIR / "embeddings" / "held_out.txt"
TINY_MODEL_DIR = ASSETS_DIR / "tiny-llama"
BUILTIN_PREFIX = "builtin:"
LOCAL_TASK_SUFFIX = ".jsonl"  # an accuracy task named by a path to its file


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
    """A shipped task's eval set, or a local task file named by its path (``*.jsonl``)."""
    if task.endswith(LOCAL_TASK_SUFFIX):
        local = Path(task).expanduser()
        if not local.is_file():
            raise ConfigError("task file not found", path=local, field="workload.accuracy_tasks",
                              hint="a JSONL file of {\"prompt\", \"answer\"} lines, or a shipped task name")
        return local
    path = ASSETS_DIR / "tasks" / f"{task}-eval.jsonl"
    if not path.is_file():
        known = sorted(p.name.removesuffix("-eval.jsonl") for p in (ASSETS_DIR / "tasks").glob("*-eval.jsonl"))
        raise ConfigError(f"no eval set for task {task!r}", field="task", hint=f"known tasks: {', '.join(known)}")
    return path


class TaskExample(BaseModel):
    """One line of a task file: the prompt, the expected answer, and other answers that count (a word task's)."""

    prompt: str
    answer: str
    aliases: list[str] = []


def read_task_file(path: Path) -> list[TaskExample]:
    """Every example of a JSONL task file; a line that is not one names the file and line."""
    examples = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            examples.append(TaskExample.model_validate(json.loads(line)))
        except (json.JSONDecodeError, ValidationError) as exc:
            raise UserError(f"not a task example ({{\"prompt\", \"answer\"}}): {exc}".splitlines()[0],
                            where=f"{path}:{number}") from None
    if not examples:
        raise UserError("the task file has no examples", where=str(path))
    return examples


def read_task(task: str, limit: int | None = None) -> list[TaskExample]:
    """The examples of a shipped task (``assets/tasks/<task>-eval.jsonl``) or a local task file, the first ``limit``
    of them."""
    examples = read_task_file(task_eval_path(task))
    return examples[:limit] if limit else examples


def tiny_model_dir() -> Path:
    """Return the path of the committed tiny model directory."""
    return TINY_MODEL_DIR


def copy_tiny_model(dest: Path | str) -> Path:
    """Copy the committed tiny model's files into ``dest`` (created if needed); return ``dest``."""
    if not (TINY_MODEL_DIR / "config.json").is_file():
        raise FileNotFoundError(f"{TINY_MODEL_DIR} has no model; run scripts/train_tiny_model.py to create it")
    dest_path = Path(dest)
    dest_path.mkdir(parents=True, exist_ok=True)
    for source in TINY_MODEL_DIR.iterdir():
        if source.is_file():
            shutil.copy2(source, dest_path / source.name)
    return dest_path


def task_fingerprints(tasks: list[str]) -> dict[str, str]:
    """``sha256:<hex>`` of each local task file's bytes, by its name in the config: a key that holds a task's name
    must change when the file behind it does (shipped tasks change only with the package)."""
    return {task: "sha256:" + hashlib.sha256(task_eval_path(task).read_bytes()).hexdigest()
            for task in tasks if task.endswith(LOCAL_TASK_SUFFIX)}
