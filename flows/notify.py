"""Told in the morning: Prefect automations that send the nightly's summary to a webhook, through Prefect's own
Apprise-backed notification block, as Slack-compatible JSON (``{"text": ...}``) or as Apprise's generic JSON
object (``webhook_block``).

- A night with a failed, crashed, blocked or regressed cell emits one event (``enginesmith.nightly.attention``,
  its summary and the catalogue's link in the payload) as it ends; an automation sends it: once per night.
- A night still running at its deadline (a UTC time of day after the schedule's start) is reported by a proactive
  automation: after a nightly run starts, Prefect expects its end within the window, per run.

The webhook URL is a secret (a Slack URL or a token in a query string is a credential): it is stored in the block's
secret fields, never in a log line or the automation's text. A receiver that answers an error does not stop the
night: Apprise logs one warning (without the URL) and the notification is not sent again.
"""

from __future__ import annotations

import ipaddress
from datetime import timedelta
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit
from uuid import UUID

from pydantic import BaseModel, SecretStr

from enginesmith.core.errors import UserError
from pipeline.common.params import CellSummary

ATTENTION_EVENT = "enginesmith.nightly.attention"
NOTIFICATION_BLOCK = "enginesmith-nightly"
ATTENTION_AUTOMATION = "enginesmith: tell the webhook about a night that needs attention"
DEADLINE_AUTOMATION = "enginesmith: tell the webhook about a night past its deadline"
NEEDS_ATTENTION = ("failed", "no-worker", "blocked")
WebhookFormat = Literal["slack", "json"]


class NightlyAlerts(BaseModel):
    block: UUID
    automations: list[UUID]
    deadline_s: float | None


def webhook_block(url: SecretStr, kind: WebhookFormat) -> Any:
    """Prefect's Apprise-backed webhook block, the URL in its secret field as an Apprise JSON URL (``json://`` for
    http, ``jsons://`` for https; the URL's own query parameters kept as the request's). ``slack`` maps Apprise's
    message to Slack's ``text`` (and drops its other fields): ``{"text": ...}``, what Slack's, Mattermost's and
    Teams' incoming webhooks take; ``json`` keeps Apprise's own object (title, message, type). Apprise names the URL
    only at DEBUG, and a receiver's error is one warning without it: the secret stays out of the server's log
    (Prefect's httpx-based custom webhook block logs the URL of a request that failed)."""
    from prefect.blocks.notifications import SlackWebhook

    parts = urlsplit(url.get_secret_value())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError("the webhook URL is not an http(s) URL", where="--webhook-env",
                        hint="e.g. https://hooks.slack.com/services/… (kept as a secret)")
    query = [(f"-{key}", value) for key, value in parse_qsl(parts.query, keep_blank_values=True)]
    if kind == "slack":
        query += [(":message", "text"), (":title", ""), (":type", ""), (":version", ""), (":attachments", "")]
    apprise_url = urlunsplit(("jsons" if parts.scheme == "https" else "json", parts.netloc, parts.path,
                              urlencode(query), ""))
    return SlackWebhook(url=SecretStr(apprise_url), allow_private_urls=_is_private(parts.hostname))


def deadline_window(cron: str, deadline: str) -> timedelta:
    """How long after the schedule's start the night must have finished: ``+H[:MM]`` after it, or ``HH:MM`` UTC
    later on the day it starts (for a daily schedule, ``M H * * *``).

    Raises:
        UserError: a deadline that is neither, a time of day for a schedule that is not daily, one not after the
            start (in the past when the night starts), or one a day or more after it.
    """
    relative = deadline.startswith("+")
    try:
        hour, _, minute = deadline.lstrip("+").partition(":")
        hours, minutes = int(hour), int(minute or 0)
        if hours < 0 or not 0 <= minutes < 60 or (not relative and hours >= 24):
            raise ValueError
    except ValueError:
        raise UserError(f"deadline {deadline!r} is neither HH:MM (UTC) nor +H[:MM] after the start",
                        where="--deadline", hint="e.g. --deadline 07:30, or --deadline +5:30") from None
    if relative:
        window = timedelta(hours=hours, minutes=minutes)
    else:
        fields = cron.split()
        if len(fields) != 5 or fields[2:] != ["*", "*", "*"] or not (fields[0] + fields[1]).isdigit():
            raise UserError(f"a deadline as a time of day needs a daily schedule (M H * * *), not {cron!r}",
                            where="--deadline", hint="give it as +H:MM after the start")
        start = timedelta(hours=int(fields[1]), minutes=int(fields[0]))
        window = timedelta(hours=hours, minutes=minutes) - start
    if window <= timedelta(0):
        raise UserError(f"deadline {deadline} UTC is not after the night's start ({cron!r}): it would be in the "
                        "past before the night begins", where="--deadline",
                        hint="give a later time, or one past midnight as +H:MM after the start (e.g. +8:00)")
    if window >= timedelta(days=1):
        raise UserError(f"deadline {deadline} is a day or more after the night's start", where="--deadline",
                        hint="a nightly runs once a day: give less than 24 hours")
    return window


