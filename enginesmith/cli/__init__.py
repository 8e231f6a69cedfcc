"""The ``enginesmith`` command, a face of the pipeline: each verb parses, calls the pipeline, the registry or the
vocabulary, and prints."""

from enginesmith.cli.app import app, main

__all__ = ["app", "main"]
