"""``enginesmith catalogue``: the registry as a static site. Registries are built through the real publish path with
validation reports shaped as ``validate`` writes them, and nights recorded through ``registry.history``; the pages
are read back as parsed HTML, and once in Debian's chromium from file://."""

from __future__ import annotations

import hashlib
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from enginesmith.core.errors import UserError
from registry.catalog import load_manifest
from registry.history import outcome_from_report, record_outcome
from registry.local import LocalStore
from registry.names import safe_file_name
from registry.publish import publish_artefact
from registry.site import pull_command, write_catalogue
from tests import report_factory
from tests.conftest import chromium_page, needs_chromium, run_cli
from tests.registry_helpers import tiny_files, write_artefact

MODEL = "tiny-llama"
SCRIPT = "<script>alert(1)</script>"
STEADY = [0.95, 0.96, 0.97]
SLOWED = [0.65, 0.66, 0.67]  # about 31 % below STEADY, far outside both spreads


def llm_report(artefact_key: str, key: str, throughput_ratios: list[float], *, recipe: str = "fp8",
               note: str = "") -> dict:
    """A ValidationReport (as ``validate`` writes it) whose per-round throughput ratios are ``throughput_ratios``."""
    return report_factory.llm_report(throughput_ratios, [1.0, 1.01, 1.02], e2el_ratios=[1.0, 1.0, 1.0],
                                     artefact_key=artefact_key, key=key, recipe=recipe, note=note)


def publish_night(store: LocalStore, root: Path, *, recipe: str, night: int, throughput_ratios: list[float],
                  note: str = "") -> str:
    """Publish one night's build of the ``recipe`` cell and record its outcome; returns the registry key."""
    seed = night * 10 + len(recipe)
    directory = write_artefact(root / f"{recipe}-{night}", recipe=recipe, files=tiny_files(seed=seed),
                               created=f"2026-11-0{night}T01:00:00+00:00")
    artefact_key = json.loads((directory / "artefact.json").read_text())["key"]
    key = hashlib.sha256(f"validation-{recipe}-{night}".encode()).hexdigest()
    report = llm_report(artefact_key, key, throughput_ratios, recipe=recipe, note=note)
    publish_artefact(store, directory, validation=report)
    manifest = load_manifest(store, MODEL, key)
    from registry.history import manifest_cell_id

    outcome = outcome_from_report(model=MODEL, cell=manifest_cell_id(manifest), recipe=recipe, target="cpu",
                                  kind=manifest.artefact.kind, key=key, status="built", report=report,
                                  artefact=manifest.artefact, flow_run=f"nightly-{night}-{recipe}")
    record_outcome(store, outcome.model_copy(update={"recorded": f"2026-11-0{night}T02:00:00+00:00"}))
    return key


@pytest.fixture
def two_nights(tmp_path: Path) -> tuple[LocalStore, dict[tuple[str, int], str]]:
    """Two cells (fp8, int4-awq) over two nights; the int4-awq cell's second night is about 31 % slower."""
    store = LocalStore(tmp_path / "registry")
    keys = {}
    for night in (1, 2):
        keys["fp8", night] = publish_night(store, tmp_path / "build", recipe="fp8", night=night,
                                           throughput_ratios=STEADY if night == 1 else [0.96, 0.95, 0.97],
                                           note=SCRIPT if night == 2 else "")
        keys["int4-awq", night] = publish_night(store, tmp_path / "build", recipe="int4-awq", night=night,
                                                throughput_ratios=STEADY if night == 1 else SLOWED)
    return store, keys


