"""The node's memory ledger: two runs on one node (two cells on a process worker, two nightlies on one host) reserve
their servers' memory before starting them, and the second waits while both would not fit, instead of the kernel's
out-of-memory killer taking one of their servers (the slow tier met it: a Gemma validation killed beside a SmolLM2
tuning sweep, its cell retried)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from enginesmith.core import node_memory
from enginesmith.core.errors import UserError
from enginesmith.core.node_memory import GIB, Reservation, admissible

# Reserves ARGV[1] GiB for "ARGV[2]", says so, and holds it until a line arrives on stdin.
HOLD = """
import logging, sys
from enginesmith.core.node_memory import GIB, reserved
logging.basicConfig(level=logging.WARNING, format="%(message)s")
with reserved(int(float(sys.argv[1]) * GIB), sys.argv[2]):
    print("holding", flush=True)
    sys.stdin.readline()
print("released", flush=True)
"""


def _held(*sizes_gib: float) -> list[Reservation]:
    return [Reservation(pid=1, started=1, bytes=int(size * GIB), what="x") for size in sizes_gib]


def test_a_reservation_is_admitted_while_the_ledger_holds_room_for_it():
    budget = 10 * GIB
    assert admissible(_held(), 6 * GIB, budget)
    assert admissible(_held(4), 6 * GIB, budget)
    assert not admissible(_held(4, 1), 6 * GIB, budget)
    assert admissible(_held(), 12 * GIB, budget), "alone it is preflight's question whether it fits, not the ledger's"


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    env = {node_memory.LEDGER_ENV: str(tmp_path / "ledger"), node_memory.BUDGET_ENV: "10"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    yield {**os.environ, **env}


_started: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _no_holder_left_behind() -> Iterator[None]:
    yield
    while _started:
        process = _started.pop()
        if process.poll() is None:
            process.kill()
        process.communicate()


def _hold(env: dict[str, str], gib: float, what: str) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(gib), what], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    _started.append(process)
    return process


def _until_waiting(process: subprocess.Popen[str]) -> str:
    """The line the process says it waits with (a process that did not wait says nothing there and holds)."""
    assert process.stderr is not None
    ready, _, _ = select.select([process.stderr], [], [], 60)
    assert ready, "it never said it was waiting"
    line = process.stderr.readline()
    assert line.startswith("waiting for"), line
    return line


def test_a_second_run_waits_for_the_first_to_release_and_then_goes_on(ledger):
    first = _hold(ledger, 6, "gemma validation")
    assert first.stdout is not None and first.stdout.readline() == "holding\n"
    second = _hold(ledger, 6, "smollm2 tuning")
    said = _until_waiting(second)
    assert "6.00 GiB" in said and "gemma validation" in said and "10.00 GiB budget" in said
    assert second.poll() is None
    first.communicate("\n", timeout=60)
    assert second.stdout is not None and second.stdout.readline() == "holding\n"
    assert second.communicate("\n", timeout=60)[0] == "released\n"
    assert list(Path(ledger[node_memory.LEDGER_ENV]).glob("*.json")) == []


def test_a_run_killed_while_holding_releases_nothing_it_no_longer_uses(ledger):
    first = _hold(ledger, 6, "killed run")
    assert first.stdout is not None and first.stdout.readline() == "holding\n"
    second = _hold(ledger, 6, "next run")
    _until_waiting(second)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=60)
    assert second.stdout is not None and second.stdout.readline() == "holding\n"
    second.communicate("\n", timeout=60)


def test_reservations_that_fit_together_do_not_wait(ledger):
    first = _hold(ledger, 4, "one")
    assert first.stdout is not None and first.stdout.readline() == "holding\n"
    with node_memory.reserved(5 * GIB, "two"):
        held = sorted(path.name for path in Path(ledger[node_memory.LEDGER_ENV]).glob("*.json"))
        assert len(held) == 2
    first.communicate("\n", timeout=60)


def test_a_budget_that_is_not_a_number_of_gib_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv(node_memory.BUDGET_ENV, "lots")
    with pytest.raises(UserError) as refused:
        node_memory.budget_bytes()
    assert refused.value.where == node_memory.BUDGET_ENV and "lots" in str(refused.value)


def test_an_ad_hoc_validation_on_the_cpu_reserves_what_a_planned_cell_does(tmp_path):
    """`enginesmith validate --candidate DIR --reference DIR` on the cpu target counts both servers in the ledger as
    the nightly does (a cpu artefact serves its model/ directory); a URL side is not counted here."""
    import shutil

    from enginesmith.core.assets import tiny_model_dir
    from enginesmith.core.checkpoints.inspect import safetensors_parameter_count
    from enginesmith.core.memory import cpu_serving_need
    from enginesmith.core.serving import reference_recipe
    from enginesmith.core.specs import BuildProfile
    from validation.stage import ServerSide, seat_started_on_cpu

    reference_dir = tiny_model_dir()
    artefact = tmp_path / "artefact"
    shutil.copytree(reference_dir, artefact / "model")
    recipe = reference_recipe(reference_dir, on_cpu=True, profile=BuildProfile())
    candidate = ServerSide(role="candidate", name="c", runtime="vllm-cpu", recipe=recipe, root=artefact)
    reference = ServerSide(role="reference", name="r", runtime="vllm-cpu", recipe=recipe, root=reference_dir)
    assert seat_started_on_cpu(candidate, reference, on_cpu=True, cpu_cores=[0, 1]) is not None
    expected = cpu_serving_need("candidate", safetensors_parameter_count(reference_dir / "model.safetensors"),
                                259).per_device_bytes
    assert candidate.memory_bytes == reference.memory_bytes == expected
    external = ServerSide(role="candidate", name="u", runtime="external", url="http://127.0.0.1:9")
    assert seat_started_on_cpu(external, reference, on_cpu=True, cpu_cores=[0, 1]) is None
    assert external.memory_bytes == 0
