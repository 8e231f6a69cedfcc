"""The registry as a static site (``enginesmith catalogue``): HTML, CSS and PNGs in one directory that any file
server or S3 bucket can host.

Pages: ``index.html`` (every model), ``models/<model>.html`` (its artefacts as a profile table, its channel moves,
each cell's history, plotted under ``models/<model>/_history/``) and ``models/<model>/<key>.html`` (one artefact: its
validation report, provenance and the pull command; its plots under ``models/<model>/<key>/``). Every link is
relative; file names come from model ids, keys and cell ids through ``registry.names.safe_file_name``. The view
models below are built by pure functions of manifests, reports and histories; the templates (``registry/templates``,
autoescaped) only lay them out, and ``write_catalogue`` does the I/O.

A manifest, report or history record that cannot be read is listed with its reason; it never stops the site.
"""

from __future__ import annotations

import os
import shlex
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from enginesmith.core.diskspace import size_label
from enginesmith.core.errors import UserError
from enginesmith.core.reports import KindReport, ReportView, parse_report
from registry.catalog import ModelListing, list_model, list_models
from registry.history import HIGHER_IS_BETTER, BuildEntry, CellHistory, ModelHistory, describe_regression
from registry.manifest import Manifest, display_timestamp, signer_label
from registry.names import safe_file_name
from registry.store import RegistryStore

if TYPE_CHECKING:
    import jinja2

    from registry.signing import Trust
    from registry.support import SupportMatrix

# Written into every catalogue: a directory holding it may be replaced by the next one, any other may not.
MARKER_FILE = ".enginesmith-catalogue"
STYLESHEET = "catalogue.css"
SUPPORT_PAGE = "support.html"
# Beside the artefact pages of a model; a registry name cannot start with "_", so no key collides with it.
HISTORY_DIR = "_history"


class CatalogueResult(BaseModel):
    out_dir: str
    index: str  # the index page's path
    pages: int
    models: int
    artefacts: int
    unreadable: int  # manifests and history records listed as unreadable


# --- view models --------------------------------------------------------------------------------------


class ArtefactRow(BaseModel):
    """One row of a model's profile table: one published artefact."""

    key: str
    short_key: str
    href: str  # relative to the model page
    target: str
    recipe: str
    kind: str
    tp: int
    pp: int
    published: str
    size: str
    throughput_ratio: str
    tpot_ratio: str
    verdict: str  # pass | FAIL | — (no report) | unreadable
    channels: list[str]
    signer: str  # the signing key as the manifest names it ("not checked"), as --trust found it, or "unsigned"


class UnreadableRow(BaseModel):
    what: str  # a manifest key or a history entry
    problem: str


class MoveRow(BaseModel):
    recorded: str
    actor: str
    channel: str
    previous: str
    key: str


class BuildRow(BaseModel):
    recorded: str
    status: str
    key: str
    href: str | None  # the artefact page (relative to the model page) where the build is published
    metrics: list[str]  # "throughput_ratio 0.95 ± 0.01"
    verdict: str
    channels: list[str]
    regressions: list[str]  # describe_regression and the short key: "throughput_ratio −31% vs previous (3f2a9c…)"
    reason: str


class CellView(BaseModel):
    cell: str
    anchor: str
    recipe: str
    target: str
    kind: str
    builds: list[BuildRow]  # newest first
    plots: list[str] = []  # relative to the model page
    plot_problem: str = ""


class ModelPage(BaseModel):
    model: str
    channels: dict[str, str]
    vouched: dict[str, str] = {}  # channel → who vouched for it until when (checked with a trust list), or why not
    artefacts: list[ArtefactRow]
    unreadable: list[UnreadableRow]
    cells: list[CellView]
    moves: list[MoveRow]  # newest first
    history_problem: str = ""


class IndexRow(BaseModel):
    model: str
    href: str
    artefacts: int
    unreadable: int
    channels: dict[str, str]


class ArtefactPage(BaseModel):
    model: str
    key: str
    model_href: str
    pull_command: str
    channels: list[str]
    profile: list[tuple[str, str]]
    provenance: list[tuple[str, str]]
    report: ReportView
    plots: list[str] = []  # relative to the artefact page
    plot_problem: str = ""
    files: list[tuple[str, str, str]]  # path, size, sha256 (first 16)


# --- pure view building -------------------------------------------------------------------------------


