"""Accuracy through the same API on both sides: the shipped task's greedy exact match, greedy agreement
with the reference, and lm-evaluation-harness (``local-completions``) where it is installed. Where it is, a
shipped task is asked once, by lm-eval, and its logged answers are scored by lm-eval and by our own rule alike
(two scores, one set of requests); without it, our own client asks.

Log-likelihood tasks run only against a server that has shown it returns prompt logprobs
(``ServerCapabilities.prompt_logprobs``): trtllm-serve does not, and its scores would sit at chance.
"""

from __future__ import annotations

import asyncio
import math
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from enginesmith.core.assets import TaskExample, read_task, task_eval_path
from enginesmith.core.cost import ACCURACY_CONCURRENCY
from enginesmith.core.reports.measures import Perplexity, TaskScore
from enginesmith.core.tasks import AccuracyTask, answer_matches, task_spec
from validation.loadgen import API_PATHS, Api, completion_payload
from validation.server import Endpoint, check_answer


async def _greedy_completions(endpoint: Endpoint, prompts: Sequence[str], max_tokens: int, *,
                              stop: list[str] | None, api: Api) -> list[str]:
    semaphore = asyncio.Semaphore(ACCURACY_CONCURRENCY)
    async with httpx.AsyncClient(timeout=300) as client:

        async def one(prompt: str) -> str:
            payload = completion_payload(endpoint, prompt, max_tokens, stream=False, capabilities=None, api=api)
            if stop:
                payload["stop"] = stop
            async with semaphore:
                response = await client.post(f"{endpoint.base_url}{API_PATHS[api]}", json=payload)
            check_answer(response, what=f"a greedy {api} request of the accuracy check")
            choice = response.json()["choices"][0]
            return str(choice["message"]["content"] or "" if api == "chat" else choice["text"])

        return list(await asyncio.gather(*(one(p) for p in prompts)))


def greedy_completions(endpoint: Endpoint, prompts: Sequence[str], max_tokens: int,
                       stop: list[str] | None = None, api: Api = "completions") -> list[str]:
    """Greedy completions of ``prompts`` (texts, or user messages with ``api="chat"``)."""
    return asyncio.run(_greedy_completions(endpoint, prompts, max_tokens, stop=stop, api=api))


def task_questions(task: str, questions: Sequence[int] | None = None, limit: int | None = None) -> list[TaskExample]:
    """A shipped or local task's examples: the first ``limit`` of them, or those at the indices ``questions`` (a
    block of a task asked in blocks, ``validation.sequential_accuracy.plan_blocks``), in that order.

    Raises IndexError for a question the task does not have."""
    rows = read_task(task, None if questions is not None else limit)
    if questions is None:
        return rows
    if any(not 0 <= index < len(rows) for index in questions):
        raise IndexError(f"task {task!r} has {len(rows)} questions, not {list(questions)}")
    return [rows[index] for index in questions]


def task_exact_match(endpoint: Endpoint, task: str, limit: int | None = None, api: Api = "completions", *,
                     questions: Sequence[int] | None = None) -> tuple[TaskScore, list[str]]:
    """Greedy completions of the task's prompts (stopped at a newline; the first ``limit``, or those at the indices
    ``questions``) compared with the answers by the task's own rule (``enginesmith.core.tasks``)."""
    score, completions, _ = _task_exact_match(endpoint, task, limit, api, questions=questions)
    return score, completions


def _task_exact_match(endpoint: Endpoint, task: str, limit: int | None, api: Api, *,
                      questions: Sequence[int] | None) -> tuple[TaskScore, list[str], list[bool]]:
    spec = task_spec(task)
    rows = task_questions(task, questions, limit)
    completions = greedy_completions(endpoint, [r.prompt for r in rows], spec.max_tokens, stop=["\n"], api=api)
    correct = [answer_matches(c, r.answer, spec, aliases=r.aliases) for c, r in zip(completions, rows, strict=True)]
    metric = "exact_match" if spec.match == "exact" else "word_match"
    return TaskScore(task=task, metric=metric, value=sum(correct) / len(rows), examples=len(rows),
                     source="enginesmith"), completions, correct


