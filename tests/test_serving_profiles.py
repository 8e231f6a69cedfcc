"""#33: serving profiles and the SLO a deployment picks one by. The SLO grammar and its bad inputs, goodput by vLLM's
definition over the recorded requests, the resolver's choice among artefacts × profiles, and the CLI: `resolve` and
`pull` with `--slo` on a registry of real manifests, `serve --print` with the chosen profile's flags, and an SLO no
profile meets (the table, exit 1, nothing written)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from enginesmith.core.errors import UserError
from enginesmith.core.reports import parse_report, serving_profiles_of
from enginesmith.core.reports.llm import ValidationReport
from enginesmith.core.reports.profiles import (
    DEFAULT_PROFILE,
    best_choice,
    judge_profile,
    linear_percentile,
    profile_from_levels,
)
from enginesmith.core.slo import Slo, SloTerm, parse_slo
from tests.conftest import run_cli
from tests.registry_helpers import manifest_for, write_artefact
from tests.report_factory import llm_report
from validation.metrics import RequestRecord, summarize

OUTPUT_TOKENS = 16


def _level(concurrency: int, round_index: int, *, ttft_ms: float, tpot_ms: float, requests: int = 24,
           seed: int = 0):  # -> BenchmarkResult
    """A level measured as the load generator summarises one: ``requests`` streamed requests whose TTFT and TPOT
    scatter ±10 % around the values given, ``concurrency`` of them at a time."""
    rng = random.Random(seed * 1000 + round_index * 10 + concurrency)
    records = []
    for _ in range(requests):
        ttft_s = ttft_ms / 1000 * rng.uniform(0.9, 1.1)
        tpot_s = tpot_ms / 1000 * rng.uniform(0.9, 1.1)
        records.append(RequestRecord(success=True, prompt_len=24, output_tokens=OUTPUT_TOKENS, ttft_s=ttft_s,
                                     itl_s=[tpot_s] * (OUTPUT_TOKENS - 1),
                                     latency_s=ttft_s + tpot_s * (OUTPUT_TOKENS - 1)))
    e2el_s = sum(r.latency_s for r in records) / requests
    duration_s = e2el_s * requests / concurrency
    return summarize(records, duration_s, concurrency=concurrency).model_copy(update={"round": round_index})


# On a CPU the trade-off looks like this: one sequence at a time decodes fastest but queues the others (TTFT grows
# with concurrency); a bigger batch starts every request at once and decodes each more slowly.
SWEEP = {  # max_num_seqs → concurrency → (TTFT ms, TPOT ms)
    1: {1: (40, 30), 4: (1600, 31)},
    4: {1: (40, 30), 4: (120, 45)},
    16: {1: (45, 31), 4: (130, 47)},
}


def _sweep_profiles():  # -> list[ServingProfile]
    profiles = []
    for seqs, levels in SWEEP.items():
        measured = [_level(c, r, ttft_ms=ttft, tpot_ms=tpot, seed=seqs) for r in range(2)
                    for c, (ttft, tpot) in levels.items()]
        profiles.append(profile_from_levels(f"max_num_seqs={seqs}", runtime="vllm-cpu", levels=measured,
                                            target="cpu", gpus=0, knobs={"max_num_seqs": seqs},
                                            args=["--max-num-seqs", str(seqs)]))
    return profiles


def test_an_slo_reads_each_metric_percentile_and_unit():
    slo = parse_slo("ttft_p95<=0.5s, tpot_p50<=40ms,e2el_p99<=2s")
    assert slo.terms == [SloTerm(metric="ttft", percentile=95, bound_ms=500), SloTerm(metric="tpot", percentile=50,
                                                                                      bound_ms=40),
                         SloTerm(metric="e2el", percentile=99, bound_ms=2000)]
    assert str(slo) == "ttft_p95<=500ms,tpot_p50<=40ms,e2el_p99<=2000ms"
    assert parse_slo(str(slo)) == slo


@pytest.mark.parametrize(("text", "named", "says"), [
    ("itl_p95<=40ms", "itl_p95<=40ms", "unknown metric 'itl'"),
    ("ttft_p97<=500ms", "ttft_p97<=500ms", "unknown percentile 'p97'"),
    ("ttft_mean<=500ms", "ttft_mean<=500ms", "unknown percentile 'mean'"),
    ("ttft_p95<=500us", "ttft_p95<=500us", "unknown unit 'us'"),
    ("ttft_p95<=500", "ttft_p95<=500", "has no unit"),
    ("ttft_p95<=0ms", "ttft_p95<=0ms", "must be positive"),
    ("ttft_p95<=-5ms", "ttft_p95<=-5ms", "must be positive"),
    ("ttft_p95>=500ms", "ttft_p95>=500ms", "'>=' is not a bound"),
    ("ttft_p95<=500ms,ttft_p99<=900ms", "ttft_p99<=900ms", "bounds TTFT twice"),
    ("ttft_p95<=500ms,,tpot_p95<=40ms", "", "empty term"),
    ("fast please", "fast please", "is not METRIC_pNN<=BOUND"),
])
def test_a_bad_slo_is_refused_naming_the_term(text, named, says):
    with pytest.raises(UserError) as caught:
        parse_slo(text)
    assert says in caught.value.message and named in caught.value.message
    assert caught.value.where == "--slo"


def test_goodput_counts_the_requests_within_every_bound_per_second():
    level = profile_from_levels("p", runtime="vllm-cpu", target="cpu", gpus=0,
                                levels=[_level(4, 0, ttft_ms=100, tpot_ms=40)]).levels[0]
    samples = level.samples
    assert samples is not None and len(samples.ttft_s) == 24
    everyone = parse_slo("ttft_p95<=1s")
    assert level.goodput(everyone) == pytest.approx(24 / samples.duration_s)
    # A bound inside the ±10 % scatter: the requests within it, and only those, count.
    bound_ms = 100.0
    within = sum(t * 1000 <= bound_ms for t in samples.ttft_s)
    assert 0 < within < 24
    assert level.goodput(parse_slo(f"ttft_p50<={bound_ms}ms")) == pytest.approx(within / samples.duration_s)
    # The level meets a percentile term by the percentile of its requests.
    p95 = 1000 * linear_percentile(samples.ttft_s, 95)
    assert not level.misses(parse_slo(f"ttft_p95<={p95 + 0.5}ms"))
    assert level.misses(parse_slo(f"ttft_p95<={p95 - 0.5}ms")) == [f"p95 TTFT {p95:.0f} ms > {p95 - 0.5:g} ms"]


def test_two_slos_choose_two_profiles_and_an_impossible_one_says_why_each_missed():
    profiles = _sweep_profiles()
    # Short first tokens at four requests in flight: batching; the most goodput among those that start quickly.
    quick_start = [judge_profile(p, parse_slo("ttft_p95<=500ms"), 4) for p in profiles]
    assert [c.meets for c in quick_start] == [False, True, True]
    assert "p95 TTFT" in quick_start[0].misses and "at c=4" in quick_start[0].misses
    assert best_choice(quick_start).profile == "max_num_seqs=4"  # type: ignore[union-attr]
    # Fast decoding at four in flight: only one sequence at a time keeps TPOT that low.
    smooth = [judge_profile(p, parse_slo("tpot_p95<=36ms"), 4) for p in profiles]
    assert best_choice(smooth).profile == "max_num_seqs=1"  # type: ignore[union-attr]
    # Without a concurrency, each profile's best level is taken: batching four at once beats any single stream.
    anywhere = best_choice([judge_profile(p, parse_slo("ttft_p95<=500ms")) for p in profiles])
    assert anywhere is not None and anywhere.concurrency == 4 and anywhere.profile != "max_num_seqs=1"
    impossible = [judge_profile(p, parse_slo("ttft_p95<=5ms,tpot_p95<=5ms")) for p in profiles]
    assert best_choice(impossible) is None
    assert all(c.misses.startswith("misses SLO: p95 TTFT") and "at c=1" in c.misses for c in impossible)
    unmeasured = judge_profile(profiles[0], parse_slo("ttft_p95<=5s"), 8)
    assert not unmeasured.meets and unmeasured.misses == "not measured at c=8 (measured at c=1, c=4)"


def test_a_report_without_a_sweep_is_one_profile_the_candidate_as_validated():
    report = parse_report(llm_report([1.0, 1.0]))
    [profile] = serving_profiles_of(report)
    assert profile.name == DEFAULT_PROFILE and profile.args == [] and profile.runtime == "vllm-cpu"
    assert [level.concurrency for level in profile.levels] == [1, 4] and profile.rounds == 2
    # An older report kept no per-request latencies and no p95: goodput cannot be computed, TTFT p50 can be read.
    assert profile.levels[0].samples is None and profile.levels[0].ttft_p95_ms is None
    assert profile.levels[0].percentile_ms("ttft", 50) == pytest.approx(19.0)
    assert judge_profile(profile, parse_slo("ttft_p50<=100ms")).meets
    assert "p95 TTFT not measured" in judge_profile(profile, parse_slo("ttft_p95<=100ms")).misses


def _publish_swept(tmp_path: Path) -> tuple[str, str]:
    """A registry holding one cpu artefact whose report carries the sweep's three profiles; (registry, key)."""
    from enginesmith.core.serving import vllm_cpu_recipe
    from enginesmith.core.specs import BuildProfile

    report = ValidationReport.model_validate(llm_report([1.0, 1.0]))
    report.profiles = _sweep_profiles()
    # Served as a cpu hf-quantized artefact is: vllm-cpu on its model directory, 16 sequences as built.
    recipe = vllm_cpu_recipe("{artefact_dir}/model", BuildProfile(max_batch_size=16))
    artefact = write_artefact(tmp_path / "build", model="swept", serve=[recipe])
    registry = str(tmp_path / "registry")
    validation = tmp_path / "report.json"
    validation.write_text(report.model_dump_json())
    published = run_cli("publish", str(artefact), "--registry", registry, "--validation", str(validation), "--json")
    assert published.returncode == 0, published.stderr
    return registry, manifest_for(artefact).key


