"""How shipped tasks are scored, and that the facts task file is what its generator writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from enginesmith.core.assets import task_eval_path
from enginesmith.core.tasks import answer_matches, task_spec
from tests.conftest import REPO_ROOT


def test_facts_accepts_the_answer_as_a_word_of_the_first_line_only():
    facts = task_spec("facts")
    assert answer_matches("The capital of France is Paris.", "Paris", facts)
    assert answer_matches("paris", "Paris", facts)
    assert answer_matches("It is Brasília.", "Brasilia", facts, aliases=["Brasília"])
    assert not answer_matches("The capital of France is Lyon.\nParis is the largest city.", "Paris", facts)
    assert not answer_matches("Parisian food is great.", "Paris", facts)  # a whole word, not a prefix
    assert not answer_matches("", "Paris", facts)


def test_addition_needs_the_exact_sum():
    addition = task_spec("addition")
    assert answer_matches(" 168 ", "168", addition)
    assert not answer_matches("1680", "168", addition) and not answer_matches("The sum is 168", "168", addition)


def test_a_shipped_task_copied_or_sliced_to_a_file_is_asked_and_scored_as_the_shipped_one(tmp_path):
    """#49: a local JSONL task was scored by exact match of the first line, so the facts task read from a copy
    scored an instruct model's sentences 0 % where the shipped task scores them by word. Where a task is read from
    never changes its score; a file of other examples keeps the local rule."""
    copy = tmp_path / "my-facts.jsonl"
    copy.write_bytes(task_eval_path("facts").read_bytes())
    spec = task_spec(str(copy))
    assert (spec.name, spec.api, spec.match, spec.max_tokens) == (str(copy), "chat", "word", 16)
    assert answer_matches("The capital of France is Paris.", "Paris", spec)
    # A slice of a shipped task (for a quicker run) is scored as the task; one line not in it makes it a local task.
    lines = task_eval_path("facts-completion").read_text().splitlines()
    part = tmp_path / "part.jsonl"
    part.write_text("\n".join(lines[100:140]) + "\n")
    assert (task_spec(str(part)).match, task_spec(str(part)).api) == ("word", "completions")
    other = tmp_path / "mine.jsonl"
    other.write_text("\n".join([*lines[:3], json.dumps({"prompt": "2+2=", "answer": "4"})]) + "\n")
    assert (task_spec(str(other)).match, task_spec(str(other)).api, task_spec(str(other)).max_tokens) == \
        ("exact", "completions", 32)


def test_the_committed_facts_task_is_what_the_generator_writes(tmp_path):
    out = tmp_path / "facts.jsonl"
    subprocess.run([sys.executable, "scripts/make_facts_task.py", "--out", str(out)], cwd=REPO_ROOT, check=True,
                   capture_output=True)
    assert out.read_text() == task_eval_path("facts").read_text()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) >= 200 and len({r["prompt"] for r in rows}) == len(rows)


def test_lm_eval_task_names_are_resolved_from_the_fact_cache_without_importing_lm_eval(tmp_path):
    """Planning resolves lm-eval task names against lm-eval's index, which takes seconds to build: the first plan
    builds it and keeps it (with each named task's YAML facts) in the fact cache, and later ones read it there
    without importing lm-eval at all. An unknown name is refused either way."""
    pytest.importorskip("lm_eval")
    script = """
import json, sys
from enginesmith.core.errors import ConfigError
from enginesmith.core.tasks import resolve_task
task = resolve_task("mmlu_high_school_psychology_generative")
try:
    resolve_task("no_such_lm_eval_task")
    refused = None
except ConfigError as exc:
    refused = exc.field
print(json.dumps({"task": task.model_dump(), "refused": refused, "imported": "lm_eval" in sys.modules}))
"""
    env = {**os.environ, "ENGINESMITH_CACHE_DIR": str(tmp_path / "cache")}

    def resolve() -> dict:  # type: ignore[type-arg]
        done = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return dict(json.loads(done.stdout))

    first, second = resolve(), resolve()
    assert first["imported"] and not second["imported"]
    assert first["task"] == second["task"] and second["task"]["source"] == "lm-eval"
    assert second["task"]["output_type"] == "generate_until"
    assert first["refused"] == second["refused"] == "workload.accuracy_tasks"
    assert {p.name for p in (tmp_path / "cache").iterdir()} == {"lm-eval-index", "lm-eval-task"}
