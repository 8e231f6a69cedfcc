"""Work pools and deployments on a Prefect server: ``nightly`` on the cpu pool with a cron schedule, and
``build-cell`` once per pool (``build-cell/cpu``, ``build-cell/gpu-h100-sxm``, ...), from this checkout.

Every worker node needs the checkout at the same absolute path (the pull step sets it as the working
directory). On Kubernetes the same deployments go on a Kubernetes work pool with a GPU node selector per
SKU; see the README.
"""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

from pydantic import BaseModel

from enginesmith.config import REPO_ROOT, default_catalogue
from flows.nightly import pool_for

NIGHTLY_CRON = "0 2 * * *"


class DeployResult(BaseModel):
    pools: list[str]
    deployments: dict[str, UUID]


def deploy_all(*, source_dir: Path = REPO_ROOT, nightly_config: str = "configs/nightly.yaml",
               cron: str = NIGHTLY_CRON, targets: list[str] | None = None) -> DeployResult:
    """Create (or update) the work pools and deployments against the server ``PREFECT_API_URL`` names."""
    from prefect import flow as prefect_flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.schedules import Cron

    catalogue = default_catalogue()
    chosen = [catalogue.target(t) for t in targets] if targets else list(catalogue.targets.values())
    pools = sorted({pool_for(t) for t in chosen} | {"cpu"})
    with get_client(sync_client=True) as client:
        for pool in pools:
            client.create_work_pool(WorkPoolCreate(name=pool, type="process"), overwrite=True)
    source = str(source_dir.resolve())
    deployments: dict[str, UUID] = {}
    cell_flow = prefect_flow.from_source(source=source, entrypoint="flows/cell.py:build_cell")
    for pool in pools:
        deployments[f"build-cell/{pool}"] = cell_flow.deploy(  # type: ignore[union-attr,assignment]
            name=pool, work_pool_name=pool, tags=["enginesmith", pool], print_next_steps=False)
    nightly_flow = prefect_flow.from_source(source=source, entrypoint="flows/nightly.py:nightly")
    deployments["nightly/nightly"] = nightly_flow.deploy(  # type: ignore[union-attr,assignment]
        name="nightly", work_pool_name="cpu", schedule=Cron(cron, timezone="UTC"),
        parameters={"config": nightly_config}, tags=["enginesmith", "nightly"], print_next_steps=False)
    return DeployResult(pools=pools, deployments=deployments)
