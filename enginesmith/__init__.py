"""enginesmith: open LLM checkpoints to validated, per-GPU inference artefacts.

The vocabulary is ``enginesmith.core``, the command ``enginesmith.cli``; the components (``pipeline``, ``flows``,
``quantization``, ``builders``, ``validation``, ``registry``) are top-level packages of the same distribution. This
module imports none of them, and no GPU-only package: torch and ModelOpt live behind ``quantization``, TensorRT-LLM
behind ``builders``, vLLM runs as a process.
"""

__version__ = "0.1.0"
