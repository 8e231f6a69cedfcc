"""Each cell's history across nightlies: outcome and channel-move records, regressions, the join with manifests,
the ``history`` and ``promote`` commands, and the plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from enginesmith.core.plan import cell_id
from registry.bundle import BundleStore, write_bundle
from registry.catalog import list_model, load_manifest
from registry.errors import ReadOnlyStoreError
from registry.gc import collect_garbage
from registry.history import (
    CellOutcome,
    ChannelMove,
    GateVerdict,
    MetricSpread,
    describe_regression,
    find_regressions,
    load_history,
    outcome_entry,
    outcome_from_manifest,
    outcome_from_report,
    previous_outcome,
    record_channel_move,
    record_outcome,
)
from registry.history_plots import write_history_plots
from registry.local import LocalStore
from registry.names import history_path, safe_file_name
from registry.publish import publish_artefact
from registry.refs import promote
from tests import report_factory
from tests.conftest import run_cli
from tests.registry_helpers import cli_json, race, read_artefact, registry_env, tiny_files, write_artefact

MODEL = "tiny-llama"
CELL = cell_id(MODEL, "fp8", "cpu", 1, 1, "hf-quantized")


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "registry")


def llm_report(throughput: list[float], tpot: list[float] | None = None, *, accuracy: float | None = 0.5,
               passed: bool = True, artefact_key: str | None = None, key: str | None = None) -> dict:
    """A validation report as validation writes it, with these per-round ratios and this addition score."""
    return report_factory.llm_report(throughput, tpot, accuracy=accuracy, passed=passed, artefact_key=artefact_key,
                                     key=key)


def outcome(recorded: str, throughput: list[float] | None = None, *, key: str = "", flow_run: str = "",
            status: str = "built", tpot: list[float] | None = None, accuracy: float | None = 0.5,
            passed: bool = True) -> CellOutcome:
    report = None if throughput is None else llm_report(throughput, tpot, accuracy=accuracy, passed=passed)
    result = outcome_from_report(model=MODEL, cell=CELL, recipe="fp8", target="cpu", kind="hf-quantized", key=key,
                                 status=status, report=report, flow_run=flow_run)  # type: ignore[arg-type]
    return result.model_copy(update={"recorded": recorded})


# --- records -----------------------------------------------------------------------------------------


def test_an_outcome_is_recorded_once_per_flow_run(store: LocalStore) -> None:
    first = outcome("2026-11-01T02:00:00+00:00", [1.0, 1.1], flow_run="run-1")
    assert record_outcome(store, first)
    body = store.read_history(MODEL, outcome_entry(first))
    retried = first.model_copy(update={"reason": "retried", "recorded": "2026-11-01T03:00:00+00:00"})
    assert outcome_entry(retried) == outcome_entry(first)
    assert not record_outcome(store, retried)
    assert store.read_history(MODEL, outcome_entry(first)) == body
    other_run = first.model_copy(update={"flow_run": "run-2"})
    assert record_outcome(store, other_run)
    assert len(store.list_history(MODEL)) == 2


def test_concurrent_creates_of_one_entry_leave_exactly_one(store: LocalStore) -> None:
    results = race(8, lambda index: store.create_history(MODEL, "entry-1", json.dumps({"writer": index}).encode()))
    assert sorted(results) == [False] * 7 + [True]
    body = store.read_history(MODEL, "entry-1")
    assert body is not None and json.loads(body)["writer"] in range(8)
    assert store.list_history(MODEL) == ["entry-1"]
    assert not list((store.root / "tmp").iterdir())


def test_history_is_not_an_artefact_or_a_channel(store: LocalStore) -> None:
    record_outcome(store, outcome("2026-11-01T02:00:00+00:00", [1.0], flow_run="run-1"))
    record_channel_move(store, ChannelMove(model=MODEL, channel="stable", key="k" * 64, previous=None, actor="a"))
    assert store.list_models() == []
    assert store.list_channels(MODEL) == []
    assert list_model(store, MODEL).manifests == []


def test_a_damaged_record_is_listed_not_raised(store: LocalStore) -> None:
    record_outcome(store, outcome("2026-11-01T02:00:00+00:00", [1.0, 1.1], flow_run="run-1"))
    damaged = store.root / history_path(MODEL, "broken")
    damaged.write_text("{ not json")
    wrong_model = store.root / history_path(MODEL, "elsewhere")
    wrong_model.write_text(outcome("2026-11-02T02:00:00+00:00").model_copy(update={"model": "other"})
                           .model_dump_json())

    history = load_history(store, MODEL)

    assert [len(cell.builds) for cell in history.cells] == [1]
    problems = {record.entry: record.problem for record in history.unreadable}
    assert set(problems) == {"broken", "elsewhere"}
    assert "not valid JSON" in problems["broken"] and "other" in problems["elsewhere"]
    assert previous_outcome(store, MODEL, CELL) is not None


def test_a_bundle_records_nothing(store: LocalStore, tmp_path: Path) -> None:
    published = publish_artefact(store, write_artefact(tmp_path / "a"))
    out = tmp_path / "one.bundle"
    write_bundle(store, [load_manifest(store, MODEL, published.key)], out)
    bundle = BundleStore(out)
    with pytest.raises(ReadOnlyStoreError):
        record_outcome(bundle, outcome("2026-11-01T02:00:00+00:00", [1.0], flow_run="run-1"))
    assert bundle.list_history(MODEL) == [] and bundle.read_history(MODEL, "x") is None
    assert [len(cell.builds) for cell in load_history(bundle, MODEL).cells] == [1]  # the manifest, as a build


def test_gc_leaves_the_history(store: LocalStore, tmp_path: Path) -> None:
    keys = [publish_artefact(store, write_artefact(tmp_path / str(seed), files=tiny_files(seed=seed))).key
            for seed in range(3)]
    for night, key in enumerate(keys):
        record_outcome(store, outcome(f"2026-11-0{night + 1}T02:00:00+00:00", [1.0], key=key, flow_run=f"run-{night}"))
    record_outcome(store, outcome("2026-11-04T02:00:00+00:00", status="failed", flow_run="run-3"))
    record_channel_move(store, ChannelMove(model=MODEL, channel="stable", key=keys[0], previous=None, actor="a"))
    entries = store.list_history(MODEL)
    assert len(entries) == 5

    result = collect_garbage(store, keep_last=1, grace_s=0)

    assert len(result.deleted_manifests) == 2
    assert store.list_history(MODEL) == entries
    history = load_history(store, MODEL)
    assert [(b.outcome.status, b.published) for b in history.cells[0].builds] == [
        ("built", False), ("built", False), ("built", True), ("failed", False)]


# --- regressions -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("after", "flagged"), [
    ([1.01, 1.01], False),  # 0.09 lower; the spreads add up to 0.1
    ([0.99, 0.99], True),   # 0.11 lower
    ([0.9, 1.1], False),    # 0.1 lower, but its own spread is 0.1: together 0.2
    ([1.5, 1.5], False),    # better
])
def test_a_throughput_drop_counts_only_beyond_the_spreads(after: list[float], flagged: bool) -> None:
    before = outcome("2026-11-01T02:00:00+00:00", [1.0, 1.2], key="a" * 64)  # median 1.1, half range 0.1
    found = find_regressions(before, outcome("2026-11-02T02:00:00+00:00", after), "previous", "a" * 64)
    assert [r.metric for r in found] == (["throughput_ratio"] if flagged else [])
    if flagged:
        assert found[0].before == pytest.approx(1.1) and found[0].after == pytest.approx(0.99)
        assert found[0].change == pytest.approx(0.99 / 1.1 - 1)
        assert found[0].against == "previous" and found[0].against_key == "a" * 64


def test_a_tpot_rise_is_the_regression_and_accuracy_drops_beyond_a_point() -> None:
    before = outcome("2026-11-01T02:00:00+00:00", [1.0], tpot=[1.0, 1.1], accuracy=0.50)
    slower = outcome("2026-11-02T02:00:00+00:00", [1.0], tpot=[1.3, 1.3], accuracy=0.485)
    faster = outcome("2026-11-02T02:00:00+00:00", [1.0], tpot=[0.7, 0.7], accuracy=0.495)
    assert [r.metric for r in find_regressions(before, slower, "previous", "")] == ["tpot_ratio", "accuracy:addition"]
    assert find_regressions(before, faster, "previous", "") == []


def test_a_frontier_that_moved_the_worse_way_beyond_its_spread_is_flagged_per_profile_and_level(tmp_path: Path) -> None:
    """#33: history follows each serving profile's throughput and p95 TPOT per concurrency, with the rule the ratios
    have: a move inside the two nights' spreads is no difference."""
    from enginesmith.core.reports.llm import ValidationReport
    from tests.test_serving_profiles import _sweep_profiles

    def night(recorded: str, slow_down: float):  # type: ignore[no-untyped-def]
        report = ValidationReport.model_validate(llm_report([1.0, 1.0]))
        profiles = _sweep_profiles()
        batched = profiles[1].levels[1]  # max_num_seqs=4 at c=4
        batched.output_throughput = batched.output_throughput.model_copy(
            update={"values": [v / slow_down for v in batched.output_throughput.values]})
        report.profiles = profiles
        return outcome_from_report(model=MODEL, cell=CELL, recipe="fp8", target="cpu", kind="hf-quantized",
                                   key="", status="built", report=report.model_dump(mode="json"),
                                   flow_run=recorded).model_copy(update={"recorded": recorded})

    before = night("2026-11-01T02:00:00+00:00", 1.0)
    assert set(before.frontier) >= {"max_num_seqs=4@c=4 tok/s", "max_num_seqs=1@c=1 p95 TPOT ms"}
    same = find_regressions(before, night("2026-11-02T02:00:00+00:00", 1.0), "previous", "")
    assert same == []
    slowed = night("2026-11-02T02:00:00+00:00", 1.5)
    slower = find_regressions(before, slowed, "previous", "")
    assert [r.metric for r in slower] == ["frontier max_num_seqs=4@c=4 tok/s"]
    assert describe_regression(slower[0]) == "frontier max_num_seqs=4@c=4 tok/s −33% vs previous"
    # The catalogue's cell page plots the frontier over the builds, beside the other metrics.
    store = LocalStore(tmp_path / "registry")
    for recorded in (before, slowed):
        record_outcome(store, recorded)
    [cell] = load_history(store, MODEL).cells
    assert [r.metric for r in cell.builds[1].regressions] == ["frontier max_num_seqs=4@c=4 tok/s"]
    paths = write_history_plots(cell, tmp_path / "plots")
    assert tmp_path / "plots" / "frontier-history.png" in paths


