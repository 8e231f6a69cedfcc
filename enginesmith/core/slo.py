"""Service-level objectives: the latency bounds a deployment asks of a server, written as
``ttft_p95<=500ms,tpot_p95<=40ms``. Pure.

A term bounds a latency metric (TTFT, TPOT or E2EL, as vLLM's benchmark defines them) at a percentile of the
requests. Two things are read from an SLO:
- whether a measured load level meets it: every term's percentile of that level's requests within its bound;
- its goodput, by vLLM's definition (``vllm bench serve --goodput``, from DistServe): the requests per second whose
  TTFT, TPOT and E2EL each lie within the bound given for that metric (a metric without a term is not bounded).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field

from enginesmith.core.errors import UserError

SloMetric = Literal["ttft", "tpot", "e2el"]
SLO_METRICS: tuple[SloMetric, ...] = ("ttft", "tpot", "e2el")
METRIC_LABELS: dict[str, str] = {"ttft": "TTFT", "tpot": "TPOT", "e2el": "E2EL"}
SLO_PERCENTILES = (50, 90, 95, 99)
_UNITS_MS = {"ms": 1.0, "s": 1000.0}
_TERM = re.compile(r"^(?P<metric>[a-z0-9]+)_(?P<stat>[a-z0-9.]+)\s*(?P<op>[<>=!]+)\s*(?P<value>[-+0-9.eE]+)\s*"
                   r"(?P<unit>[^\s0-9.]*)$")
EXAMPLE = "ttft_p95<=500ms,tpot_p95<=40ms"


class SloTerm(BaseModel):
    metric: SloMetric
    percentile: int = Field(description="of the level's requests, one of 50, 90, 95, 99")
    bound_ms: float = Field(gt=0)

    @property
    def label(self) -> str:
        """``p95 TTFT``"""
        return f"p{self.percentile} {METRIC_LABELS[self.metric]}"

    def __str__(self) -> str:
        return f"{self.metric}_p{self.percentile}<={self.bound_ms:g}ms"


class Slo(BaseModel):
    terms: list[SloTerm] = Field(min_length=1)

    def bound_ms(self, metric: str) -> float | None:
        return next((term.bound_ms for term in self.terms if term.metric == metric), None)

    def __str__(self) -> str:
        return ",".join(str(term) for term in self.terms)


def parse_slo(text: str, *, where: str = "--slo") -> Slo:
    """``ttft_p95<=500ms,tpot_p95<=40ms`` → ``Slo``. Raises ``UserError`` naming the term that is wrong: an unknown
    metric, percentile or unit, another comparison than ``<=``, a bound that is not positive, a metric twice."""
    pieces = [piece.strip() for piece in text.split(",")]
    if not text.strip() or any(not piece for piece in pieces):
        raise UserError(f"the SLO {text!r} has an empty term", where=where, hint=f"write terms like {EXAMPLE}")
    terms: list[SloTerm] = []
    for piece in pieces:
        term = _parse_term(piece, where)
        if any(seen.metric == term.metric for seen in terms):
            raise UserError(f"the SLO bounds {METRIC_LABELS[term.metric]} twice ({piece!r})", where=where,
                            hint="give each metric one term: goodput counts a request against one bound per metric")
        terms.append(term)
    return Slo(terms=terms)


def _parse_term(piece: str, where: str) -> SloTerm:
    match = _TERM.match(piece)
    if match is None:
        raise UserError(f"SLO term {piece!r} is not METRIC_pNN<=BOUND", where=where, hint=f"e.g. {EXAMPLE}")
    metric, stat, op, value, unit = (match[name] for name in ("metric", "stat", "op", "value", "unit"))
    if metric not in SLO_METRICS:
        raise UserError(f"SLO term {piece!r}: unknown metric {metric!r}", where=where,
                        hint=f"the metrics are {', '.join(SLO_METRICS)}")
    percentile = int(stat[1:]) if re.fullmatch(r"p\d+", stat) else None
    if percentile not in SLO_PERCENTILES:
        raise UserError(f"SLO term {piece!r}: unknown percentile {stat!r}", where=where,
                        hint=f"use one of {', '.join(f'p{p}' for p in SLO_PERCENTILES)}")
    if op != "<=":
        raise UserError(f"SLO term {piece!r}: {op!r} is not a bound", where=where,
                        hint="an SLO bounds a latency from above: write <=")
    if unit not in _UNITS_MS:
        raise UserError(f"SLO term {piece!r}: unknown unit {unit!r}" if unit else
                        f"SLO term {piece!r} has no unit", where=where, hint="give the bound in ms or s")
    try:
        bound = float(value)
    except ValueError:
        raise UserError(f"SLO term {piece!r}: {value!r} is not a number", where=where, hint=f"e.g. {EXAMPLE}") from None
    if not bound > 0:
        raise UserError(f"SLO term {piece!r}: the bound must be positive", where=where,
                        hint="a latency bound of zero or less can never be met")
    return SloTerm(metric=metric, percentile=percentile, bound_ms=bound * _UNITS_MS[unit])


def meets_bounds(ttft_s: float, tpot_s: float, e2el_s: float, slo: Slo) -> bool:
    """One request within every bound the SLO gives (vLLM's goodput test; a one-token request's TPOT is 0)."""
    for metric, value_s in (("ttft", ttft_s), ("tpot", tpot_s), ("e2el", e2el_s)):
        bound = slo.bound_ms(metric)
        if bound is not None and value_s * 1000 > bound:
            return False
    return True
