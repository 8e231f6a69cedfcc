"""The cell kinds, one module each (its plan rules, preflight, stages in order, report and serve recipe): ``llm``
(with ``llm_steps`` and ``llm_preflight``) and ``encoder`` (with ``encoder_plan`` and ``encoder_steps``). Each
implements ``pipeline.common.protocol.CellKind`` and is registered by ``pipeline.kind_registry``; a kind never
imports the pipeline that iterates over the kinds, nor another kind."""