def pull_command(model: str, key: str, registry_url: str, *, bundle: bool = False,
                 s3_endpoint: str | None = None) -> str:
    """The command that pulls ``model@key`` from this registry (a bundle is pulled with ``--from-bundle``)."""
    source = ["--from-bundle", registry_url] if bundle else ["--registry", registry_url]
    endpoint = ["--s3-endpoint", s3_endpoint] if s3_endpoint and not bundle else []
    dest = f"{safe_file_name(model)}-{key[:12]}"
    return shlex.join(["enginesmith", "pull", f"{model}@{key}", *source, *endpoint, "--dest", dest])


def _short(key: str | None) -> str:
    return key[:12] if key else "—"


def report_view(parsed: KindReport | str | None) -> ReportView:
    if parsed is None:
        return ReportView(kind="none")
    if isinstance(parsed, str):
        return ReportView(kind="unreadable", problem=parsed, summary="the validation report could not be read")
    return parsed.view()


def _verdict(view: ReportView) -> str:
    if view.problem:  # only an unreadable report has one
        return "unreadable"
    return "—" if view.passed is None else ("pass" if view.passed else "FAIL")


def channels_by_key(channels: dict[str, str]) -> dict[str, list[str]]:
    by_key: dict[str, list[str]] = {}
    for channel, key in sorted(channels.items()):
        by_key.setdefault(key, []).append(channel)
    return by_key


def artefact_row(manifest: Manifest, view: ReportView, channels: list[str], signer: str) -> ArtefactRow:
    a = manifest.artefact
    return ArtefactRow(key=manifest.key, short_key=_short(manifest.key),
                       href=f"{safe_file_name(manifest.model)}/{safe_file_name(manifest.key)}.html",
                       target=a.target, recipe=manifest.recipe, kind=a.kind, tp=a.tp, pp=a.pp,
                       published=display_timestamp(manifest.published), size=size_label(manifest.total_bytes),
                       throughput_ratio=view.throughput_ratio, tpot_ratio=view.tpot_ratio, verdict=_verdict(view),
                       channels=channels, signer=signer)


def provenance_rows(manifest: Manifest, signer: str) -> list[tuple[str, str]]:
    a, lineage = manifest.artefact, manifest.artefact.lineage
    gpu = a.build_gpu
    return [
        ("checkpoint", f"{lineage.repo_id} @ {lineage.commit_sha}"),
        ("checkpoint key", lineage.checkpoint_key),
        ("calibration dataset", lineage.calibration_dataset or "—"),
        ("calibration sha256", lineage.calibration_sha256 or "—"),
        ("quantize key", lineage.quantize_key or "—"),
        ("toolchain", ", ".join(f"{name} {version}" for name, version in sorted(a.versions.items())) or "—"),
        ("build GPU", f"{gpu.name} (SM {gpu.sm}, driver {gpu.driver_version or '—'})" if gpu else "— (no GPU)"),
        ("artefact key", a.key),
        ("created", a.created),
        ("published", manifest.published),
        ("signed by", signer),
    ]


def profile_rows(manifest: Manifest) -> list[tuple[str, str]]:
    a = manifest.artefact
    return [("recipe", manifest.recipe), ("kind", a.kind),
            ("target", a.target + (f" (SM {a.target_sm})" if a.target_sm else "")), ("tp × pp", f"{a.tp} × {a.pp}"),
            ("size", f"{size_label(manifest.total_bytes)} in {len(a.files)} files"),
            ("runtimes", ", ".join(a.runtimes) or "—")]


def build_row(model: str, entry: BuildEntry) -> BuildRow:
    outcome = entry.outcome
    metrics = [f"{name} {spread.median:.3f} ± {spread.half_range:.3f}"
               for name in [*HIGHER_IS_BETTER, *sorted(set(outcome.metrics) - set(HIGHER_IS_BETTER))]
               if (spread := outcome.metrics.get(name)) is not None and spread.values]
    verdict = "—" if outcome.passed is None else ("pass" if outcome.passed else "FAIL")
    href = f"{safe_file_name(model)}/{safe_file_name(outcome.key)}.html" if entry.published and outcome.key else None
    regressions = [f"{describe_regression(r)} ({_short(r.against_key)})" for r in entry.regressions]
    return BuildRow(recorded=display_timestamp(outcome.recorded), status=outcome.status, key=_short(outcome.key),
                    href=href, metrics=metrics, verdict=verdict, channels=entry.channels, regressions=regressions,
                    reason=outcome.reason)


