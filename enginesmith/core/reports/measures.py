"""The measured quantities every validation report is made of: a quantity over rounds with its spread, one load
level, a gate's verdict, task scores and embedding agreement. Plain pydantic (no numpy): the registry, the
catalogue and ``enginesmith report`` read them on nodes without the validation extra."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, computed_field


class Spread(BaseModel):
    """One quantity measured once per round: its median over the rounds and how far the rounds spread.

    ``half_range`` is (max − min) / 2, in the quantity's unit; ``relative_half_range`` divides it by the median.
    A gate compares its margin (median − limit) with ``half_range``: a margin inside it is not a difference.
    """

    values: list[float]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def median(self) -> float:
        return float(statistics.median(self.values))

    @computed_field  # type: ignore[prop-decorator]
    @property
    def low(self) -> float:
        return min(self.values)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def high(self) -> float:
        return max(self.values)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def half_range(self) -> float:
        return (self.high - self.low) / 2

    @computed_field  # type: ignore[prop-decorator]
    @property
    def relative_half_range(self) -> float:
        return self.half_range / abs(self.median) if self.median else 0.0

    @classmethod
    def of(cls, values: Sequence[float | None]) -> Spread | None:
        """The spread of the rounds' values; None when any round has no value (the quantity was not measured)."""
        if not values or any(v is None for v in values):
            return None
        return cls(values=[float(v) for v in values if v is not None])


class BenchmarkResult(BaseModel):
    """One load level, field names as in `vllm bench serve --save-result` (times in ms, rates per second)."""

    concurrency: int | None
    request_rate: float | None
    duration: float
    completed: int
    failed: int
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    request_goodput: float | None
    output_throughput: float
    total_token_throughput: float
    max_output_tokens_per_s: float
    mean_ttft_ms: float
    median_ttft_ms: float
    std_ttft_ms: float
    mean_tpot_ms: float
    median_tpot_ms: float
    std_tpot_ms: float
    mean_itl_ms: float
    median_itl_ms: float
    std_itl_ms: float
    mean_e2el_ms: float
    median_e2el_ms: float
    std_e2el_ms: float
    percentiles_ms: dict[str, float]  # "p99_ttft_ms" → value, for ttft, tpot, itl, e2el
    # Ours, not vLLM's: requests of several tokens whose tokens all arrived at one instant (one SSE message,
    # or several in one read). A server whose HTTP side lags its engine sends what it holds at once; their
    # TPOT then reads 0 and says nothing about decoding speed.
    all_at_once_requests: int = 0
    ttfts: list[float] = []  # per completed request, in seconds (as vLLM's --save-detailed)
    # Per completed request too, in seconds, in the order of ``ttfts`` (a one-token request's TPOT is 0, as vLLM
    # counts it for goodput): goodput under any SLO is computed from them (enginesmith.core.reports.profiles).
    tpots: list[float] = []
    e2els: list[float] = []
    errors: list[str] = []
    # Ours: which measurement round this level belongs to, and the warm-up that preceded it (at the same
    # concurrency, in batches, until two batches' output throughputs agreed within the workload's tolerance).
    round: int = 0
    warmup_requests: int = 0
    warmup_s: float = 0.0
    warmup_steady: bool | None = None  # None: no warm-up asked for


# clear: the bounds lie wholly on one side of the limit; inside: undecided, measure more rounds;
# median: still undecided when no more rounds were allowed, decided on the median; not-judged: the measure cannot
# discriminate (an accuracy task the reference itself fails), so the gate's verdict is the config's choice.
# "abandoned": still undecided when another gate had failed clear, so the cell's verdict was final and measuring
# stopped (validation.stage; WorkloadSpec.complete_report measures on).
Decision = Literal["clear", "inside", "median", "not-judged", "abandoned"]


class GateResult(BaseModel):
    name: str
    measured: float | None  # the median over rounds, for performance gates
    limit: float
    passed: bool
    detail: str = ""
    low: float | None = None  # the rounds' lowest and highest values (performance gates)
    high: float | None = None
    rounds: int | None = None
    decision: Decision = "clear"
    # The interval the sequential test put around the ratio at this look (``DecisionRule``); None before it existed
    # and for gates measured once.
    bound_low: float | None = None
    bound_high: float | None = None
    # An accuracy gate judged in blocks of questions (validation.sequential_accuracy): the questions both sides had
    # answered when it was decided, of the task's; None for a whole task judged once, and in older reports.
    questions: int | None = None
    questions_total: int | None = None

    @property
    def verdict(self) -> str:
        """pass, FAIL (shown to fail), or not decided (re-measuring, or abandoned once another gate had failed)."""
        return "pass" if self.passed else "FAIL" if self.failed else "not decided"

    @property
    def failed(self) -> bool:
        """Shown to fail by its own measurement: not an undecided gate ("inside": more rounds to come) nor an
        abandoned one (it did not pass, but was never shown to fail)."""
        return not self.passed and self.decision not in ("inside", "abandoned")

    @property
    def decided_by(self) -> str:
        bounds = "" if self.bound_low is None or self.bound_high is None else \
            f" (bounds {self.bound_low:.3f}–{self.bound_high:.3f})"
        if self.questions is not None and self.decision in ("clear", "median"):
            of = "" if self.questions_total is None else f" of {self.questions_total}"
            if self.decision == "median":
                return f"limit inside the bounds after all {self.questions}{of} questions{bounds}: decided on the " \
                       "point estimate"
            return f"decided after {self.questions}{of} questions{bounds}"
        if self.decision == "inside":
            return f"limit inside the bounds{bounds}: re-measuring"
        if self.decision == "median":
            return f"limit inside the bounds after {self.rounds} rounds{bounds}: decided on the median"
        if self.decision == "abandoned":
            return f"not decided: the verdict had failed (after {self.rounds} rounds the limit was inside the " \
                   f"bounds{bounds})"
        if self.decision == "not-judged":
            return "not judged: the measure cannot discriminate (" + ("accepted by the config)" if self.passed else
                                                                     "the cell fails unless the config accepts it)")
        return f"clear of the bounds over {self.rounds} rounds{bounds}" if self.rounds else \
            "measured once (deterministic)"

    @property
    def spread_label(self) -> str:
        return "" if self.low is None or self.high is None else f"{self.low:.3f}–{self.high:.3f}"


