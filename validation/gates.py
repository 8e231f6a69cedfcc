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
) -> list[GateResult]:
    """Throughput ratio ≥ min, TPOT ratio ≤ max, each task's accuracy drop ≤ the recipe's limit, no failed
    requests. A measure that could not be taken fails its gate (never passes silently)."""
    results = [
        GateResult(name="min_throughput_ratio", measured=throughput_ratio, limit=gates.min_throughput_ratio,
                   passed=throughput_ratio is not None and throughput_ratio >= gates.min_throughput_ratio,
                   detail="candidate max output throughput / reference's"),
        GateResult(name="max_tpot_ratio", measured=tpot_ratio, limit=gates.max_tpot_ratio,
                   passed=tpot_ratio is not None and tpot_ratio <= gates.max_tpot_ratio,
                   detail="candidate median TPOT at concurrency 1 / reference's"),
        GateResult(name="failed_requests", measured=float(failed_requests), limit=0.0, passed=failed_requests == 0,
                   detail="requests that failed on either side"),
    ]
    limit = gates.max_drop_for(recipe_id)
    for task, drop in sorted(accuracy_drops_points.items()):
        results.append(GateResult(name=f"accuracy_drop:{task}", measured=drop, limit=limit, passed=drop <= limit,
                                  detail=f"reference − candidate, points; limit for {recipe_id}"))
    return results