def cell_view(history: CellHistory) -> CellView:
    return CellView(cell=history.cell, anchor=f"cell-{safe_file_name(history.cell)}", recipe=history.recipe,
                    target=history.target, kind=history.kind,
                    builds=[build_row(history.model, entry) for entry in reversed(history.builds)])


def model_page(listing: ModelListing, history: ModelHistory | None, reports: dict[str, ReportView],
               signers: dict[str, str], *, history_problem: str = "") -> ModelPage:
    """The model page's view: ``reports`` holds each readable manifest's report view by key, ``signers`` its
    ``signature_label``."""
    channels_of = channels_by_key(listing.channels)
    # Grouped as a profile table is read (by target, then recipe, kind and parallelism), newest first in a group.
    manifests = sorted(listing.manifests, key=lambda m: (m.artefact.target, m.recipe, m.artefact.kind, m.artefact.tp,
                                                         m.artefact.pp))
    rows = [artefact_row(m, reports[m.key], channels_of.get(m.key, []), signers[m.key]) for m in manifests]
    unreadable = [UnreadableRow(what=f"manifest {u.key}", problem=u.problem) for u in listing.unreadable]
    cells: list[CellView] = []
    moves: list[MoveRow] = []
    if history is not None:
        cells = [cell_view(cell) for cell in history.cells]
        moves = [MoveRow(recorded=display_timestamp(m.recorded), actor=m.actor, channel=m.channel,
                         previous=_short(m.previous), key=_short(m.key)) for m in reversed(history.channel_moves)]
        unreadable += [UnreadableRow(what=f"history record {r.entry}", problem=r.problem) for r in history.unreadable]
    return ModelPage(model=listing.model, channels=listing.channels, artefacts=rows, unreadable=unreadable,
                     cells=cells, moves=moves, history_problem=history_problem)


def artefact_page(manifest: Manifest, view: ReportView, channels: list[str], command: str,
                  signer: str) -> ArtefactPage:
    return ArtefactPage(model=manifest.model, key=manifest.key, model_href=f"../{safe_file_name(manifest.model)}.html",
                        pull_command=command, channels=channels, profile=profile_rows(manifest),
                        provenance=provenance_rows(manifest, signer), report=view,
                        files=[(f.path, f"{f.size:,}", (f.sha256 or "—")[:16]) for f in manifest.artefact.files])


# --- writing ------------------------------------------------------------------------------------------


