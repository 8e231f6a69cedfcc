"""Accuracy judged in blocks (validation.sequential_accuracy): its bounds against cases worked by hand, its last look
against today's gate, and its error budget in simulation. Pure: no server, no network."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import beta

from enginesmith.core.specs import GateSpec
from validation.gates import evaluate_gates
from validation.sequential_accuracy import (
    AccuracyLook,
    clopper_pearson,
    drop_bounds,
    first_decided_look,
    judge_accuracy_look,
    plan_blocks,
)

Pairs = list[tuple[bool, bool]]


def paired_answers(reference_only: int, candidate_only: int, both_right: int, both_wrong: int) -> Pairs:
    return ([(True, False)] * reference_only + [(False, True)] * candidate_only + [(True, True)] * both_right
            + [(False, False)] * both_wrong)


def judge_in_blocks(pairs: Pairs, limit_points: float, error_budget: float = 0.05) -> AccuracyLook:
    """Ask block after block until a look decides, as the validation stage will."""
    blocks = plan_blocks(len(pairs))
    for look, block in enumerate(blocks, start=1):
        judged = judge_accuracy_look(pairs[:block.stop], limit_points, look=look, looks=len(blocks),
                                     error_budget=error_budget)
        if judged.decision != "undecided":
            return judged
    raise AssertionError("the last look always decides")


def test_a_task_is_planned_in_blocks_of_64_with_the_remainder_last():
    assert [len(block) for block in plan_blocks(281)] == [64, 64, 64, 64, 25]
    assert plan_blocks(281)[-1] == range(256, 281)
    assert plan_blocks(128) == [range(0, 64), range(64, 128)]
    assert plan_blocks(10) == [range(0, 10)]
    assert plan_blocks(10, block_questions=4) == [range(0, 4), range(4, 8), range(8, 10)]
    for questions, block_questions in ((0, 64), (10, 0)):
        with pytest.raises(ValueError):
            plan_blocks(questions, block_questions)


def test_clopper_pearson_matches_its_closed_forms_and_the_beta_quantiles():
    # 0 of n: P(X = 0) = (1 − p)ⁿ = α/2 gives the upper bound 1 − (α/2)^(1/n); n of n mirrors it.
    assert clopper_pearson(0, 10, 0.05) == (0.0, pytest.approx(1 - 0.025 ** (1 / 10)))
    assert clopper_pearson(10, 10, 0.05) == (pytest.approx(0.025 ** (1 / 10)), 1.0)
    # 1 of 2: P(X ≥ 1) = 1 − (1 − p)² = α/2 and P(X ≤ 1) = 1 − p² = α/2.
    low, high = clopper_pearson(1, 2, 0.1)
    assert (low, high) == (pytest.approx(1 - math.sqrt(0.95)), pytest.approx(math.sqrt(0.95)))
    # No trial says nothing.
    assert clopper_pearson(0, 0, 0.05) == (0.0, 1.0)
    low, high = clopper_pearson(7, 40, 0.01)
    assert low == pytest.approx(beta.ppf(0.005, 7, 34)) and high == pytest.approx(beta.ppf(0.995, 8, 33))
    with pytest.raises(ValueError):
        clopper_pearson(3, 2, 0.05)


def test_identical_answers_bound_the_drop_by_the_discordance_bound_on_0_of_n():
    """No discordant pair: p is unconstrained, so the drop lies within ±q's upper bound. Look 2 of 5 at budget 0.05
    spends 0.01; q's interval gets 0.005, 0.0025 a tail: 1 − 0.0025^(1/128) = 1 − e^(−5.99146/128) = 0.045730, so
    ±4.573 points, inside a 5-point limit. After 64 questions: 1 − 0.0025^(1/64) = 0.089368, ±8.937 points."""
    pairs = paired_answers(0, 0, both_right=90, both_wrong=38)
    judged = judge_accuracy_look(pairs, 5.0, look=2, looks=5, error_budget=0.05)
    assert judged.bound_high_points == pytest.approx(100 * (1 - 0.0025 ** (1 / 128)))
    assert judged.bound_high_points == pytest.approx(4.5730, abs=1e-4)
    assert judged.bound_low_points == pytest.approx(-4.5730, abs=1e-4)
    assert (judged.decision, judged.on_point_estimate, judged.drop_points) == ("pass", False, 0.0)
    first = judge_accuracy_look(pairs[:64], 5.0, look=1, looks=5, error_budget=0.05)
    assert first.bound_high_points == pytest.approx(8.9368, abs=1e-4)
    assert first.decision == "undecided"
    assert "64 questions" in first.detail and "undecided" in first.detail


def test_a_candidate_wrong_on_every_question_fails_on_its_lower_bound():
    """10 questions, all reference-only right (b = 10, c = 0), look 1 of 2 at budget 0.1: share 0.05. p from 10 of 10
    at 0.05: p ≥ 0.025^(1/10) = 0.691503; q from 10 of 10 at 0.025: q ≥ 0.0125^(1/10) = 0.645195. Lower bound
    (2·0.691503 − 1)·0.645195 = 0.247113: 24.71 points, above a 20-point limit; the upper bound is 1·1, 100 points."""
    judged = judge_accuracy_look(paired_answers(10, 0, 0, 0), 20.0, look=1, looks=2, error_budget=0.1)
    assert judged.bound_low_points == pytest.approx(100 * (2 * 0.025 ** 0.1 - 1) * 0.0125 ** 0.1)
    assert judged.bound_low_points == pytest.approx(24.7113, abs=1e-4)
    assert judged.bound_high_points == pytest.approx(100.0)
    assert (judged.decision, judged.drop_points, judged.reference_only_right) == ("fail", 100.0, 10)


def test_a_candidate_right_where_the_reference_is_wrong_passes_a_zero_limit():
    """The mirror of the case above (b = 0, c = 10): p ≤ 1 − 0.691503 = 0.308497, and with 2p − 1 < 0 the upper
    bound takes q's lower bound: (2·0.308497 − 1)·0.645195 = −24.71 points, at most a limit of 0."""
    judged = judge_accuracy_look(paired_answers(0, 10, 0, 0), 0.0, look=1, looks=2, error_budget=0.1)
    assert judged.bound_high_points == pytest.approx(-24.7113, abs=1e-4)
    assert judged.bound_low_points == pytest.approx(-100.0)
    assert (judged.decision, judged.candidate_only_right) == ("pass", 10)


