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

import statistics
from typing import Literal

from pydantic import BaseModel, computed_field

from registry.manifest import utc_timestamp

HISTORY_SCHEMA_VERSION = 1

OutcomeStatus = Literal["built", "gate-failed", "failed", "no-worker"]
# The metrics a cell's history follows, and which way is better.
HIGHER_IS_BETTER: dict[str, bool] = {
    "throughput_ratio": True,   # candidate ÷ reference output tokens/s (LLM), embeddings/s (encoder)
    "tpot_ratio": False,        # candidate ÷ reference time per output token at concurrency 1
}


class MetricSpread(BaseModel):
    """One metric as the rounds measured it: every round's value; median and half range derived."""

    values: list[float]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def median(self) -> float:
        return float(statistics.median(self.values))

    @computed_field  # type: ignore[prop-decorator]
    @property
    def half_range(self) -> float:
        return (max(self.values) - min(self.values)) / 2


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
    accuracy: dict[str, float] = {}  # task → the candidate's score (0..1)
    gates: list[GateVerdict] = []
    passed: bool | None = None  # the gate verdict; None where validation never ran
    reason: str = ""


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
