"""Validation: server lifecycle, load generator, accuracy, gates and the report (candidate vs reference)."""
