"""The config vocabulary: GPU targets, quantisation recipes, build profiles and the build matrix.

Every YAML file in ``configs/`` validates into one of these models; ``enginesmith schema`` prints their JSON
Schema for editor completion. References between files (a matrix naming a target or a recipe) are checked
in ``enginesmith.core.config``, where the catalogue is known.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from enginesmith.core.errors import UserError
from enginesmith.core.slo import Slo, parse_slo
from enginesmith.core.state import DEFAULTS, REGISTRY_ENV, WORK_ENV

ArtefactKind = Literal["trtllm-engine", "hf-quantized"]
ARTEFACT_KINDS: tuple[ArtefactKind, ...] = ("trtllm-engine", "hf-quantized")
# Encoders (embedding models) take the ONNX road: the graph itself on onnxruntime's CPU provider, or a TensorRT
# engine that trtexec builds from it on a GPU of the SKU.
EncoderKind = Literal["onnx", "tensorrt-engine"]
ENCODER_KINDS: tuple[EncoderKind, ...] = ("onnx", "tensorrt-engine")


class ExactRuntime(BaseModel):
    """The runtime an engine runs on only at the exact version it was built with."""

    key: str  # its entry in an artefact's ``versions``
    name: str
    hint: str = ""  # how a machine without it installed can still say which version it has


# Artefact kinds that are engines: the resolver refuses them on the cpu and on any other runtime version.
EXACT_RUNTIMES: dict[str, ExactRuntime] = {
    "trtllm-engine": ExactRuntime(key="tensorrt_llm", name="TensorRT-LLM", hint=" (pass --runtime-version)"),
    "tensorrt-engine": ExactRuntime(key="tensorrt", name="TensorRT"),
}
Runtime = Literal["trtllm-tensorrt", "trtllm-pytorch", "vllm", "vllm-cpu"]

SLUG = r"^[a-z0-9][a-z0-9._-]*$"
_SHA1 = re.compile(r"^[0-9a-f]{40}$")
# git check-ref-format, as the Hub applies it to branch and tag names ("refs/pr/1" included).
_BAD_REF = re.compile(r"(^[-/.])|(\.\.)|(@\{)|([\x00-\x20~^:?*\[\\\x7f])|(/\.)|(//)|([/.]$)|(\.lock$)")


class StrictModel(BaseModel):
    """Unknown fields are errors: a typo in a config must not be silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def is_commit_sha(revision: str) -> bool:
    return bool(_SHA1.match(revision))


def check_revision(revision: str) -> str:
    """A Hub revision: a 40-hex commit sha, or a branch or tag name that git would accept."""
    if not revision or revision == "@" or _BAD_REF.search(revision):
        raise ValueError(
            f"revision {revision!r} is not a commit sha, branch or tag name "
            "(use a 40-hex commit sha, or a name like 'main' or 'v1.0')"
        )
    return revision


def normalize_pci_device_id(raw: str) -> str:
    """``2330``, ``0x2330`` → ``0x2330`` (device id in upper-case hex, as the catalogue writes it)."""
    if not re.fullmatch(r"(0[xX])?[0-9a-fA-F]{4}", raw):
        raise ValueError(f"PCI device id {raw!r} must be 4 hex digits like '0x2330'")
    return "0x" + raw[-4:].upper()


def check_power_of_two(value: int, what: str) -> int:
    if value < 1 or value & (value - 1):
        raise ValueError(f"{what} must be a power of two (1, 2, 4, 8, ...), got {value}")
    return value


# --- the catalogue: targets and recipes --------------------------------------------------------------


class BuildProfile(StrictModel):
    """Engine build and runtime limits. ``None`` means: the target's default, else TensorRT-LLM's own."""

    max_batch_size: int | None = Field(None, ge=1)
    max_input_len: int | None = Field(None, ge=1)
    max_seq_len: int | None = Field(None, ge=1)
    max_num_tokens: int | None = Field(None, ge=1)
    kv_cache_type: Literal["paged", "continuous"] | None = None
    gemm_plugin: Literal["auto", "float16", "bfloat16", "float32", "fp8", "nvfp4", "disable"] | None = None
    use_paged_context_fmha: bool | None = None
    use_fp8_context_fmha: bool | None = None
    multiple_profiles: bool | None = None
    gather_context_logits: bool | None = None
    workers: int | None = Field(None, ge=1)
    kv_cache_free_gpu_memory_fraction: float | None = Field(None, gt=0, le=1)
    cuda_graph_batch_sizes: list[int] | None = None

    def merged_over(self, defaults: BuildProfile) -> BuildProfile:
        """This profile's explicit values on top of ``defaults`` (e.g. a SKU's build defaults)."""
        explicit = {k: v for k, v in self.model_dump().items() if v is not None}
        return defaults.model_copy(update=explicit)


