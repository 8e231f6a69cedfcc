"""The pipeline layer, between the stages and their two faces (the Prefect flows and the CLI): planning with I/O
(``plan_sources``), the checks short of a GPU (``preflight``) and the Prefect-free cell runner (``steps``)."""
