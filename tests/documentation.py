"""The documentation the tests read: the README and the docs site's pages (``docs/``), wherever a block moved."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO_ROOT

DOCS_DIR = REPO_ROOT / "docs"


def pages() -> list[Path]:
    """The README first, then every page of the site in path order."""
    return [REPO_ROOT / "README.md", *sorted(DOCS_DIR.rglob("*.md"))]


def text() -> str:
    return "\n".join(page.read_text() for page in pages())


def marked_blocks(marker: str) -> list[str]:
    """The bash blocks under ``<!-- marker -->`` on any page, in page order."""
    return re.findall(rf"<!-- {re.escape(marker)} -->\s*```bash\n(.*?)```", text(), re.DOTALL)


def block_lines(marker: str) -> list[str]:
    """The commands of those blocks: their lines, less blank lines and comments."""
    return [line.strip() for block in marked_blocks(marker) for line in block.splitlines()
            if line.strip() and not line.strip().startswith("#")]
