"""The ``enginesmith`` command, a face of the pipeline: each verb parses, calls the pipeline, the registry or the
vocabulary, and prints."""

import enginesmith.entry  # noqa: F401  (before anything imports a component: see its docstring)
from enginesmith.cli.app import app, main

__all__ = ["app", "main"]
