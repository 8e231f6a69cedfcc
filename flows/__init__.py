"""Prefect flows and deployments: orchestration only. The only package that imports Prefect."""

# Every process that talks to the Prefect API (the nightly, the runs on the nodes) asks again on a 500 as Prefect's
# client does on a 502 or 503 (waiting 2, 4, 8, 16, 32 s): a server whose database restarts answers 500 for the
# moments it is gone, and a run or a dispatch that gave up then would fail a cell that was building (the fleet
# bench's --fault restart-postgres: 4 of 91 cells reported failed though each was published). Set in the
# environment before Prefect is imported: its settings are read once.
API_RETRY_ENV = {"PREFECT_CLIENT_RETRY_EXTRA_CODES": "500"}
