"""The gate verdict: every gate with its measured value, its spread over the rounds, and its limit. Pure.

A performance gate knows its noise, and is decided by a sequential test (``DecisionRule``). Its ratio is
taken per round (candidate / reference, measured in the same round); the report shows the median over rounds.
The test works on the per-round log ratios y₁…yₙ: their mean m, and a variance pooled from their own (n − 1
degrees of freedom) and a prior of ``PRIOR_ROUNDS`` rounds at the workload's ``round_noise``, so two rounds
that happen to agree cannot decide alone. With the Student-t quantile q at ``error_budget / looks`` (one-sided,
Bonferroni over the looks the rounds allow), the bounds are exp(m ∓ q·σ/√n). The gate passes when the bounds
lie wholly on the good side of the limit, fails when they lie wholly on the bad side, and otherwise is *inside*:
the caller measures another round, and after the last one the median decides (said so: that verdict is outside
the error budget). Whatever the true ratio, the chance that a gate is decided on the wrong side of its limit at
one of its looks is at most ``error_budget`` under the model (independent, normal per-round log ratios).
"""

from __future__ import annotations

import math
import statistics
from typing import Literal

from enginesmith.core.reports.measures import Calibration, Decision, DecisionRule, GateResult, Spread
from enginesmith.core.specs import GateSpec, WorkloadSpec
from validation.sequential_accuracy import AccuracyLook

Judgement = Literal["pass", "fail", "inside"]
PRIOR_ROUNDS = 4  # the prior noise counts as this many rounds' worth of evidence
DEFAULT_ERROR_BUDGET, DEFAULT_ROUND_NOISE = 0.05, 0.05
# A fixed set of rounds judged once (the encoders' speed gate): the default budget on a single look.
SINGLE_LOOK = DecisionRule(error_budget=DEFAULT_ERROR_BUDGET, first_look=1, looks=1,
                           round_noise=DEFAULT_ROUND_NOISE, prior_rounds=PRIOR_ROUNDS)


def decision_rule(workload: WorkloadSpec) -> DecisionRule:
    """The rule a workload's rounds are judged by: a look after every round from ``repeats`` to ``max_repeats``."""
    return DecisionRule(error_budget=workload.error_budget, first_look=workload.repeats,
                        looks=workload.max_repeats - workload.repeats + 1, round_noise=workload.round_noise,
                        prior_rounds=PRIOR_ROUNDS)


def student_t_cdf(t: float, dof: int) -> float:
    """P(T ≤ t) for Student's t with an integer ``dof`` ≥ 1 (Abramowitz & Stegun 26.7.3–4: finite sums)."""
    theta = math.atan(t / math.sqrt(dof))
    cos2 = math.cos(theta) ** 2
    if dof % 2 == 1:
        term, total = 1.0, 0.0
        if dof > 1:
            total = term = 1.0
            for k in range(3, dof - 1, 2):  # 1 + 2/3 cos² + (2·4)/(3·5) cos⁴ + …
                term *= (k - 1) / k * cos2
                total += term
        inner = 2 / math.pi * (theta + (math.sin(theta) * math.cos(theta) * total if dof > 1 else 0.0))
    else:
        term = total = 1.0
        for k in range(2, dof - 1, 2):  # 1 + 1/2 cos² + (1·3)/(2·4) cos⁴ + …
            term *= (k - 1) / k * cos2
            total += term
        inner = math.sin(theta) * total
    return (1 + inner) / 2


def student_t_quantile(p: float, dof: int) -> float:
    """The t with P(T ≤ t) = ``p`` (0.5 < p < 1), by bisection on ``student_t_cdf``."""
    low, high = 0.0, 1.0
    while student_t_cdf(high, dof) < p:
        high *= 2
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if student_t_cdf(middle, dof) < p else (low, middle)
    return (low + high) / 2


