"""Kill a real ``enginesmith publish`` or ``pull`` at random bytes of its traffic, many times, then let it finish,
counting what crossed the network (``tests.killing_proxy``): the slow test and ``bench/registry_kill_resume.py``
share it.

Each run is SIGKILLed when the bytes it has sent (publish) or received (pull) through the proxy cross an offset drawn
uniformly from [64 KiB, 1.5 × total / kills): the kills spread over the whole transfer and land wherever the byte
falls (inside a part, a chunk, a request's headers). After ``kills`` runs were killed, one more runs to the end.
"""

from __future__ import annotations

import random
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.killing_proxy import Direction, KillingProxy
from tests.registry_helpers import start_cli

MIN_KILL_OFFSET = 64 * 1024
RUN_TIMEOUT_S = 900  # a safety net only: each run ends when the proxy kills it or it finishes


@dataclass
class KillReport:
    total_bytes: int  # the artefact's
    direction: Direction
    per_run: list[int] = field(default_factory=list)  # bytes relayed in that direction, per run (the last finished)
    kill_offsets: list[int] = field(default_factory=list)

    @property
    def kills(self) -> int:
        return len(self.kill_offsets)

    @property
    def relayed(self) -> int:
        return sum(self.per_run)

    @property
    def ratio(self) -> float:
        return self.relayed / self.total_bytes

    @property
    def waste_per_kill(self) -> float:
        return (self.relayed - self.total_bytes) / max(1, self.kills)


def kill_and_resume(args: list[str], *, env: dict[str, str], proxy: KillingProxy, direction: Direction,
                    total_bytes: int, kills: int, rng: random.Random, log_dir: Path) -> KillReport:
    """Run ``enginesmith ARGS`` until ``kills`` runs were killed mid-transfer, then once to completion; raises
    ``AssertionError`` with the log when a run fails other than by the kill."""
    report = KillReport(total_bytes=total_bytes, direction=direction)
    log_dir.mkdir(parents=True, exist_ok=True)
    upper = max(MIN_KILL_OFFSET + 1, int(1.5 * total_bytes / kills))
    run = 0
    while True:
        run += 1
        log = log_dir / f"run-{run}.log"
        before = proxy.received[direction]
        process = start_cli(*args, env=env, log=log)
        offset = rng.randrange(MIN_KILL_OFFSET, upper) if report.kills < kills else None
        fired = proxy.arm(process.pid, direction, offset) if offset is not None else None
        try:
            code = process.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            tail = log.read_text()[-3000:]
            raise AssertionError(f"run {run} did not end within {RUN_TIMEOUT_S} s:\n{tail}") from None
        finally:
            proxy.disarm()
        report.per_run.append(proxy.received[direction] - before)
        if fired is not None and fired.is_set() and code == -signal.SIGKILL:
            assert offset is not None
            report.kill_offsets.append(offset)
            continue
        assert code == 0, f"run {run} exited {code}:\n{log.read_text()[-3000:]}"
        return report
