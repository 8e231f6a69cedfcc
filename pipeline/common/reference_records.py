"""The reference's results between the validation stage's cache file on this node and the registry's record of its
reference key (``registry.reference_records``): a candidate on any node, tonight or on a later night, reuses what
the first run of that key measured. A registry that cannot be reached costs only the reuse: the reference is
measured here, as it would be without a record, and the run says so in its log."""

from __future__ import annotations

import json
import logging
import socket
from datetime import datetime, timezone
from pathlib import Path

from enginesmith.core.errors import UserError
from enginesmith.core.reports.llm import ReferenceRecordUse
from enginesmith.core.staging import write_whole
from registry.manifest import utc_timestamp
from registry.reference_records import ReferenceRecord, read_reference_record, write_reference_record
from registry.store import open_store

log = logging.getLogger(__name__)


def fetch(url: str, model: str, key: str, cache_path: Path) -> ReferenceRecordUse | None:
    """The record of ``key``, laid into ``cache_path`` where validation reads the reference's results; None where
    the registry has none (or cannot be read)."""
    try:
        record = read_reference_record(open_store(url), model, key)
    except (UserError, OSError) as exc:  # an unavailable store is a TransientError, one of the first
        log.warning("the reference record %s could not be read from %s (%s): the reference is measured here",
                    key[:16], url, exc)
        return None
    if record is None:
        return None
    write_whole(cache_path, json.dumps(record.results))
    return ReferenceRecordUse(key=key, measured_at=record.measured_at, measured_by=record.measured_by, reused=True)


def keep(url: str, model: str, key: str, cache_path: Path, *, measured_by: str,
         measured_now: bool) -> ReferenceRecordUse | None:
    """Record the reference's results validation left in ``cache_path`` under ``key``, unless the key has a record
    already (another run's, written meanwhile: the same results); None where there is nothing whole to record (the
    validation stopped before the reference had answered) or the registry refused."""
    if not cache_path.is_file():
        return None
    measured_at = utc_timestamp(datetime.fromtimestamp(cache_path.stat().st_mtime, tz=timezone.utc))
    who = measured_by if measured_now else f"an earlier run on {socket.gethostname()}"
    record = ReferenceRecord(key=key, model=model, measured_at=measured_at, measured_by=who,
                             results=json.loads(cache_path.read_text()))
    try:
        write_reference_record(open_store(url), record)
    except (UserError, OSError) as exc:
        log.warning("the reference record %s could not be written to %s (%s): the next run measures it again",
                    key[:16], url, exc)
        return None
    return ReferenceRecordUse(key=key, measured_at=measured_at, measured_by=who, reused=not measured_now)
