"""The quantize stage in a process of its own, so that what it held goes back to the node when it ends.

Quantising holds the model in fp32 and the quality check's held-out logits (9.2 GiB peak for Gemma 3 270M, whose
vocabulary is 262k). Run inside the nightly's flow process, 4.1 GiB of that stayed with the flow after the stage had
returned (glibc keeps freed heap, and malloc_trim gave back 0.5 GiB), through validation, beside the two servers
the cell then starts (#49). A child process returns all of it when it exits. The child is stopped when the flow
process dies (``enginesmith.core.process.spawn``); its output goes to the flow's own stdout and stderr.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from enginesmith.core import errors
from enginesmith.core.artefacts import QuantizedCheckpoint
from enginesmith.core.process import spawn
from quantization.stage import QuantizeRequest, quantize_checkpoint, read_completed

# As ``python -m enginesmith`` starts: our components first, whatever the working directory holds.
CHILD = "import enginesmith.entry; from quantization.own_process import main; main()"


def quantize_in_own_process(request: QuantizeRequest) -> QuantizedCheckpoint:
    """``quantize_checkpoint(request)`` run in a child process; a finished output with this key is read here. A
    UserError in the child is raised here as it was raised there (message, where, hint)."""
    done = read_completed(Path(request.out_dir))
    if done is not None and done.key == request.key:
        return done
    with tempfile.TemporaryDirectory(prefix="enginesmith-quantize-") as scratch:
        answer_path = Path(scratch) / "answer.json"
        process = spawn([sys.executable, "-c", CHILD, str(answer_path)], stdin=subprocess.PIPE, text=True)
        try:
            process.communicate(request.model_dump_json())
        except BaseException:  # Ctrl-C, a cancelled flow: the child goes with it
            process.kill()
            process.wait()
            raise
        answer = json.loads(answer_path.read_text()) if answer_path.is_file() else None
    if answer is None:
        raise RuntimeError(f"the quantize process ended (exit {process.returncode}) without an answer: its "
                           "traceback, if it wrote one, is in the log above")
    if "error" in answer:
        raise _rebuilt_error(answer["error"])
    return QuantizedCheckpoint.model_validate(answer["result"])


def _rebuilt_error(sent: dict[str, Any]) -> errors.UserError:
    kind = getattr(errors, sent["kind"], errors.UserError)
    error: errors.UserError = kind.__new__(kind)
    Exception.__init__(error, sent["fields"].get("message", ""))
    error.__dict__.update(sent["fields"])
    return error


def main() -> None:
    """The child: the request on stdin, the answer (result or UserError) written to the path in argv[1]. Any other
    exception propagates: its traceback goes to stderr and the parent reports the exit."""
    answer_path = Path(sys.argv[1])
    request = QuantizeRequest.model_validate_json(sys.stdin.read())
    try:
        answer: dict[str, Any] = {"result": quantize_checkpoint(request).model_dump(mode="json")}
    except errors.UserError as exc:
        answer = {"error": {"kind": type(exc).__name__, "fields": dict(vars(exc))}}
    answer_path.write_text(json.dumps(answer))