def test_metric_spread_is_median_and_half_range() -> None:
    spread = MetricSpread(values=[1.0, 3.0, 2.0])
    assert (spread.median, spread.half_range) == (2.0, 1.0)


# --- reports and manifests ---------------------------------------------------------------------------


def test_an_encoder_report_gives_throughput_cosine_and_recall(tmp_path: Path) -> None:
    report = report_factory.encoder_report("a" * 64, "k" * 64, throughput_ratios=[1.8, 2.0, 1.9], min_cosine=0.991,
                                           recall=0.95, k=10)
    artefact = read_artefact(write_artefact(tmp_path, kind="onnx", recipe="int8",
                                            versions={"onnxruntime": "1.22.0"}))
    result = outcome_from_report(model=MODEL, cell="c", recipe="int8", target="cpu", kind="onnx", key="k" * 64,
                                 status="built", report=report, artefact=artefact, flow_run="run-1")
    assert result.metrics["throughput_ratio"].median == pytest.approx(1.9)
    assert result.accuracy == {"min_cosine": 0.991, "recall@10": 0.95}
    assert result.passed is True and [g.name for g in result.gates] == ["min_cosine_to_reference"]
    assert (result.commit_sha, result.calibration_sha256, result.versions) == ("a" * 40, "d" * 64,
                                                                             {"onnxruntime": "1.22.0"})


