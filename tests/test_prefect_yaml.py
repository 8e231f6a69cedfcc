"""prefect.yaml lists the same build-cell deployments, on the same work pools, as ``enginesmith deploy``
(``flows.deploy.deploy_all``) creates, so ``prefect deploy --all`` leaves no pool without its deployment."""

from __future__ import annotations

import yaml

from tests.conftest import REPO_ROOT


def _build_cell_deployments() -> list[dict]:
    spec = yaml.safe_load((REPO_ROOT / "prefect.yaml").read_text())
    return [d for d in spec["deployments"] if d["entrypoint"] == "flows/cell.py:build_cell"]


def test_prefect_yaml_has_a_build_cell_deployment_per_pool_deploy_all_creates():
    from enginesmith.config import default_catalogue
    from flows.deploy import pool_names

    expected = pool_names(default_catalogue().targets.values())
    deployments = _build_cell_deployments()
    names = [d["name"] for d in deployments]
    assert len(names) == len(set(names)), "a build-cell deployment is listed twice"
    assert sorted(names) == expected
    assert {d["name"]: d["work_pool"]["name"] for d in deployments} == {pool: pool for pool in expected}
    assert {d["name"]: d["tags"] for d in deployments} == {pool: ["enginesmith", pool] for pool in expected}


def test_pool_names_cover_both_kinds_the_nightly_pool_and_routed_pools():
    from enginesmith.config import default_catalogue
    from flows.deploy import pool_names

    catalogue = default_catalogue()
    h100 = catalogue.target("h100-sxm")
    assert pool_names([h100]) == ["cpu", "gpu-h100-sxm", "gpu-h100-sxm-engine"]
    assert pool_names([catalogue.target("cpu")], {"llama-3.1-70b-instruct/*": "gpu-h200-big"}) == [
        "cpu", "gpu-h200-big"]


def test_prefect_yaml_has_the_encoder_cell_deployment_deploy_all_creates():
    from flows.deploy import ENCODER_ENTRYPOINT

    spec = yaml.safe_load((REPO_ROOT / "prefect.yaml").read_text())
    encoder = [d for d in spec["deployments"] if d["entrypoint"] == ENCODER_ENTRYPOINT]
    assert [(d["name"], d["work_pool"]["name"]) for d in encoder] == [("cpu", "cpu")]
    module, _, function = ENCODER_ENTRYPOINT.partition(":")
    assert f"def {function}(" in (REPO_ROOT / module).read_text()
