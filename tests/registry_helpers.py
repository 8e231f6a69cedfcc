"""Builders for registry tests: artefact directories as the build stage writes them, and CLI runs against a
given registry and cache."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from enginesmith.core.artefacts import (
    ARTEFACT_FILE,
    COMPLETE_MARKER,
    METADATA_FILE,
    Artefact,
    Lineage,
    QuantizedCheckpoint,
    ServeRecipe,
    artefact_record_bytes,
)
from enginesmith.core.checkpoints.models import Checkpoint, CheckpointFile
from tests.conftest import REPO_ROOT, run_cli

MIB = 1024 * 1024


def deterministic_bytes(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def tiny_files(seed: int = 0) -> dict[str, bytes]:
    """A few small files shaped like an HF-quantised checkpoint, one of them twice (same content)."""
    tokenizer = json.dumps({"version": "1.0", "seed": seed}).encode()
    return {
        "config.json": json.dumps({"model_type": "llama", "hidden_size": 64, "seed": seed}).encode(),
        "model.safetensors": deterministic_bytes(96 * 1024, seed),
        "tokenizer.json": tokenizer,
        "extra/tokenizer.json": tokenizer,
    }


def big_files(total_bytes: int, seed: int = 0, parts: int = 2) -> dict[str, bytes]:
    """``parts`` weight files adding up to ``total_bytes`` plus a small config."""
    size = total_bytes // parts
    files = {f"rank{i}.safetensors": deterministic_bytes(size, seed * 100 + i) for i in range(parts)}
    files["config.json"] = json.dumps({"seed": seed}).encode()
    return files


def write_artefact(
    root: Path,
    *,
    model: str = "tiny-llama",
    files: dict[str, bytes] | None = None,
    key: str | None = None,
    recipe: str = "fp8",
    kind: str = "hf-quantized",
    target: str = "cpu",
    target_sm: int | None = None,
    tp: int = 1,
    pp: int = 1,
    versions: dict[str, str] | None = None,
    created: str = "2026-01-01T00:00:00+00:00",
    serve: list[ServeRecipe] | None = None,
) -> Path:
    """Write an artefact directory (``artefact.json`` plus its files) under ``root``; returns the directory."""
    files = tiny_files() if files is None else files
    records = [CheckpointFile(path=path, size=len(body), sha256=hashlib.sha256(body).hexdigest())
               for path, body in sorted(files.items())]
    key = key or hashlib.sha256(
        json.dumps([model, recipe, kind, target, tp, pp, [r.sha256 for r in records]]).encode()
    ).hexdigest()
    artefact = Artefact(
        key=key, kind=kind, target=target, target_sm=target_sm, tp=tp, pp=pp,
        lineage=Lineage(model_id=model, repo_id=f"enginesmith/{model}", commit_sha="a" * 40,
                        checkpoint_key="c" * 64, recipe=recipe, calibration_dataset="builtin:addition",
                        calibration_sha256="d" * 64),
        versions=versions or {"modelopt": "0.37.0", "torch": "2.13.0"},
        files=records, created=created, serve=serve or [],
    )
    directory = root / f"{model}-{key[:8]}"
    for path, body in files.items():
        (directory / path).parent.mkdir(parents=True, exist_ok=True)
        (directory / path).write_bytes(body)
    (directory / ARTEFACT_FILE).write_bytes(artefact_record_bytes(artefact))
    return directory


def read_artefact(directory: Path) -> Artefact:
    return Artefact.model_validate_json((directory / ARTEFACT_FILE).read_bytes())


def file_digests(directory: Path, paths: list[str]) -> dict[str, str]:
    return {p: hashlib.sha256((directory / p).read_bytes()).hexdigest() for p in paths}


def registry_env(registry: str, cache: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {"ENGINESMITH_REGISTRY": registry, "ENGINESMITH_CACHE_DIR": str(cache), **(extra or {})}


def cli_json(*args: str, env: dict[str, str]) -> dict:
    """Run ``enginesmith ARGS --json``; returns the parsed output, failing the test with stderr otherwise."""
    result = run_cli(*args, "--json", env=env)
    assert result.returncode == 0, f"enginesmith {' '.join(args)} failed:\n{result.stderr}"
    return json.loads(result.stdout)


def start_cli(*args: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``enginesmith ARGS`` as a background process (to be killed), output to ``log``."""
    with log.open("wb") as handle:
        return subprocess.Popen([sys.executable, "-m", "enginesmith", *args], cwd=REPO_ROOT,
                                env={**os.environ, **env}, stdout=handle, stderr=subprocess.STDOUT)