def test_an_llm_report_without_tpot_gives_what_it_has() -> None:
    result = outcome("2026-11-01T02:00:00+00:00", [0.9, 1.1], passed=False)
    assert set(result.metrics) == {"throughput_ratio"}
    assert result.accuracy == {"addition": 0.5} and result.passed is False
    assert outcome("2026-11-01T02:00:00+00:00").metrics == {}


def test_manifests_become_builds_of_their_cells(tmp_path: Path, store: LocalStore) -> None:
    llm = publish_artefact(store, write_artefact(tmp_path / "llm"))
    # each kind's report names its cell (an encoder cell has no parallelism in its id)
    encoder_dir = write_artefact(tmp_path / "enc", kind="onnx", recipe="int8", files=tiny_files(seed=5))
    encoder = publish_artefact(store, encoder_dir, validation=report_factory.encoder_report(
        read_artefact(encoder_dir).key, "e" * 64, cell=f"{MODEL}/int8/cpu/onnx"))
    cells = {outcome_from_manifest(load_manifest(store, MODEL, key)).cell for key in (llm.key, encoder.key)}
    assert cells == {CELL, f"{MODEL}/int8/cpu/onnx"}


# --- load_history ------------------------------------------------------------------------------------


def publish_validated(store: LocalStore, tmp_path: Path, seed: int, throughput: list[float]) -> str:
    """Publish an artefact under a validation key, as the build-cell flow does; returns that key."""
    source = write_artefact(tmp_path / f"build-{seed}", files=tiny_files(seed=seed))
    artefact = read_artefact(source)
    key = f"{seed:02d}" + "v" * 62
    publish_artefact(store, source, key=key,
                     validation=llm_report(throughput, artefact_key=artefact.key, key=key))
    return key


