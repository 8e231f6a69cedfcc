"""The gate verdict: every gate with its measured value, its spread over the rounds, and its limit. Pure.

A performance gate knows its noise. Its ratio is the median of the per-round ratios (candidate / reference,
measured in the same round); the rounds' half-range is the noise. The gate passes when the median clears
the limit by more than the half-range, fails when it misses by more than the half-range, and otherwise is
*inside* the spread: the caller measures more rounds, and once no more are allowed the median decides.
"""

from __future__ import annotations

from typing import Literal

from enginesmith.reports.measures import Decision, GateResult, Spread
from enginesmith.specs import GateSpec

Judgement = Literal["pass", "fail", "inside"]


def judge(spread: Spread | None, limit: float, *, at_least: bool) -> Judgement:
    """``pass`` when the median clears ``limit`` by more than the half-range, ``fail`` when it misses by more,
    ``inside`` otherwise. A quantity that was not measured fails."""
    if spread is None:
        return "fail"
    margin = spread.median - limit if at_least else limit - spread.median
    if margin > spread.half_range or (margin >= 0 and spread.half_range == 0):
        return "pass"
    if margin < -spread.half_range:
        return "fail"
    return "inside"


def _performance_gate(name: str, spread: Spread | None, limit: float, *, at_least: bool, final: bool,
                      detail: str) -> GateResult:
    judgement = judge(spread, limit, at_least=at_least)
    if judgement == "inside" and final:
        assert spread is not None
        passed = spread.median >= limit if at_least else spread.median <= limit
        decision: Decision = "median"
    else:
        passed, decision = judgement == "pass", "inside" if judgement == "inside" else "clear"
    return GateResult(name=name, measured=spread.median if spread else None, limit=limit, passed=passed,
                      detail=detail, low=spread.low if spread else None, high=spread.high if spread else None,
                      rounds=len(spread.values) if spread else None, decision=decision)


def evaluate_gates(
    gates: GateSpec,
    recipe_id: str,
    *,
    throughput_ratio: Spread | None,
    tpot_ratio: Spread | None,
    accuracy_drops_points: dict[str, float],
    failed_requests: int,
    e2el_ratio: Spread | None = None,
    tpot_unobservable: str | None = None,
    perplexity_increase: float | None = None,
    final: bool = True,
) -> list[GateResult]:
    """Throughput ratio ≥ min, TPOT ratio ≤ max, each task's accuracy drop ≤ the recipe's limit, no failed
    requests. A measure that could not be taken fails its gate (never passes silently). With ``final`` false,
    a performance gate inside its spread comes back undecided (``decision == "inside"``).

    Where TPOT at concurrency 1 is not observable (``tpot_unobservable`` says why), the latency gate holds the
    median end-to-end latency at concurrency 1 to the same limit instead, and says so.
    """
    if tpot_unobservable is None:
        latency, latency_detail = tpot_ratio, "candidate median TPOT at concurrency 1 / reference's, per round"
    else:
        latency = e2el_ratio
        latency_detail = (f"TPOT at concurrency 1 not observable ({tpot_unobservable}); candidate median E2EL at "
                          "concurrency 1 / reference's, per round, instead")
    results = [
        _performance_gate("min_throughput_ratio", throughput_ratio, gates.min_throughput_ratio, at_least=True,
                          final=final, detail="candidate max output throughput / reference's, per round"),
        _performance_gate("max_tpot_ratio", latency, gates.max_tpot_ratio, at_least=False, final=final,
                          detail=latency_detail),
        GateResult(name="failed_requests", measured=float(failed_requests), limit=0.0, passed=failed_requests == 0,
                   detail="requests that failed on either side"),
    ]
    limit = gates.max_drop_for(recipe_id)
    for task, drop in sorted(accuracy_drops_points.items()):
        results.append(GateResult(name=f"accuracy_drop:{task}", measured=drop, limit=limit, passed=drop <= limit,
                                  detail=f"reference − candidate, points; limit for {recipe_id}"))
    if perplexity_increase is not None:
        limit = gates.max_perplexity_increase_for(recipe_id)
        results.append(GateResult(name="max_perplexity_increase", measured=perplexity_increase, limit=limit,
                                  passed=perplexity_increase <= limit,
                                  detail=f"candidate perplexity / reference's − 1 on the held-out text; limit for "
                                         f"{recipe_id}"))
    return results


def undecided(results: list[GateResult]) -> list[GateResult]:
    """The gates that want more rounds."""
    return [result for result in results if result.decision == "inside"]
