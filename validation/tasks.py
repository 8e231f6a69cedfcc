"""How each shipped task is asked and scored. Pure.

- ``addition`` (the tiny model's): a completion prompt ``"123+45="``; the completion, stripped, must equal the sum.
- ``facts`` (for instruct models): one user message asking for a one-word answer; the reply's first word,
  without punctuation and case, must equal the answer. Written by ``scripts/make_facts_task.py``.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel

from enginesmith.errors import ConfigError


class TaskSpec(BaseModel):
    name: str
    api: Literal["completions", "chat"]  # how the prompts are meant to be sent
    match: Literal["exact", "first-word"]
    max_tokens: int


TASKS: dict[str, TaskSpec] = {t.name: t for t in [
    TaskSpec(name="addition", api="completions", match="exact", max_tokens=8),
    TaskSpec(name="facts", api="chat", match="first-word", max_tokens=12),
]}

_WORD = re.compile(r"[\w'-]+", re.UNICODE)


def task_spec(name: str) -> TaskSpec:
    try:
        return TASKS[name]
    except KeyError:
        raise ConfigError(f"no scoring rule for task {name!r}", field="workload.accuracy_tasks",
                          hint=f"known tasks: {', '.join(sorted(TASKS))}") from None


def first_word(text: str) -> str:
    found = _WORD.search(text)
    return found.group(0).lower() if found else ""


def answer_matches(completion: str, answer: str, spec: TaskSpec, aliases: list[str] | None = None) -> bool:
    """Is ``completion`` the answer (or one of its ``aliases``) by the task's rule?"""
    accepted = [answer, *(aliases or [])]
    if spec.match == "exact":
        return completion.strip() in accepted
    return first_word(completion) in {a.lower() for a in accepted}
