"""Each cell's history across nightlies: an append-only log of outcomes and channel moves, beside the manifests.

A published manifest says what passed; it does not say what failed, what a night measured that did not pass, or
when ``prod`` was moved and by whom. The nightly therefore writes one small record per cell run (``CellOutcome``)
and ``promote`` one per channel move (``ChannelMove``), under ``history/<model>/<entry>.json``: created once and
atomically, as manifests are (a second write of the same entry changes nothing, so a retried task cannot record
twice). ``gc`` never touches the log: it is small and it is the only record of failures.

``load_history`` joins the log with the manifests: a manifest that no record mentions (published by hand, or
before the log existed) appears as a build of its cell, read from its own report. Regressions are flagged only
where a metric moved by more than its measurements spread (``Regression``).
"""

from __future__ import annotations

import getpass
import hashlib
import json
import math
import os
import socket
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError, computed_field

from enginesmith.core.plan import cell_id
from enginesmith.core.reports import parse_report, serving_profiles_of
from enginesmith.core.reports.measures import Spread
from enginesmith.core.reports.profiles import DEFAULT_PROFILE, ServingProfile
from registry.catalog import READ_THREADS, list_model
from registry.errors import IntegrityError
from registry.manifest import parse_timestamp, utc_timestamp
from registry.names import is_name
from registry.store import RegistryStore

if TYPE_CHECKING:
    from enginesmith.core.artefacts import Artefact
    from registry.manifest import Manifest

HISTORY_SCHEMA_VERSION = 1

ACTOR_ENV = "ENGINESMITH_ACTOR"
CHANNEL_ENTRY_PREFIX = "channel-"
# Signed statements kept beside the history records, created once as they are (registry.channel_statements,
# registry.withdrawals): not outcomes or moves, so the history reads past them.
STATEMENT_ENTRY_PREFIX = "statement-"
WITHDRAWAL_ENTRY_PREFIX = "withdrawal-"
# The reference's results, one record per reference key (registry.reference_records): kept beside, read past.
REFERENCE_ENTRY_PREFIX = "reference-"
CELL_HASH_CHARS = 12
# A task score is a share of examples (0..1) with no spread over rounds: a drop of more than one point
# (0.01) is flagged. Smaller moves are within what re-running the same examples on another night gives.
ACCURACY_DROP_TOLERANCE = 0.01
# A cosine to the reference (an encoder's ``min_cosine``) sits just under 1 and is deterministic for the same
# inputs: 0.999 → 0.990 is a real loss though it is under one point, so cosine-like keys have their own, tighter
# tolerance.
COSINE_DROP_TOLERANCE = 0.005
# Rounds a metric needs on each side before its spread is trusted: a single round has half range 0, and judging by
# it would flag any tiny drop. With fewer, only a relative worsening beyond SINGLE_ROUND_TOLERANCE counts.
MIN_ROUNDS_FOR_SPREAD = 2
SINGLE_ROUND_TOLERANCE = 0.10

OutcomeStatus = Literal["built", "gate-failed", "failed", "no-worker"]
# The metrics a cell's history follows, and which way is better.
HIGHER_IS_BETTER: dict[str, bool] = {
    "throughput_ratio": True,   # candidate ÷ reference output tokens/s (LLM), embeddings/s (encoder)
    "tpot_ratio": False,        # candidate ÷ reference time per output token at concurrency 1
    "e2el_ratio": False,        # candidate ÷ reference request latency at concurrency 1 (where TPOT is not observable)
}


# A measurement is a finite number: NaN or infinity in a record makes it unreadable, never a median.
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


class MetricSpread(Spread):
    """One metric as the rounds measured it, as history keeps it: every round's value (at least one, all finite)."""

    values: list[FiniteFloat] = Field(min_length=1)


class GateVerdict(BaseModel):
    name: str
    measured: float | None
    limit: float
    passed: bool


