"""Accuracy judged in blocks of questions (#63): a task's paired drop, decided as soon as its bounds clear the limit.

Both sides answer the same questions, so each question is a pair (reference right?, candidate right?). Only the
discordant pairs move the drop: b questions the reference got right and the candidate wrong, c the other way. Over
n questions the drop is (b − c) / n, in points × 100: the same number as today's gate, reference score minus
candidate score.

The bounds are exact (they rest on no normal approximation) and conservative. Write q for the true share of
discordant questions and p for the chance that a discordant question is one the reference got right; the true drop
is δ = (2p − 1)·q. Given m = b + c, b ~ Binomial(m, p), and m ~ Binomial(n, q). At each look this module takes a
Clopper–Pearson interval for p (from b of m) and one for q (from m of n), and bounds δ by its least and greatest
value over that rectangle. The look's share of the error budget, error_budget / looks (split evenly over the planned
looks: Bonferroni), goes half to each tail of p's interval and half to q's (a quarter to each of its tails). A pass
is wrong only if δ > limit ≥ the upper bound, which needs p above its upper bound or q outside its interval: a
chance of at most the look's share. A wrong fail likewise, below the lower bound. Over all looks, the chance of a
verdict on the wrong side of the limit is at most ``error_budget``: the semantics of ``workload.error_budget`` for the
performance gates (``validation.gates``).

q is bounded rather than taken as m / n: treating the observed discordance as the true one passes a candidate whose
true drop sits at the limit in about half the runs when discordance is rare (b and c small), because a low draw of m
shrinks the interval as well as the drop. With no discordant pair, p is unconstrained and δ lies within ±q's upper
bound, the Clopper–Pearson bound on 0 of n.

At the last look every question has been asked, and the point estimate decides exactly as today's gate does, so a
full run never decides differently from today; where the bounds had not decided, the look says so
(``on_point_estimate``): that verdict is outside the error budget.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel
from scipy.special import betaincinv

from enginesmith.core.tasks import ACCURACY_BLOCK_QUESTIONS

DEFAULT_BLOCK_QUESTIONS = ACCURACY_BLOCK_QUESTIONS

AccuracyDecision = Literal["pass", "fail", "undecided"]


class AccuracyLook(BaseModel):
    """One look at a task's paired accuracy drop: what had been asked, the drop with its bounds, and the decision."""

    look: int  # 1-based, after the look-th block
    looks: int  # planned: one after each block
    questions: int  # asked of both sides so far: how many questions decided the task, once decided
    reference_only_right: int  # b: the reference right, the candidate wrong
    candidate_only_right: int  # c: the candidate right, the reference wrong
    drop_points: float  # reference score − candidate score, × 100, as today's gate computes it
    bound_low_points: float
    bound_high_points: float
    limit_points: float
    error_budget: float  # over all planned looks; each look spends error_budget / looks
    decision: AccuracyDecision
    on_point_estimate: bool  # the last look, its bounds undecided: the point estimate decided, outside the budget
    detail: str
    task_questions: int | None = None  # the task's, where the look was taken over a whole plan (first_decided_look)


def plan_blocks(questions: int, block_questions: int = DEFAULT_BLOCK_QUESTIONS) -> list[range]:
    """The blocks a task of ``questions`` questions is asked in, as ranges of question indices: ``block_questions``
    each, the last block the remainder. One look follows each block.

    Raises ValueError when either count is below 1.
    """
    if questions < 1:
        raise ValueError(f"a task needs at least one question to be planned in blocks, not {questions}")
    if block_questions < 1:
        raise ValueError(f"a block needs at least one question, not {block_questions}")
    return [range(start, min(start + block_questions, questions)) for start in range(0, questions, block_questions)]


def clopper_pearson(successes: int, trials: int, alpha: float) -> tuple[float, float]:
    """The two-sided Clopper–Pearson interval for a binomial proportion, alpha / 2 in each tail: the beta quantiles
    B(alpha / 2; k, n − k + 1) and B(1 − alpha / 2; k + 1, n − k), with 0 at k = 0 and 1 at k = n. No trial: (0, 1).

    The quantiles are ``scipy.special.betaincinv``, the function ``scipy.stats.beta.ppf`` wraps, at a fortieth of
    its cost a call."""
    if not 0 <= successes <= trials:
        raise ValueError(f"successes ({successes}) must lie between 0 and trials ({trials})")
    if trials == 0:
        return 0.0, 1.0
    low = 0.0 if successes == 0 else float(betaincinv(successes, trials - successes + 1, alpha / 2))
    high = 1.0 if successes == trials else float(betaincinv(successes + 1, trials - successes, 1 - alpha / 2))
    return low, high


def drop_bounds(reference_only_right: int, candidate_only_right: int, questions: int,
                alpha: float) -> tuple[float, float]:
    """Bounds on the true drop (a fraction, not points) after ``questions`` paired questions, each holding with
    probability at least 1 − ``alpha``: δ = (2p − 1)·q over the rectangle of p's interval (at ``alpha``) and q's (at
    ``alpha`` / 2). See the module's docstring."""
    discordant = reference_only_right + candidate_only_right
    p_low, p_high = clopper_pearson(reference_only_right, discordant, alpha)
    q_low, q_high = clopper_pearson(discordant, questions, alpha / 2)
    # (2p − 1)·q is increasing in p; in q it rises where 2p − 1 > 0 and falls where it is negative.
    high = (2 * p_high - 1) * (q_high if p_high >= 0.5 else q_low)
    low = (2 * p_low - 1) * (q_low if p_low >= 0.5 else q_high)
    return low, high


