"""The TensorRT-LLM tools a build runs, from the TensorRT-LLM runtime environment (the catalogue's ``runtimes/``),
and the versions they run with: read from the interpreter of the tool itself (its shebang), via importlib.metadata, so
nothing GPU-bound is imported to find out."""

from __future__ import annotations

from pathlib import Path

from enginesmith.core.runtimes import interpreter_of, read_versions

# ModelOpt is not among them: the artefact's "modelopt" is the exporter the quantised checkpoint records.
PACKAGES = {
    "tensorrt_llm": ["tensorrt_llm", "tensorrt-llm"],
    "tensorrt": ["tensorrt", "tensorrt-cu12", "tensorrt-cu13"],
    "torch": ["torch"],
}

__all__ = ["PACKAGES", "interpreter_of", "toolchain_versions"]


def toolchain_versions(script: Path, packages: dict[str, list[str]] | None = None) -> dict[str, str]:
    """Installed versions next to ``script`` (those found): ``packages`` maps a version key to distribution names,
    by default TensorRT-LLM, TensorRT and torch."""
    return read_versions(interpreter_of(script), packages or PACKAGES)