class TargetSpec(StrictModel):
    """A GPU SKU (or ``cpu``) that artefacts are built for and detected as."""

    id: str = Field(pattern=SLUG)
    name: str
    nvml_names: list[str] = []
    pci_device_ids: list[str] = []
    sm: int | None = Field(description="compute capability as major*10+minor (90 = SM 9.0); null for cpu")
    memory_gib: float = Field(gt=0)
    gpus_per_node: int = Field(8, ge=1)
    build_defaults: BuildProfile = BuildProfile()
    bf16_dense_tflops: float | None = Field(None, gt=0, description="spec sheet, per GPU: what cost estimates scale by")
    memory_bandwidth_gbs: float | None = Field(None, gt=0, description="spec sheet, per GPU (GB/s)")

    @field_validator("pci_device_ids")
    @classmethod
    def _normalise_pci_ids(cls, ids: list[str]) -> list[str]:
        return [normalize_pci_device_id(raw) for raw in ids]

    @property
    def is_cpu(self) -> bool:
        return self.sm is None

    @property
    def sm_label(self) -> str:
        return "-" if self.sm is None else f"{self.sm // 10}.{self.sm % 10}"


class KindSupport(StrictModel):
    sm: list[int]
    why: str
    runtimes: list[Runtime] = []


class CpuSupport(StrictModel):
    supported: bool
    why: str = ""


class CalibrationDefaults(StrictModel):
    samples: int = Field(512, ge=1)
    seq_len: int = Field(512, ge=8)
    batch_size: int = Field(8, ge=1)


class RecipeSpec(StrictModel):
    """A quantisation recipe: a ModelOpt config and where its result can run."""

    id: str = Field(pattern=SLUG)
    description: str = ""
    modelopt_config: str | None = Field(description="name of the ModelOpt config in modelopt.torch.quantization")
    kv_cache: Literal["fp8"] | None = None
    quant_algo: str | None = Field(description="TensorRT-LLM QuantAlgo that the export carries")
    kv_cache_quant_algo: str | None = None
    awq_block_size: int | None = Field(None, ge=32, description="the preferred AWQ block (group) size")
    awq_block_size_fallbacks: list[int] = Field(
        default_factory=list, description="block sizes the runtimes also accept, tried in order when a model's "
                                          "input widths do not divide by awq_block_size")
    weight_bits: int = Field(ge=1, le=16, description="bits of each stored weight value: the grid the recipe "
                                                       "rounds weights onto (scales come on top)")
    weight_bytes_per_param: float = Field(gt=0)
    max_export_dequant_rel_err: float | None = Field(
        None, gt=0, description="the most the exported checkpoint, dequantised, may differ from the calibrated "
                                "weights it was written from (relative logits error on held-out text); beyond it the "
                                "export wrote other weights than calibration chose, and the quantize stage stops")
    calibration: CalibrationDefaults | None = None
    support: dict[ArtefactKind, KindSupport]
    cpu: CpuSupport

    @property
    def is_passthrough(self) -> bool:
        return self.modelopt_config is None


class EncoderRecipeSpec(StrictModel):
    """How an encoder's ONNX graph is made: its precision, ModelOpt ONNX quantisation (or none), the opset that
    needs, and where each encoder kind can run it."""

    id: str = Field(pattern=SLUG)
    description: str = ""
    quantize: Literal["int8", "fp8"] | None = Field(description="modelopt.onnx.quantization mode; null = none")
    precision: Literal["fp32", "fp16"] = Field(description="the graph's floating-point precision (what is not "
                                                            "quantised)")
    opset: int = Field(ge=13, le=21, description="the export opset the recipe needs (int8 13, fp8 21)")
    tensorrt_sm: list[int] = Field(description="SMs a TensorRT engine of this recipe runs on")
    tensorrt_why: str
    cpu: CpuSupport = Field(description="whether onnxruntime's CPU provider runs the graph (the onnx kind)")