# Prompt logprobs (perplexity, lm-eval's log-likelihood tasks) stay at 4 in flight: they hold fp32 logits over the
# vocabulary for every prompt token, and at 16 a SmolLM2 server's peak rose 0.5 GiB (4.25 GiB against 3.65) for
# perplexity no quicker (36-41 s either way). Generation (greedy answers, lm-eval's generate_until tasks) runs at
# ACCURACY_CONCURRENCY: served in float32, Gemma 3 270M answered 64 questions in 31.4 s at 4, 22.3 s at 8 and 12.4 s
# at 16, its server's peak 6.54-6.57 GiB at either (2026-12-07).
MEMORY_BOUND_CONCURRENCY = 4


async def _prompt_logprobs(endpoint: Endpoint, paragraphs: Sequence[str]) -> list[list[float]]:
    semaphore = asyncio.Semaphore(MEMORY_BOUND_CONCURRENCY)
    async with httpx.AsyncClient(timeout=300) as client:

        async def one(text: str) -> list[float]:
            payload = {"model": endpoint.model, "prompt": text, "max_tokens": 1, "temperature": 0.0, "echo": True,
                       "logprobs": 0}
            async with semaphore:
                response = await client.post(f"{endpoint.base_url}/v1/completions", json=payload)
            check_answer(response, what="a prompt-logprobs request of the perplexity check")
            body = response.json()
            prompt_tokens = int(body["usage"]["prompt_tokens"])
            logprobs = body["choices"][0]["logprobs"]["token_logprobs"][:prompt_tokens]
            return [float(v) for v in logprobs[1:] if v is not None]

        return list(await asyncio.gather(*(one(p) for p in paragraphs)))


def perplexity(endpoint: Endpoint, paragraphs: Sequence[str], *, text: str) -> Perplexity:
    """Perplexity of ``paragraphs`` (each scored on its own) through ``/v1/completions`` with ``echo`` and
    ``logprobs``: only servers that return prompt logprobs (``ServerCapabilities.prompt_logprobs``) can."""
    scored = asyncio.run(_prompt_logprobs(endpoint, paragraphs))
    values = [v for paragraph in scored for v in paragraph]
    if not values:
        raise ValueError("the server returned no prompt logprobs")
    return Perplexity(text=text, value=math.exp(-sum(values) / len(values)), tokens=len(values),
                      paragraphs=len(paragraphs))


def greedy_agreement(candidate: Sequence[str], reference: Sequence[str]) -> float:
    """Share of prompts whose greedy completions (the first N tokens) are identical on both sides."""
    return sum(a == b for a, b in zip(candidate, reference, strict=True)) / len(reference)


def lm_eval_available() -> bool:
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        return False
    return True


# Imported by a side's scoring on first use: httpx's transports and the event loop backend they run on; with lm-eval,
# its model and task modules, the json builder that reads a task file, and what its metrics and seeding import.
FIRST_USE_MODULES = ("anyio._backends._asyncio", "anyio.streams.tls", "anyio.to_thread", "httpcore._async.http2",
                     "httpcore._backends.anyio", "sniffio")
LM_EVAL_FIRST_USE_MODULES = ("datasets.packaged_modules.json", "lm_eval.evaluator", "lm_eval.models.openai_completions",
                             "lm_eval.tasks", "scipy.io", "torch.backends.xnnpack")


def import_for_threads(tokenizer_dir: Path) -> None:
    """Import, in the calling thread, what scoring a side imports on first use. transformers and lm-eval import
    their parts lazily, and a module two threads import at once can be handed half-initialised to one of them
    (``module 'transformers' has no attribute 'AutoTokenizer'``): sides scored at the same time call this first."""
    import importlib

    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(tokenizer_dir))
    for module in FIRST_USE_MODULES + (LM_EVAL_FIRST_USE_MODULES if lm_eval_available() else ()):
        importlib.import_module(module)


