"""Scripts run by path inside a runtime's own environment, which has no enginesmith (``vllm_argcheck.py``: vLLM's own
argument parser over our serve commands). A script's folder goes first on ``sys.path``, so they sit here, where no
module could be mistaken for one the runtime imports (``enginesmith/core`` holds a ``secrets.py`` and a
``tasks.py``: numpy, under vLLM, imported ours)."""