def bounds(spread: Spread, rule: DecisionRule) -> tuple[float, float]:
    """The ratio's lower and upper bound at this look: exp(m ∓ q·σ/√n) over the per-round log ratios."""
    logs = [math.log(max(value, 1e-12)) for value in spread.values]
    rounds = len(logs)
    mean = statistics.fmean(logs)
    own = statistics.variance(logs) * (rounds - 1) if rounds > 1 else 0.0
    dof = rule.prior_rounds + rounds - 1
    sigma = math.sqrt((rule.prior_rounds * rule.round_noise ** 2 + own) / dof)
    half_width = student_t_quantile(1 - rule.error_budget / rule.looks, dof) * sigma / math.sqrt(rounds)
    return math.exp(mean - half_width), math.exp(mean + half_width)


def judge(spread: Spread | None, limit: float, *, at_least: bool, rule: DecisionRule = SINGLE_LOOK) -> Judgement:
    """``pass`` when the bounds lie wholly on the good side of ``limit``, ``fail`` when wholly on the bad side,
    ``inside`` otherwise. A quantity that was not measured fails."""
    if spread is None:
        return "fail"
    low, high = bounds(spread, rule)
    good, bad = (low > limit, high < limit) if at_least else (high < limit, low > limit)
    return "pass" if good else "fail" if bad else "inside"


def _performance_gate(name: str, spread: Spread | None, limit: float, *, at_least: bool, final: bool,
                      detail: str, rule: DecisionRule = SINGLE_LOOK) -> GateResult:
    judgement = judge(spread, limit, at_least=at_least, rule=rule)
    if judgement == "inside" and final:
        assert spread is not None
        passed = spread.median >= limit if at_least else spread.median <= limit
        decision: Decision = "median"
    else:
        passed, decision = judgement == "pass", "inside" if judgement == "inside" else "clear"
    low, high = bounds(spread, rule) if spread is not None else (None, None)
    return GateResult(name=name, measured=spread.median if spread else None, limit=limit, passed=passed,
                      detail=detail, low=spread.low if spread else None, high=spread.high if spread else None,
                      rounds=len(spread.values) if spread else None, decision=decision, bound_low=low,
                      bound_high=high)