def test_the_bounds_always_hold_the_point_estimate():
    rng = np.random.default_rng(7)
    for _ in range(200):
        questions = int(rng.integers(1, 300))
        discordant = int(rng.integers(0, questions + 1))
        reference_only = int(rng.integers(0, discordant + 1))
        low, high = drop_bounds(reference_only, discordant - reference_only, questions, 0.01)
        drop = (2 * reference_only - discordant) / questions
        assert -1 <= low <= drop <= high <= 1


def test_the_last_look_decides_as_todays_gate_does():
    """All questions asked: the verdict is the point estimate's, as ``evaluate_gates`` gives it for the same scores
    (the stage computes a drop as 100 × (reference score − candidate score)), float rounding included: 90 against 85
    right of 100 is 5.000000000000004 points, over a 5-point limit today, and here."""
    rng = np.random.default_rng(11)
    cases: list[tuple[Pairs, str]] = [(paired_answers(5, 0, 85, 10), "int4-awq"), (paired_answers(1, 0, 99, 0), "fp8")]
    for _ in range(300):
        questions = int(rng.integers(1, 200))
        reference = rng.random(questions) < rng.random()
        candidate = np.where(rng.random(questions) < rng.random() * 0.2, ~reference, reference)
        cases.append((list(zip(reference.tolist(), candidate.tolist(), strict=True)),
                      str(rng.choice(["int4-awq", "fp8", "bf16", "nvfp4"]))))
    gates = GateSpec()
    for pairs, recipe in cases:
        reference_score = sum(r for r, _ in pairs) / len(pairs)
        candidate_score = sum(c for _, c in pairs) / len(pairs)
        results = evaluate_gates(gates, recipe, throughput_ratio=None, tpot_ratio=None, failed_requests=0,
                                 accuracy_drops_points={"task": 100 * (reference_score - candidate_score)})
        today = next(result for result in results if result.name == "accuracy_drop:task")
        judged = judge_accuracy_look(pairs, gates.max_drop_for(recipe), look=3, looks=3, error_budget=0.05)
        assert (judged.decision == "pass") == today.passed
        assert judged.drop_points == today.measured
        assert judged.on_point_estimate == (judged.bound_low_points <= judged.limit_points < judged.bound_high_points)
    boundary = judge_accuracy_look(cases[0][0], 5.0, look=1, looks=1, error_budget=0.05)
    assert (boundary.decision, boundary.on_point_estimate) == ("fail", True)
    assert "point estimate decided" in boundary.detail


