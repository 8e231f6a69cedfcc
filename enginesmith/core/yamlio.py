"""YAML files in, Pydantic models out, with errors that name the file, the line and the field path."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from enginesmith.core.errors import ConfigError

ModelT = TypeVar("ModelT", bound=BaseModel)


class YamlDocument:
    """A parsed YAML file: its data, plus the node tree to look up the line of any field."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        try:
            self.root_node = yaml.compose(text, Loader=yaml.SafeLoader)
            self.data: Any = yaml.safe_load(text)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = mark.line + 1 if mark is not None else None
            problem = exc.problem or exc.context or "invalid YAML"
            raise ConfigError(
                f"YAML syntax error: {problem}", path=path, line=line, hint="fix the YAML syntax at that line"
            ) from None

    @classmethod
    def read(cls, path: Path | str) -> YamlDocument:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError("file not found", path=path, hint="check the path") from None
        except OSError as exc:
            raise ConfigError(f"cannot read file: {exc.strerror}", path=path) from None
        return cls(path, text)

    def line_of(self, loc: Sequence[str | int]) -> int | None:
        """1-based line of the deepest node that exists along ``loc`` (a Pydantic error location)."""
        node = self.root_node
        line = node.start_mark.line + 1 if node is not None else None
        for part in loc:
            if isinstance(node, yaml.MappingNode):
                child = next((v for k, v in node.value if getattr(k, "value", None) == str(part)), None)
                key_node = next((k for k, _ in node.value if getattr(k, "value", None) == str(part)), None)
                if child is None or key_node is None:
                    break
                line = key_node.start_mark.line + 1
                node = child
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
                node = node.value[part]
                line = node.start_mark.line + 1
            else:
                break
        return line

    def validate(self, model: type[ModelT], *, context: dict[str, Any] | None = None) -> ModelT:
        """Validate the data against ``model``; the first error names its field path, line and the allowed values."""
        try:
            return model.model_validate(self.data, context=context)
        except ValidationError as exc:
            raise self.error_from_validation(exc) from None

    def error_from_validation(self, exc: ValidationError) -> ConfigError:
        first = exc.errors()[0]
        loc = [part for part in first["loc"] if not (isinstance(part, str) and part.startswith("function-"))]
        more = exc.error_count() - 1
        message = first["msg"].removeprefix("Value error, ")
        if more:
            message += f" (and {more} more error{'s' if more > 1 else ''})"
        return ConfigError(message, path=self.path, line=self.line_of(loc), field=format_loc(loc))


def format_loc(loc: Sequence[str | int]) -> str:
    """``("matrix", 0, "targets", 2)`` → ``matrix[0].targets[2]``."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text
