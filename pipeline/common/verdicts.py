"""What the preflight decides about each planned cell, whatever its kind: ``ready``; ``invalid`` (it breaks a plan
rule and is never built); or ``blocked`` (it would be built and fail), with every check and its detail."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

CellStatus = Literal["ready", "invalid", "blocked"]


class Check(BaseModel):
    name: str
    ok: bool | None  # None: skipped, and ``detail`` says why
    detail: str
    bytes_needed: int | None = None  # a memory check's estimate per device, as ``detail`` states it in GiB


class CellPreflight(BaseModel):
    id: str
    key: str
    status: CellStatus
    checks: list[Check]

    @property
    def reasons(self) -> list[str]:
        return [f"{c.name}: {c.detail}" for c in self.checks if c.ok is False]


def verdict(cell_id: str, key: str, checks: list[Check], *, invalid: bool) -> CellPreflight:
    """The cell's status from its checks: invalid where it breaks a plan rule, blocked where any check failed."""
    status: CellStatus = "invalid" if invalid else ("blocked" if any(c.ok is False for c in checks) else "ready")
    return CellPreflight(id=cell_id, key=key, status=status, checks=checks)