class DecisionRule(BaseModel):
    """How the performance gates were decided: a sequential test on the per-round ratios, spent over a fixed
    number of looks. Kept in the report so a reader can check every verdict from the rounds' values."""

    error_budget: float  # per gate: the chance of a verdict on the wrong side of a limit, over all looks
    first_look: int  # rounds measured before the first look (workload.repeats)
    looks: int  # looks allowed: one after each round from first_look to workload.max_repeats
    round_noise: float  # σ of a ratio's log per round assumed beforehand, worth prior_rounds rounds
    prior_rounds: int

    @property
    def description(self) -> str:
        return (f"Sequential test per performance gate on the mean of the per-round log ratios: their variance is "
                f"pooled with a prior of {self.prior_rounds} rounds at σ = {self.round_noise:g}, and the gate is "
                f"decided once the one-sided Student-t bound at {self.error_budget:g} / {self.looks} (its share of "
                f"the error budget {self.error_budget:g}, spent evenly over {self.looks} looks, from round "
                f"{self.first_look} on) lies wholly on one side of the limit. A level no undecided gate depends on "
                f"is not measured again; a gate still undecided after the last look is decided on the median, and "
                f"says so. The budget holds while the rounds' own noise is at most σ = {self.round_noise:g} "
                f"(independent, normal per-round log ratios).")


class SideCost(BaseModel):
    """What one side spent on the verdict: requests sent, seconds of measurement, warm-up and accuracy, and the
    device time it held (GPU-seconds on a GPU target; None on the CPU)."""

    requests: int  # every request: measured, warm-up and accuracy
    measured_requests: int
    warmup_requests: int
    accuracy_requests: int  # 0 where the results came from the cache
    measure_s: float
    warmup_s: float
    accuracy_s: float
    accuracy_cached: bool = False
    held_s: float  # its server up (started to stopped)
    gpus: int = 0
    gpu_s: float | None = None  # held_s × gpus on a GPU target


class TaskScore(BaseModel):
    task: str
    metric: str
    value: float  # 0..1
    examples: int
    source: str  # "enginesmith" (our exact match over the API) or "lm-eval"


class Perplexity(BaseModel):
    """exp(mean negative log-likelihood) of a held-out text, from the server's own prompt logprobs."""

    text: str  # where the text came from
    value: float
    tokens: int  # tokens scored (each paragraph's first token has no logprob)
    paragraphs: int


class ServerCapabilities(BaseModel):
    """What a server has shown it accepts (probed, never assumed)."""

    vllm_extensions: bool  # ignore_eos and friends
    prompt_logprobs: bool  # echo + logprobs returns a logprob per prompt token
    detail: str = ""


class CosineAgreement(BaseModel):
    """cos(candidate_i, reference_i) over the same inputs."""

    inputs: int
    min_cosine: float
    mean_cosine: float


class RetrievalScore(BaseModel):
    k: int
    queries: int
    recall_at_k: float
    missed: list[str]  # query ids with no relevant document in the top k


class ThroughputLevel(BaseModel):
    side: str
    batch_size: int
    embeddings_per_s: Spread
    median_latency_ms: Spread


def fmt_value(value: float | None, spec: str = ".2f") -> str:
    return "—" if value is None else format(value, spec)


def fmt_spread(spread: Spread | None, spec: str = ".2f") -> str:
    """``median (min–max)``; a single round shows its value alone."""
    if spread is None:
        return "—"
    if len(spread.values) == 1:
        return format(spread.median, spec)
    return f"{spread.median:{spec}} ({spread.low:{spec}}–{spread.high:{spec}})"


def fmt_ratio(spread: Spread | None) -> str:
    """``median ±relative half-range``: the ratio with its noise beside it."""
    if spread is None:
        return "—"
    return f"{spread.median:.3f} ±{spread.relative_half_range:.1%}"


class Calibration(BaseModel):
    """Whether the speed ratios of a run where they should read 1.00 by construction (the cpu target, an A/A run)
    did: "ok" (1.00 inside every ratio's bounds), "off" (a harness fault: the placement, the load generator, a loaded
    machine; not the artefact's speed) or "not-judged" (too few rounds to put bounds around a ratio)."""

    status: Literal["ok", "off", "not-judged"]
    detail: str

    @property
    def headline(self) -> str:
        return {"ok": "calibration ok", "off": "calibration off", "not-judged": "calibration not judged"}[
            self.status] + f": {self.detail}"