def size_or_zero(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def manifest_for(directory: Path, *, validation: dict | None = None, published: str | None = None,
                 key: str | None = None):  # -> registry.manifest.Manifest
    """The manifest publishing ``directory`` would write (without a registry)."""
    from registry.manifest import Manifest, utc_timestamp

    artefact = read_artefact(directory)
    return Manifest(model=artefact.lineage.model_id, key=key or artefact.key, published=published or utc_timestamp(),
                    artefact=artefact, validation=validation)


def throughput_report(tokens_per_s: float, tpot_ms: float, *, target: str = "h100-sxm") -> dict:
    """A validation report whose candidate peaked at ``tokens_per_s`` in each of three rounds with a median TPOT of
    ``tpot_ms`` at c=1, on a GPU target (its speed is the artefact's)."""
    from tests.report_factory import llm_report

    return llm_report([1.0, 1.0, 1.0], tpot_ms=tpot_ms, peak_tok_s=tokens_per_s, target=target)


def race(writers: int, create: Callable[[int], bool]) -> list[bool]:
    """``create(i)`` from ``writers`` threads released together by a barrier (not a sleep); what each returned."""
    barrier = threading.Barrier(writers)
    outcomes: list[bool] = []

    def run(index: int) -> None:
        barrier.wait()
        outcomes.append(create(index))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


QUANTIZE_KEY = "a1" * 32


def write_quantized(out_dir: Path, files: dict[str, bytes], key: str = QUANTIZE_KEY) -> QuantizedCheckpoint:
    """A finished quantize output as the stage leaves it: the exports, then quantize.json and the marker."""
    listed = []
    for relative, body in files.items():
        (out_dir / relative).parent.mkdir(parents=True, exist_ok=True)
        (out_dir / relative).write_bytes(body)
        listed.append(CheckpointFile(path=relative, size=len(body), sha256=hashlib.sha256(body).hexdigest()))
    source = Checkpoint(source="local", repo_id="tiny-llama", requested_revision="main",
                        commit_sha="sha256:" + "0" * 64, local_path="/nodes/big/checkpoints/tiny-llama", files=[],
                        total_bytes=0, architecture=None, model_type="llama", dtype="bfloat16", parameter_count=1000)
    quantized = QuantizedCheckpoint(
        key=key, recipe="fp8", source=source, out_dir=str(out_dir), formats=["hf", "trtllm"], tp=1, pp=1,
        device="cuda", quant_algo="FP8", kv_cache_quant_algo=None, group_size=None, calibration=None, quality=None,
        versions={"modelopt": "0.37.0"}, timings_s={}, files=listed)
    (out_dir / METADATA_FILE).write_text(quantized.model_dump_json())
    (out_dir / COMPLETE_MARKER).write_text(key + "\n")
    return quantized


def exports(seed: int = 0) -> dict[str, bytes]:
    files = tiny_files(seed)
    # The TensorRT-LLM export's weights are the HF export's bytes here: one blob for two files.
    hf = {"hf/" + path: body for path, body in files.items()}
    return hf | {"trtllm/rank0.safetensors": files["model.safetensors"]}


def artefact_with_weights(root: Path, size: int) -> Path:
    """An artefact with a weights file of ``size`` bytes (whole MiB) written without holding it in memory: a random
    MiB repeated, each copy numbered so that no two MiB are alike."""
    source = write_artefact(root, files={"weights.safetensors": b"", **tiny_files()})
    block = bytearray(random.Random(5).randbytes(MIB))
    digest = hashlib.sha256()
    with (source / "weights.safetensors").open("wb") as handle:
        for index in range(size // MIB):
            block[:8] = index.to_bytes(8, "little")
            digest.update(block)
            handle.write(block)
    artefact = read_artefact(source)
    weights = CheckpointFile(path="weights.safetensors", size=size, sha256=digest.hexdigest())
    files = [weights if f.path == weights.path else f for f in artefact.files]
    (source / ARTEFACT_FILE).write_text(artefact.model_copy(update={"files": files}).model_dump_json(indent=2))
    return source


def open_store_of_kind(request, kind: str, tmp_path: Path, label: str):  # -> registry.store.RegistryStore
    """A registry of ``kind`` for one test: a local directory, a prefix of its own on the session's SeaweedFS server
    (``s3``) or a namespace of its own on the session's docker-registry (``oci``, its credentials set in this
    process's environment for the rest of the test)."""
    from registry.store import open_store

    if kind == "local":
        return open_store(str(tmp_path / label))
    name = f"{label}-{os.urandom(5).hex()}"
    if kind == "s3":
        server = request.getfixturevalue("seaweedfs")
        request.getfixturevalue("s3_env")
        return open_store(server.registry_url(name))
    server = request.getfixturevalue("oci_registry")
    monkeypatch = request.getfixturevalue("monkeypatch")
    for variable, value in server.env.items():
        monkeypatch.setenv(variable, value)
    return open_store(server.registry_url(name))


@contextmanager
def immutable(directory: Path) -> Iterator[None]:
    """``directory`` made immutable (chattr +i: refused to root too) for the block; skips where chattr cannot."""
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(directory)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here (needs root and a filesystem with attributes)")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(directory)], check=True)