class CellOutcome(BaseModel):
    """What one run of one cell ended with. Written by the build-cell / build-encoder-cell flow (built,
    gate-failed, failed) and by the nightly for a run that never reported (crashed, no worker)."""

    record: Literal["cell-outcome"] = "cell-outcome"
    schema_version: Literal[1] = 1
    model: str
    cell: str  # the plan's cell id, e.g. tiny-llama/int8-sq/cpu/tp1/hf-quantized
    recipe: str
    target: str
    kind: str
    status: OutcomeStatus
    key: str = ""  # the registry key the cell was planned under (its validation key)
    recorded: str  # ISO 8601, UTC
    flow_run: str = ""  # the Prefect flow run; entry names derive from it, so a retry records once
    commit_sha: str = ""
    calibration_sha256: str | None = None
    versions: dict[str, str] = {}
    metrics: dict[str, MetricSpread] = {}  # keys from HIGHER_IS_BETTER
    # The serving frontier it was published with: per profile and concurrency, output tokens/s and p95 TPOT (ms)
    # per round, keyed ``<profile>@c=<n> tok/s`` and ``<profile>@c=<n> p95 TPOT ms`` (``frontier_metrics``).
    frontier: dict[str, MetricSpread] = {}
    accuracy: dict[str, FiniteFloat] = {}  # task → the candidate's score (0..1)
    gates: list[GateVerdict] = []
    passed: bool | None = None  # the gate verdict; None where validation never ran
    reason: str = ""
    signer: str | None = None  # the fingerprint of the key that signed what it published (None: unsigned)


class ChannelMove(BaseModel):
    """``promote`` moved ``model:channel`` to ``key``: who did it, and when."""

    record: Literal["channel-move"] = "channel-move"
    schema_version: Literal[1] = 1
    model: str
    channel: str
    key: str
    previous: str | None
    actor: str  # ENGINESMITH_ACTOR, else user@host
    recorded: str = ""  # ISO 8601, UTC


class Regression(BaseModel):
    """A metric that got worse by more than the two measurements' spread (the sum of their half ranges)."""

    metric: str
    against: str  # "previous" or "channel:<name>"
    against_key: str
    before: float
    after: float

    @computed_field  # type: ignore[prop-decorator]
    @property
    def change(self) -> float:
        """Relative change, after ÷ before − 1 (e.g. −0.3 for 30 % lower)."""
        return self.after / self.before - 1 if self.before else 0.0


def signed_percent(change: float) -> str:
    """A relative change as a whole percent with its sign: ``−31%`` (a true minus sign), ``+5%``, ``±0%``."""
    percent = round(change * 100)
    sign = "−" if percent < 0 else "+" if percent > 0 else "±"
    return f"{sign}{abs(percent)}%"


def describe_regression(regression: Regression) -> str:
    """``throughput_ratio −31% vs previous`` or ``… vs channel:stable``: how the CLI, the catalogue and the nightly
    word a regression."""
    return f"{regression.metric} {signed_percent(regression.change)} vs {regression.against}"


class BuildEntry(BaseModel):
    """One build of a cell, in time order, with where it stands."""

    outcome: CellOutcome
    published: bool  # a manifest exists under outcome.key
    channels: list[str] = []  # channels that point at outcome.key now
    regressions: list[Regression] = []


class CellHistory(BaseModel):
    model: str
    cell: str
    recipe: str
    target: str
    kind: str
    builds: list[BuildEntry]  # oldest first


class UnreadableRecord(BaseModel):
    entry: str
    problem: str


class ModelHistory(BaseModel):
    model: str
    cells: list[CellHistory]
    channel_moves: list[ChannelMove]  # oldest first
    channels: dict[str, str]  # channel → key, now
    unreadable: list[UnreadableRecord] = []


def now() -> str:
    return utc_timestamp()


# --- entry names -------------------------------------------------------------------------------------


def cell_entry_prefix(cell: str) -> str:
    """The start of every entry name of ``cell``'s outcomes: a cell id holds '/', so it is hashed."""
    return hashlib.sha256(cell.encode()).hexdigest()[:CELL_HASH_CHARS] + "-"


def outcome_entry(outcome: CellOutcome) -> str:
    """The entry name ``outcome`` is recorded under: ``<sha256(cell)[:12]>-<flow run>``, so a retried task of the
    same flow run records once. Without a flow run: ``<sha256(cell)[:12]>-<recorded, compact>-<content hash>``
    (the same outcome twice is still one entry; two different ones are two)."""
    prefix = cell_entry_prefix(outcome.cell)
    if outcome.flow_run:
        run = outcome.flow_run
        if not is_name(prefix + run):
            run = hashlib.sha256(run.encode()).hexdigest()[:32]
        return prefix + run
    return f"{prefix}{_compact_time(outcome.recorded)}-{_content_hash(outcome)}"


