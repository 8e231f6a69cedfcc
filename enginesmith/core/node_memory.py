"""This node's memory, shared by every enginesmith process on it. A run reserves what the memory model says its
servers will hold before it starts them, and waits while the reservations of other runs would take the node past
its budget. Preflight sums what one run holds at once; two runs on one node (a process worker running two cells, two
nightlies on one host) are each told they fit, and without a ledger the kernel's out-of-memory killer picks one of
their servers.

The ledger is a directory of one JSON file per reservation, read and written under a file lock. A reservation whose
process is gone (killed, crashed) is dropped by the next reader, so nothing stays reserved for a dead run.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel

from enginesmith.core.errors import UserError
from enginesmith.core.locks import exclusive

log = logging.getLogger(__name__)
GIB = 1024**3
LEDGER_ENV = "ENGINESMITH_MEMORY_LEDGER"  # the ledger's directory; default: <tmp>/enginesmith-<uid>-memory
BUDGET_ENV = "ENGINESMITH_NODE_MEMORY_GIB"  # what enginesmith's servers may hold in all on this node
# Of the node's memory, what the ledger hands out: the rest is for what it does not count (the pipeline's own
# processes, a quantisation, the Prefect worker, other services on the node).
BUDGET_FRACTION = 0.8
POLL_S = 1.0


class Reservation(BaseModel):
    """Memory a process holds for what it started: its pid and that process's start time (a pid is reused)."""

    pid: int
    started: int  # /proc/<pid>/stat field 22, in clock ticks since boot
    bytes: int
    what: str


def admissible(held: list[Reservation], wanted: int, budget: int) -> bool:
    """May ``wanted`` bytes be reserved beside ``held``? Alone it always may: whether it fits the node at all is
    preflight's verdict, and waiting could not change it."""
    return not held or sum(reservation.bytes for reservation in held) + wanted <= budget


def budget_bytes() -> int | None:
    """The ledger's budget: ``ENGINESMITH_NODE_MEMORY_GIB``, else ``BUDGET_FRACTION`` of the node's memory; None
    where the node's memory cannot be read (not Linux): nothing is held back."""
    configured = os.environ.get(BUDGET_ENV)
    if configured:
        try:
            gib = float(configured)
        except ValueError:
            gib = -1.0
        if gib <= 0:
            raise UserError(f"{BUDGET_ENV}={configured!r} is not a positive number of GiB", where=BUDGET_ENV,
                            hint="set it to what enginesmith's servers may hold in all on this node, e.g. 20")
        return int(gib * GIB)
    total = _meminfo_bytes("MemTotal")
    return None if total is None else int(total * BUDGET_FRACTION)


def ledger_dir() -> Path:
    configured = os.environ.get(LEDGER_ENV)
    if configured:
        return Path(configured)
    return Path(tempfile.gettempdir()) / f"enginesmith-{os.getuid()}-memory"


@contextmanager
def reserved(wanted: int, what: str) -> Iterator[None]:
    """Hold ``wanted`` bytes of this node's ledger for the block; wait (saying for what, once) while other
    processes' reservations leave too little of the budget. Nothing is held back where there is no budget."""
    budget = budget_bytes()
    if budget is None or wanted <= 0:
        yield
        return
    directory = ledger_dir()
    directory.mkdir(parents=True, exist_ok=True)
    mine = Reservation(pid=os.getpid(), started=_start_time(os.getpid()) or 0, bytes=wanted, what=what)
    path = directory / f"{mine.pid}-{uuid.uuid4().hex}.json"
    told = False
    while True:
        with exclusive(directory / ".lock"):
            held = _live_reservations(directory)
            if admissible(held, wanted, budget):
                path.write_text(mine.model_dump_json())
                break
        if not told:
            told = True
            log.warning("waiting for %.2f GiB of this node's memory for %s: %s hold %.2f of the %.2f GiB budget "
                        "(%s)", wanted / GIB, what, _describe(held), sum(r.bytes for r in held) / GIB, budget / GIB,
                        BUDGET_ENV)
        time.sleep(POLL_S)
    if told:
        log.warning("reserved %.2f GiB of this node's memory for %s", wanted / GIB, what)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


def _describe(held: list[Reservation]) -> str:
    shown = ", ".join(f"{r.what} (pid {r.pid}, {r.bytes / GIB:.2f} GiB)" for r in held[:4])
    return shown + (f" and {len(held) - 4} more" if len(held) > 4 else "")


def _live_reservations(directory: Path) -> list[Reservation]:
    """The ledger's reservations whose process still runs; the others' files are removed (called under the lock)."""
    live = []
    for path in sorted(directory.glob("*.json")):
        try:
            reservation = Reservation.model_validate(json.loads(path.read_text()))
        except (OSError, ValueError):
            path.unlink(missing_ok=True)  # a torn or foreign file: it reserves nothing
            continue
        if _start_time(reservation.pid) == reservation.started:
            live.append(reservation)
        else:
            path.unlink(missing_ok=True)
    return live


def _start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), or None if no such process runs."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after the command name, which may hold spaces
    return None if fields[0] == "Z" else int(fields[19])


def _meminfo_bytes(field: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            name, _, value = line.partition(":")
            if name == field:
                return int(value.split()[0]) * 1024
    except OSError:
        return None
    return None