def test_resolve_and_pull_choose_the_profile_an_slo_asks_for_and_serve_starts_it(tmp_path):
    registry, key = _publish_swept(tmp_path)
    common = ["--target", "cpu", "--registry", registry]

    def resolved(slo: str) -> dict:
        done = run_cli("resolve", "swept", "--slo", slo, "--concurrency", "4", "--json", *common)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)["chosen"]

    assert resolved("ttft_p95<=500ms")["profile"]["profile"] == "max_num_seqs=4"
    assert resolved("tpot_p95<=36ms")["profile"]["profile"] == "max_num_seqs=1"

    dest = tmp_path / "pulled"
    pulled = run_cli("pull", "swept", "--slo", "tpot_p95<=36ms", "--concurrency", "4", "--dest", str(dest),
                     "--cache-dir", str(tmp_path / "cache"), *common)
    assert pulled.returncode == 0, pulled.stderr
    assert "serving profile max_num_seqs=1" in pulled.stdout
    record = json.loads((dest / ".enginesmith-pull.json").read_text())
    assert record["key"] == key and record["profile"]["name"] == "max_num_seqs=1"
    assert record["profile"]["args"] == ["--max-num-seqs", "1"] and record["profile"]["concurrency"] == 4
    table = run_cli("resolve", "swept", "--slo", "ttft_p95<=500ms", "--concurrency", "4", *common)
    assert "max_num_seqs=4" in table.stdout and "goodput" in table.stdout