def channel_entry(move: ChannelMove) -> str:
    """The entry name ``move`` is recorded under: ``channel-<recorded, compact>-<content hash>``; one move recorded
    twice (a retry) is one entry."""
    return f"{CHANNEL_ENTRY_PREFIX}{_compact_time(move.recorded)}-{_content_hash(move)}"


def _compact_time(recorded: str) -> str:
    try:
        moment = parse_timestamp(recorded)
    except ValueError:
        moment = parse_timestamp(now())
    return moment.strftime("%Y%m%dT%H%M%S%fZ")


def _content_hash(record: BaseModel) -> str:
    return hashlib.sha256(record.model_dump_json().encode()).hexdigest()[:12]


def _to_bytes(record: BaseModel) -> bytes:
    return (record.model_dump_json(indent=2) + "\n").encode()


# --- writing -----------------------------------------------------------------------------------------


def record_outcome(store: RegistryStore, outcome: CellOutcome) -> bool:
    """Record ``outcome`` once: ``False`` (changing nothing) when its entry exists already.

    Raises ``ReadOnlyStoreError`` for a bundle and ``RegistryUnavailableError`` when the storage does not answer.
    """
    return store.create_history(outcome.model, outcome_entry(outcome), _to_bytes(outcome))


def record_channel_move(store: RegistryStore, move: ChannelMove) -> bool:
    """Record ``move`` once (stamped now if it has no time): ``False`` when its entry exists already."""
    if not move.recorded:
        move = move.model_copy(update={"recorded": now()})
    return store.create_history(move.model, channel_entry(move), _to_bytes(move))


def current_actor() -> str:
    """Who is acting, for ``ChannelMove.actor``: ``ENGINESMITH_ACTOR``, else ``user@host``."""
    actor = os.environ.get(ACTOR_ENV, "").strip()
    if actor:
        return actor
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no login name (a container with an unnamed uid)
        user = str(os.getuid()) if hasattr(os, "getuid") else "unknown"
    return f"{user}@{socket.gethostname()}"


# --- outcomes from reports and manifests ---------------------------------------------------------------


def outcome_from_report(
    *,
    model: str,
    cell: str,
    recipe: str,
    target: str,
    kind: str,
    key: str,
    status: OutcomeStatus,
    report: Mapping[str, Any] | None,
    artefact: Artefact | None = None,
    flow_run: str = "",
    reason: str = "",
    signer: str | None = None,
) -> CellOutcome:
    """The outcome of one cell run, with what its validation report measured: each kind's report says which of
    its measures are per-round ratios, which are accuracy, and its gates (``enginesmith.core.reports``). A report this
    version cannot read leaves them out, as does a measurement that is not a finite number."""
    metrics: dict[str, MetricSpread] = {}
    frontier: dict[str, MetricSpread] = {}
    accuracy: dict[str, float] = {}
    gates: list[GateVerdict] = []
    passed: bool | None = None
    parsed = parse_report(report)
    if parsed is not None and not isinstance(parsed, str):
        metrics = {name: MetricSpread(values=spread.values) for name, spread in parsed.round_metrics().items()
                   if spread.values and all(math.isfinite(v) for v in spread.values)}
        accuracy = {name: value for name, value in parsed.accuracy().items() if math.isfinite(value)}
        # A swept cell's profiles; an unswept one's single profile is its candidate, which the ratios follow already.
        frontier = frontier_metrics([p for p in serving_profiles_of(parsed) if p.name != DEFAULT_PROFILE])
        gates = [GateVerdict.model_validate(gate.model_dump()) for gate in parsed.gates
                 if gate.decision != "abandoned"]  # a gate the verdict did not wait for has no verdict of its own
        passed = parsed.passed
    lineage = artefact.lineage if artefact is not None else None
    return CellOutcome(
        model=model, cell=cell, recipe=recipe, target=target, kind=kind, status=status, key=key, recorded=now(),
        flow_run=flow_run, commit_sha=lineage.commit_sha if lineage else "",
        calibration_sha256=lineage.calibration_sha256 if lineage else None,
        versions=dict(artefact.versions) if artefact is not None else {}, metrics=metrics, frontier=frontier,
        accuracy=accuracy, gates=gates, passed=passed, reason=reason, signer=signer,
    )


FRONTIER_THROUGHPUT, FRONTIER_TPOT = "tok/s", "p95 TPOT ms"


