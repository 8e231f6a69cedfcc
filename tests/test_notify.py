"""#50 item 5: told in the morning. `enginesmith deploy --webhook-env NAME` saves the webhook (a secret) in Prefect's
webhook notification block and creates the automations of flows/notify.py; a night with a cell that needs
attention emits one event, which the automation sends once; a nightly run still running at its deadline is
reported by a proactive automation. The slow tests run on the session's Prefect server (its triggers and actions
services) against a local HTTP receiver (tests/webhook_receiver.py)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import SecretStr

from enginesmith.core.errors import UserError
from pipeline.common.params import CellSummary
from tests.conftest import run_cli
from tests.waiting import wait_for

TOKEN = "T0KEN-s3cr3t-4f9a"


@pytest.mark.parametrize(("cron", "deadline", "hours"), [
    ("0 2 * * *", "07:30", 5.5), ("0 22 * * *", "+8:00", 8.0), ("*/30 * * * *", "+1", 1.0)])
def test_a_deadline_is_a_window_after_the_start(cron, deadline, hours):
    from flows.notify import deadline_window

    assert deadline_window(cron, deadline) == timedelta(hours=hours)


@pytest.mark.parametrize(("cron", "deadline", "says"), [
    ("0 2 * * *", "01:00", "in the past"), ("0 2 * * *", "02:00", "in the past"), ("0 2 * * *", "+24", "a day"),
    ("0 2 * * *", "7h", "neither"), ("0 2 * * *", "25:00", "neither"), ("*/30 * * * *", "07:00", "daily")])
def test_a_deadline_in_the_past_or_unreadable_is_refused_naming_the_option(cron, deadline, says):
    from flows.notify import deadline_window

    with pytest.raises(UserError, match=says) as error:
        deadline_window(cron, deadline)
    assert error.value.where == "--deadline"


def test_the_cli_refuses_a_bad_deadline_and_an_unset_webhook_before_touching_a_server(tmp_path: Path):
    done = run_cli("deploy", "--deadline", "01:00", "--webhook-env", "ENGINESMITH_TEST_HOOK",
                   env={"PREFECT_API_URL": "http://127.0.0.1:9/api", "ENGINESMITH_TEST_HOOK": "http://x/" + TOKEN})
    assert done.returncode == 2 and "--deadline" in done.stderr and "in the past" in done.stderr
    assert TOKEN not in done.stdout + done.stderr
    done = run_cli("deploy", "--webhook-env", "ENGINESMITH_UNSET_HOOK", env={"PREFECT_API_URL": "http://127.0.0.1:9/api"})
    assert done.returncode == 2 and "ENGINESMITH_UNSET_HOOK is not set" in done.stderr


def test_the_webhook_url_lives_in_the_blocks_secret_fields():
    from flows.notify import webhook_block

    block = webhook_block(SecretStr(f"https://hooks.example.com/services/{TOKEN}?channel=ops"), "slack")
    assert TOKEN not in block.model_dump_json() and TOKEN not in repr(block)
    apprise_url = block.url.get_secret_value()
    assert apprise_url.startswith(f"jsons://hooks.example.com/services/{TOKEN}?-channel=ops&%3Amessage=text")
    with pytest.raises(UserError, match="not an http"):
        webhook_block(SecretStr("hooks.example.com/x"), "slack")


def test_the_cells_that_need_attention_and_none_otherwise():
    from flows.notify import attention_lines

    summaries = [CellSummary(cell="a/fp8/h100-sxm/tp1/hf-quantized", status="built"),
                 CellSummary(cell="b/fp8/h100-sxm/tp1/hf-quantized", status="failed", reason="tpot ratio 3.0"),
                 CellSummary(cell="c/fp8/h100-sxm/tp1/hf-quantized", status="built"),
                 CellSummary(cell="d/fp8/h100-sxm/tp1/hf-quantized", status="cached"),
                 CellSummary(cell="e/fp8/cpu/tp1/hf-quantized", status="built",
                             reason="calibration off: throughput 1.54, bounds 1.05–1.95 — the harness's error")]
    versus = {"a/fp8/h100-sxm/tp1/hf-quantized": "throughput -1.0% (within spread)",
              "c/fp8/h100-sxm/tp1/hf-quantized": "throughput -31.0% (regression)"}
    lines = attention_lines(summaries, versus)
    assert [line.split(":")[0] for line in lines] == ["- b/fp8/h100-sxm/tp1/hf-quantized",
                                                     "- c/fp8/h100-sxm/tp1/hf-quantized",
                                                     "- e/fp8/cpu/tp1/hf-quantized"]
    assert "calibration off: throughput 1.54" in lines[2]
    assert attention_lines(summaries[:1] + summaries[3:4], versus) == []


@pytest.mark.slow
def test_a_night_that_needs_attention_is_told_once_and_a_night_past_its_deadline_too(prefect_server, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled, Running

    from flows.notify import create_nightly_alerts, emit_attention
    from tests.webhook_receiver import webhook_receiver

    deployment_id = _nightly_deployment()
    with webhook_receiver(path=f"/hooks/{TOKEN}") as receiver:
        create_nightly_alerts(SecretStr(receiver.url), "json", nightly_deployment=deployment_id,
                              deadline=timedelta(seconds=10))
        summaries = [CellSummary(cell="m/fp8/h100-sxm/tp1/hf-quantized", status="failed", reason="crashed twice"),
                     CellSummary(cell="m/bf16/h100-sxm/tp1/hf-quantized", status="built")]
        _until_live(receiver, summaries)
        nights = [str(uuid.uuid4()), str(uuid.uuid4())]
        assert emit_attention(nights[0], "configs/nightly.yaml", summaries, {}, "file:///srv/catalogue/index.html")
        assert not emit_attention(str(uuid.uuid4()), "configs/nightly.yaml", summaries[1:], {}, None)  # all well
        assert emit_attention(nights[1], "configs/nightly.yaml", summaries, {}, None)

        def attention() -> list:
            return [m for m in receiver.messages()
                    if "need attention" in m.body.get("title", "") and PROBE not in m.body["title"]]

        wait_for(lambda: len(attention()) >= 2, "both nights' summaries at the receiver", timeout_s=120)
        messages = [m.body["message"] for m in attention()]  # the automation's order, not the nights'
        assert all("m/fp8/h100-sxm/tp1/hf-quantized: failed: crashed twice" in m for m in messages)
        assert all("1 built, 1 failed" in m for m in messages)
        assert sum("file:///srv/catalogue/index.html" in m for m in messages) == 1  # the night that had a catalogue
        assert len(attention()) == 2  # once per night; the night without a failed cell sent nothing

        with get_client(sync_client=True) as client:
            run = client.create_flow_run_from_deployment(deployment_id)
            client.set_flow_run_state(run.id, Running(), force=True)
            wait_for(lambda: any("past its deadline" in m.body.get("title", "") for m in receiver.messages()),
                     "the deadline's message", timeout_s=120)
            client.set_flow_run_state(run.id, Cancelled(), force=True)
        late = next(m.body for m in receiver.messages() if "past its deadline" in m.body.get("title", ""))
        assert run.name in late["message"] and "None" not in late["message"]  # a server without a UI has no link
    assert all(m.path == f"/hooks/{TOKEN}" for m in receiver.messages())


@pytest.mark.slow
def test_a_webhook_that_answers_500_is_asked_and_its_url_stays_out_of_every_log(prefect_server):
    """Found by this test: Prefect's httpx-based custom webhook block put the failing request's URL (the secret)
    in the server's log; the Apprise-backed block logs one warning without it."""
    from prefect.client.orchestration import get_client

    from flows.notify import ATTENTION_AUTOMATION, NOTIFICATION_BLOCK, create_nightly_alerts
    from tests.webhook_receiver import webhook_receiver

    with webhook_receiver(path=f"/hooks/{TOKEN}") as receiver:
        receiver.status = 500
        alerts = create_nightly_alerts(SecretStr(receiver.url), "slack", nightly_deployment=_nightly_deployment(),
                                       deadline=None)
        summaries = [CellSummary(cell="m/fp8/l40s/tp1/hf-quantized", status="no-worker", reason="no worker")]
        _until_live(receiver, summaries)  # the failing receiver was asked
        assert receiver.messages()[0].body == {"text": receiver.messages()[0].body["text"]}  # Slack-compatible
        assert receiver.messages()[0].body["text"].startswith("enginesmith nightly")
        with get_client(sync_client=True) as client:
            [automation] = client.read_automations_by_name(ATTENTION_AUTOMATION)
            block = client.read_block_document(alerts.block, include_secrets=False)
        assert TOKEN not in automation.model_dump_json() and TOKEN not in block.model_dump_json()
        assert block.name == NOTIFICATION_BLOCK
    assert TOKEN not in prefect_server.log_path.read_text(errors="replace")


PROBE = "probe.yaml"


def _until_live(receiver, summaries: list[CellSummary]) -> None:  # type: ignore[no-untyped-def]
    """Return once the attention automation just created has sent a probe night's message to ``receiver``. Prefect's
    trigger service loads a new automation a moment after it is created (an event before that is not matched, and
    one matched by the automation it replaced goes to that one's receiver): a probe is emitted every 5 s until one
    arrives, so the test's own events go to a live automation. Probe messages name the config ``probe.yaml``."""
    from flows.notify import emit_attention

    def arrived() -> bool:
        if any(PROBE in str(m.body) for m in receiver.messages()):
            return True
        emit_attention(str(uuid.uuid4()), PROBE, summaries, {}, None)
        return False

    wait_for(arrived, "a probe night's message from the new automation", timeout_s=180, interval_s=5)


def _nightly_deployment() -> uuid.UUID:
    """The session's nightly deployment where an earlier test deployed it, else a deployment of a flow named
    nightly created here (its runs' states are set by the test; none is ever run)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            return client.read_deployment_by_name("nightly/nightly").id
        except ObjectNotFound:
            return client.create_deployment(flow_id=client.create_flow_from_name("nightly"), name="nightly")