def judge_accuracy_look(pairs: Sequence[tuple[bool, bool]], limit_points: float, *, look: int, looks: int,
                        error_budget: float) -> AccuracyLook:
    """Decide a task's accuracy gate after ``look`` of ``looks`` planned blocks, from the (reference correct,
    candidate correct) pair of every question asked so far: ``pass`` when the drop's upper bound is at most
    ``limit_points``, ``fail`` when its lower bound is above it, ``undecided`` otherwise (ask the next block). At the
    last look the point estimate decides, as today's gate does.

    Raises ValueError for no question, a limit that is not a finite number (a negative one asks the candidate to
    gain), a look outside 1..looks, or a budget outside (0, 1).
    """
    if not pairs:
        raise ValueError("no question has been asked: a look needs at least one answered pair")
    if not math.isfinite(limit_points):
        raise ValueError(f"the accuracy drop limit must be a number of points, not {limit_points}")
    if not 1 <= look <= looks:
        raise ValueError(f"look {look} lies outside the planned looks 1..{looks}")
    if not 0 < error_budget < 1:
        raise ValueError(f"the error budget must lie strictly between 0 and 1, not {error_budget}")
    questions = len(pairs)
    reference_only = sum(reference and not candidate for reference, candidate in pairs)
    candidate_only = sum(candidate and not reference for reference, candidate in pairs)
    # The same arithmetic as the validation stage's drop (scores first), so the last look reproduces its verdict.
    reference_score = sum(reference for reference, _ in pairs) / questions
    candidate_score = sum(candidate for _, candidate in pairs) / questions
    drop_points = 100 * (reference_score - candidate_score)
    share = error_budget / looks
    low, high = drop_bounds(reference_only, candidate_only, questions, share)
    low_points, high_points = 100 * low, 100 * high
    by_bounds: AccuracyDecision = ("pass" if high_points <= limit_points else
                                   "fail" if low_points > limit_points else "undecided")
    final = look == looks
    on_point_estimate = final and by_bounds == "undecided"
    # At the last look the point estimate decides even where the bounds agree with it, so that no float rounding
    # between the two computations can part a full run's verdict from today's.
    decision: AccuracyDecision = ("pass" if drop_points <= limit_points else "fail") if final else by_bounds
    if on_point_estimate:
        how = "the bounds did not clear the limit by the last look, so the point estimate decided (outside the budget)"
    elif decision == "undecided":
        how = f"the bounds at {share:.3g} hold the limit: ask the next block"
    else:
        how = f"decided by the bounds at {share:.3g} (error budget {error_budget:g} / {looks} looks)"
    detail = (f"look {look}/{looks} after {questions} questions: reference-only right {reference_only}, "
              f"candidate-only right {candidate_only}; drop {drop_points:.2f} points, bounds {low_points:.2f} to "
              f"{high_points:.2f}, limit {limit_points:g}: {decision}, {how}")
    return AccuracyLook(look=look, looks=looks, questions=questions, reference_only_right=reference_only,
                        candidate_only_right=candidate_only, drop_points=drop_points, bound_low_points=low_points,
                        bound_high_points=high_points, limit_points=limit_points, error_budget=error_budget,
                        decision=decision, on_point_estimate=on_point_estimate, detail=detail)


def first_decided_look(reference: Sequence[bool], candidate: Sequence[bool], limit_points: float, *,
                       error_budget: float, block_questions: int = DEFAULT_BLOCK_QUESTIONS,
                       questions: int | None = None) -> AccuracyLook:
    """The looks of a task of ``questions`` questions (default: as many as the reference answered) whose
    ``reference`` and ``candidate`` each answered the first ones (correct or not, in question order), taken after
    each block both completed: the first decided look, else the last one taken (``undecided``: ask the next block).
    The looks are planned over the whole task, however much of it has been answered.

    A function of the answers alone, so a candidate that was asked more than the look needed (its side was scored
    before the reference's answers were known) is judged exactly as one asked block by block.

    Raises ValueError when either side answered more questions than the task has, or when no block was answered by
    both.
    """
    total = len(reference) if questions is None else questions
    if len(candidate) > total or len(reference) > total:
        raise ValueError(f"the candidate answered {len(candidate)} questions and the reference {len(reference)}, "
                         f"of a task of {total}")
    blocks = plan_blocks(total, block_questions)
    taken: AccuracyLook | None = None
    for look, block in enumerate(blocks, start=1):
        if block.stop > min(len(candidate), len(reference)):
            break
        pairs = list(zip(reference[:block.stop], candidate[:block.stop], strict=True))
        taken = judge_accuracy_look(pairs, limit_points, look=look, looks=len(blocks), error_budget=error_budget)
        taken = taken.model_copy(update={"task_questions": total})
        if taken.decision != "undecided":
            return taken
    if taken is None:
        raise ValueError(f"the candidate answered {len(candidate)} questions and the reference {len(reference)}: "
                         f"one of them fewer than the first block ({blocks[0].stop})")
    return taken