def frontier_metrics(profiles: list[ServingProfile]) -> dict[str, MetricSpread]:
    """Each profile's output throughput and p95 TPOT per concurrency, per round: what history follows of a frontier."""
    found: dict[str, MetricSpread] = {}
    for profile in profiles:
        for level in profile.levels:
            for name, spread in ((FRONTIER_THROUGHPUT, level.output_throughput), (FRONTIER_TPOT, level.tpot_p95_ms)):
                if spread is not None and spread.values and all(math.isfinite(v) for v in spread.values):
                    found[f"{profile.name}@c={level.concurrency} {name}"] = MetricSpread(values=spread.values)
    return found


def manifest_cell_id(manifest: Manifest) -> str:
    """The plan's cell id of a published artefact: as its report names it, else (reports that name none: every
    LLM report before they did) as an LLM cell of its model, recipe, target, parallelism and kind is named."""
    parsed = parse_report(manifest.validation)
    if parsed is not None and not isinstance(parsed, str) and parsed.cell:
        return parsed.cell
    artefact = manifest.artefact
    return cell_id(manifest.model, manifest.recipe, artefact.target, artefact.tp, artefact.pp, artefact.kind)


def outcome_from_manifest(manifest: Manifest) -> CellOutcome:
    """A published artefact as a build of its cell (for manifests no outcome record mentions), recorded at its
    publication."""
    artefact = manifest.artefact
    outcome = outcome_from_report(model=manifest.model, cell=manifest_cell_id(manifest), recipe=manifest.recipe,
                                  target=artefact.target, kind=artefact.kind, key=manifest.key, status="built",
                                  report=manifest.validation, artefact=artefact)
    return outcome.model_copy(update={"recorded": manifest.published,
                                      "signer": manifest.signature.signer if manifest.signature else None})


# --- regressions -------------------------------------------------------------------------------------


def find_regressions(before: CellOutcome, after: CellOutcome, against: str, against_key: str) -> list[Regression]:
    """What got worse from ``before`` to ``after``.

    A metric of ``HIGHER_IS_BETTER`` measured by both in at least ``MIN_ROUNDS_FOR_SPREAD`` rounds is flagged when its
    median moved the worse way by more than ``before.half_range + after.half_range``: a move inside the two spreads
    is no difference (the validation gates read their margins the same way). Where either side has fewer rounds its
    spread says nothing (one round has half range 0), so the metric is flagged only when it moved the worse way by
    more than ``SINGLE_ROUND_TOLERANCE`` (10 %) of the earlier median, and by more than the spreads there are. The
    serving frontier's throughput and p95 TPOT per profile and concurrency are flagged alike
    (``frontier <profile>@c=<n> tok/s``). A task score (``accuracy``) is flagged as ``accuracy:<task>`` when it
    dropped by more than ``accuracy_drop_tolerance(task)``: one point, half a point for a cosine (``min_cosine``).
    """
    found = []
    for metric, higher_is_better in HIGHER_IS_BETTER.items():
        old, new = before.metrics.get(metric), after.metrics.get(metric)
        if old is None or new is None:
            continue
        worse_by = (old.median - new.median) if higher_is_better else (new.median - old.median)
        if worse_by > _allowed_move(old, new):
            found.append(Regression(metric=metric, against=against, against_key=against_key, before=old.median,
                                    after=new.median))
    for metric, old in before.frontier.items():
        new = after.frontier.get(metric)
        if new is None:
            continue
        worse_by = (old.median - new.median) if metric.endswith(FRONTIER_THROUGHPUT) else (new.median - old.median)
        if worse_by > _allowed_move(old, new):
            found.append(Regression(metric=f"frontier {metric}", against=against, against_key=against_key,
                                    before=old.median, after=new.median))
    for task, old_score in before.accuracy.items():
        new_score = after.accuracy.get(task)
        if new_score is not None and old_score - new_score > accuracy_drop_tolerance(task):
            found.append(Regression(metric=f"accuracy:{task}", against=against, against_key=against_key,
                                    before=old_score, after=new_score))
    return found


def _allowed_move(old: MetricSpread, new: MetricSpread) -> float:
    """How far a metric may move the worse way and be no difference: its two spreads together, and where either
    was measured in one round, at least ``SINGLE_ROUND_TOLERANCE`` of the earlier median."""
    allowed = old.half_range + new.half_range
    if min(len(old.values), len(new.values)) < MIN_ROUNDS_FOR_SPREAD:
        allowed = max(allowed, SINGLE_ROUND_TOLERANCE * abs(old.median))
    return allowed