def evaluate_gates(
    gates: GateSpec,
    recipe_id: str,
    *,
    throughput_ratio: Spread | None,
    tpot_ratio: Spread | None,
    accuracy_drops_points: dict[str, float],
    failed_requests: int,
    reference_accuracy: dict[str, float] | None = None,
    accuracy_looks: dict[str, AccuracyLook] | None = None,
    greedy_agreement: float | None = None,
    e2el_ratio: Spread | None = None,
    tpot_unobservable: str | None = None,
    perplexity_increase: float | None = None,
    goodput_ratio: Spread | None = None,
    slo: str | None = None,
    final: bool = True,
    rule: DecisionRule = SINGLE_LOOK,
) -> list[GateResult]:
    """Throughput ratio ≥ min, TPOT ratio ≤ max, goodput ratio ≥ min (where the gates ask for it), each task's
    accuracy drop ≤ the recipe's limit, no failed requests. A measure that could not be taken fails its gate (never
    passes silently). With ``final`` false, a performance gate whose bounds (``rule``) hold its limit comes back
    undecided (``decision == "inside"``).

    Where TPOT at concurrency 1 is not observable (``tpot_unobservable`` says why), the latency gate holds the
    median end-to-end latency at concurrency 1 to the same limit instead, and says so.

    A task with a look in ``accuracy_looks`` (its key's; asked in blocks, ``validation.sequential_accuracy``) is
    judged by it: its drop over the questions that decided it, the bounds and how many questions that was. A task
    the reference itself scores below ``gates.min_reference_accuracy`` is not judged either way.
    """
    if tpot_unobservable is None:
        latency, latency_detail = tpot_ratio, "candidate median TPOT at concurrency 1 / reference's, per round"
    else:
        latency = e2el_ratio
        latency_detail = (f"TPOT at concurrency 1 not observable ({tpot_unobservable}); candidate median E2EL at "
                          "concurrency 1 / reference's, per round, instead")
    results = [
        _performance_gate("min_throughput_ratio", throughput_ratio, gates.min_throughput_ratio, at_least=True,
                          final=final, detail="candidate max output throughput / reference's, per round", rule=rule),
        _performance_gate("max_tpot_ratio", latency, gates.max_tpot_ratio, at_least=False, final=final,
                          detail=latency_detail, rule=rule),
        GateResult(name="failed_requests", measured=float(failed_requests), limit=0.0, passed=failed_requests == 0,
                   detail="requests that failed on either side"),
    ]
    if gates.min_goodput_ratio is not None:
        results.insert(2, _performance_gate(
            "min_goodput_ratio", goodput_ratio, gates.min_goodput_ratio, at_least=True, final=final, rule=rule,
            detail=f"candidate's most goodput over the levels (requests/s within {slo}) / reference's, per round"))
    limit = gates.max_drop_for(recipe_id)
    for task, drop in sorted(accuracy_drops_points.items()):
        reference = (reference_accuracy or {}).get(task)
        look = (accuracy_looks or {}).get(task)
        asked = {} if look is None else {"questions": look.questions, "questions_total": look.task_questions}
        if look is not None:
            drop = look.drop_points
        if reference is not None and reference < gates.min_reference_accuracy:
            results.append(GateResult(
                name=f"accuracy_drop:{task}", measured=drop, limit=limit, passed=gates.accept_unjudged_accuracy,
                decision="not-judged", **asked,
                detail=f"not judged: the reference scores {reference:.1%} on it, below gates.min_reference_accuracy "
                       f"{gates.min_reference_accuracy:.0%}, so the task cannot tell a broken candidate from a good "
                       "one (check the task's prompts and scoring for this model, or set "
                       "gates.accept_unjudged_accuracy)"))
            continue
        if look is not None:
            results.append(GateResult(
                name=f"accuracy_drop:{task}", measured=drop, limit=limit, passed=look.decision == "pass",
                decision="median" if look.on_point_estimate else "clear", bound_low=look.bound_low_points,
                bound_high=look.bound_high_points, **asked,
                detail=f"reference − candidate, points, over the questions both answered; limit for {recipe_id}; "
                       f"{look.detail}"))
            continue
        results.append(GateResult(name=f"accuracy_drop:{task}", measured=drop, limit=limit, passed=drop <= limit,
                                  detail=f"reference − candidate, points; limit for {recipe_id}"))
    if greedy_agreement is not None:
        floor = gates.min_greedy_agreement_for(recipe_id)
        results.append(GateResult(name="min_greedy_agreement", measured=greedy_agreement, limit=floor,
                                  passed=greedy_agreement >= floor,
                                  detail=f"share of prompts whose first greedy tokens match the BF16 reference's; "
                                         f"floor for {recipe_id}"))
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


def check_calibration(ratios: dict[str, Spread | None], rule: DecisionRule) -> Calibration:
    """For ratios that should read 1.00 by construction: is 1.00 inside the bounds the sequential test puts around
    each at its last look? Outside: a harness fault. One round puts no bounds around a ratio: not judged."""
    measured = {name: spread for name, spread in ratios.items() if spread is not None}
    if not measured:
        return Calibration(status="not-judged", detail="no speed ratio was measured")
    if any(len(spread.values) < 2 for spread in measured.values()):
        return Calibration(status="not-judged", detail="one round puts no bounds around a ratio (workload.repeats 1)")
    parts, off = [], False
    for name, spread in measured.items():
        low, high = bounds(spread, rule)
        parts.append(f"{name} {spread.median:.2f}, bounds {low:.2f}–{high:.2f}")
        off = off or not low <= 1.0 <= high
    return Calibration(status="off" if off else "ok", detail="; ".join(parts))