TASK_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: {max_tokens}
  do_sample: false
  temperature: 0.0
{scoring}"""
# exact: lm-eval's own exact_match after stripping; word: our rule (enginesmith.core.tasks), as process_results.
EXACT_SCORING = """metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: false
    ignore_punctuation: false
filter_list:
  - name: strip
    filter:
      - function: remove_whitespace
      - function: take_first
"""
WORD_SCORING = """process_results: !function enginesmith_scoring.process_results
metric_list:
  - metric: word_match
    aggregation: mean
    higher_is_better: true
"""
WORD_SCORING_MODULE = """from enginesmith.core.reports.measures import Perplexity, TaskScore
from enginesmith.core.tasks import AccuracyTask, answer_matches, task_spec


def process_results(doc, results):
    spec = task_spec({task!r})
    return {{"word_match": float(answer_matches(results[0], doc["answer"], spec, aliases=doc.get("aliases")))}}
"""


def shipped_task_scores(endpoint: Endpoint, task: str, tokenizer_dir: Path, *, api: Api) -> tuple[list[TaskScore], int]:
    """A shipped or local task's scores and the requests they took: with lm-eval installed, one lm-eval run whose
    answers our rule scores too (``enginesmith`` then ``lm-eval``); without it, our own client's exact match."""
    scores, answers = shipped_task_answers(endpoint, task, tokenizer_dir, api=api)
    return scores, len(next(iter(answers.values())))


def shipped_task_answers(endpoint: Endpoint, task: str, tokenizer_dir: Path, *, api: Api,
                         questions: Sequence[int] | None = None) -> tuple[list[TaskScore], dict[str, list[bool]]]:
    """``shipped_task_scores`` over the whole task or the questions at the indices ``questions``, with each
    question's correctness by each score's rule, in question order, keyed ``<task>/<source>`` as the accuracy
    gates are: what a task asked in blocks is judged from (``validation.sequential_accuracy``)."""
    if not lm_eval_available():
        score, _, correct = _task_exact_match(endpoint, task, None, api, questions=questions)
        return [score], {f"{task}/{score.source}": correct}
    harness, answers, harness_correct = lm_eval_task(endpoint, task, tokenizer_dir, with_answers=True,
                                                     questions=questions)
    spec = task_spec(task)
    correct = [answer_matches(text, doc["answer"], spec, aliases=doc.get("aliases")) for doc, text in answers]
    ours = TaskScore(task=task, metric="exact_match" if spec.match == "exact" else "word_match",
                     value=sum(correct) / len(answers), examples=len(answers), source="enginesmith")
    return [ours, harness], {f"{task}/{ours.source}": correct, f"{task}/{harness.source}": harness_correct}


