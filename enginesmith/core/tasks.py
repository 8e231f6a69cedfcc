"""Which accuracy tasks exist and how each is asked and scored.

A task is one of the shipped ones below (asked and scored by enginesmith, and by lm-eval over the same file); a local
JSONL file of ``{"prompt", "answer"}`` lines by its path (asked over /v1/completions, the first line of the greedy
completion scored by exact match, up to 32 tokens); or a task of lm-evaluation-harness's registry by its name
(``gsm8k``, ``mmlu_abstract_algebra_generative``), run by lm-eval with that task's own prompts, few-shot and
generation settings; those download their dataset from the Hub.

- ``addition`` (the tiny model's): a completion prompt ``"123+45="``; the completion, stripped, must equal the sum.
- ``facts`` (for instruct models): one user message with a one-word answer; instruct models answer in a
  sentence ("The capital of France is Paris."), so the reply's first line must contain the answer (or an alias)
  as a whole word, case aside. Written by ``scripts/make_facts_task.py``.
- ``facts-completion`` (for base models, which have no chat template): the same questions as a two-shot
  ``Q: …\nA:`` completion prompt, scored as ``facts``.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from enginesmith.core.assets import LOCAL_TASK_SUFFIX
from enginesmith.core.errors import ConfigError
from enginesmith.core.factcache import fact_path, read_fact, write_fact


class TaskSpec(BaseModel):
    name: str
    api: Literal["completions", "chat"]  # how the prompts are meant to be sent
    match: Literal["exact", "word"]
    max_tokens: int


TASKS: dict[str, TaskSpec] = {t.name: t for t in [
    TaskSpec(name="addition", api="completions", match="exact", max_tokens=8),
    TaskSpec(name="facts", api="chat", match="word", max_tokens=16),
    TaskSpec(name="facts-completion", api="completions", match="word", max_tokens=8),
]}

# A shipped or local task is asked of the candidate in blocks of this many questions, judged after each against the
# reference's answers (validation.sequential_accuracy); it enters the validation stage key (enginesmith.core.plan).
ACCURACY_BLOCK_QUESTIONS = 64

_WORD = re.compile(r"[\w'-]+", re.UNICODE)


def task_spec(name: str) -> TaskSpec:
    """How a shipped or local task is asked and scored. A local file holding a shipped task's examples (a copy of
    its eval set, or some of its examples: a slice for a quicker run) is asked and scored as that task is: where a
    task is read from never changes how an answer is scored."""
    if name.endswith(LOCAL_TASK_SUFFIX):
        shipped = _shipped_task_with_content(Path(name).expanduser())
        if shipped is not None:
            return shipped.model_copy(update={"name": name})
        return TaskSpec(name=name, api="completions", match="exact", max_tokens=32)
    try:
        return TASKS[name]
    except KeyError:
        raise ConfigError(f"no scoring rule for task {name!r}", field="workload.accuracy_tasks",
                          hint=f"known tasks: {', '.join(sorted(TASKS))}") from None


def _shipped_task_with_content(path: Path) -> TaskSpec | None:
    from enginesmith.core.assets import read_task_file

    if not path.is_file():
        return None
    examples = {example.model_dump_json() for example in read_task_file(path)}
    for spec in TASKS.values():
        if examples and examples <= _shipped_lines(spec.name):
            return spec
    return None


@cache
def _shipped_lines(task: str) -> frozenset[str]:
    """A shipped task's examples as JSON, read once per process (the files are package data)."""
    from enginesmith.core.assets import read_task_file, task_eval_path

    return frozenset(example.model_dump_json() for example in read_task_file(task_eval_path(task)))


class AccuracyTask(BaseModel):
    """A task as validation will run it."""

    name: str
    source: Literal["shipped", "local", "lm-eval"]
    output_type: str  # lm-eval's: generate_until, multiple_choice, loglikelihood, loglikelihood_rolling
    dataset: str | None = None  # the Hub dataset an lm-eval task downloads
    checked: bool = True  # False: lm-eval is not installed where this was resolved, so the name was not checked

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Scored from the prompt's log-likelihoods, which only some servers return (trtllm-serve does not)."""
        return self.output_type != "generate_until"


