"""What does a night with nothing to build cost, next to the night that built everything?

One Prefect server (SQLite; its start-up is timed and reported apart), then, alternating in one run, for each
round: `enginesmith nightly CONFIG --inline` on a fresh registry and work directory (the full night: every cell
quantised, built, validated and published), then the same command again with nothing changed (the no-op night:
every cell cached). Each night is a fresh process, as the nightly deployment's run is; its wall time counts the
interpreter and Prefect's imports, and the flow run's own duration is read back from the server.

The config is configs/examples/tiny-cpu.yaml with its registry and work directory under the bench's scratch
directory: `--workload shipped` (its own workload: three interleaved rounds, 400 addition questions per side) or
`--workload short` (the orchestration tests' one-round workload, for a quick look).

Targets (#32): the no-op night costs < 2 % of the full one, and < 15 s of the nightly's own work.
Prints a table per round and, last, one JSON line with every measurement, the medians and their spread.
Usage: python bench/noop_nightly.py [--rounds 3] [--workload shipped|short] [--work-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from spread import spread  # noqa: E402  (bench/, this script's own directory)

from tests.conftest import write_tiny_matrix  # noqa: E402  (after the path set-up)
from tests.prefect_processes import running_prefect_server  # noqa: E402
from validation.server import free_port  # noqa: E402

NOOP_SHARE_TARGET = 0.02
NOOP_OWN_WORK_TARGET_S = 15.0


def night(config: Path, api_url: str) -> tuple[float, str]:
    """One `enginesmith nightly --inline` as its own process; returns (wall seconds, what it printed)."""
    env = {**os.environ, "PREFECT_API_URL": api_url, "PREFECT_LOGGING_LEVEL": "WARNING"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "enginesmith", "nightly", str(config), "--inline"], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True)
    wall_s = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"the nightly failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return wall_s, done.stdout


def last_nightly_run_s(api_url: str) -> float:
    """The duration the server recorded for the newest `nightly` flow run (its subflows included)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterParentTaskRunId
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        [run] = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["nightly"])),
            flow_run_filter=FlowRunFilter(parent_task_run_id=FlowRunFilterParentTaskRunId(is_null_=True)),
            sort=FlowRunSort.START_TIME_DESC, limit=1)
    assert run.start_time is not None and run.end_time is not None
    return (run.end_time - run.start_time).total_seconds()



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="full + no-op pairs, in turn (default 3)")
    parser.add_argument("--workload", choices=["shipped", "short"], default="shipped")
    parser.add_argument("--work-dir", type=Path, default=None, help="scratch directory (default: a temporary one)")
    args = parser.parse_args()
    scratch = args.work_dir or Path(tempfile.mkdtemp(prefix="noop-nightly-"))
    scratch.mkdir(parents=True, exist_ok=True)

    started = time.perf_counter()
    with running_prefect_server(None, port=free_port(), log_path=scratch / "prefect-server.log") as api_url:
        server_start_s = time.perf_counter() - started
        print(f"Prefect server up in {server_start_s:.1f} s (not counted below)", flush=True)
        rows = []
        for index in range(args.rounds):
            root = scratch / f"round-{index + 1}"
            shutil.rmtree(root, ignore_errors=True)
            config = write_tiny_matrix(root, flow_workload=args.workload == "short")
            full_s, _ = night(config, api_url)
            full_flow_s = last_nightly_run_s(api_url)
            noop_s, printed = night(config, api_url)
            noop_flow_s = last_nightly_run_s(api_url)
            if "0 built" not in printed:
                raise SystemExit(f"the second night built something:\n{printed}")
            rows.append({"full_s": round(full_s, 2), "full_flow_s": round(full_flow_s, 2), "noop_s": round(noop_s, 2),
                         "noop_flow_s": round(noop_flow_s, 3), "noop_share": round(noop_s / full_s, 4)})
            print(f"round {index + 1}: full {full_s:7.1f} s (flow {full_flow_s:7.1f} s)   no-op {noop_s:5.1f} s "
                  f"(flow {noop_flow_s:4.1f} s)   no-op / full {noop_s / full_s:.2%}", flush=True)

    share = spread([r["noop_share"] for r in rows])
    noop = spread([r["noop_s"] for r in rows])
    verdict = {
        "bench": "noop_nightly", "config": "configs/examples/tiny-cpu.yaml", "workload": args.workload,
        "rounds": rows, "server_start_s": round(server_start_s, 2),
        "full_s": spread([r["full_s"] for r in rows]), "noop_s": noop,
        "noop_flow_s": spread([r["noop_flow_s"] for r in rows]), "noop_share": share,
        "targets": {"noop_share_below_2pct": share["max"] < NOOP_SHARE_TARGET,
                    "noop_below_15s": noop["max"] < NOOP_OWN_WORK_TARGET_S},
    }
    print(json.dumps(verdict))


if __name__ == "__main__":
    main()