class TargetCatalogue(StrictModel):
    targets: list[TargetSpec]

    @model_validator(mode="after")
    def _unique_ids(self) -> TargetCatalogue:
        _refuse_duplicates([t.id for t in self.targets], "target id")
        return self


class RecipeCatalogue(StrictModel):
    recipes: list[RecipeSpec]
    encoder_recipes: list[EncoderRecipeSpec] = []

    @model_validator(mode="after")
    def _unique_ids(self) -> RecipeCatalogue:
        _refuse_duplicates([r.id for r in self.recipes], "recipe id")
        _refuse_duplicates([r.id for r in self.encoder_recipes], "encoder recipe id")
        return self


def _refuse_duplicates(ids: list[str], what: str) -> None:
    seen: set[str] = set()
    for item in ids:
        if item in seen:
            raise ValueError(f"duplicate {what} {item!r}")
        seen.add(item)


# --- the build matrix ------------------------------------------------------------------------------


class CheckpointSourceSpec(StrictModel):
    """Where a model's checkpoint comes from: a Hub repo pinned to a revision, or a local directory."""

    id: str = Field(pattern=SLUG, description="short name used in cell ids and registry paths")
    repo: str = Field(description="Hub repo id ('org/name') or a local directory ('./dir', '/abs/dir')")
    revision: str = Field("main", description="commit sha (preferred), branch or tag")

    @field_validator("revision")
    @classmethod
    def _valid_revision(cls, revision: str) -> str:
        return check_revision(revision)

    @property
    def is_local(self) -> bool:
        return self.repo.startswith(("/", "./", "../", "~", "file:"))


class ModelSpec(CheckpointSourceSpec):
    """An LLM checkpoint to build from."""

    params_b: float | None = Field(None, gt=0, description="parameters in billions, for the memory check")
    allow_pickle: bool = False
    trust_remote_code: bool = False
    task: str | None = Field(None, description="eval task shipped with the model (e.g. 'addition')")


class MatrixBlock(StrictModel):
    """One cartesian product of the matrix: every model × recipe × target × tp × kind."""

    models: list[str] = Field(min_length=1)
    recipes: list[str] = Field(min_length=1)
    targets: list[str] = Field(min_length=1)
    kinds: list[ArtefactKind] = Field(default_factory=lambda: list(ARTEFACT_KINDS), min_length=1)
    tp: list[int] = Field(default_factory=lambda: [1], min_length=1)
    pp: list[int] = Field(default_factory=lambda: [1], min_length=1)
    profile: str = "default"

    @field_validator("tp", "pp")
    @classmethod
    def _powers_of_two(cls, sizes: list[int], info: object) -> list[int]:
        name = getattr(info, "field_name", "size")
        for size in sizes:
            check_power_of_two(size, name)
        return sizes


class EncoderModelSpec(CheckpointSourceSpec):
    """An embedding model (a sentence-transformers directory): exported to ONNX, quantised, served for
    ``/v1/embeddings``. ``pooling`` and ``normalize``, when given, are what the config expects of the checkpoint's
    own modules (a mismatch is an error, not a silent override); ``max_length`` caps the served sequence length."""

    pooling: Literal["mean", "cls"] | None = None
    normalize: bool | None = None
    max_length: int | None = Field(None, ge=8, le=8192)


class EncoderMatrixBlock(StrictModel):
    """Every encoder × encoder recipe × target × kind."""

    models: list[str] = Field(min_length=1)
    recipes: list[str] = Field(min_length=1)
    targets: list[str] = Field(min_length=1)
    kinds: list[EncoderKind] = Field(default_factory=lambda: list(ENCODER_KINDS), min_length=1)


class EncoderWorkloadSpec(StrictModel):
    """What validation sends to the candidate, the unquantised graph and the vLLM reference, in interleaved
    rounds: requests of each batch size, one at a time, timed per side."""

    batch_sizes: list[int] = Field(default_factory=lambda: [1, 8, 32], min_length=1)
    requests: int = Field(8, ge=1, description="timed requests per batch size, side and round")
    warmup_requests: int = Field(2, ge=0)
    repeats: int = Field(3, ge=1, description="interleaved rounds")
    recall_k: int = Field(10, ge=1)