def resolve_task(name: str) -> AccuracyTask:
    """A shipped task, else a task of lm-eval's registry; raises a ConfigError naming what exists."""
    if name in TASKS:
        return AccuracyTask(name=name, source="shipped", output_type="generate_until")
    if name.endswith(LOCAL_TASK_SUFFIX):
        from enginesmith.core.assets import read_task

        read_task(name)  # the file exists and every line is an example
        return AccuracyTask(name=name, source="local", output_type="generate_until")
    index = _lm_eval_index()
    if index is None:
        # A quantise or build worker need not have lm-eval: the name is checked where validation runs.
        return AccuracyTask(name=name, source="lm-eval", output_type="generate_until", checked=False)
    entry = index.get(name)
    if entry is None or entry.yaml_path is None:
        raise ConfigError(f"unknown accuracy task {name!r}", field="workload.accuracy_tasks",
                          hint=f"shipped tasks: {', '.join(sorted(TASKS))}, or a task name lm-eval lists "
                               "(lm-eval ls tasks)")
    if entry.kind == "GROUP":
        raise ConfigError(f"{name!r} is an lm-eval group, not one task", field="workload.accuracy_tasks",
                          hint="name its tasks (each is gated on its own), e.g. mmlu_abstract_algebra_generative")
    if entry.kind != "TASK":
        raise ConfigError(f"{name!r} is an lm-eval {entry.kind.lower()}; enginesmith runs lm-eval tasks "
                          "defined in YAML", field="workload.accuracy_tasks", hint="name a YAML-defined task")
    facts = _task_facts(Path(entry.yaml_path))
    return AccuracyTask(name=name, source="lm-eval", output_type=facts.output_type, dataset=facts.dataset)


class _IndexEntry(BaseModel):
    kind: str  # lm-eval's TaskManager kind: TASK, GROUP, TAG, PY_TASK
    yaml_path: str | None


class _TaskFacts(BaseModel):
    output_type: str
    dataset: str | None


def _lm_eval_install() -> tuple[str, str] | None:
    """lm-eval's version and where it is installed, read without importing it (None: not installed)."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        found = distribution("lm_eval")
    except PackageNotFoundError:
        return None
    return found.version, str(found.locate_file(""))


@cache
def _lm_eval_index() -> dict[str, _IndexEntry] | None:
    """lm-eval's task index: building it imports lm-eval and reads thousands of YAML files (seconds on every plan), so
    it is kept in the fact cache per lm-eval install (version and location)."""
    install = _lm_eval_install()
    if install is None:
        return None
    path = fact_path("lm-eval-index", *install)
    kept = read_fact(path)
    if isinstance(kept, dict):
        try:
            return {name: _IndexEntry.model_validate(entry) for name, entry in kept.items()}
        except ValueError:
            pass  # damaged: built again below
    try:
        from lm_eval.tasks import TaskManager
    except ImportError:
        return None
    index = {name: _IndexEntry(kind=entry.kind.name, yaml_path=str(entry.yaml_path) if entry.yaml_path else None)
             for name, entry in TaskManager().task_index.items()}
    write_fact(path, {name: entry.model_dump() for name, entry in index.items()})
    return index


def _task_facts(path: Path) -> _TaskFacts:
    """A task YAML's output type and Hub dataset, includes resolved (kept in the fact cache by path and mtime)."""
    kept_path = fact_path("lm-eval-task", str(path), path.stat().st_mtime_ns)
    kept = read_fact(kept_path)
    if isinstance(kept, dict):
        try:
            return _TaskFacts.model_validate(kept)
        except ValueError:
            pass
    from lm_eval.tasks._yaml_loader import load_yaml  # resolves the task's includes, without importing its code

    config = dict(load_yaml(path, resolve_func=False))
    dataset = config.get("dataset_path")
    facts = _TaskFacts(output_type=str(config.get("output_type", "generate_until")),
                       dataset=None if dataset is None else str(dataset))
    write_fact(kept_path, facts.model_dump())
    return facts


def words(text: str) -> set[str]:
    return {word.lower() for word in _WORD.findall(text)}


def answer_matches(completion: str, answer: str, spec: TaskSpec, aliases: list[str] | None = None) -> bool:
    """Is ``completion`` the answer (or one of its ``aliases``) by the task's rule?"""
    accepted = [answer, *(aliases or [])]
    if spec.match == "exact":
        return completion.strip() in accepted
    first_line = completion.strip().split("\n", 1)[0]
    return any(a.lower() in words(first_line) for a in accepted)
