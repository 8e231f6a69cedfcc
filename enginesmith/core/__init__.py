"""The shared vocabulary every layer speaks: config specs and the catalogues (targets, recipes, runtimes), planning
and keys, the report schema, errors, the memory model, staging and process helpers. It imports nothing else of
enginesmith's (``enginesmith.cli``, ``flows``, ``pipeline`` and the stages all import it), and no GPU-only package."""