def test_a_task_at_the_limit_is_decided_by_the_bounds_within_the_error_budget():
    """The true drop at the 5-point limit, once with rare discordance (the candidate loses 5 % of the questions and
    wins none) and once with common (it loses 20 % and wins 15 %): 281 questions in five blocks, budget 0.05. A
    verdict the bounds decide is on the wrong side of the limit just above it (a pass) or just below (a fail): each
    must come in at most 5 % of runs, with a Monte-Carlo margin of three standard errors. The last look's point
    estimate passes about half of them, outside the budget, as today's gate does on every run."""
    rng = np.random.default_rng(63)
    tasks, questions, error_budget = 1500, 281, 0.05
    margin = 3 * math.sqrt(error_budget * (1 - error_budget) / tasks)
    for reference_only_rate, candidate_only_rate in ((0.05, 0.0), (0.20, 0.15)):
        draws = rng.random((tasks, questions))
        reference_right = (draws < reference_only_rate) | (draws >= reference_only_rate + candidate_only_rate) & (
            rng.random((tasks, questions)) < 0.7)
        candidate_right = np.where(draws < reference_only_rate + candidate_only_rate, ~reference_right, reference_right)
        verdicts = [judge_in_blocks(list(zip(reference.tolist(), candidate.tolist(), strict=True)), 5.0, error_budget)
                    for reference, candidate in zip(reference_right, candidate_right, strict=True)]
        passed_by_bounds = sum(v.decision == "pass" and not v.on_point_estimate for v in verdicts) / tasks
        failed_by_bounds = sum(v.decision == "fail" and not v.on_point_estimate for v in verdicts) / tasks
        assert passed_by_bounds <= error_budget + margin, (reference_only_rate, passed_by_bounds)
        assert failed_by_bounds <= error_budget + margin, (reference_only_rate, failed_by_bounds)
        assert 0.3 < sum(v.on_point_estimate and v.decision == "pass" for v in verdicts) / tasks < 0.7


def test_a_candidate_answering_as_the_reference_passes_before_the_last_block():
    """281 questions at a 5-point limit, every answer the reference's: decided at look 2 of 5, after 128 questions
    (±4.573 points, worked above), not after 281."""
    judged = judge_in_blocks(paired_answers(0, 0, both_right=200, both_wrong=81), 5.0)
    assert (judged.decision, judged.look, judged.questions, judged.on_point_estimate) == ("pass", 2, 128, False)


def test_a_negative_limit_asks_the_candidate_to_gain_and_is_judged_like_any_other():
    """A gate may ask a candidate to gain points (tests/test_flows.py sets fp8's limit to -100, which no build can
    meet): answers like the reference's fail it clear at the first look."""
    judged = judge_accuracy_look(paired_answers(0, 0, both_right=40, both_wrong=24), -100.0, look=1, looks=5,
                                 error_budget=0.05)
    assert (judged.decision, judged.on_point_estimate) == ("fail", False) and judged.bound_low_points > -100


def test_what_cannot_be_judged_is_refused():
    pairs = paired_answers(1, 1, 1, 1)
    with pytest.raises(ValueError, match="no question"):
        judge_accuracy_look([], 5.0, look=1, looks=1, error_budget=0.05)
    with pytest.raises(ValueError, match="a number of points"):
        judge_accuracy_look(pairs, float("nan"), look=1, looks=1, error_budget=0.05)
    with pytest.raises(ValueError, match="outside the planned looks"):
        judge_accuracy_look(pairs, 5.0, look=3, looks=2, error_budget=0.05)
    with pytest.raises(ValueError, match="error budget"):
        judge_accuracy_look(pairs, 5.0, look=1, looks=1, error_budget=0.0)


def test_a_look_over_the_first_answers_is_planned_over_the_whole_task():
    """The reference has answered 128 of 281 questions and the candidate 192: the look is taken after the second
    block (the most both answered), with its share of the budget for five planned looks, as it would be with every
    answer in; the same answers give the same look."""
    everything = [True] * 200 + [False] * 81
    judged = first_decided_look(everything[:128], everything[:192], 5.0, error_budget=0.05, questions=281)
    whole = first_decided_look(everything, everything[:192], 5.0, error_budget=0.05)
    assert (judged.look, judged.looks, judged.questions, judged.task_questions) == (2, 5, 128, 281)
    assert judged == whole
    with pytest.raises(ValueError, match="of a task of 281"):
        first_decided_look([*everything, True], everything, 5.0, error_budget=0.05, questions=281)
    with pytest.raises(ValueError, match="fewer than the first block"):
        first_decided_look(everything[:10], everything, 5.0, error_budget=0.05, questions=281)


def test_the_candidates_look_waits_for_the_reference_to_have_answered_as_many():
    """The reference's answers as they come (validation.stage.AnswersSoFar): a look after 2 questions is given the
    answers once the reference has 2, not before; a reference that stops answering releases the look with what
    there is."""
    import threading

    from validation.stage import AnswersSoFar

    given = AnswersSoFar()
    seen: list[dict[str, list[bool]]] = []
    looking = threading.Thread(target=lambda: seen.append(given.first(["facts/enginesmith"], 2)))
    looking.start()
    given.extend({"facts/enginesmith": [True]})
    looking.join(0.2)
    assert looking.is_alive() and not seen
    given.extend({"facts/enginesmith": [False]})
    looking.join(60)
    assert seen == [{"facts/enginesmith": [True, False]}]
    stopped = threading.Thread(target=lambda: seen.append(given.first(["facts/enginesmith"], 64)))
    stopped.start()
    given.close()
    stopped.join(60)
    assert not stopped.is_alive() and seen[-1] == {"facts/enginesmith": [True, False]}
    assert AnswersSoFar({"k": [True]}).first(["k"], 64) == {"k": [True]}  # cached: all there, none coming