def template_environment() -> jinja2.Environment:
    import jinja2

    return jinja2.Environment(loader=jinja2.PackageLoader("registry", "templates"), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def write_catalogue(store: RegistryStore, out_dir: Path, *, registry_url: str,
                    s3_endpoint: str | None = None, trust: Trust | None = None,
                    support: SupportMatrix | None = None) -> CatalogueResult:
    """Write the site for every model in ``store`` to ``out_dir``, replacing the catalogue there if any.

    The pages are written to a new directory beside ``out_dir`` and renamed into place at the end, so an
    interrupted run leaves the previous site whole (but for the instant between two renames, which the next run
    recovers from: ``_swap_into_place``). ``registry_url`` (and ``s3_endpoint``) is what the pull commands
    name. With ``trust``, each signature is checked against it (``signature_label``). With ``support`` (the matrix of
    the config whose night wrote it), a support page too, linked from the index.

    Raises ``UserError`` when ``out_dir`` exists and is not a catalogue this command wrote.
    """
    from registry.bundle import BundleStore

    out_dir = out_dir.absolute()
    _check_replaceable(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        writer = _SiteWriter(staging, template_environment(), registry_url=registry_url,
                             bundle=isinstance(store, BundleStore), s3_endpoint=s3_endpoint, trust=trust)
        result = writer.write(store, support)
        (staging / MARKER_FILE).write_text("written by enginesmith catalogue; replaced whole by the next run\n")
        _swap_into_place(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return result.model_copy(update={"out_dir": str(out_dir), "index": str(out_dir / "index.html")})


def _check_replaceable(out_dir: Path) -> None:
    if out_dir.exists() and (not out_dir.is_dir() or (any(out_dir.iterdir()) and not (out_dir / MARKER_FILE).exists())):
        raise UserError(f"{out_dir} exists and is not a catalogue written by enginesmith", where="--out",
                        hint="name a new or empty directory, or one an earlier `enginesmith catalogue` wrote")


def _swap_into_place(staging: Path, out_dir: Path) -> None:
    """Rename ``staging`` to ``out_dir``, retiring the catalogue there first.

    Two renames, not one atomic swap: between them ``out_dir`` does not exist, and a crash there leaves the old site
    as ``.<name>.old-*`` beside it. A missing ``out_dir`` is fine to write, so the next run writes the site again and
    then removes every retired catalogue (an ``.old-*`` sibling holding ``MARKER_FILE``).
    """
    if out_dir.exists():
        retired = out_dir.parent / f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}"
        out_dir.rename(retired)
    staging.rename(out_dir)
    for old in out_dir.parent.glob(f".{out_dir.name}.old-*"):
        if old.is_dir() and (old / MARKER_FILE).exists():
            shutil.rmtree(old, ignore_errors=True)


def signature_label(store: RegistryStore, manifest: Manifest, trust: Trust | None) -> str:
    """The "signed by" of an artefact: without ``trust``, the key its manifest names, marked not checked; with it,
    the trusted signer once the signature holds, or why it does not."""
    if trust is None or manifest.signature is None:
        return signer_label(manifest)
    from registry.errors import SignatureError
    from registry.signing import verify_stored

    try:
        checked = verify_stored(store, manifest, trust)
    except SignatureError as exc:
        return f"does not hold: {exc.message}"
    return f"{checked.signer} (key {checked.fingerprint[:16]}; checked)"


class _SiteWriter:
    """Renders the views into ``root``; counts what it wrote."""

    def __init__(self, root: Path, env: jinja2.Environment, *, registry_url: str, bundle: bool,
                 s3_endpoint: str | None, trust: Trust | None) -> None:
        self.root, self.env = root, env
        self.registry_url, self.bundle, self.s3_endpoint = registry_url, bundle, s3_endpoint
        self.trust = trust
        self.pages = 0

    def render(self, template: str, path: Path, *, depth: int, **context: Any) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        html = self.env.get_template(template).render(root="../" * depth, stylesheet=STYLESHEET, **context)
        path.write_text(html, encoding="utf-8")
        self.pages += 1

    def write(self, store: RegistryStore, support: SupportMatrix | None = None) -> CatalogueResult:
        shutil.copyfile(Path(__file__).parent / "templates" / STYLESHEET, self.root / STYLESHEET)
        if support is not None:
            self.write_support(support)
        index_rows: list[IndexRow] = []
        broken: list[UnreadableRow] = []
        artefacts = unreadable = 0
        for summary in list_models(store):
            try:
                listing = list_model(store, summary.model)
            except UserError as exc:  # a model directory whose listing fails: listed, the others still written
                broken.append(UnreadableRow(what=summary.model, problem=exc.render()))
                unreadable += 1
                continue
            page = self.write_model(store, listing)
            artefacts += len(page.artefacts)
            unreadable += len(page.unreadable)
            index_rows.append(IndexRow(model=listing.model, href=f"models/{safe_file_name(listing.model)}.html",
                                       artefacts=len(listing.manifests), unreadable=len(page.unreadable),
                                       channels=listing.channels))
        self.render("index.html.j2", self.root / "index.html", depth=0, models=index_rows, broken=broken,
                    location=store.location, title="enginesmith catalogue",
                    support=SUPPORT_PAGE if support is not None else None)
        return CatalogueResult(out_dir=str(self.root), index=str(self.root / "index.html"), pages=self.pages,
                               models=len(index_rows), artefacts=artefacts, unreadable=unreadable)

    def write_support(self, matrix: SupportMatrix) -> None:
        from registry.support import cell_summary, reasons, support_rows

        recipes, rows = support_rows(matrix)
        shown = [{**row.model_dump(exclude={"cells"}),
                  "cells": [None if cell is None else {"status": cell.status, "reason": cell.reason,
                                                       "summary": cell_summary(cell)} for cell in row.cells]}
                 for row in rows]
        self.render("support.html.j2", self.root / SUPPORT_PAGE, depth=0, config=matrix.config, recipes=recipes,
                    rows=shown, reasons=reasons(matrix), title=f"support matrix: {matrix.config}")

    def channel_statements(self, store: RegistryStore, listing: ModelListing) -> dict[str, str]:
        """Each channel's signed statement as the page says it: with a trust list, checked (without remembering its
        sequence: a page only reports); without one, its sequence and signer's key, not checked."""
        from registry.channel_statements import ChannelStatementError, check_channel, newest_claim

        said: dict[str, str] = {}
        for channel, key in sorted(listing.channels.items()):
            if self.trust is not None:
                try:
                    checked = check_channel(store, listing.model, channel, key, self.trust, remember=False)
                except ChannelStatementError as refused:
                    said[channel] = f"not vouched for: {refused.check.detail}"
                    continue
                assert checked.claim is not None
                said[channel] = (f"statement {checked.claim.sequence} by {checked.signer}, until "
                                 f"{display_timestamp(checked.claim.expires.isoformat())}")
                continue
            claim = newest_claim(store, listing.model, channel)
            if claim is not None:
                said[channel] = f"statement {claim.sequence}, until {display_timestamp(claim.expires.isoformat())} " \
                                "(not checked)"
        return said

    def write_model(self, store: RegistryStore, listing: ModelListing) -> ModelPage:
        from registry.history import load_history
        from registry.withdrawals import read_withdrawals

        model_dir = self.root / "models" / safe_file_name(listing.model)
        channels_of = channels_by_key(listing.channels)
        reports: dict[str, ReportView] = {}
        signers: dict[str, str] = {}
        withdrawn = read_withdrawals(store, listing.model, self.trust).reasons()
        for manifest in listing.manifests:
            parsed = parse_report(manifest.validation)
            reports[manifest.key] = view = report_view(parsed)
            signer = signature_label(store, manifest, self.trust)
            if manifest.key in withdrawn:
                signer = f"WITHDRAWN, {withdrawn[manifest.key]}; {signer}"
            signers[manifest.key] = signer
            self.write_artefact(manifest, parsed, view, channels_of.get(manifest.key, []), signer, model_dir)
        history: ModelHistory | None = None
        history_problem = ""
        try:
            history = load_history(store, listing.model)
            page = model_page(listing, history, reports, signers)
            page.vouched = self.channel_statements(store, listing)
        # Whatever stops the history (the storage, a record no check foresaw) costs the history section, not the
        # model page nor the rest of the site.
        except Exception as exc:
            history, history_problem = None, _problem(exc)
            page = model_page(listing, None, reports, signers, history_problem=history_problem)
            page.vouched = self.channel_statements(store, listing)
        if history is not None:
            for cell, cell_page in zip(history.cells, page.cells, strict=True):
                cell_page.plots, cell_page.plot_problem = self.write_history_plots(
                    cell, model_dir / HISTORY_DIR / cell_page.anchor, relative_to=model_dir.parent)
        self.render("model.html.j2", model_dir.parent / f"{safe_file_name(listing.model)}.html", depth=1, page=page,
                    title=listing.model)
        return page

    def write_artefact(self, manifest: Manifest, parsed: KindReport | str | None,
                       view: ReportView, channels: list[str], signer: str, model_dir: Path) -> None:
        page = artefact_page(manifest, view, channels,
                             pull_command(manifest.model, manifest.key, self.registry_url, bundle=self.bundle,
                                          s3_endpoint=self.s3_endpoint), signer)
        if parsed is not None and not isinstance(parsed, str):
            page.plots, page.plot_problem = self.write_report_plots(parsed, model_dir / safe_file_name(manifest.key),
                                                                    relative_to=model_dir)
        self.render("artefact.html.j2", model_dir / f"{safe_file_name(manifest.key)}.html", depth=2, page=page,
                    title=manifest.ref)

    def write_report_plots(self, report: KindReport, plot_dir: Path, *, relative_to: Path) -> tuple[list[str], str]:
        return _plots(lambda: report.plots(plot_dir), plot_dir, relative_to)

    def write_history_plots(self, history: CellHistory, plot_dir: Path, *, relative_to: Path) -> tuple[list[str], str]:
        from registry.history_plots import write_history_plots

        return _plots(lambda: write_history_plots(history, plot_dir), plot_dir, relative_to)


def _problem(exc: Exception) -> str:
    return exc.render() if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"


def _plots(write: Callable[[], list[Path]], plot_dir: Path, relative_to: Path) -> tuple[list[str], str]:
    """The plots ``write`` makes in ``plot_dir``, as links relative to ``relative_to``; or why there are none."""
    plot_dir.mkdir(parents=True, exist_ok=True)
    try:
        paths = write()
    # A report that validates but cannot be drawn (no levels, a side with no rounds) loses its plots, not its page.
    except (ValueError, KeyError, IndexError, StopIteration, ZeroDivisionError) as exc:
        return [], f"plots not drawn: {type(exc).__name__}: {exc}"
    except ImportError as exc:  # a node without the validation extra reads the reports but cannot draw them
        return [], f"plots not drawn: {exc.name or exc} is not installed (pip install 'enginesmith[validation]')"
    return [path.relative_to(relative_to).as_posix() for path in paths], ""

