"""Config files: the catalogue, the matrix schema, and the errors a user sees for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from enginesmith.core.config import default_catalogue, load_pipeline_config
from enginesmith.core.errors import ConfigError
from tests.conftest import CONFIGS, run_cli

MINIMAL = """\
version: 1
name: test
models:
  - id: m
    repo: org/model
    revision: main
    params_b: 1.0
matrix:
  - models: [m]
    recipes: [bf16, fp8]
    targets: [h100-sxm]
    tp: [1]
calibration:
  dataset: {calib}
"""


@pytest.fixture
def minimal(tmp_path):
    calib = tmp_path / "calib.txt"
    calib.write_text("1+1=2\n2+2=4\n")
    return MINIMAL.replace("{calib}", str(calib))


def test_catalogue_has_every_required_sku():
    catalogue = default_catalogue()
    required = {"h100-sxm", "h100-pcie", "h100-nvl", "h200", "h200-nvl", "gh200", "a100-40gb", "a100-80gb",
                "a100-pcie-80gb", "l40s", "l4", "b200", "cpu"}
    assert required <= set(catalogue.targets)
    assert {"bf16", "fp8", "fp8-kv", "int4-awq", "w4a8-awq", "nvfp4", "int8-sq"} <= set(catalogue.recipes)
    assert catalogue.targets["cpu"].is_cpu
    assert catalogue.targets["h200"].sm == 90 and catalogue.targets["b200"].sm == 100


def test_shipped_configs_validate():
    for path in [CONFIGS / "nightly.yaml", *sorted((CONFIGS / "examples").glob("*.yaml"))]:
        config = load_pipeline_config(path)
        assert (config.models and config.matrix) or (config.encoders and config.encoder_matrix), path


def test_yaml_syntax_error_names_file_and_line(write_config, minimal):
    broken = minimal.replace("    recipes: [bf16, fp8]", "    recipes: [bf16, fp8\n")
    path = write_config(broken)
    with pytest.raises(ConfigError) as caught:
        load_pipeline_config(path)
    assert caught.value.path == str(path)
    assert caught.value.line is not None and 10 <= caught.value.line <= 13
    assert "YAML syntax error" in str(caught.value)


def test_unknown_target_lists_known_targets_and_line(write_config, minimal):
    path = write_config(minimal.replace("targets: [h100-sxm]", "targets: [h100-sxm, h900]"))
    with pytest.raises(ConfigError) as caught:
        load_pipeline_config(path)
    error = caught.value
    assert error.field == "matrix[0].targets[1]"
    assert error.line == 11
    assert "unknown target 'h900'" in error.message
    assert "h100-sxm" in (error.hint or "") and "b200" in (error.hint or "")


def test_an_accuracy_task_that_does_not_exist_is_refused_when_the_config_loads(write_config, minimal):
    """#15 finding 1: configs/nightly.yaml named gsm8k-mini, which never existed; the config loaded, and every
    cell would have failed in validation after its quantise and build."""
    path = write_config(minimal + "workload:\n  name: w\n  accuracy_tasks: [facts, gsm8k-mini]\n")
    with pytest.raises(ConfigError) as caught:
        load_pipeline_config(path)
    assert caught.value.field == "workload.accuracy_tasks[1]" and caught.value.line == 17
    assert "gsm8k-mini" in caught.value.message and "facts" in (caught.value.hint or "")


def test_lm_eval_registry_tasks_are_named_as_lm_eval_names_them(write_config, minimal):
    """#15 item 2: a task is a shipped one or one of lm-eval's registry, checked against lm-eval's own task index
    when the config loads; a group (mmlu) is refused with what to name instead."""
    from enginesmith.core.tasks import resolve_task

    path = write_config(minimal + "workload:\n  name: w\n  accuracy_tasks: [facts, gsm8k, "
                                  "mmlu_abstract_algebra_generative]\n")
    assert load_pipeline_config(path).workload.accuracy_tasks[1] == "gsm8k"
    gsm8k = resolve_task("gsm8k")
    assert (gsm8k.source, gsm8k.output_type, gsm8k.dataset) == ("lm-eval", "generate_until", "openai/gsm8k")
    assert resolve_task("mmlu_abstract_algebra").needs_prompt_logprobs  # multiple choice: log-likelihoods
    assert not resolve_task("facts").needs_prompt_logprobs
    group = write_config(minimal + "workload:\n  name: w\n  accuracy_tasks: [mmlu]\n", name="group.yaml")
    with pytest.raises(ConfigError) as caught:
        load_pipeline_config(group)
    assert "group" in caught.value.message and "mmlu_abstract_algebra_generative" in (caught.value.hint or "")


def test_a_local_task_file_is_a_task_and_its_bad_lines_are_named(write_config, minimal, tmp_path):
    from enginesmith.core.assets import read_task
    from enginesmith.core.tasks import resolve_task, task_spec

    good = tmp_path / "capitals.jsonl"
    good.write_text('{"prompt": "Capital of France:", "answer": " Paris"}\n\n{"prompt": "2+2=", "answer": "4"}\n')
    path = write_config(minimal + f"workload:\n  name: w\n  accuracy_tasks: [{good}]\n")
    assert load_pipeline_config(path).workload.accuracy_tasks == [str(good)]
    assert resolve_task(str(good)).source == "local" and task_spec(str(good)).match == "exact"
    assert [e.answer for e in read_task(str(good))] == [" Paris", "4"]
    # The file's content is in the validation key: an edited task file is validated again, not taken as cached.
    from enginesmith.core.config import default_catalogue
    from pipeline.common.plan_sources import plan_config

    before = plan_config(path, default_catalogue(), resolve_hub=False)[1].cells[0].stage_keys
    good.write_text(good.read_text() + '{"prompt": "3+3=", "answer": "6"}\n')
    after = plan_config(path, default_catalogue(), resolve_hub=False)[1].cells[0].stage_keys
    assert after.validation != before.validation and after.build == before.build
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "answer": "b"}\n{"prompt": "no answer"}\n')
    broken = write_config(minimal + f"workload:\n  name: w\n  accuracy_tasks: [{bad}]\n", name="bad.yaml")
    with pytest.raises(ConfigError) as caught:
        load_pipeline_config(broken)
    assert f"{bad}:2" in caught.value.message and caught.value.field == "workload.accuracy_tasks[0]"


def test_unknown_recipe_lists_known_recipes(write_config, minimal):
    path = write_config(minimal.replace("recipes: [bf16, fp8]", "recipes: [fp4]"))
    with pytest.raises(ConfigError) as caught:
        load_pipeline_config(path)
    assert caught.value.field == "matrix[0].recipes[0]"
    assert "int4-awq" in (caught.value.hint or "")


def test_schema_error_names_field_path_and_allowed_values(write_config, minimal):
    path = write_config(minimal.replace("    tp: [1]", "    tp: [1]\n    kinds: [onnx]"))
    with pytest.raises(ConfigError) as caught:
        load_pipeline_config(path)
    assert caught.value.field == "matrix[0].kinds[0]"
    assert "'trtllm-engine'" in caught.value.message and "'hf-quantized'" in caught.value.message


def test_tp_must_be_a_power_of_two(write_config, minimal):
    path = write_config(minimal.replace("tp: [1]", "tp: [1, 3]"))
    with pytest.raises(ConfigError) as caught:
        load_pipeline_config(path)
    assert caught.value.field == "matrix[0].tp"
    assert "power of two" in caught.value.message and "3" in caught.value.message


@pytest.mark.parametrize("revision", ["has space", "a..b", "-main", "refs/heads/", "x~1", "v1.lock"])
def test_revision_must_be_a_commit_branch_or_tag(write_config, minimal, revision):
    path = write_config(minimal.replace("revision: main", f"revision: '{revision}'"))
    with pytest.raises(ConfigError) as caught:
        load_pipeline_config(path)
    assert caught.value.field == "models[0].revision"
    assert "not a commit sha, branch or tag" in caught.value.message


@pytest.mark.parametrize("revision", ["main", "v1.0", "refs/pr/1", "0e9e39f249a16976918f6564b8830bc894c89659"])
def test_valid_revisions_are_accepted(write_config, minimal, revision):
    assert load_pipeline_config(write_config(minimal.replace("revision: main", f"revision: '{revision}'")))


def test_unknown_field_is_refused(write_config, minimal):
    path = write_config(minimal.replace("    params_b: 1.0", "    params_b: 1.0\n    revison: main"))
    with pytest.raises(ConfigError) as caught:
        load_pipeline_config(path)
    assert caught.value.field == "models[0].revison"


def test_cli_user_error_exits_2_without_traceback(write_config, minimal):
    path = write_config(minimal.replace("targets: [h100-sxm]", "targets: [h900]"))
    result = run_cli("plan", str(path))
    assert result.returncode == 2
    assert "unknown target 'h900'" in result.stderr
    assert f"{path}:11" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_debug_shows_traceback(write_config, minimal):
    path = write_config(minimal.replace("targets: [h100-sxm]", "targets: [h900]"))
    result = run_cli("--debug", "plan", str(path))
    assert result.returncode != 0
    assert "Traceback" in result.stderr


def test_schema_command_prints_json_schema():
    result = run_cli("schema")
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    assert "matrix" in schema["properties"] and "models" in schema["properties"]
    assert run_cli("schema", "nope").returncode == 2


def test_the_catalogue_is_package_data_and_an_operator_can_bring_their_own(tmp_path: Path):
    """#31: what the installed CLI reads (targets, recipes, runtimes) ships inside the package; an operator's own
    catalogue (ENGINESMITH_CONFIG_DIR) is read instead, and one that lacks a file is refused naming it and the
    setting."""
    import shutil

    import enginesmith
    from enginesmith.core.config import config_dir

    shipped = config_dir()
    assert shipped.is_relative_to(Path(enginesmith.__file__).parent)
    assert {"targets.yaml", "recipes.yaml"} <= {p.name for p in shipped.iterdir()}
    assert (shipped / "runtimes" / "runtimes.yaml").is_file()

    own = tmp_path / "catalogue"
    shutil.copytree(shipped, own)
    text = (own / "targets.yaml").read_text()
    h100 = text[text.index("  - id: h100-sxm"):]
    h100 = h100[:h100.index("\n  - id:", 1) + 1]
    (own / "targets.yaml").write_text(text + h100.replace("id: h100-sxm", "id: h100-sxm-lab"))
    listed = run_cli("targets", "--json", env={"ENGINESMITH_CONFIG_DIR": str(own)})
    assert listed.returncode == 0, listed.stderr
    assert "h100-sxm-lab" in {t["id"] for t in json.loads(listed.stdout)}

    (own / "recipes.yaml").unlink()
    refused = run_cli("targets", env={"ENGINESMITH_CONFIG_DIR": str(own)})
    assert refused.returncode == 2
    assert "recipes.yaml" in refused.stderr and "ENGINESMITH_CONFIG_DIR" in refused.stderr


def test_the_nightly_cli_refuses_a_bad_config_in_one_line_before_prefect_starts(write_config):
    """#31 (7): a bad config reached Prefect, which logged it as a failed flow run with a traceback before the CLI's
    own error line; now the CLI reads the config first and prints the error once."""
    config = write_config("""
version: 1
name: bad
models: [{id: tiny, repo: ./nowhere}]
matrix: [{models: [tiny], recipes: [fp8], targets: [no-such-sku], kinds: [hf-quantized]}]
""")
    refused = run_cli("nightly", str(config), "--inline", env={"PREFECT_API_URL": "http://127.0.0.1:9/api"})
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no-such-sku" in errors[0]
    assert "Traceback" not in refused.stderr and "prefect" not in refused.stderr.lower()


def test_an_operators_catalogue_with_a_bad_field_is_refused_naming_the_file_field_and_line(tmp_path: Path):
    import shutil

    from enginesmith.core.config import config_dir

    own = tmp_path / "catalogue"
    shutil.copytree(config_dir(), own)
    text = (own / "targets.yaml").read_text()
    first = text.index("\n    memory_gib:") + len("\n    ")
    end = text.index("\n", first)
    (own / "targets.yaml").write_text(text[:first] + "memory_gib: lots" + text[end:])
    line = text[:first].count("\n") + 1
    refused = run_cli("targets", env={"ENGINESMITH_CONFIG_DIR": str(own)})
    assert refused.returncode == 2
    message = " ".join(refused.stderr.split())
    assert f"targets.yaml:{line}" in message and "memory_gib" in message, message