def create_nightly_alerts(url: SecretStr, kind: WebhookFormat, *, nightly_deployment: UUID,
                          deadline: timedelta | None) -> NightlyAlerts:
    """Save the webhook block and (re)create the two automations against the server ``PREFECT_API_URL`` names."""
    from prefect.automations import AutomationCore, EventTrigger, Posture
    from prefect.client.orchestration import get_client
    from prefect.events.actions import SendNotification

    block_id = webhook_block(url, kind).save(NOTIFICATION_BLOCK, overwrite=True)
    attention = AutomationCore(
        name=ATTENTION_AUTOMATION,
        description="A nightly run with a failed, crashed, blocked or regressed cell: its summary, once.",
        trigger=EventTrigger(expect={ATTENTION_EVENT}, match={"prefect.resource.id": "enginesmith.nightly.*"},
                             posture=Posture.Reactive, threshold=1, within=timedelta(0)),
        actions=[SendNotification(block_document_id=block_id, subject="{{ event.payload.subject }}",
                                  body="{{ event.payload.summary }}")])
    automations = [attention]
    if deadline is not None:
        hours = deadline.total_seconds() / 3600
        automations.append(AutomationCore(
            name=DEADLINE_AUTOMATION,
            description=f"A nightly run not finished {hours:.1f} h after it started.",
            trigger=EventTrigger(
                after={"prefect.flow-run.Running"},
                expect={"prefect.flow-run.Completed", "prefect.flow-run.Failed", "prefect.flow-run.Crashed",
                        "prefect.flow-run.Cancelled", "prefect.flow-run.TimedOut"},
                match={"prefect.resource.id": "prefect.flow-run.*"},
                match_related={"prefect.resource.id": f"prefect.deployment.{nightly_deployment}"},
                for_each={"prefect.resource.id"}, posture=Posture.Proactive, threshold=1, within=deadline),
            actions=[SendNotification(
                block_document_id=block_id, subject="enginesmith: the nightly is past its deadline",
                body=f"The nightly run {{{{ flow_run.name }}}} started {hours:.1f} h ago and has not finished "
                     "(state {{ flow_run.state.name }}). {{ flow_run|ui_url or '' }}")]))  # no UI: no "None"
    ids = []
    with get_client(sync_client=True) as client:
        for automation in automations:
            for existing in client.read_automations_by_name(automation.name):
                client.delete_automation(existing.id)
            ids.append(client.create_automation(automation))
        if deadline is None:
            for existing in client.read_automations_by_name(DEADLINE_AUTOMATION):
                client.delete_automation(existing.id)
    return NightlyAlerts(block=block_id, automations=ids,
                         deadline_s=deadline.total_seconds() if deadline is not None else None)


def attention_lines(summaries: list[CellSummary], versus: dict[str, str]) -> list[str]:
    """The cells that need someone in the morning, a line each: failed, crashed (retried and failed), blocked,
    without a worker, regressed against their last measurement, or built by a run whose calibration was off (its
    speed ratios measured the harness: someone should look at the node)."""
    lines = []
    for summary in summaries:
        if summary.status in NEEDS_ATTENTION:
            lines.append(f"- {summary.cell}: {summary.status}: {summary.reason[:300]}")
        elif "(regression)" in versus.get(summary.cell, ""):
            lines.append(f"- {summary.cell}: regressed: {versus[summary.cell]}")
        elif summary.reason.startswith("calibration off"):  # built, but its speed measured the harness
            lines.append(f"- {summary.cell}: {summary.reason[:300]}")
    return lines


def emit_attention(flow_run_id: str, config: str, summaries: list[CellSummary], versus: dict[str, str],
                   catalogue: str | None) -> bool:
    """Emit the night's attention event where any cell needs it; True where one was emitted."""
    from prefect.events import emit_event

    lines = attention_lines(summaries, versus)
    if not lines:
        return False
    counts = {status: sum(s.status == status for s in summaries) for status in ("built", "cached", *NEEDS_ATTENTION)}
    subject = f"enginesmith nightly ({config}): {len(lines)} cell(s) need attention"
    summary = "\n".join([subject, ", ".join(f"{n} {status}" for status, n in counts.items() if n), *lines,
                         *([f"catalogue: {catalogue}"] if catalogue else [])])
    emit_event(event=ATTENTION_EVENT, resource={"prefect.resource.id": f"enginesmith.nightly.{flow_run_id}"},
               related=[{"prefect.resource.id": f"prefect.flow-run.{flow_run_id}",
                         "prefect.resource.role": "flow-run"}],
               payload={"subject": subject, "summary": summary, "catalogue": catalogue,
                        "cells": [line[2:].split(":")[0] for line in lines]})
    return True


def _is_private(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return not ipaddress.ip_address(host).is_global
    except ValueError:
        return False