class EncoderGateSpec(StrictModel):
    """What an encoder candidate must achieve against the vLLM reference (the checkpoint in float32)."""

    min_cosine: dict[str, float] = Field(
        default_factory=lambda: {"fp32": 0.9999, "fp16": 0.999, "int8": 0.95, "fp8": 0.98},
        description="per recipe: the lowest cosine similarity of any sentence's embedding to the reference's")
    default_min_cosine: float = Field(0.95, gt=0, le=1)
    max_recall_drop: float = Field(0.05, ge=0, le=1, description="recall@k below the reference's, at most")
    min_throughput_ratio: float = Field(
        0.5, gt=0, description="candidate embeddings/s ÷ the unquantised graph's on the same runtime, at the "
                               "largest batch size (median over rounds)")

    def min_cosine_for(self, recipe_id: str) -> float:
        return self.min_cosine.get(recipe_id, self.default_min_cosine)


LATENCY_CONCURRENCY = 1  # the level the latency gate (TPOT, or E2EL where TPOT is not observable) is judged at


class WorkloadSpec(StrictModel):
    """What validation sends to both servers."""

    name: str = "default"
    dataset: Literal["random", "sharegpt", "task"] = "random"
    dataset_path: str | None = None
    api: Literal["completions", "chat"] = Field(
        "completions", description="the endpoint the load and the accuracy checks use: /v1/completions (prompts as "
        "text) or /v1/chat/completions (each prompt one user message; the server applies the model's chat template)")
    input_len: int = Field(128, ge=1)
    output_len: int = Field(128, ge=1)
    num_prompts: int = Field(64, ge=1)
    concurrency: list[int] = Field(default_factory=lambda: [1, 4, 16, 64], min_length=1)
    request_rate: float | None = Field(
        None, gt=0, description="requests/s (Poisson when burstiness is 1); null = all at once"
    )
    burstiness: float = Field(1.0, gt=0)
    warmup_requests: int = Field(
        8, ge=0, description="warm-up batch size at each level's concurrency (at least 4 × concurrency is sent); "
        "0 = no warm-up")
    warmup_max_s: float = Field(60, gt=0, description="warm-up stops once steady, or after this long")
    warmup_tolerance: float = Field(
        0.1, gt=0, description="steady = two warm-up batches' output throughputs within this share of each other")
    min_duration_s: float = Field(60, ge=0, description="each level measures for at least this long")
    min_requests: int = Field(64, ge=1, description="each level completes at least this many requests")
    level_timeout_s: float = Field(
        900, gt=0, description="a level that has not sent its minimum requests by then is an error")
    repeats: int = Field(
        2, ge=1, description="interleaved rounds (candidate, reference, …) measured before the gates are first judged")
    max_repeats: int = Field(
        6, ge=1, description="rounds allowed while a performance gate is undecided (one look after each round)")
    error_budget: float = Field(
        0.05, gt=0, lt=0.5, description="per performance gate: the chance of a verdict on the wrong side of its limit, "
        "spent evenly over the looks from repeats to max_repeats")
    round_noise: float = Field(
        0.05, gt=0, description="an upper bound on the per-round noise of a ratio (σ of its log) on this target, "
        "worth four rounds of evidence: two rounds that happen to agree cannot decide a gate alone, and the error "
        "budget holds while the true noise stays below it")
    complete_report: bool = Field(
        False, description="measure every performance gate to its decision even after another gate failed clear "
        "(by default the verdict is final then and measuring stops: the undecided gates read 'not decided')")
    calibration_rounds: int = Field(
        0, ge=0, description="GPU targets: after the verdict, the reference served again on the candidate's GPUs and "
        "measured against itself in this many interleaved rounds, an A/A run whose speed ratios must read 1.00 (a "
        "harness fault otherwise, as on the cpu target); 0: off. It costs another server start and these rounds on "
        "both sides' GPUs (the report says how much). The cpu target checks its calibration in every run")
    accuracy_tasks: list[str] = []
    greedy_agreement_tokens: int = Field(16, ge=1)
    baselines: list[Literal["transformers-serve"]] = Field(
        default_factory=list, description="more servers measured on the reference checkpoint beside the candidate "
        "and the reference, in the same rounds (reported, never gated)")
    perplexity_text: str | None = Field(
        None, description="held-out text whose perplexity both servers compute from prompt logprobs: "
        "'builtin:<name>' or a text file (one paragraph a line)")
    slo: str | None = Field(
        None, description="latency bounds for goodput (vLLM's: requests/s within every bound), e.g. "
                          "'ttft_p95<=500ms,tpot_p95<=40ms'; each level reports its goodput, and the gate "
                          "min_goodput_ratio compares the sides'")

    @field_validator("slo")
    @classmethod
    def _slo_parses(cls, text: str | None) -> str | None:
        if text is not None:
            try:
                parse_slo(text, where="workload.slo")
            except UserError as exc:
                raise ValueError(f"{exc.message} ({exc.hint})") from None
        return text

    def parsed_slo(self) -> Slo | None:
        return None if self.slo is None else parse_slo(self.slo, where="workload.slo")

    def keyed(self) -> dict[str, object]:
        """The workload as a stage key takes it: a field added after keys were recorded enters only when set."""
        unset = {name for name, default in (("slo", None), ("complete_report", False), ("calibration_rounds", 0))
                 if getattr(self, name) == default}
        return self.model_dump(mode="json", exclude=unset)

    @model_validator(mode="after")
    def _rounds_in_order(self) -> WorkloadSpec:
        if self.max_repeats < self.repeats:
            raise ValueError(f"max_repeats ({self.max_repeats}) must be at least repeats ({self.repeats})")
        return self