def test_load_history_joins_outcomes_manifests_and_channels(store: LocalStore, tmp_path: Path) -> None:
    recorded_key = publish_validated(store, tmp_path, 1, [1.0, 1.02])
    record_outcome(store, outcome("2026-11-01T02:00:00+00:00", [1.0, 1.02], key=recorded_key, flow_run="run-1"))
    record_outcome(store, outcome("2026-11-02T02:00:00+00:00", [0.6, 0.62], key="f" * 64, status="gate-failed",
                                  passed=False, flow_run="run-2"))
    record_outcome(store, outcome("2026-11-03T02:00:00+00:00", status="no-worker", flow_run="run-3"))
    by_hand = publish_validated(store, tmp_path, 2, [0.99, 1.01])  # published now: the newest build
    promote(store, load_manifest(store, MODEL, recorded_key), "stable")

    history = load_history(store, MODEL)

    assert [cell.cell for cell in history.cells] == [CELL]
    builds = history.cells[0].builds
    assert [(b.outcome.key[:2], b.outcome.status, b.published) for b in builds] == [
        ("01", "built", True), ("ff", "gate-failed", False), ("", "no-worker", False), ("02", "built", True)]
    assert builds[0].channels == ["stable"] and builds[3].channels == ["latest"]
    assert history.channels == {"latest": by_hand, "stable": recorded_key}
    failed = builds[1].regressions
    # stable is on the previous build: flagged once, against the previous build.
    assert {(r.metric, r.against) for r in failed} == {("throughput_ratio", "previous")}
    # The manifest published by hand: better than the failed build, and within the spreads of stable's.
    assert builds[3].regressions == []
    assert builds[2].regressions == []
    assert load_history(store, MODEL, recipe="other").cells == []
    newest = previous_outcome(store, MODEL, CELL)
    assert newest is not None and newest.flow_run == "run-2"
    assert previous_outcome(store, MODEL, CELL, excluding_flow_run="run-2").flow_run == "run-1"  # type: ignore[union-attr]


def test_a_regression_against_a_channel_alone(store: LocalStore) -> None:
    record_outcome(store, outcome("2026-11-01T02:00:00+00:00", [1.0, 1.0], key="a" * 64, flow_run="run-1"))
    record_outcome(store, outcome("2026-11-02T02:00:00+00:00", [0.8, 0.8], key="b" * 64, flow_run="run-2"))
    record_outcome(store, outcome("2026-11-03T02:00:00+00:00", [0.8, 0.8], key="c" * 64, flow_run="run-3"))
    store.write_ref(MODEL, "prod", "a" * 64, expected=None)

    builds = load_history(store, MODEL).cells[0].builds

    assert [[(r.against, r.against_key[:1]) for r in b.regressions] for b in builds] == [
        [], [("previous", "a")], [("channel:prod", "a")]]
    assert builds[0].channels == ["prod"]


# --- commands ----------------------------------------------------------------------------------------


