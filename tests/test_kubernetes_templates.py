"""#50 item 6: Kubernetes work pools on paper, checked by Prefect's own code. ``enginesmith deploy --kubernetes DIR``
writes each GPU pool's base job template; the Kubernetes worker's own job configuration (prefect-kubernetes)
renders the job of a planned cell's run from it, as the worker would before sending it to a cluster, and the
rendered manifest is checked against the Kubernetes API's schema (kubernetes-validate, strict: no unknown field).
No cluster is needed."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest

from enginesmith.core.config import default_catalogue
from tests.conftest import run_cli

pytest.importorskip("prefect_kubernetes", reason="the kubernetes extra (prefect-kubernetes) is not installed")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

KUBERNETES_VERSION = "1.33"


def render(template: dict[str, Any], job_variables: dict[str, Any], *, pool: str) -> dict[str, Any]:
    """The job the Kubernetes worker would create for a run of ``build-cell/<pool>`` with these job variables."""
    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.objects import Flow, FlowRun
    from prefect.client.schemas.responses import DeploymentResponse
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

    # The worker resolves block and variable references through its client; these templates have none, so the
    # client (pointing nowhere) is never called, and no Prefect server is needed.
    unused = PrefectClient(api="http://127.0.0.1:9/api")
    configuration = asyncio.run(KubernetesWorkerJobConfiguration.from_template_and_values(
        template, job_variables, client=unused))
    flow = Flow(id=uuid.uuid4(), name="build-cell")
    deployment = DeploymentResponse(id=uuid.uuid4(), name=pool, flow_id=flow.id)
    flow_run = FlowRun(id=uuid.uuid4(), name="llama-3.1-70b-instruct/fp8/l40s/tp4/trtllm-engine", flow_id=flow.id,
                       deployment_id=deployment.id, job_variables=job_variables)
    configuration.prepare_for_flow_run(flow_run, deployment=deployment, flow=flow)
    return configuration.job_manifest


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("k8s")
    done = run_cli("deploy", "--kubernetes", str(out), "--target", "l40s", "--target", "h100-sxm",
                   "--image-repository", "registry.example.com/ml")
    assert done.returncode == 0, done.stderr
    assert "prefect work-pool create gpu-l40s-engine --type kubernetes --base-job-template" in done.stdout
    return {path.stem: json.loads(path.read_text()) for path in out.glob("*.json")}


def test_each_gpu_pool_gets_a_template_and_the_cpu_none(templates):
    assert set(templates) == {"gpu-l40s", "gpu-l40s-engine", "gpu-h100-sxm", "gpu-h100-sxm-engine"}


def test_a_planned_cells_job_renders_valid_with_its_gpus_its_sku_and_its_runtime(templates):
    manifest = render(templates["gpu-l40s-engine"], {"gpus": 8}, pool="gpu-l40s-engine")
    kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
    pod = manifest["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert container["image"] == f"registry.example.com/ml/enginesmith-trtllm:{_version()}"
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["ENGINESMITH_ENV_TRTLLM"] == "PATH" and "PREFECT__FLOW_RUN_ID" in env
    [term] = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    [expression] = term["matchExpressions"]
    l40s = default_catalogue().target("l40s")
    assert expression["key"] == "nvidia.com/gpu.product"
    assert expression["values"] == [name.replace(" ", "-") for name in l40s.nvml_names]
    assert manifest["spec"]["completions"] == 1 and "completions" not in pod


def test_prefect_kubernetes_own_default_fails_the_same_schema_check():
    """Why the templates move two fields: the worker's default base job template puts the Job's completions and
    parallelism in the pod spec, unknown fields there (the API server drops them with a warning, or rejects them
    under strict field validation)."""
    from prefect_kubernetes.worker import KubernetesWorker

    default = KubernetesWorker.get_default_base_job_template()
    manifest = render(default, {"image": "python:3.12"}, pool="gpu-l40s")
    with pytest.raises(kubernetes_validate.ValidationError, match=r"completions|parallelism"):
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


def test_a_pod_asking_more_gpus_than_a_node_has_is_refused_by_the_template(templates):
    from prefect.utilities.schema_tools.validation import validate

    schema = templates["gpu-h100-sxm"]["variables"]
    with pytest.raises(Exception, match="9"):
        validate({"gpus": 9}, schema, raise_on_error=True)


def _version() -> str:
    from importlib.metadata import version

    return version("enginesmith")