class GateSpec(StrictModel):
    """What the candidate must achieve against the reference to be published."""

    min_throughput_ratio: float = Field(0.9, gt=0)
    max_tpot_ratio: float = Field(1.15, gt=0)
    min_goodput_ratio: float | None = Field(
        None, gt=0, description="candidate's most goodput over the levels / reference's, per round, at workload.slo")
    max_accuracy_drop_points: dict[str, float] = Field(
        default_factory=lambda: {"bf16": 0.5, "fp8": 1.0, "fp8-kv": 1.0, "int4-awq": 5.0, "w4a8-awq": 5.0,
                                 "nvfp4": 3.0, "int8-sq": 3.0}
    )
    default_max_accuracy_drop_points: float = 2.0
    min_reference_accuracy: float = Field(
        0.1, ge=0, le=1, description="an accuracy task on which the reference scores below this cannot tell a broken "
        "candidate from a good one (both at 0 %): its gate is not judged, and the cell fails unless "
        "accept_unjudged_accuracy")
    accept_unjudged_accuracy: bool = Field(
        False, description="publish a cell whose accuracy gates could not be judged (the report says so)")
    min_greedy_agreement: dict[str, float] = Field(
        default_factory=dict, description="per recipe: the share of prompts whose first greedy tokens must match the "
        "BF16 reference's (workload.greedy_agreement_tokens); default_min_greedy_agreement for the rest")
    default_min_greedy_agreement: float = Field(
        0.1, ge=0, le=1, description="a floor that only a broken candidate (or random weights) falls under")
    min_quantize_agreement: dict[str, float] = Field(
        default_factory=dict, description="per recipe: the quantise report's top-1 agreement with BF16 below which "
        "the cell stops before build and validation; default_min_quantize_agreement for the rest")
    default_min_quantize_agreement: float = Field(0.3, ge=0, le=1)
    max_perplexity_increase: dict[str, float] = Field(
        default_factory=lambda: {"bf16": 0.005, "fp8": 0.03, "fp8-kv": 0.05, "int4-awq": 0.15, "w4a8-awq": 0.15,
                                 "nvfp4": 0.10, "int8-sq": 0.05},
        description="candidate perplexity / reference's − 1, per recipe")
    default_max_perplexity_increase: float = 0.05

    def max_drop_for(self, recipe_id: str) -> float:
        return self.max_accuracy_drop_points.get(recipe_id, self.default_max_accuracy_drop_points)

    def min_quantize_agreement_for(self, recipe_id: str) -> float:
        return self.min_quantize_agreement.get(recipe_id, self.default_min_quantize_agreement)

    def min_greedy_agreement_for(self, recipe_id: str) -> float:
        return self.min_greedy_agreement.get(recipe_id, self.default_min_greedy_agreement)

    def max_perplexity_increase_for(self, recipe_id: str) -> float:
        return self.max_perplexity_increase.get(recipe_id, self.default_max_perplexity_increase)


