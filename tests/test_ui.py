"""The Prefect UI in a real browser: Debian's chromium driven by Playwright's Python API (no browser
download) starts build-cell from the deployment's custom-run form with a changed parameter; the API then
shows the run got that parameter and finished. The session's Prefect server serves the UI, a cpu worker runs the
deployment, and the first nightly's published registry makes the run complete in seconds."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.conftest import chromium_page, needs_chromium
from tests.waiting import wait_for

pytestmark = pytest.mark.slow


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


def test_custom_run_from_the_ui_reaches_the_flow(prefect_server, cpu_worker, published_tiny_config):
    needs_chromium()
    from playwright.sync_api import expect

    api = prefect_server.api_url
    base = api.removesuffix("/api")
    # Every cell flow has a "cpu" deployment: this is the LLM's typed form, build-cell's.
    cell_deployment = httpx.get(f"{api}/deployments/name/build-cell/cpu", timeout=10).json()
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
