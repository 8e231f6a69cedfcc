"""A GPU cell's optional calibration round (``workload.calibration_rounds``): after the verdict, the reference served
again where the candidate ran and measured against itself, an A/A run whose speed ratios must read 1.00.

On the cpu target every run checks its own calibration (both sides run the same BF16 kernels); on a GPU the
candidate's ratios are the artefact's speed, so only a run of the reference against itself tells the harness's error
there (the two sides' GPUs, the load generator, the node). It costs another server start and these rounds on both
sides' GPUs, which the report states.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from enginesmith.core.reports.measures import Calibration
from enginesmith.core.specs import GateSpec, WorkloadSpec
from validation.gates import check_calibration, decision_rule
from validation.stage import ServerSide, validate


@dataclass(frozen=True)
class CalibrationRound:
    calibration: Calibration
    note: str


def measure_calibration(twin: ServerSide, reference: ServerSide, *, workload: WorkloadSpec, target_id: str,
                        tokenizer_dir: Path, out_dir: Path, health_timeout_s: float = 600,
                        reference_accuracy_cache: Path | None = None,
                        keep_servers_up: bool = True) -> CalibrationRound:
    """``twin``: the reference's recipe placed on the candidate's devices. Measured against ``reference`` for
    exactly ``workload.calibration_rounds`` interleaved rounds at the workload's levels (no accuracy tasks: the
    reference's are cached, the twin's would repeat them)."""
    rounds = workload.calibration_rounds
    aa_workload = workload.model_copy(update={
        "repeats": rounds, "max_repeats": rounds, "accuracy_tasks": [], "perplexity_text": None, "baselines": [],
        "complete_report": True})
    report = validate(replace(twin, role="candidate"), replace(reference, role="reference"), workload=aa_workload,
                      gates=GateSpec(), recipe_id="bf16", target_id=target_id, tokenizer_dir=tokenizer_dir,
                      out_dir=out_dir, health_timeout_s=health_timeout_s,
                      reference_accuracy_cache=reference_accuracy_cache, keep_servers_up=keep_servers_up)
    comparison = report.comparison
    calibration = check_calibration({"throughput": comparison.throughput_ratios, "TPOT": comparison.tpot_ratios},
                                    decision_rule(aa_workload))
    gpu_s = sum(side.cost.gpu_s or 0.0 for side in (comparison.candidate, comparison.reference) if side.cost)
    note = (f"Calibration round (workload.calibration_rounds: {rounds}): the reference served again on the "
            f"candidate's devices and measured against itself in {comparison.rounds} rounds: "
            f"{calibration.headline}. It cost {report.verdict_s:.0f} s"
            + (f" and {gpu_s:.0f} GPU-seconds" if gpu_s else "") + ".")
    return CalibrationRound(calibration=calibration, note=note)