def test_the_served_command_carries_the_chosen_profiles_flags_once(tmp_path):
    from enginesmith.core.artefacts import with_flags

    argv = ["python", "-m", "vllm", "--model", "m", "--max-num-seqs", "16", "--enforce-eager", "--port", "1"]
    assert with_flags(argv, ["--max-num-seqs", "1"]) == [*argv[:6], "1", *argv[7:]]
    assert with_flags(argv, ["--max-num-batched-tokens", "512", "--enforce-eager"]) == [
        *argv, "--max-num-batched-tokens", "512"]
    registry, _ = _publish_swept(tmp_path)
    common = ["--target", "cpu", "--registry", registry, "--cache-dir", str(tmp_path / "cache")]
    for slo, seqs in (("tpot_p95<=36ms", "1"), ("ttft_p95<=500ms", "4")):
        dest = tmp_path / f"pulled-{seqs}"
        pulled = run_cli("pull", "swept", "--slo", slo, "--concurrency", "4", "--dest", str(dest), *common)
        assert pulled.returncode == 0, pulled.stderr
        printed = run_cli("serve", str(dest), "--print", "--port", "8123")
        assert printed.returncode == 0, printed.stderr
        words = printed.stdout.split()
        assert words.count("--max-num-seqs") == 1 and words[words.index("--max-num-seqs") + 1] == seqs
    plain = run_cli("pull", "swept", "--dest", str(tmp_path / "plain"), *common)
    assert plain.returncode == 0, plain.stderr
    words = run_cli("serve", str(tmp_path / "plain"), "--print").stdout.split()
    assert words[words.index("--max-num-seqs") + 1] == "16"  # no SLO: served as built