def test_history_command_prints_a_table_and_json(store: LocalStore, tmp_path: Path) -> None:
    key = publish_validated(store, tmp_path, 1, [1.0, 1.02])
    record_outcome(store, outcome("2026-11-01T02:00:00+00:00", [1.0, 1.02], key=key, flow_run="run-1"))
    record_outcome(store, outcome("2026-11-02T02:00:00+00:00", [0.6, 0.62], key="f" * 64, status="gate-failed",
                                  passed=False, flow_run="run-2"))
    (store.root / history_path(MODEL, "broken")).write_text("[]")
    env = registry_env(str(store.root), tmp_path / "cache")

    table = run_cli("history", MODEL, env=env)
    assert table.returncode == 0, table.stderr
    assert CELL in table.stdout and "gate-failed" in table.stdout and key[:12] in table.stdout
    assert "throughput_ratio −40% vs previous" in table.stdout
    assert "vs channel:latest" not in table.stdout  # latest is on the previous build: flagged once
    assert "broken" in table.stderr

    listed = cli_json("history", MODEL, "--target", "cpu", env=env)
    assert [b["outcome"]["status"] for b in listed["cells"][0]["builds"]] == ["built", "gate-failed"]
    assert listed["cells"][0]["builds"][0]["published"] is True
    recorded = listed["cells"][0]["builds"][0]["outcome"]  # its lineage filled in from the published manifest
    assert recorded["commit_sha"] == "a" * 40 and recorded["versions"]["modelopt"] == "0.37.0"
    assert [u["entry"] for u in listed["unreadable"]] == ["broken"]

    plots = tmp_path / "plots"
    assert run_cli("history", MODEL, "--plots", str(plots), env=env).returncode == 0
    assert sorted(p.name for p in (plots / safe_file_name(CELL)).iterdir()) == [
        f"{safe_file_name('accuracy:addition')}.png", "throughput_ratio.png"]


def test_promote_records_who_moved_the_channel(store: LocalStore, tmp_path: Path) -> None:
    first = publish_artefact(store, write_artefact(tmp_path / "a")).key
    second = publish_artefact(store, write_artefact(tmp_path / "b", files=tiny_files(seed=1))).key
    env = registry_env(str(store.root), tmp_path / "cache", {"ENGINESMITH_ACTOR": "alice"})

    moved = cli_json("promote", f"{MODEL}@{first}", "--channel", "stable", env=env)
    assert (moved["moved"], moved["key"], moved["previous"]) == (True, first, None)
    assert cli_json("promote", f"{MODEL}@{second}", "stable", env={**env, "ENGINESMITH_ACTOR": "bob"})["moved"]
    assert not cli_json("promote", f"{MODEL}@{second}", "--channel", "stable", env=env)["moved"]

    moves = load_history(store, MODEL).channel_moves
    assert [(m.channel, m.key, m.previous, m.actor) for m in moves] == [
        ("stable", first, None, "alice"), ("stable", second, first, "bob")]

    for args in (["--channel", "stable", "stable"], []):
        refused = run_cli("promote", f"{MODEL}@{first}", *args, env=env)
        assert refused.returncode == 2 and "--channel" in refused.stderr


