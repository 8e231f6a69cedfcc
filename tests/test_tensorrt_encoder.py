"""builders.tensorrt_encoder against the TEST DOUBLE trtexec (tests/fakes/trtexec.py): there is no GPU and no
TensorRT here, so these tests check the command, the version gate and the error handling, not an engine."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from builders.tensorrt_encoder import (
    TrtexecBuild,
    build_tensorrt_encoder,
    tensorrt_version_from_output,
    trtexec_argv,
)
from enginesmith.core.errors import TransientError, UserError
from tests.fakes import trtexec as fake_trtexec

REPO_ROOT = Path(__file__).resolve().parents[1]
ENCODER_INPUTS = ["input_ids", "attention_mask"]


def write_encoder_graph(path: Path, *, valid: bool = True) -> Path:
    """A tiny encoder-shaped ONNX graph: int64 input_ids and attention_mask [batch, seq] → int64 [batch, seq].
    With ``valid=False`` its node reads a tensor nothing defines, which onnx.checker refuses."""
    inputs = [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "seq"]) for name in ENCODER_INPUTS]
    output = helper.make_tensor_value_info("masked_ids", TensorProto.INT64, ["batch", "seq"])
    second = "attention_mask" if valid else "undefined_tensor"
    node = helper.make_node("Mul", ["input_ids", second], ["masked_ids"])
    graph = helper.make_graph([node], "tiny_encoder", inputs, [output])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, str(path))
    return path


@pytest.fixture
def onnx_graph(tmp_path: Path) -> Path:
    return write_encoder_graph(tmp_path / "encoder.onnx")


@pytest.fixture
def fake_trtexec_bin(tmp_path: Path) -> Path:
    """An executable ``trtexec`` that runs the TEST DOUBLE tests/fakes/trtexec.py."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "trtexec"
    script.write_text(
        f"#!{sys.executable}\n"
        f"import sys\nsys.path.insert(0, {str(REPO_ROOT)!r})\n"
        "from tests.fakes.trtexec import main\nsys.exit(main(sys.argv[1:]))\n"
    )
    script.chmod(0o755)
    return script


