"""The gate verdict: every gate with its measured value and limit. Pure."""

from __future__ import annotations

from pydantic import BaseModel

from enginesmith.specs import GateSpec


class GateResult(BaseModel):
    name: str
    measured: float | None
    limit: float
    passed: bool
    detail: str = ""


def evaluate_gates(
    gates: GateSpec,
    recipe_id: str,
    *,
    throughput_ratio: float | None,
    tpot_ratio: float | None,
    accuracy_drops_points: dict[str, float],
    failed_requests: int,
    e2el_ratio: float | None = None,
    tpot_unobservable: str | None = None,
) -> list[GateResult]:
    """Throughput ratio ≥ min, TPOT ratio ≤ max, each task's accuracy drop ≤ the recipe's limit, no failed
    requests. A measure that could not be taken fails its gate (never passes silently).

    Where TPOT at concurrency 1 is not observable (``tpot_unobservable`` says why), the latency gate holds the
    median end-to-end latency at concurrency 1 to the same limit instead, and says so.
    """
    if tpot_unobservable is None:
        latency, latency_detail = tpot_ratio, "candidate median TPOT at concurrency 1 / reference's"
    else:
        latency = e2el_ratio
        latency_detail = (f"TPOT at concurrency 1 not observable ({tpot_unobservable}); candidate median E2EL at "
                          "concurrency 1 / reference's instead")
    results = [
        GateResult(name="min_throughput_ratio", measured=throughput_ratio, limit=gates.min_throughput_ratio,
                   passed=throughput_ratio is not None and throughput_ratio >= gates.min_throughput_ratio,
                   detail="candidate max output throughput / reference's"),
        GateResult(name="max_tpot_ratio", measured=latency, limit=gates.max_tpot_ratio,
                   passed=latency is not None and latency <= gates.max_tpot_ratio, detail=latency_detail),
        GateResult(name="failed_requests", measured=float(failed_requests), limit=0.0, passed=failed_requests == 0,
                   detail="requests that failed on either side"),
    ]
    limit = gates.max_drop_for(recipe_id)
    for task, drop in sorted(accuracy_drops_points.items()):
        results.append(GateResult(name=f"accuracy_drop:{task}", measured=drop, limit=limit, passed=drop <= limit,
                                  detail=f"reference − candidate, points; limit for {recipe_id}"))
    return results
