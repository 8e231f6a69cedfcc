"""enginesmith: open LLM checkpoints to validated, per-GPU inference artefacts.

This package holds the shared vocabulary (config specs, GPU catalogue, keys, plans, errors) and the CLI.
It imports no GPU-only package: torch and ModelOpt live behind ``quantization``, TensorRT-LLM behind
``builders``, vLLM runs as a process.
"""

__version__ = "0.1.0"