@pytest.fixture
def fake_trtexec_env(fake_trtexec_bin: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The double chosen through ENGINESMITH_TRTEXEC, reporting TensorRT 11.4.0, with no fault."""
    monkeypatch.setenv("ENGINESMITH_TRTEXEC", str(fake_trtexec_bin))
    monkeypatch.delenv("FAKE_TRTEXEC_VERSION", raising=False)
    monkeypatch.delenv("FAKE_TRTEXEC_FAIL", raising=False)
    return fake_trtexec_bin


def build(onnx_path: Path, out_dir: Path, *, input_names: list[str] = ENCODER_INPUTS,
          expected_tensorrt: str = "11.4.0", timeout_s: float = 600) -> TrtexecBuild:
    return build_tensorrt_encoder(onnx_path, out_dir, input_names=input_names, max_batch=32, max_seq_length=256,
                                  expected_tensorrt=expected_tensorrt, timeout_s=timeout_s)


def test_argv_has_trtexec_flags_and_one_profile() -> None:
    argv = trtexec_argv(Path("g.onnx"), Path("out/model.plan"), input_names=[*ENCODER_INPUTS, "token_type_ids"],
                        max_batch=64, max_seq_length=512, opt_batch=16, opt_seq_length=128)
    assert argv == [
        "trtexec", "--onnx=g.onnx", "--saveEngine=out/model.plan", "--stronglyTyped",
        "--minShapes=input_ids:1x1,attention_mask:1x1,token_type_ids:1x1",
        "--optShapes=input_ids:16x128,attention_mask:16x128,token_type_ids:16x128",
        "--maxShapes=input_ids:64x512,attention_mask:64x512,token_type_ids:64x512",
        "--skipInference",
    ]


def test_argv_refuses_opt_above_max() -> None:
    with pytest.raises(UserError, match=r"opt \(64\) <= max \(32\)"):
        trtexec_argv(Path("g.onnx"), Path("model.plan"), input_names=ENCODER_INPUTS, max_batch=32,
                     max_seq_length=128, opt_batch=64, opt_seq_length=128)


def test_fake_accepts_the_adapters_argv(onnx_graph: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    argv = trtexec_argv(onnx_graph, tmp_path / "model.plan", input_names=ENCODER_INPUTS, max_batch=8,
                        max_seq_length=64, opt_batch=4, opt_seq_length=32)
    assert fake_trtexec.main(argv[1:]) == 0
    assert "&&&& PASSED TensorRT.trtexec [TensorRT v110400]" in capsys.readouterr().out


@pytest.mark.parametrize("removed", ["--int8", "--fp16", "--best", "--calib=calib.cache"])
def test_fake_refuses_precision_flags_removed_in_tensorrt_11(
    removed: str, onnx_graph: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = trtexec_argv(onnx_graph, tmp_path / "model.plan", input_names=ENCODER_INPUTS, max_batch=8,
                        max_seq_length=64, opt_batch=4, opt_seq_length=32)
    assert fake_trtexec.main([*argv[1:], removed]) == 1
    out = capsys.readouterr().out
    assert f"Unknown option: {removed}" in out
    assert "removed in TensorRT 11" in out
    assert not (tmp_path / "model.plan").exists()


def test_build_writes_engine_and_records_version_and_config(
    onnx_graph: Path, tmp_path: Path, fake_trtexec_bin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found on PATH this time, not through ENGINESMITH_TRTEXEC.
    monkeypatch.delenv("ENGINESMITH_TRTEXEC", raising=False)
    monkeypatch.delenv("FAKE_TRTEXEC_VERSION", raising=False)
    monkeypatch.setenv("PATH", f"{fake_trtexec_bin.parent}:/usr/bin:/bin")
    out_dir = tmp_path / "artefact"
    built = build_tensorrt_encoder(onnx_graph, out_dir, input_names=ENCODER_INPUTS, max_batch=32,
                                   max_seq_length=256, expected_tensorrt="11.4.0")

    assert built.engine_file == "model.plan"
    assert built.versions == {"tensorrt": "11.4.0"}
    engine = json.loads((out_dir / built.engine_file).read_text())
    assert "TEST DOUBLE" in engine["fake"]
    assert engine["onnx_sha256"] == hashlib.sha256(onnx_graph.read_bytes()).hexdigest()
    assert engine["shapes"]["attention_mask"] == {"min": [1, 1], "opt": [32, 256], "max": [32, 256]}
    config = built.build_config
    assert config["shapes"] == {name: {"min": [1, 1], "opt": [32, 256], "max": [32, 256]} for name in ENCODER_INPUTS}
    assert config["flags"] == ["--stronglyTyped", "--skipInference"]
    recorded_argv = config["argv"]
    assert isinstance(recorded_argv, list)
    assert recorded_argv[:3] == ["trtexec", "--onnx=encoder.onnx", "--saveEngine=model.plan"]
    assert str(tmp_path) not in json.dumps(recorded_argv)
    assert isinstance(config["build_seconds"], float)
    assert "&&&& PASSED" in (out_dir / "trtexec.log").read_text()


def test_version_mismatch_refused_before_any_engine(
    onnx_graph: Path, tmp_path: Path, fake_trtexec_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TRTEXEC_VERSION", "101400")
    out_dir = tmp_path / "artefact"
    with pytest.raises(UserError) as refused:
        build(onnx_graph, out_dir, expected_tensorrt="11.4.0")
    message = refused.value.render()
    assert "TensorRT 10.14.0" in message and "TensorRT 11.4.0" in message
    assert str(fake_trtexec_env) in message
    assert refused.value.hint and "ENGINESMITH_TRTEXEC" in refused.value.hint
    assert not out_dir.exists()


def test_patch_release_differences_are_accepted(onnx_graph: Path, tmp_path: Path, fake_trtexec_env: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_TRTEXEC_VERSION", "110402")
    built = build(onnx_graph, tmp_path / "artefact", expected_tensorrt="11.4")
    assert built.versions == {"tensorrt": "11.4.2"}


def test_missing_trtexec_names_the_variable(onnx_graph: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENGINESMITH_TRTEXEC", raising=False)
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(UserError, match="ENGINESMITH_TRTEXEC"):
        build(onnx_graph, tmp_path / "artefact")
    monkeypatch.setenv("ENGINESMITH_TRTEXEC", str(tmp_path / "no-such-trtexec"))
    with pytest.raises(UserError, match="ENGINESMITH_TRTEXEC"):
        build(onnx_graph, tmp_path / "artefact")


def test_graph_failing_the_checker_fails_the_build_with_the_log_tail(tmp_path: Path, fake_trtexec_env: Path) -> None:
    broken = write_encoder_graph(tmp_path / "broken.onnx", valid=False)
    out_dir = tmp_path / "artefact"
    with pytest.raises(UserError) as failed:
        build(broken, out_dir)
    log_path = out_dir / "trtexec.log"
    assert failed.value.where == str(log_path)
    assert "Failed to parse onnx file" in failed.value.message
    assert "undefined_tensor" in failed.value.message
    assert "&&&& FAILED" in failed.value.message
    assert not (out_dir / "model.plan").exists()


def test_profile_naming_an_input_the_graph_lacks_fails_the_build(onnx_graph: Path, tmp_path: Path,
                                                                  fake_trtexec_env: Path) -> None:
    with pytest.raises(UserError, match="network's inputs are"):
        build(onnx_graph, tmp_path / "artefact", input_names=[*ENCODER_INPUTS, "token_type_ids"])


def test_exit_zero_without_engine_is_refused(onnx_graph: Path, tmp_path: Path, fake_trtexec_env: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    out_dir = tmp_path / "artefact"
    out_dir.mkdir()
    (out_dir / "model.plan").write_text("stale engine from an earlier build")
    monkeypatch.setenv("FAKE_TRTEXEC_FAIL", "no-engine")
    with pytest.raises(UserError, match=r"exited 0 but wrote no model\.plan"):
        build(onnx_graph, out_dir)


def test_build_past_its_timeout_is_transient(onnx_graph: Path, tmp_path: Path, fake_trtexec_env: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_TRTEXEC_FAIL", "hang")
    with pytest.raises(TransientError, match="did not finish within 2 s"):
        build(onnx_graph, tmp_path / "artefact", timeout_s=2)


@pytest.mark.parametrize(("line", "version"), [
    ("&&&& RUNNING TensorRT.trtexec [TensorRT v110400] [b12] # trtexec --help", "11.4.0"),
    ("&&&& RUNNING TensorRT.trtexec [TensorRT v100300] [b17] # trtexec --onnx=m.onnx", "10.3.0"),
    ("&&&& RUNNING TensorRT.trtexec [TensorRT v8601] # trtexec --loadEngine=e", "8.6.1"),
    ("[I] TensorRT version: 11.4.0", None),
])
def test_tensorrt_version_read_from_trtexec_banner(line: str, version: str | None) -> None:
    assert tensorrt_version_from_output(f"noise\n{line}\nmore") == version
