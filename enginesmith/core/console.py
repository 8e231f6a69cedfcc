"""Output for people (rich tables, to stdout) and for scripts (``--json``); messages go to stderr."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table
from rich.text import Text

# Piped output (CI logs, `| less`) gets a wide table rather than the 80 columns rich assumes. Console markup is off:
# text in square brackets (``enginesmith[validation]``, ``files[3]``, a URL's ``[::1]``) prints as it is. A print
# that styles passes ``markup=True`` and escapes every value it interpolates; a styled table cell is a ``Text``.
stdout = Console(highlight=False, markup=False, width=None if sys.stdout.isatty() else 200)
stderr = Console(stderr=True, highlight=False, markup=False, soft_wrap=True)


def print_json(value: Any) -> None:
    """Machine-readable output: Pydantic models in JSON mode, one document on stdout."""
    if isinstance(value, BaseModel):
        text = value.model_dump_json(indent=2)
    elif isinstance(value, list) and all(isinstance(v, BaseModel) for v in value):
        text = json.dumps([v.model_dump(mode="json") for v in value], indent=2)
    else:
        text = json.dumps(value, indent=2, default=str)
    print(text)


Cell = str | Text  # a table cell: plain text (printed as it is), or a styled Text


def styled(text: str, style: str) -> Text:
    """A table cell (or part of one) in a style, its text taken literally."""
    return Text(text, style=style)


def table(title: str | None, columns: list[str], rows: Sequence[Sequence[Cell]]) -> Table:
    result = Table(title=title, show_lines=False, header_style="bold")
    for column in columns:
        result.add_column(column, overflow="fold")
    for row in rows:
        result.add_row(*row)
    return result


class UserErrorsOnce(logging.Filter):
    """Keeps a ``UserError`` raised inside a flow off the console, where the CLI prints it once as its ``error:``
    line: the engine's traceback of it is dropped, and so is any later record repeating its message (the run's
    final state). Records of other errors pass untouched; the API handler (the UI's log) is not filtered."""

    def __init__(self, error_type: type[BaseException]) -> None:
        super().__init__()
        self.error_type = error_type
        self.seen: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, self.error_type):
            self.seen.append(str(error).splitlines()[0])
            return False
        if self.seen:
            message = record.getMessage()
            return not any(seen in message for seen in self.seen)
        return True


def keep_user_errors_off_the_console(error_type: type[BaseException]) -> UserErrorsOnce:
    """Install ``UserErrorsOnce`` on the root logger's handlers (Prefect's console handler among them)."""
    once = UserErrorsOnce(error_type)
    for handler in logging.getLogger().handlers:
        handler.addFilter(once)
    return once
