"""Known ``trtllm-build`` / TensorRT failures → what to tell the user.

The strings are what TensorRT-LLM 1.2.x's ``trtllm-build`` and TensorRT print for each failure.
"""

from __future__ import annotations

import re

# (pattern in the build log, what happened, what to do)
KNOWN_FAILURES: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (re.compile(r"out of memory|CUDA_ERROR_OUT_OF_MEMORY|OutOfMemory|OOM", re.IGNORECASE),
     "the build ran out of GPU memory",
     "lower max_batch_size, max_num_tokens or max_seq_len in the build profile, or build with more GPUs (tp)"),
    (re.compile(r"not supported on SM>=100|is not supported on SM"),
     "this quantisation is not supported on the build GPU's SM",
     "pick a recipe the target supports (`enginesmith recipes`); the planner should have refused this cell"),
    (re.compile(r"generated on an incompatible device|expecting compute \d+\.\d+ got compute"),
     "the engine was built for another GPU architecture",
     "rebuild on a GPU of the target SKU"),
    (re.compile(r"Version tag does not match|kSERIALIZATION_VERSION|not compatible with this version of TensorRT"),
     "TensorRT version mismatch between build and runtime",
     "build and serve with the same TensorRT-LLM and TensorRT versions (pin tensorrt_llm 1.2.1)"),
)


def explain_failure(log_text: str) -> tuple[str, str] | None:
    """The first known failure found in a build log: (what happened, what to do), or None."""
    for pattern, what, hint in KNOWN_FAILURES:
        if pattern.search(log_text):
            return what, hint
    return None
