"""#65: the docs site as a reader gets it: built strict, served on loopback and opened in headless chromium, it loads
nothing from outside (no fonts, no scripts), its search answers offline, and the home page, the tutorial and a
generated reference page render their content."""

from __future__ import annotations

import contextlib
import functools
import http.server
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, chromium_page, needs_chromium

pytestmark = pytest.mark.slow
PAGES = {"index": ("", "Open LLM checkpoints in"), "tutorial": ("tutorial/first-run/", "./scripts/demo.sh"),
         "cli": ("reference/cli/", "enginesmith validate")}


@contextlib.contextmanager
def _served(site: Path) -> Iterator[str]:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run([str(REPO_ROOT / ".venv" / "bin" / "mkdocs"), "build", "--strict", "--site-dir", str(out)],
                           cwd=REPO_ROOT, capture_output=True, text=True, env={"NO_MKDOCS_2_WARNING": "1",
                                                                                "PATH": "/usr/bin:/bin"})
    assert built.returncode == 0, built.stderr[-3000:]
    return out


def test_the_site_renders_offline_and_its_search_finds_a_command(site: Path, tmp_path: Path) -> None:
    needs_chromium()
    with _served(site) as root, chromium_page(lambda url: url.startswith(root)) as (page, blocked):
        for name, (path, expected) in PAGES.items():
            page.goto(root + path)
            assert expected in page.locator("article").inner_text(), name
            page.screenshot(path=str(tmp_path / f"{name}.png"))
        page.goto(root)
        page.keyboard.press("s")  # Material's key for the search box
        page.keyboard.type("withdrawal", delay=20)
        found = page.locator(".md-search-result__item a[href*='how-to/signing/']")
        found.first.wait_for(timeout=30_000)  # the index is searched in the page's worker, from the site's own files
        page.screenshot(path=str(tmp_path / "search.png"))
    assert blocked == [], blocked
