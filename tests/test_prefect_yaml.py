"""prefect.yaml lists the same build-cell deployments, on the same work pools, as ``enginesmith deploy``
(``flows.deploy.deploy_all``) creates, so ``prefect deploy --all`` leaves no pool without its deployment."""

from __future__ import annotations

import pytest
import yaml

from tests.conftest import REPO_ROOT


def _cell_deployments(entrypoint: str) -> list[dict]:
    spec = yaml.safe_load((REPO_ROOT / "prefect.yaml").read_text())
    return [d for d in spec["deployments"] if d["entrypoint"] == entrypoint]


@pytest.mark.parametrize("flow_name", ["build-cell", "run-cell"])
def test_prefect_yaml_has_each_cell_flow_deployed_per_pool_deploy_all_creates(flow_name: str):
    from enginesmith.core.config import default_catalogue
    from flows.deploy import CELL_ENTRYPOINTS, pool_names

    expected = pool_names(default_catalogue().targets.values())
    deployments = _cell_deployments(CELL_ENTRYPOINTS[flow_name])
    names = [d["name"] for d in deployments]
    assert len(names) == len(set(names)), f"a {flow_name} deployment is listed twice"
    assert sorted(names) == expected
    assert {d["name"]: d["work_pool"]["name"] for d in deployments} == {pool: pool for pool in expected}
    assert {d["name"]: d["tags"] for d in deployments} == {pool: ["enginesmith", pool] for pool in expected}


def test_pool_names_cover_both_kinds_the_nightly_pool_and_routed_pools():
    from enginesmith.core.config import default_catalogue
    from flows.deploy import pool_names

    catalogue = default_catalogue()
    h100 = catalogue.target("h100-sxm")
    assert pool_names([h100]) == ["cpu", "gpu-h100-sxm", "gpu-h100-sxm-engine"]
    assert pool_names([catalogue.target("cpu")], {"llama-3.1-70b-instruct/*": "gpu-h200-big"}) == [
        "cpu", "gpu-h200-big"]


def test_the_cell_entrypoints_name_flows_that_exist():
    from flows.deploy import CELL_ENTRYPOINTS

    for flow_name, entrypoint in CELL_ENTRYPOINTS.items():
        module, _, function = entrypoint.partition(":")
        source = (REPO_ROOT / module).read_text()
        assert f"def {function}(" in source and (f'"{flow_name}"' in source or "RUN_CELL_FLOW" in source)