class QuantizeToolchain(StrictModel):
    modelopt: str = "0.47.0"
    torch: str = "2.13.0"
    transformers: str = "4.57.6"


class TrtllmToolchain(StrictModel):
    tensorrt_llm: str = "1.2.1"
    tensorrt: str = "10.14.1"
    modelopt: str = Field(
        "0.37.0", description="the ModelOpt the TensorRT-LLM image pins; engine checkpoints are exported with it"
    )
    cuda: str = "13.0"


class VllmToolchain(StrictModel):
    vllm: str = "0.32.0"


class EncoderToolchain(StrictModel):
    """What exports, quantises, runs and builds an encoder's graph (ModelOpt and torch come from ``quantize``)."""

    onnx: str = "1.21.0"
    onnxruntime: str = "1.24.4"
    tensorrt: str = Field("11.4.0", description="the trtexec that builds tensorrt-engine encoder artefacts")


class Toolchains(StrictModel):
    """Versions that determine outputs, so they are part of the stage keys."""

    quantize: QuantizeToolchain = QuantizeToolchain()
    trtllm: TrtllmToolchain = TrtllmToolchain()
    vllm: VllmToolchain = VllmToolchain()
    encoder: EncoderToolchain = EncoderToolchain()


class CalibrationSpec(StrictModel):
    """Calibration data: a file shipped with the repo, or a Hub dataset (needs network)."""

    dataset: str = Field(
        "builtin:addition", description="'builtin:<name>', a local text/JSONL path, or a Hub dataset id"
    )
    samples: int | None = Field(None, ge=1)
    seq_len: int | None = Field(None, ge=8)
    batch_size: int | None = Field(None, ge=1)


class SigningSpec(StrictModel):
    """How publishing signs (#34): an elliptic-curve private key from a file or an environment variable, never the key
    itself in the config."""

    key_file: str | None = Field(None, description="a PEM private key file that only its owner may read (mode 600)")
    key_env: str | None = Field(None, description="the environment variable holding the PEM private key")
    passphrase_env: str | None = Field(None, description="the environment variable holding the key's passphrase")

    @model_validator(mode="after")
    def _one_key(self) -> SigningSpec:
        if (self.key_file is None) == (self.key_env is None):
            raise ValueError("give key_file or key_env (one of them)")
        return self


class RegistrySpec(StrictModel):
    url: str = Field(DEFAULTS[REGISTRY_ENV], description="a local directory, file://, s3://bucket/prefix or "
                     "oci://host[:port]/namespace")
    catalogue: str | None = Field(None, description="where the nightly writes the registry's static catalogue site "
                                  "after publishing (a local directory; default: <workdir>/catalogue)")
    signing: SigningSpec | None = Field(None, description="sign every artefact the pipeline publishes")


class TuningSpec(StrictModel):
    """A sweep of the candidate runtime's serving knobs once a cell has passed its gates (#33): each combination of
    the values is a serving profile, measured as validation measures (warm-up, interleaved rounds, minimum duration
    and requests) on the cell's SKU and published with the artefact, for a deployment to pick by SLO."""

    knobs: dict[str, list[int | str]] = Field(
        min_length=1, description="knob → the values to try; the catalogue's serving_knobs.yaml names each runtime's")
    recipes: list[str] | None = Field(None, description="the recipes whose cells are tuned (default: every one)")
    concurrency: list[int] | None = Field(
        None, min_length=1, description="the levels each profile is measured at (default: the workload's)")
    rounds: int = Field(2, ge=1, le=10, description="interleaved rounds: every profile measured once per round")
    min_duration_s: float | None = Field(None, ge=0, description="per level and round (default: the workload's)")
    min_requests: int | None = Field(None, ge=1, description="per level and round (default: the workload's)")
    warmup_max_s: float | None = Field(None, gt=0, description="each level's warm-up at most (default: the workload's)")
    budget_s: float = Field(900, gt=0, description="measuring time for the whole sweep: a round that would run past "
                                                   "it is not started")

    @field_validator("knobs")
    @classmethod
    def _values_given_once(cls, knobs: dict[str, list[int | str]]) -> dict[str, list[int | str]]:
        for name, values in knobs.items():
            if not values:
                raise ValueError(f"knob {name!r} has no values to try")
            _refuse_duplicates([str(value) for value in values], f"value of knob {name!r}:")
        return knobs

    def applies_to(self, recipe_id: str) -> bool:
        return self.recipes is None or recipe_id in self.recipes


