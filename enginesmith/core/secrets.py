"""Secrets are scrubbed at the boundary where they enter: whoever reads a token registers it here, and every
log record and user-facing error passes through ``scrub``.
"""

from __future__ import annotations

import logging
import os

REDACTED = "***"
_MIN_SECRET_LENGTH = 6
_known_secrets: set[str] = set()


def register_secret(value: str | None) -> str | None:
    """Remember a secret so it is scrubbed from logs and errors from now on; returns it unchanged."""
    if value and len(value) >= _MIN_SECRET_LENGTH:
        _known_secrets.add(value)
        _install_log_filter()
    return value


def scrub(text: str) -> str:
    for secret in sorted(_known_secrets, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def hf_token() -> str | None:
    """The Hugging Face token: ``HF_TOKEN`` (or the legacy ``HUGGING_FACE_HUB_TOKEN``), else huggingface_hub's
    stored login. Registered as a secret before it is returned."""
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    if not token:
        from huggingface_hub import get_token

        token = get_token()
    return register_secret(token)


class _ScrubFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = scrub(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


_filter = _ScrubFilter()


def _install_log_filter() -> None:
    """Attach the scrubber to every handler of the root logger (and to the root logger itself)."""
    root = logging.getLogger()
    if _filter not in root.filters:
        root.addFilter(_filter)
    for handler in root.handlers:
        if _filter not in handler.filters:
            handler.addFilter(_filter)