def test_plots_are_pngs_named_after_their_metrics(store: LocalStore, tmp_path: Path) -> None:
    record_outcome(store, outcome("2026-11-01T02:00:00+00:00", [1.0, 1.1], tpot=[1.0, 1.0], flow_run="run-1"))
    record_outcome(store, outcome("2026-11-02T02:00:00+00:00", [0.5, 0.5], tpot=[1.0, 1.0], passed=False,
                                  flow_run="run-2"))
    record_outcome(store, outcome("2026-11-03T02:00:00+00:00", status="failed", flow_run="run-3"))

    paths = write_history_plots(load_history(store, MODEL).cells[0], tmp_path / "plots")

    assert sorted(p.name for p in paths) == [f"{safe_file_name('accuracy:addition')}.png", "throughput_ratio.png",
                                             "tpot_ratio.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)


# --- records that validate badly ---------------------------------------------------------------------


@pytest.mark.parametrize("values", [[], [float("nan")], [1.0, float("inf")]], ids=["empty", "nan", "inf"])
def test_a_metric_with_no_or_non_finite_values_is_an_unreadable_record(store: LocalStore, tmp_path: Path,
                                                                       values: list[float]) -> None:
    record_outcome(store, outcome("2026-11-01T02:00:00+00:00", [1.0, 1.1], flow_run="run-1"))
    raw = outcome("2026-11-02T02:00:00+00:00", [0.5, 0.5], flow_run="run-2").model_dump(mode="json")
    raw["metrics"]["throughput_ratio"] = {"values": values}
    (store.root / history_path(MODEL, "bad-metric")).write_text(json.dumps(raw))  # NaN, Infinity as Python writes

    history = load_history(store, MODEL)

    assert [len(cell.builds) for cell in history.cells] == [1]
    assert [record.entry for record in history.unreadable] == ["bad-metric"]
    assert "throughput_ratio" in history.unreadable[0].problem
    shown = run_cli("history", MODEL, env=registry_env(str(store.root), tmp_path / "cache"))
    assert shown.returncode == 0, shown.stderr
    assert "bad-metric" in shown.stderr


def test_a_report_with_non_finite_rounds_leaves_the_metric_out() -> None:
    non_finite = llm_report([1.0, 1.0], accuracy=0.5)
    non_finite["comparison"]["throughput_ratios"]["values"][1] = float("nan")
    non_finite["comparison"]["candidate"]["accuracy"][0]["value"] = float("inf")
    result = outcome_from_report(model=MODEL, cell=CELL, recipe="fp8", target="cpu", kind="hf-quantized", key="",
                                 status="built", report=non_finite)
    assert result.metrics == {} and result.accuracy == {}


def test_history_prints_data_that_looks_like_markup_as_text(store: LocalStore, tmp_path: Path) -> None:
    failed = outcome("2026-11-01T02:00:00+00:00", status="failed", flow_run="run-1").model_copy(
        update={"reason": "KeyError('[/weights]')"})
    record_outcome(store, failed)
    odd = outcome("2026-11-02T02:00:00+00:00", [1.0, 1.1], flow_run="run-2").model_copy(update={
        "cell": f"{MODEL}/[bold]fp8[/]", "accuracy": {"[/task]": 0.5}, "versions": {"[red]torch": "2.[/]"},
        "gates": [GateVerdict(name="[/gate]", measured=0.5, limit=0.9, passed=False)], "passed": False})
    record_outcome(store, odd)
    record_channel_move(store, ChannelMove(model=MODEL, channel="stable", key="a" * 64, previous=None,
                                           actor="[/ops]@host", recorded="2026-11-03T02:00:00+00:00"))
    raw = json.loads(failed.model_dump_json()) | {"record": "[/odd]"}
    (store.root / history_path(MODEL, "odd-type")).write_text(json.dumps(raw))

    shown = run_cli("history", MODEL, env=registry_env(str(store.root), tmp_path / "cache"))

    assert shown.returncode == 0, shown.stderr
    for text in ("KeyError('[/weights]')", f"{MODEL}/[bold]fp8[/]", "[/task] 0.500", "[/gate]", "[/ops]@host"):
        assert text in shown.stdout, text
    assert "'[/odd]'" in shown.stderr


# --- the regression rule, edges ----------------------------------------------------------------------


@pytest.mark.parametrize(("before", "after", "flagged"), [
    ([1.0], [0.99], False),        # one round each: no spread to judge by; 1 % is inside the 10 % tolerance
    ([1.0], [0.89], True),         # 11 % lower
    ([1.0, 1.0], [0.95], False),   # one side has a single round: the tolerance, not the (zero) spread
    ([1.0, 1.0], [0.95, 0.95], True),  # two rounds each, no spread: 5 % lower is beyond it
])
def test_a_metric_measured_in_one_round_is_judged_by_a_relative_tolerance(before: list[float], after: list[float],
                                                                          flagged: bool) -> None:
    found = find_regressions(outcome("2026-11-01T02:00:00+00:00", before),
                             outcome("2026-11-02T02:00:00+00:00", after), "previous", "")
    assert [r.metric for r in found] == (["throughput_ratio"] if flagged else [])


@pytest.mark.parametrize(("after", "flagged"), [(0.990, True), (0.996, False)])
def test_a_cosine_drop_under_one_point_is_still_flagged(after: float, flagged: bool) -> None:
    before = outcome("2026-11-01T02:00:00+00:00").model_copy(update={"accuracy": {"min_cosine": 0.999}})
    later = outcome("2026-11-02T02:00:00+00:00").model_copy(update={"accuracy": {"min_cosine": after}})
    found = find_regressions(before, later, "previous", "")
    assert [r.metric for r in found] == (["accuracy:min_cosine"] if flagged else [])


def test_a_channel_on_the_previous_build_is_not_flagged_twice(store: LocalStore) -> None:
    record_outcome(store, outcome("2026-11-01T02:00:00+00:00", [1.0, 1.0], key="a" * 64, flow_run="run-1"))
    record_outcome(store, outcome("2026-11-02T02:00:00+00:00", [0.8, 0.8], key="b" * 64, flow_run="run-2"))
    store.write_ref(MODEL, "prod", "a" * 64, expected=None)

    builds = load_history(store, MODEL).cells[0].builds

    assert [[(r.against, r.against_key[:1]) for r in b.regressions] for b in builds] == [[], [("previous", "a")]]


# --- plots and file names ----------------------------------------------------------------------------


def test_a_build_recorded_at_no_valid_time_is_left_out_of_the_plots(store: LocalStore, tmp_path: Path) -> None:
    record_outcome(store, outcome("2026-11-01T02:00:00+00:00", [1.0, 1.1], flow_run="run-1"))
    record_outcome(store, outcome("last tuesday", [0.9, 1.0], flow_run="run-2"))

    paths = write_history_plots(load_history(store, MODEL).cells[0], tmp_path / "plots")

    assert paths and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)
    shown = run_cli("history", MODEL, "--plots", str(tmp_path / "cli-plots"),
                    env=registry_env(str(store.root), tmp_path / "cache"))
    assert shown.returncode == 0, shown.stderr