class _Page(HTMLParser):
    """What a test reads from one written page: its links, its text, and the text of elements by class or id."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.scripts = 0
        self.text: list[str] = []
        self.by_class: dict[str, list[str]] = {}
        self.by_id: dict[str, str] = {}
        self._open: list[tuple[list[str], str | None, list[str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        self.scripts += tag == "script"
        for name in ("href", "src"):
            if found.get(name):
                self.links.append(str(found[name]))
        if tag not in ("br", "img", "meta", "link"):
            self._open.append(((found.get("class") or "").split(), found.get("id"), []))

    def handle_endtag(self, tag: str) -> None:
        if tag in ("br", "img", "meta", "link") or not self._open:
            return
        classes, element_id, parts = self._open.pop()
        text = "".join(parts)
        for name in classes:
            self.by_class.setdefault(name, []).append(text)
        if element_id:
            self.by_id[element_id] = text
        if self._open:
            self._open[-1][2].append(text)

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._open:
            self._open[-1][2].append(data)


def read_page(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    return page


def test_every_model_artefact_and_cell_gets_a_page_and_the_slowed_cell_is_flagged(two_nights, tmp_path: Path) -> None:
    store, keys = two_nights
    out = tmp_path / "site"
    result = write_catalogue(store, out, registry_url="s3://models/registry", s3_endpoint=None)
    assert (result.models, result.artefacts, result.unreadable, result.pages) == (1, 4, 0, 1 + 1 + 4)
    assert result.index == str(out / "index.html")

    index = read_page(out / "index.html")
    assert "models/tiny-llama.html" in index.links
    model_page = read_page(out / "models" / "tiny-llama.html")
    for key in keys.values():
        assert f"tiny-llama/{key}.html" in model_page.links
    regressions = model_page.by_class["regression"]
    assert len(regressions) == 1 and regressions[0].startswith("throughput_ratio −31% vs previous"), regressions
    slowed_cell = next(text for text in model_page.by_class["cell"] if "int4-awq" in text)
    assert "throughput_ratio −31% vs previous" in slowed_cell
    assert len(model_page.by_class["cell"]) == 2
    assert any(link.endswith(".png") for link in model_page.links)  # the history plots

    artefact = read_page(out / "models" / "tiny-llama" / f"{keys['fp8', 1]}.html")
    assert artefact.by_id["pull-command"] == (f"enginesmith pull tiny-llama@{keys['fp8', 1]} --registry "
                                              f"s3://models/registry --dest tiny-llama-{keys['fp8', 1][:12]}")
    assert "min_throughput_ratio" in "".join(artefact.text)  # the gate table
    assert "max output throughput (tok/s)" in "".join(artefact.text)  # the comparison table
    assert {"throughput.png", "tpot.png", "ttft.png"} <= {Path(link).name for link in artefact.links}
    provenance = artefact.by_id["provenance"]
    assert "enginesmith/tiny-llama @ " + "a" * 40 in provenance and "builtin:addition" in provenance
    assert "d" * 64 in provenance and "modelopt 0.37.0" in provenance


def test_a_script_in_a_report_or_note_is_shown_as_text(two_nights, tmp_path: Path) -> None:
    store, keys = two_nights
    out = tmp_path / "site"
    write_catalogue(store, out, registry_url=str(store.root))
    page = out / "models" / "tiny-llama" / f"{keys['fp8', 2]}.html"
    parsed = read_page(page)
    assert parsed.scripts == 0
    assert SCRIPT in "".join(parsed.text)  # shown, as text
    assert SCRIPT not in page.read_text() and "&lt;script&gt;" in page.read_text()
    assert all(read_page(path).scripts == 0 for path in out.rglob("*.html"))


def test_a_damaged_manifest_is_listed_with_its_reason_and_the_rest_is_written(two_nights, tmp_path: Path) -> None:
    store, keys = two_nights
    damaged = "f" * 64
    (store.root / "manifests" / MODEL / f"{damaged}.json").write_text('{"schema_version": 1, "model": ')
    out = tmp_path / "site"
    result = write_catalogue(store, out, registry_url=str(store.root))
    assert result.unreadable == 1 and result.artefacts == 4
    model_page = read_page(out / "models" / "tiny-llama.html")
    listed = model_page.by_class["unreadable-item"]
    assert len(listed) == 1 and damaged in listed[0] and "not valid JSON" in listed[0], listed
    assert not (out / "models" / "tiny-llama" / f"{damaged}.html").exists()
    assert (out / "models" / "tiny-llama" / f"{keys['int4-awq', 2]}.html").exists()


def test_a_report_of_another_shape_is_listed_as_unreadable_on_its_page(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "registry")
    directory = write_artefact(tmp_path / "build")
    artefact_key = json.loads((directory / "artefact.json").read_text())["key"]
    publish_artefact(store, directory, validation={"artefact_key": artefact_key, "comparison": {"candidate": {}},
                                                   "notes": [SCRIPT]})
    out = tmp_path / "site"
    result = write_catalogue(store, out, registry_url=str(store.root))
    assert result.artefacts == 1
    page = read_page(out / "models" / "tiny-llama" / f"{artefact_key}.html")
    assert "the validation report could not be read" in "".join(page.text) and page.scripts == 0
    model_page = read_page(out / "models" / "tiny-llama.html")
    assert "unreadable" in model_page.by_class["verdict"]


def test_links_are_relative_and_resolve_to_written_files(two_nights, tmp_path: Path) -> None:
    store, _ = two_nights
    out = tmp_path / "site"
    write_catalogue(store, out, registry_url=str(store.root))
    pages = list(out.rglob("*.html"))
    assert len(pages) == 6
    for page in pages:
        for link in read_page(page).links:
            parsed = urlparse(link)
            assert not parsed.scheme and not parsed.netloc and not link.startswith("/"), (page, link)
            target = (page.parent / unquote(parsed.path)).resolve()
            assert target.is_file(), (page, link)
            assert target.is_relative_to(out.resolve())


def test_a_new_catalogue_replaces_the_old_and_a_foreign_directory_is_refused(two_nights, tmp_path: Path) -> None:
    store, _ = two_nights
    out = tmp_path / "site"
    write_catalogue(store, out, registry_url=str(store.root))
    (out / "stale.html").write_text("old")
    write_catalogue(store, out, registry_url=str(store.root))
    assert not (out / "stale.html").exists() and (out / "index.html").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".site")] == []  # no staging left behind

    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    with pytest.raises(UserError, match="not a catalogue written by enginesmith"):
        write_catalogue(store, foreign, registry_url=str(store.root))
    assert (foreign / "notes.txt").read_text() == "keep"


def test_file_names_from_ids_stay_inside_their_folder() -> None:
    assert safe_file_name("tiny-llama") == "tiny-llama"
    for unsafe in ("../../etc/passwd", "a/b", "..", "x<y>", ""):
        name = safe_file_name(unsafe)
        assert "/" not in name and name not in (".", "..") and name
    assert safe_file_name("a/b") != safe_file_name("a-b")
    assert pull_command("m", "k" * 64, "/reg dir", bundle=False).endswith(f"--registry '/reg dir' --dest m-{'k' * 12}")
    assert "--from-bundle b.tar" in pull_command("m", "k" * 64, "b.tar", bundle=True)


def test_the_cli_writes_the_site_and_says_where_the_index_is(two_nights, tmp_path: Path) -> None:
    store, _ = two_nights
    out = tmp_path / "site"
    result = run_cli("catalogue", "--out", str(out), "--registry", str(store.root), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["index"] == str(out / "index.html") and summary["artefacts"] == 4
    shown = run_cli("catalogue", "--out", str(out), "--registry", str(store.root))
    assert shown.returncode == 0 and str(out / "index.html") in shown.stdout.replace("\n", ""), shown.stdout


def test_the_site_in_a_browser_from_index_to_the_pull_command_and_back_to_the_regression(two_nights,
                                                                                          tmp_path: Path) -> None:
    needs_chromium()
    from playwright.sync_api import expect

    store, keys = two_nights
    out = tmp_path / "site"
    registry_url = str(store.root)
    write_catalogue(store, out, registry_url=registry_url)
    dialogs: list[str] = []
    with chromium_page(lambda url: url.startswith(("file://", "http://127.0.0.1"))) as (page, blocked):
        def dismiss(dialog) -> None:
            dialogs.append(dialog.message)
            dialog.dismiss()

        page.on("dialog", dismiss)
        page.goto((out / "index.html").as_uri())
        page.get_by_role("link", name=MODEL, exact=True).click()
        expect(page).to_have_url((out / "models" / "tiny-llama.html").as_uri())
        page.locator(f'a.artefact-link[href$="{keys["fp8", 2]}.html"]').click()
        expect(page.locator("#pull-command")).to_be_visible()
        assert page.locator("#pull-command").inner_text() == pull_command(MODEL, keys["fp8", 2], registry_url)
        expect(page.get_by_text(SCRIPT).first).to_be_visible()  # the report's note, as text
        page.go_back()
        expect(page).to_have_url((out / "models" / "tiny-llama.html").as_uri())
        flags = page.locator(".regression")
        expect(flags).to_have_count(1)
        expect(flags).to_have_text(re.compile(r"^throughput_ratio −31% vs previous"))
        slowed = page.locator("section.cell", has=page.locator("h3", has_text="int4-awq"))
        steady = page.locator("section.cell", has=page.locator("h3", has_text="fp8"))
        expect(slowed.locator(".regression")).to_have_count(1)
        expect(steady.locator(".regression")).to_have_count(0)
    assert dialogs == [] and blocked == []


def encoder_report(artefact_key: str, key: str) -> dict:
    """An EncoderValidationReport as ``validate_encoder`` writes it (two batch sizes, three sides, three rounds)."""
    return report_factory.encoder_report(artefact_key, key, what=SCRIPT, gate_detail=SCRIPT)


def test_an_encoder_report_gets_its_tables_and_plot(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "registry")
    directory = write_artefact(tmp_path / "build", model="minilm", recipe="int8", kind="onnx")
    artefact_key = json.loads((directory / "artefact.json").read_text())["key"]
    key = "e" * 64
    publish_artefact(store, directory, validation=encoder_report(artefact_key, key))
    out = tmp_path / "site"
    result = write_catalogue(store, out, registry_url=str(store.root))
    assert (result.artefacts, result.unreadable) == (1, 0)
    page = read_page(out / "models" / "minilm" / f"{key}.html")
    text = "".join(page.text)
    assert "Accuracy against the vLLM reference" in text and "candidate ÷ fp32-onnx" in text
    assert "min_cosine_to_reference" in text and SCRIPT in text and page.scripts == 0
    assert f"{key}/throughput.png" in page.links and (out / "models" / "minilm" / key / "throughput.png").is_file()
    model_page = read_page(out / "models" / "minilm.html")
    assert any(cell.startswith("1.500 ±") for cell in _cells(out / "models" / "minilm.html"))
    assert model_page.by_class["verdict"][0] == "pass"


def _cells(path: Path) -> list[str]:
    class Cells(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.cells: list[str] = []
            self._in = False

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if tag == "td":
                self._in, self.cells = True, [*self.cells, ""]

        def handle_endtag(self, tag: str) -> None:
            self._in = self._in and tag != "td"

        def handle_data(self, data: str) -> None:
            if self._in:
                self.cells[-1] += data

    parser = Cells()
    parser.feed(path.read_text())
    return parser.cells


def test_channel_moves_and_an_unreadable_history_record_are_listed(two_nights, tmp_path: Path) -> None:
    from registry.history import ChannelMove, record_channel_move
    from registry.names import history_path

    store, keys = two_nights
    record_channel_move(store, ChannelMove(model=MODEL, channel="stable", key=keys["fp8", 2], previous=keys["fp8", 1],
                                           actor=f"ops{SCRIPT}@host", recorded="2026-11-03T09:00:00+00:00"))
    damaged = store.root / history_path(MODEL, "zz-damaged")
    damaged.write_text("{not json")
    out = tmp_path / "site"
    result = write_catalogue(store, out, registry_url=str(store.root))
    assert result.unreadable == 1
    page = read_page(out / "models" / "tiny-llama.html")
    moves = page.by_id["moves"]
    assert f"ops{SCRIPT}@host" in moves and keys["fp8", 1][:12] in moves and keys["fp8", 2][:12] in moves
    assert "stable" in moves and "2026-11-03 09:00:00" in moves
    listed = page.by_class["unreadable-item"]
    assert len(listed) == 1 and "zz-damaged" in listed[0], listed
    assert page.scripts == 0


def test_a_bundle_is_catalogued_and_its_pages_pull_from_the_bundle(two_nights, tmp_path: Path) -> None:
    from registry.bundle import BundleStore, bundle_manifests, write_bundle

    store, keys = two_nights
    manifests, channels = bundle_manifests(store, [MODEL])
    bundle = tmp_path / "models.tar"
    write_bundle(store, manifests, bundle, refs=channels)
    out = tmp_path / "site"
    result = write_catalogue(BundleStore(bundle), out, registry_url=str(bundle))
    assert (result.models, result.artefacts) == (1, 4)
    page = read_page(out / "models" / "tiny-llama" / f"{keys['int4-awq', 1]}.html")
    assert page.by_id["pull-command"] == pull_command(MODEL, keys["int4-awq", 1], str(bundle), bundle=True)
    assert "--from-bundle" in page.by_id["pull-command"]


def test_a_history_record_with_no_values_is_listed_and_the_site_is_written(two_nights, tmp_path: Path) -> None:
    from registry.names import history_path

    store, _ = two_nights
    raw = outcome_from_report(model=MODEL, cell=f"{MODEL}/fp8/cpu/tp1/hf-quantized", recipe="fp8", target="cpu",
                              kind="hf-quantized", key="", status="failed", report=None).model_dump(mode="json")
    raw["metrics"] = {"throughput_ratio": {"values": []}}
    (store.root / history_path(MODEL, "zz-empty")).write_text(json.dumps(raw))
    out = tmp_path / "site"

    result = write_catalogue(store, out, registry_url=str(store.root))

    assert result.unreadable == 1
    page = read_page(out / "models" / "tiny-llama.html")
    assert len(page.by_class["cell"]) == 2
    listed = page.by_class["unreadable-item"]
    assert len(listed) == 1 and "zz-empty" in listed[0] and "throughput_ratio" in listed[0], listed


def test_a_history_that_fails_to_load_is_shown_with_its_reason(two_nights, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import registry.history

    def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("the history backend fell over")

    monkeypatch.setattr(registry.history, "load_history", broken)
    store, keys = two_nights
    out = tmp_path / "site"

    result = write_catalogue(store, out, registry_url=str(store.root))

    assert result.artefacts == 4
    page = read_page(out / "models" / "tiny-llama.html")
    assert any("the history backend fell over" in text for text in page.by_class["problem"])
    assert f"tiny-llama/{keys['fp8', 1]}.html" in page.links


def test_a_run_that_crashed_between_the_renames_is_recovered_by_the_next(two_nights, tmp_path: Path) -> None:
    store, _ = two_nights
    out = tmp_path / "site"
    write_catalogue(store, out, registry_url=str(store.root))
    out.rename(tmp_path / ".site.old-deadbeef")  # the old site retired, the new one never renamed into place
    foreign = tmp_path / ".site.old-notours"
    foreign.mkdir()

    write_catalogue(store, out, registry_url=str(store.root))

    assert (out / "index.html").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".site")) == [".site.old-notours"]