def test_an_slo_no_profile_meets_prints_why_each_missed_exits_1_and_writes_nothing(tmp_path):
    registry, _ = _publish_swept(tmp_path)
    dest = tmp_path / "pulled"
    refused = run_cli("pull", "swept", "--slo", "ttft_p95<=5ms", "--target", "cpu", "--registry", registry,
                      "--dest", str(dest), "--cache-dir", str(tmp_path / "cache"))
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "misses-slo" in refused.stdout and "p95 TTFT" in refused.stdout and "at c=1" in refused.stdout
    assert "within the SLO ttft_p95<=5ms" in " ".join(refused.stderr.split())
    assert not dest.exists() and not (tmp_path / "cache").exists()
    resolved = run_cli("resolve", "swept", "--slo", "ttft_p95<=5ms", "--target", "cpu", "--registry", registry)
    assert resolved.returncode == 1 and "no profile meets the SLO here" in resolved.stdout
    bad = run_cli("resolve", "swept", "--slo", "ttft_p95<=5parsecs", "--target", "cpu", "--registry", registry)
    assert bad.returncode == 2 and "unknown unit 'parsecs'" in bad.stderr
    lonely = run_cli("resolve", "swept", "--concurrency", "4", "--target", "cpu", "--registry", registry)
    assert lonely.returncode == 2 and "--concurrency" in lonely.stderr


def test_a_generous_e2el_bound_is_met_by_every_profile_at_some_level():
    slo = Slo(terms=[SloTerm(metric="e2el", percentile=90, bound_ms=10_000)])
    assert all(judge_profile(p, slo).meets for p in _sweep_profiles())


def test_the_catalogue_shows_each_profile_and_draws_the_frontier_which_the_browser_loads(tmp_path):
    from tests.conftest import chromium_page, needs_chromium

    registry, key = _publish_swept(tmp_path)
    out = tmp_path / "site"
    written = run_cli("catalogue", "--out", str(out), "--registry", registry)
    assert written.returncode == 0, written.stderr
    page_path = out / "models" / "swept" / f"{key}.html"
    frontier = out / "models" / "swept" / key / "frontier.png"
    assert frontier.stat().st_size > 10_000
    text = page_path.read_text()
    assert "Serving profiles measured on cpu" in text and all(f"max_num_seqs={n}" in text for n in (1, 4, 16))
    needs_chromium()
    with chromium_page(lambda url: url.startswith("file://")) as (page, blocked):
        page.goto(page_path.as_uri())
        image = page.locator('img[src$="frontier.png"]')
        image.scroll_into_view_if_needed()
        assert image.evaluate("img => img.complete && img.naturalWidth") > 500  # loaded and decoded
        rows = page.locator("table", has_text="Serving profiles measured on").locator("tbody tr")
        assert rows.count() == 6  # three profiles × two concurrencies
    assert blocked == []
