"""The spread every bench reports beside a median: the numbers its last (JSON) line carries."""

from __future__ import annotations

import statistics


def spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4), "max": round(max(values), 4)}
