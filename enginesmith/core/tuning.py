"""The serving sweep a cell gets once it has passed its gates (a config's ``tuning:`` section, #33): which knobs each
serve runtime has (the catalogue's ``serving_knobs.yaml``), the grid of points a section asks for, and what the plan
refuses in a section before any time is spent. Pure."""

from __future__ import annotations

from itertools import product
from typing import Literal

from pydantic import BaseModel, Field

from enginesmith.core.specs import StrictModel, TargetSpec, TuningSpec, WorkloadSpec

KNOBS_FILE = "serving_knobs.yaml"


class KnobSpec(StrictModel):
    """One serving knob of a runtime: the flag it sets and the values it takes."""

    flag: str = Field(pattern=r"^--[a-z][a-z0-9_-]*$")
    type: Literal["int", "str"] = "int"
    choices: list[str] | None = None  # str knobs: the values the runtime accepts
    min_sm: int | None = None  # a value other than the first choice needs this SM at least
    description: str = ""


class ServingKnobs(StrictModel):
    """``serving_knobs.yaml``: serve runtime → knob → its spec."""

    runtimes: dict[str, dict[str, KnobSpec]]


class TuningPoint(BaseModel):
    """One combination of knob values: a serving profile to measure."""

    name: str  # "max_num_seqs=4", or "max_num_seqs=4,max_num_batched_tokens=512"
    knobs: dict[str, int | str]
    args: list[str]  # the flags it sets on the candidate's serve command


def tuning_points(tuning: TuningSpec, knobs: dict[str, KnobSpec]) -> list[TuningPoint]:
    """Every combination of the section's values, in its order, as flags of the runtime whose ``knobs`` are given."""
    names = list(tuning.knobs)
    points = []
    for values in product(*(tuning.knobs[name] for name in names)):
        chosen = dict(zip(names, values, strict=True))
        args = [word for name, value in chosen.items() for word in (knobs[name].flag, str(value))]
        points.append(TuningPoint(name=",".join(f"{name}={value}" for name, value in chosen.items()), knobs=chosen,
                                  args=args))
    return points


def tuning_levels(tuning: TuningSpec, workload: WorkloadSpec) -> tuple[list[int], float, int]:
    """The concurrencies, minimum seconds and minimum requests each profile is measured with per round."""
    return (list(tuning.concurrency or workload.concurrency),
            workload.min_duration_s if tuning.min_duration_s is None else tuning.min_duration_s,
            workload.min_requests if tuning.min_requests is None else tuning.min_requests)


def tuning_problems(tuning: TuningSpec, runtime: str, catalogue: ServingKnobs, target: TargetSpec,
                    workload: WorkloadSpec) -> list[str]:
    """Why the section cannot be swept for a cell served by ``runtime`` on ``target``: a knob the runtime does not
    have, a value it does not take, a budget too small for one round of the sweep. Empty: it can."""
    known = catalogue.runtimes.get(runtime, {})
    problems = []
    for name, values in tuning.knobs.items():
        spec = known.get(name)
        if spec is None:
            has = ", ".join(known) or "none"
            problems.append(f"tuning.knobs.{name}: {runtime} has no serving knob {name!r} (it has: {has})")
            continue
        for value in values:
            problem = _value_problem(name, spec, value, target)
            if problem:
                problems.append(problem)
    if problems:
        return problems
    levels, min_duration_s, _ = tuning_levels(tuning, workload)
    points = len(tuning_points(tuning, known))
    round_s = points * len(levels) * min_duration_s
    if tuning.budget_s < round_s:
        problems.append(f"tuning.budget_s: {tuning.budget_s:g} s is less than one round of the sweep ({points} "
                        f"profiles × {len(levels)} levels × {min_duration_s:g} s = {round_s:g} s of measuring)")
    return problems


def _value_problem(name: str, spec: KnobSpec, value: int | str, target: TargetSpec) -> str | None:
    where = f"tuning.knobs.{name}"
    if spec.type == "int":
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            return f"{where}: {value!r} is not a positive whole number"
        return None
    if spec.choices is not None and value not in spec.choices:
        return f"{where}: {value!r} is not one of {', '.join(spec.choices)}"
    if spec.min_sm is not None and spec.choices and value != spec.choices[0]:
        sm = target.sm
        if sm is None or sm < spec.min_sm:
            return (f"{where}: {value!r} needs SM {spec.min_sm // 10}.{spec.min_sm % 10} or newer; {target.id} "
                    f"{'is the cpu' if sm is None else f'is SM {sm // 10}.{sm % 10}'}")
    return None
