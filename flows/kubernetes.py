"""Kubernetes work pools on paper: each GPU pool's base job template for Prefect's Kubernetes worker
(``prefect-kubernetes``), written by ``enginesmith deploy --kubernetes DIR``.

Each template is the Kubernetes worker's own default with what a cell's pod needs on a GPU node: its GPUs as an
extended resource (``nvidia.com/gpu``, a job variable the fleet dispatcher sets per run to the GPUs the cell holds),
a node affinity on the GPU product label NVIDIA's GPU Feature Discovery sets (the SKU's NVML names, spaces as
dashes), the toleration of the GPU nodes' usual taint, the runtime's image (TensorRT-LLM 1.2.1 for engine pools,
vLLM for the others; images a node's Dockerfile builds, named under ``--image-repository``) and its environment
(the runtime's tools on the image's PATH). The worker's own code renders a run's job from it, so what a cluster
would receive can be checked without one (tests/test_kubernetes_templates.py).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from enginesmith.core.errors import UserError
from enginesmith.core.specs import TargetSpec
from flows import API_RETRY_ENV

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # set by NVIDIA GPU Feature Discovery: the NVML name, spaces as '-'
DEFAULT_IMAGE_REPOSITORY = "ghcr.io/enginesmith"
# The runtime environment (enginesmith/catalogue/runtimes/runtimes.yaml) each pool's image carries on its PATH.
POOL_RUNTIMES = {"engine": ("trtllm", "enginesmith-trtllm"), "hf": ("vllm", "enginesmith-vllm")}


class KubernetesPool(BaseModel):
    pool: str
    target: str
    template_file: Path


def gpu_products(target: TargetSpec) -> list[str]:
    """The values GPU Feature Discovery gives the SKU's nodes for ``nvidia.com/gpu.product``."""
    return [name.replace(" ", "-") for name in (target.nvml_names or [target.name])]


def base_job_template(target: TargetSpec, pool: str, *, image_repository: str, tag: str) -> dict[str, Any]:
    """The Kubernetes worker's default base job template, made a GPU pool's for ``target``."""
    try:
        from prefect_kubernetes.worker import KubernetesWorker
    except ImportError:
        raise UserError("writing Kubernetes work pools needs prefect-kubernetes", where="--kubernetes",
                        hint="pip install 'enginesmith[kubernetes]'") from None
    runtime, image = POOL_RUNTIMES["engine" if pool.endswith("-engine") else "hf"]
    template = copy.deepcopy(KubernetesWorker.get_default_base_job_template())
    variables = template["variables"]["properties"]
    variables["gpus"] = {"title": "GPUs", "type": "integer", "minimum": 1, "maximum": target.gpus_per_node,
                         "default": 1, "description": f"{GPU_RESOURCE} the run's pod requests: the GPUs the cell "
                                                      "holds (its candidate and its reference)"}
    variables["image"]["default"] = f"{image_repository}/{image}:{tag}"
    variables["env"]["default"] = {f"ENGINESMITH_ENV_{runtime.upper()}": "PATH", **API_RETRY_ENV}
    job = template["job_configuration"]["job_manifest"]
    pod = job["spec"]["template"]["spec"]
    # The worker's default puts the Job's own fields in the pod spec: unknown fields there, which the API server
    # drops with a warning, or rejects under strict field validation.
    for field in ("completions", "parallelism"):
        job["spec"][field] = pod.pop(field)
    container = pod["containers"][0]
    container["resources"]["limits"][GPU_RESOURCE] = "{{ gpus }}"
    container["resources"]["requests"][GPU_RESOURCE] = "{{ gpus }}"
    pod["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": GPU_PRODUCT_LABEL, "operator": "In", "values": gpu_products(target)}]}]}}}
    pod["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    return template


def write_templates(targets: list[TargetSpec], pools_of: dict[str, set[str]], out_dir: Path, *,
                    image_repository: str = DEFAULT_IMAGE_REPOSITORY, tag: str) -> list[KubernetesPool]:
    """A template file per GPU pool (``pools_of``: target id → its pools) in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for target in targets:
        if target.is_cpu:
            continue
        for pool in sorted(pools_of.get(target.id, ())):
            path = out_dir / f"{pool}.json"
            template = base_job_template(target, pool, image_repository=image_repository, tag=tag)
            path.write_text(json.dumps(template, indent=2) + "\n")
            written.append(KubernetesPool(pool=pool, target=target.id, template_file=path))
    return written