class PipelineConfig(StrictModel):
    """A build matrix: ``configs/nightly.yaml``, ``configs/examples/tiny-cpu.yaml``."""

    version: Literal[1] = 1
    name: str
    registry: RegistrySpec = RegistrySpec()
    workdir: str = DEFAULTS[WORK_ENV]
    models: list[ModelSpec] = []
    matrix: list[MatrixBlock] = []
    build_profile: BuildProfile = BuildProfile()
    profiles: dict[str, BuildProfile] = {}
    calibration: CalibrationSpec = CalibrationSpec()
    workload: WorkloadSpec = WorkloadSpec()
    gates: GateSpec = GateSpec()
    toolchains: Toolchains = Toolchains()
    # Cell-id glob → the SKU whose nodes quantise those cells (first match wins; the cell's own SKU where none
    # does): a model can need a bigger node to calibrate than to build and serve. That node's pool quantises and
    # hands the output over through the registry (registry/stages.py).
    quantize_on: dict[str, str] = {}
    encoders: list[EncoderModelSpec] = []
    encoder_matrix: list[EncoderMatrixBlock] = []
    encoder_workload: EncoderWorkloadSpec = EncoderWorkloadSpec()
    encoder_gates: EncoderGateSpec = EncoderGateSpec()
    # Cell kinds beyond LLMs and encoders: the modules that register them (imported when the config is planned),
    # and each one's own section, validated by that kind.
    tuning: TuningSpec | None = Field(None, description="serving profiles to measure after a cell passes (#33)")
    plugins: list[str] = Field(default_factory=list, description="modules that register cell kinds")
    kinds: dict[str, dict[str, Any]] = Field(default_factory=dict, description="a plug-in kind's section, by name")

    @model_validator(mode="after")
    def _goodput_needs_an_slo(self) -> PipelineConfig:
        if self.gates.min_goodput_ratio is not None and self.workload.slo is None:
            raise ValueError("gates.min_goodput_ratio compares goodput at workload.slo, and there is none: add "
                             "workload.slo, e.g. 'ttft_p95<=500ms,tpot_p95<=40ms'")
        return self

    @model_validator(mode="after")
    def _latency_gate_has_its_level(self) -> PipelineConfig:
        if self.matrix and LATENCY_CONCURRENCY not in self.workload.concurrency:
            raise ValueError(f"gates.max_tpot_ratio compares TPOT (or E2EL) at concurrency {LATENCY_CONCURRENCY}, "
                             f"and workload.concurrency ({self.workload.concurrency}) has no {LATENCY_CONCURRENCY}: "
                             f"add {LATENCY_CONCURRENCY} to it")
        return self

    @model_validator(mode="after")
    def _unique_model_ids(self) -> PipelineConfig:
        _refuse_duplicates([m.id for m in self.models] + [e.id for e in self.encoders], "model id")
        if not self.matrix and not self.encoder_matrix and not self.kinds:
            raise ValueError("nothing to build: give 'matrix' (LLMs, with 'models') or 'encoder_matrix' (embedding "
                             "models, with 'encoders'), or a plug-in kind's section under 'kinds'")
        if self.matrix and not self.models:
            raise ValueError("'matrix' names LLMs but 'models' is empty")
        if self.encoder_matrix and not self.encoders:
            raise ValueError("'encoder_matrix' names encoders but 'encoders' is empty")
        return self

    def encoder(self, model_id: str) -> EncoderModelSpec:
        return next(e for e in self.encoders if e.id == model_id)

    def model(self, model_id: str) -> ModelSpec:
        return next(m for m in self.models if m.id == model_id)

    def profile(self, name: str) -> BuildProfile:
        return self.build_profile if name == "default" else self.profiles[name]
