"""The Prefect UI in a real browser: Debian's chromium driven by Playwright's Python API (no browser
download) starts build-cell from the deployment's custom-run form with a changed parameter; the API then
shows the run got that parameter and finished. Needs the nightly test's published registry (same module
fixtures) so the run completes in seconds."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest import REPO_ROOT, chromium_page, needs_chromium
from tests.waiting import wait_for, wait_for_health

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ui_server(tmp_path_factory):
    """A real `prefect server start` (the harness runs without the UI) and a cpu worker against it."""
    needs_chromium()
    from validation.server import free_port

    home = tmp_path_factory.mktemp("prefect-ui-home")
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_API_HOST": "127.0.0.1",
           "PREFECT_SERVER_API_PORT": str(port), "PREFECT_API_URL": api, "PREFECT_UI_API_URL": api}
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start"], env=env, cwd=REPO_ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    processes = [server]
    try:
        wait_for_health(f"{api}/health", "the Prefect server to answer /health", timeout_s=300, process=server)
        deploy = subprocess.run([sys.executable, "-c", "from flows.deploy import deploy_all; "
                                 "deploy_all(targets=['cpu'], nightly_config='configs/examples/tiny-cpu.yaml')"],
                                env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
        assert deploy.returncode == 0, deploy.stderr[-2000:]
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "prefect", "worker", "start", "--pool", "cpu", "--type", "process"], env=env,
            cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        yield f"http://127.0.0.1:{port}", api
    finally:
        for process in reversed(processes):
            _stop(process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGINT the process group until the process exits (Prefect processes may ignore the first), then SIGKILL."""
    for wait_s in (3, 10):
        try:
            os.killpg(process.pid, signal.SIGINT)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _submit_with_retry(page, click) -> dict:  # type: ignore[no-untyped-def]
    """SQLite can answer a 503 under load; the UI then shows an error: click again (reference/prefect.md §10.3)."""
    status = 0
    for attempt in range(1, 5):
        with page.expect_response(lambda r: r.request.method == "POST" and "create_flow_run" in r.url) as info:
            click()
        status = info.value.status
        if status < 300:
            return dict(info.value.json())
        time.sleep(attempt)
    raise AssertionError(f"create_flow_run kept failing (last status {status})")


def test_custom_run_from_the_ui_reaches_the_flow(ui_server, published_tiny_config):
    from playwright.sync_api import expect

    base, api = ui_server
    deployment = httpx.post(f"{api}/deployments/filter", json={}, timeout=10).json()
    cell_deployment = next(d for d in deployment if d["name"] == "cpu")
    defaults = {"params": {"config": str(published_tiny_config), "model": "tiny-llama", "recipe": "int4-awq",
                           "target": "cpu"}}
    with chromium_page(lambda url: url.startswith(base)) as (page, _blocked):
        import json
        from urllib.parse import quote

        page.goto(f"{base}/v2/deployments/deployment/{cell_deployment['id']}/run?parameters="
                  + quote(json.dumps(defaults)))
        run_name = page.get_by_label("Run Name")
        expect(run_name).not_to_have_value("", timeout=60_000)
        run_name.fill("ui-custom-run")
        page.get_by_role("button", name="Select RecipeName").click()
        page.get_by_role("option", name="fp8", exact=True).click()
        created = _submit_with_retry(page, lambda: page.get_by_role("button", name="Submit").click())
    flow_run_id = created["id"]
    flow_run: dict = {}

    def finished() -> bool:
        response = httpx.get(f"{api}/flow_runs/{flow_run_id}", timeout=10)
        if response.status_code != 200:  # SQLite under load: ask again
            return False
        flow_run.update(response.json())
        return flow_run["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")

    wait_for(finished, f"flow run {flow_run_id} to finish", timeout_s=600, interval_s=2)
    assert flow_run["parameters"]["params"]["recipe"] == "fp8"  # the changed parameter reached the run
    assert flow_run["state"]["type"] == "COMPLETED", flow_run["state"]
