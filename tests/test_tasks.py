"""How shipped tasks are scored, and that the facts task file is what its generator writes."""

from __future__ import annotations

import json
import subprocess
import sys

from enginesmith.assets import task_eval_path
from tests.conftest import REPO_ROOT
from validation.tasks import answer_matches, task_spec


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


def test_the_committed_facts_task_is_what_the_generator_writes(tmp_path):
    out = tmp_path / "facts.jsonl"
    subprocess.run([sys.executable, "scripts/make_facts_task.py", "--out", str(out)], cwd=REPO_ROOT, check=True,
                   capture_output=True)
    assert out.read_text() == task_eval_path("facts").read_text()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) >= 200 and len({r["prompt"] for r in rows}) == len(rows)