def accuracy_drop_tolerance(task: str) -> float:
    """How far ``task``'s score may drop before it is a regression: ``COSINE_DROP_TOLERANCE`` for a cosine to the
    reference (a key naming a cosine, e.g. ``min_cosine``), ``ACCURACY_DROP_TOLERANCE`` for any other score."""
    return COSINE_DROP_TOLERANCE if "cosine" in task else ACCURACY_DROP_TOLERANCE


def version_changes(previous: CellOutcome | None, outcome: CellOutcome) -> dict[str, tuple[str | None, str | None]]:
    """Toolchain versions that differ between two builds: name → (before, after); ``None`` where one lacks it.
    Empty when there is no previous build or either build has no versions recorded (a failure before the build)."""
    if previous is None or not previous.versions or not outcome.versions:
        return {}
    names = sorted(set(previous.versions) | set(outcome.versions))
    return {name: (previous.versions.get(name), outcome.versions.get(name)) for name in names
            if previous.versions.get(name) != outcome.versions.get(name)}


def _has_measurements(outcome: CellOutcome) -> bool:
    return bool(outcome.metrics or outcome.accuracy)


# --- reading -----------------------------------------------------------------------------------------

HistoryRecord = CellOutcome | ChannelMove


def parse_record(body: bytes, model: str) -> HistoryRecord:
    """A stored history record; raises ``IntegrityError`` saying what is wrong with it."""
    try:
        raw = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise IntegrityError(f"not valid JSON ({exc})", where="history record") from None
    if not isinstance(raw, dict):
        raise IntegrityError("not a JSON object", where="history record")
    version = raw.get("schema_version")
    if isinstance(version, int) and version > HISTORY_SCHEMA_VERSION:
        raise IntegrityError(f"history schema {version} is newer than this enginesmith reads "
                             f"({HISTORY_SCHEMA_VERSION})", where="history record", hint="upgrade enginesmith")
    kinds: dict[str, type[CellOutcome] | type[ChannelMove]] = {"cell-outcome": CellOutcome,
                                                               "channel-move": ChannelMove}
    record_type = kinds.get(str(raw.get("record")))
    if record_type is None:
        raise IntegrityError(f"unknown record type {raw.get('record')!r}", where="history record")
    try:
        record: HistoryRecord = record_type.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "(document)"
        raise IntegrityError(f"{field}: {first['msg']}", where="history record") from None
    if record.model != model:
        raise IntegrityError(f"the record is of {record.model}, but it is stored under {model}",
                             where="history record")
    return record


def _read_records(store: RegistryStore, model: str, entries: list[str]
                  ) -> list[tuple[str, HistoryRecord | UnreadableRecord]]:
    def read(entry: str) -> tuple[str, HistoryRecord | UnreadableRecord | None]:
        try:
            body = store.read_history(model, entry)
            return entry, None if body is None else parse_record(body, model)
        except IntegrityError as exc:
            return entry, UnreadableRecord(entry=entry, problem=exc.message)

    with ThreadPoolExecutor(READ_THREADS) as pool:
        loaded = list(pool.map(read, entries))
    return [(entry, record) for entry, record in loaded if record is not None]  # None: deleted since the listing


def previous_outcome(store: RegistryStore, model: str, cell: str, *, excluding_flow_run: str = ""
                     ) -> CellOutcome | None:
    """The newest recorded outcome of ``cell`` that measured something (for "vs last night"), or ``None``.

    Reads only that cell's records (their entry names start with its hash); unreadable ones are skipped, and so
    are those of ``excluding_flow_run`` (the run asking).
    """
    prefix = cell_entry_prefix(cell)
    entries = [entry for entry in store.list_history(model) if entry.startswith(prefix)]
    outcomes = [record for _, record in _read_records(store, model, entries)
                if isinstance(record, CellOutcome) and record.cell == cell and _has_measurements(record)
                and not (excluding_flow_run and record.flow_run == excluding_flow_run)]
    return max(outcomes, key=_recorded_order, default=None)


def _recorded_order(outcome: CellOutcome | ChannelMove) -> tuple[float, str]:
    try:
        return parse_timestamp(outcome.recorded).timestamp(), outcome.recorded
    except ValueError:
        return 0.0, outcome.recorded


