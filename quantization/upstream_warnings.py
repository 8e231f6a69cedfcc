"""What ModelOpt warns of while it calibrates and exports (amax entries calibration never set, layers it skipped),
kept for the quantise report instead of scrolling past in a worker's log: a warning that the exported scales of a
layer are a substitute says more about the artefact than any log line read after it was published."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

UPSTREAM = "modelopt"
# The report keeps this many distinct messages (each with its count); a model with thousands of experts repeats one.
KEPT_MESSAGES = 20
# What ModelOpt 0.47 says on every run of this stage, whatever the model: the CPU calibrates in fp32 and exports BF16
# by design; transformers 4 has neither the tied-weights list nor the conversion mapping its export looks for; and
# the TensorRT-LLM export says it enables lm_head quantization wherever lm_head has quantizers, which every recipe
# here disables. A report that always carried them would hide the warnings that are about the model.
EVERY_RUN = ("differs from target dtype", "deduplicating them on export requires transformers>=5.0",
             "Quant-aware reverse weight conversion skipped", "Enable lm_head quantization.")


class UpstreamWarnings:
    """Distinct warning messages, in the order first seen, with how often each came."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, message: str) -> None:
        if not any(known in message for known in EVERY_RUN):
            self.counts[message] = self.counts.get(message, 0) + 1

    def messages(self) -> list[str]:
        kept = [f"{message} (×{count})" if count > 1 else message
                for message, count in list(self.counts.items())[:KEPT_MESSAGES]]
        if len(self.counts) > KEPT_MESSAGES:
            kept.append(f"… and {len(self.counts) - KEPT_MESSAGES} other messages")
        return kept


class _Recorder(logging.Handler):
    def __init__(self, into: UpstreamWarnings) -> None:
        super().__init__(level=logging.WARNING)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.add(f"{record.levelname.lower()}: {record.getMessage()}")


@contextmanager
def recording(into: UpstreamWarnings) -> Iterator[None]:
    """Record into ``into`` what ModelOpt warns (``warnings`` raised from its modules, and its loggers at WARNING
    and above) inside the block; other libraries' warnings are shown as before, once each."""
    handler = _Recorder(into)
    logger = logging.getLogger(UPSTREAM)
    logger.addHandler(handler)
    others: dict[tuple[str, type[Warning], str, int], warnings.WarningMessage] = {}
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        logger.removeHandler(handler)
    for found in caught:
        if f"{os.sep}{UPSTREAM}{os.sep}" in found.filename and not issubclass(
                found.category, (DeprecationWarning, PendingDeprecationWarning, FutureWarning)):
            into.add(f"{found.category.__name__}: {found.message}")
        else:
            others.setdefault((str(found.message), found.category, found.filename, found.lineno), found)
    for found in others.values():
        warnings.warn_explicit(found.message, found.category, found.filename, found.lineno)