def lm_eval_task(endpoint: Endpoint, task: str, tokenizer_dir: Path, limit: int | None = None, *,
                 with_answers: bool = False, questions: Sequence[int] | None = None) -> Any:
    """Run a shipped or local task file (generate_until) through lm-eval, offline: ``local-completions`` for
    completion tasks, ``local-chat-completions`` with the server's chat template for chat tasks, scored by the task's
    own rule. ``questions``: only the examples at those indices (written to a file of their own, which the task
    reads instead of the task's). With ``with_answers``: ``(score, [(doc, answer text), …], [correct by lm-eval's
    metric, …])``, the answers as lm-eval received them, in question order (lm-eval's concurrent requests return out
    of order; its doc ids do not)."""
    spec = task_spec(task)
    metric = "exact_match" if spec.match == "exact" else "word_match"
    with tempfile.TemporaryDirectory() as include_dir:
        name = "enginesmith_" + re.sub(r"[^a-z0-9_]", "_", Path(task).stem.lower())
        data = task_eval_path(task)
        if questions is not None:
            data = Path(include_dir, f"{name}-questions.jsonl")
            data.write_text("".join(row.model_dump_json() + "\n" for row in task_questions(task, questions)),
                            encoding="utf-8")
            limit = None
        scoring = EXACT_SCORING if spec.match == "exact" else WORD_SCORING
        Path(include_dir, f"{name}.yaml").write_text(
            TASK_YAML.format(name=name, data=data, max_tokens=spec.max_tokens, scoring=scoring))
        Path(include_dir, "enginesmith_scoring.py").write_text(WORD_SCORING_MODULE.format(task=task))
        value, count, samples = _run_lm_eval(endpoint, name, tokenizer_dir, chat=spec.api == "chat", metric=metric,
                                             include_dir=include_dir, limit=limit, log_samples=with_answers)
    score = TaskScore(task=task, metric=metric, value=value, examples=count or limit or 0, source="lm-eval")
    if not with_answers:
        return score
    ordered = sorted(samples, key=lambda sample: int(sample["doc_id"]))
    return (score, [(sample["doc"], str(sample["resps"][0][0])) for sample in ordered],
            [bool(sample[metric]) for sample in ordered])


def lm_eval_registry_task(endpoint: Endpoint, task: AccuracyTask, tokenizer_dir: Path, *, api: Api,
                          limit: int | None = None) -> TaskScore:
    """A task of lm-eval's registry with its own prompts, few-shot and generation settings (its dataset comes from
    the Hub). Generation tasks go through the workload's API; log-likelihood tasks through ``local-completions``,
    which needs a server that returns prompt logprobs."""
    chat = api == "chat" and not task.needs_prompt_logprobs
    value, count, _ = _run_lm_eval(endpoint, task.name, tokenizer_dir, chat=chat, metric=None, include_dir=None,
                                   limit=limit, concurrent=(MEMORY_BOUND_CONCURRENCY if task.needs_prompt_logprobs
                                                            else ACCURACY_CONCURRENCY))
    return TaskScore(task=task.name, metric=task.output_type, value=value, examples=count or limit or 0,
                     source="lm-eval")


def _run_lm_eval(endpoint: Endpoint, name: str, tokenizer_dir: Path, *, chat: bool, metric: str | None,
                 include_dir: str | None, limit: int | None, concurrent: int = ACCURACY_CONCURRENCY,
                 log_samples: bool = False) -> tuple[float, int, list[dict[str, Any]]]:
    """lm-eval's ``simple_evaluate`` against the server, ``concurrent`` requests in flight; the task's value for
    ``metric`` (None: its first metric, e.g. gsm8k's ``exact_match,strict-match``), how many examples it scored, and
    its logged samples (with ``log_samples``; else none)."""
    import os

    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    if include_dir is not None:
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # a shipped task reads its own file, never the Hub
    results = simple_evaluate(
        model="local-chat-completions" if chat else "local-completions",
        model_args={"model": endpoint.model,
                    "base_url": f"{endpoint.base_url}{API_PATHS['chat' if chat else 'completions']}",
                    "tokenizer": str(tokenizer_dir), "tokenized_requests": False,
                    "num_concurrent": concurrent, "max_retries": 2},
        # A shipped task's own directory alone: indexing lm-eval's thousands of task files takes seconds a call.
        tasks=[name], task_manager=(TaskManager(include_path=include_dir, include_defaults=False) if include_dir
                                    else TaskManager()),
        limit=limit, log_samples=log_samples, apply_chat_template=chat,
    )
    assert results is not None
    metrics = results["results"][name]
    value = next(v for k, v in metrics.items() if isinstance(v, int | float) and "stderr" not in k and k != "alias"
                 and (metric is None or k.startswith(metric)))
    count = results.get("n-samples", {}).get(name, {}).get("effective", 0)
    samples = list((results.get("samples") or {}).get(name, [])) if log_samples else []
    return float(value), int(count), samples