def load_history(store: RegistryStore, model: str, *, recipe: str | None = None, target: str | None = None,
                 kind: str | None = None) -> ModelHistory:
    """Every build of ``model``'s cells (optionally of one recipe, target or kind), oldest first, joined with the
    published manifests, with channels and regressions; and the channel moves, oldest first.

    A manifest that no outcome names by key appears as a build read from its own report. Each build that measured
    something is compared with the previous build of its cell that did (``against="previous"``) and, where it is
    newer than a channel's build of the cell and that build is not the previous one (compared with already), with
    that build (``against="channel:<name>"``). A record that cannot be read is listed in ``unreadable``, never
    raised.
    """
    entries = [entry for entry in store.list_history(model)
               if not entry.startswith((STATEMENT_ENTRY_PREFIX, WITHDRAWAL_ENTRY_PREFIX, REFERENCE_ENTRY_PREFIX))]
    loaded = _read_records(store, model, entries)
    listing = list_model(store, model)
    outcomes = [record for _, record in loaded if isinstance(record, CellOutcome)]
    moves = sorted((record for _, record in loaded if isinstance(record, ChannelMove)), key=_recorded_order)
    unreadable = [record for _, record in loaded if isinstance(record, UnreadableRecord)]
    recorded_keys = {outcome.key for outcome in outcomes if outcome.key}
    manifests = {m.key: m for m in listing.manifests}
    outcomes = [_with_lineage(outcome, manifests.get(outcome.key)) for outcome in outcomes]
    outcomes += [outcome_from_manifest(m) for m in listing.manifests if m.key not in recorded_keys]
    published = set(manifests)

    def wanted(outcome: CellOutcome) -> bool:
        return ((recipe is None or outcome.recipe == recipe) and (target is None or outcome.target == target)
                and (kind is None or outcome.kind == kind))

    by_cell: dict[str, list[CellOutcome]] = {}
    for outcome in filter(wanted, outcomes):
        by_cell.setdefault(outcome.cell, []).append(outcome)
    cells = [_cell_history(model, cell, sorted(cell_outcomes, key=_recorded_order), published, listing.channels)
             for cell, cell_outcomes in sorted(by_cell.items())]
    return ModelHistory(model=model, cells=cells, channel_moves=moves, channels=listing.channels,
                        unreadable=unreadable)


def _with_lineage(outcome: CellOutcome, manifest: Manifest | None) -> CellOutcome:
    """``outcome`` with the source commit and toolchain of its published artefact where it recorded none."""
    if manifest is None or (outcome.commit_sha and outcome.versions):
        return outcome
    lineage = manifest.artefact.lineage
    return outcome.model_copy(update={
        "commit_sha": outcome.commit_sha or lineage.commit_sha,
        "calibration_sha256": outcome.calibration_sha256 or lineage.calibration_sha256,
        "versions": outcome.versions or dict(manifest.artefact.versions),
    })


def _cell_history(model: str, cell: str, outcomes: list[CellOutcome], published: set[str],
                  channels: dict[str, str]) -> CellHistory:
    builds = [BuildEntry(outcome=outcome, published=bool(outcome.key) and outcome.key in published,
                         channels=sorted(c for c, key in channels.items() if outcome.key and key == outcome.key))
              for outcome in outcomes]
    # A channel's build of this cell: the newest build under its key that measured something.
    channel_builds: dict[str, int] = {}
    for channel, key in sorted(channels.items()):
        under_key = [i for i, build in enumerate(builds) if build.outcome.key == key
                     and _has_measurements(build.outcome)]
        if under_key:
            channel_builds[channel] = under_key[-1]
    previous: int | None = None
    for index, build in enumerate(builds):
        if not _has_measurements(build.outcome):
            continue
        if previous is not None:
            before = builds[previous].outcome
            build.regressions += find_regressions(before, build.outcome, "previous", before.key)
        previous_key = builds[previous].outcome.key if previous is not None else None
        for channel, at in channel_builds.items():
            # An older build is not a candidate to replace the channel's: comparing it would flag only progress. A
            # channel on the previous build was compared with just above: the same regression is not flagged twice.
            if at < index and builds[at].outcome.key not in (build.outcome.key, previous_key):
                before = builds[at].outcome
                build.regressions += find_regressions(before, build.outcome, f"channel:{channel}", before.key)
        previous = index
    first = outcomes[0]
    return CellHistory(model=model, cell=cell, recipe=first.recipe, target=first.target, kind=first.kind,
                       builds=builds)
