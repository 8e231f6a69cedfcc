"""How each shipped task is asked and scored. Pure.

- ``addition`` (the tiny model's): a completion prompt ``"123+45="``; the completion, stripped, must equal the sum.
- ``facts`` (for instruct models): one user message with a one-word answer; instruct models answer in a
  sentence ("The capital of France is Paris."), so the reply's first line must contain the answer (or an alias)
  as a whole word, case aside. Written by ``scripts/make_facts_task.py``.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel

from enginesmith.errors import ConfigError


class TaskSpec(BaseModel):
    name: str
    api: Literal["completions", "chat"]  # how the prompts are meant to be sent
    match: Literal["exact", "word"]
    max_tokens: int


TASKS: dict[str, TaskSpec] = {t.name: t for t in [
    TaskSpec(name="addition", api="completions", match="exact", max_tokens=8),
    TaskSpec(name="facts", api="chat", match="word", max_tokens=16),
]}

_WORD = re.compile(r"[\w'-]+", re.UNICODE)


def task_spec(name: str) -> TaskSpec:
    try:
        return TASKS[name]
    except KeyError:
        raise ConfigError(f"no scoring rule for task {name!r}", field="workload.accuracy_tasks",
                          hint=f"known tasks: {', '.join(sorted(TASKS))}") from None


def words(text: str) -> set[str]:
    return {word.lower() for word in _WORD.findall(text)}


def answer_matches(completion: str, answer: str, spec: TaskSpec, aliases: list[str] | None = None) -> bool:
    """Is ``completion`` the answer (or one of its ``aliases``) by the task's rule?"""
    accepted = [answer, *(aliases or [])]
    if spec.match == "exact":
        return completion.strip() in accepted
    first_line = completion.strip().split("\n", 1)[0]
    return any(a.lower() in words(first_line) for a in accepted)
