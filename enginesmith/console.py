"""Output for people (rich tables, to stdout) and for scripts (``--json``); messages go to stderr."""

from __future__ import annotations

import json
import sys
from typing import Any

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

# Piped output (CI logs, `| less`) gets a wide table rather than the 80 columns rich assumes.
stdout = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)


def print_json(value: Any) -> None:
    """Machine-readable output: Pydantic models in JSON mode, one document on stdout."""
    if isinstance(value, BaseModel):
        text = value.model_dump_json(indent=2)
    elif isinstance(value, list) and all(isinstance(v, BaseModel) for v in value):
        text = json.dumps([v.model_dump(mode="json") for v in value], indent=2)
    else:
        text = json.dumps(value, indent=2, default=str)
    print(text)


def table(title: str | None, columns: list[str], rows: list[list[str]]) -> Table:
    result = Table(title=title, show_lines=False, header_style="bold")
    for column in columns:
        result.add_column(column, overflow="fold")
    for row in rows:
        result.add_row(*row)
    return result