def test_plot_files_of_ids_that_differ_only_in_unsafe_characters_do_not_collide(store: LocalStore,
                                                                                 tmp_path: Path) -> None:
    assert len({safe_file_name(name) for name in ("a/b", "a_b", "a-b", "x/y", "x__y", "x_y")}) == 6
    scores = outcome("2026-11-01T02:00:00+00:00", [1.0, 1.1], flow_run="run-1").model_copy(
        update={"accuracy": {"a/b": 0.5, "a_b": 0.6}})
    record_outcome(store, scores)
    for cell in ("x/y", "x__y"):
        record_outcome(store, scores.model_copy(update={"cell": cell, "flow_run": f"run-{cell}"}))
    history = load_history(store, MODEL)

    paths = write_history_plots(next(c for c in history.cells if c.cell == CELL), tmp_path / "plots")
    assert len(paths) == len(set(paths)) == 3 and all(p.exists() for p in paths)

    out = tmp_path / "cli-plots"
    shown = run_cli("history", MODEL, "--plots", str(out), env=registry_env(str(store.root), tmp_path / "cache"))
    assert shown.returncode == 0, shown.stderr
    assert len([d for d in out.iterdir() if d.is_dir()]) == 3


# --- the shared formatters ---------------------------------------------------------------------------


def test_one_wording_for_a_regression_its_change_and_its_time() -> None:
    from registry.history import Regression, describe_regression, signed_percent
    from registry.manifest import display_timestamp

    slower = Regression(metric="throughput_ratio", against="previous", against_key="a" * 64, before=1.0, after=0.69)
    assert describe_regression(slower) == "throughput_ratio −31% vs previous"
    assert describe_regression(slower.model_copy(update={"against": "channel:stable"})) == (
        "throughput_ratio −31% vs channel:stable")
    assert [signed_percent(x) for x in (-0.31, 0.054, 0.0, -0.004)] == ["−31%", "+5%", "±0%", "±0%"]
    assert display_timestamp("2026-11-03T10:00:00.123456+01:00") == "2026-11-03 09:00:00"
    assert display_timestamp("2026-11-03T09:00:00Z") == "2026-11-03 09:00:00"
    assert display_timestamp("last tuesday") == "last tuesday" and display_timestamp("") == "—"
