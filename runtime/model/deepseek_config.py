"""DeepSeek-V2/V3's config.json as transformers reads it: `ModelConfig`'s head size and the
`FamilyConfig` fields of latent attention and DeepSeek's experts (model/deepseek.py runs them).
Kept apart from the model so that reading a config imports no layer code.

A.X-K1 (`AXK1ForCausalLM`, axk1: `model/axk1.py`) is V3's with a norm on each MoE block's output,
its q bottleneck always there, its correction bias optional (its releases have none).
GLM-4.7-Flash (`Glm4MoeLiteForCausalLM`, glm4_moe_lite) is DeepSeek-V3 as transformers builds
it (`DeepseekV3Attention`, GLM-4.5's router: V3's noaux_tc with sigmoid scores and the
correction bias) with its own defaults and its MLP kinds per layer from ``mlp_layer_types``
(transformers reads no ``first_k_dense_replace`` for it: by default the first layer dense, the
rest experts).

DeepSeek-V3.2 (`DeepseekV32ForCausalLM`) and GLM-5 (`GlmMoeDsaForCausalLM`) are V3 with a
lightning indexer in every attention layer (`model_configs.IndexerConfig`, model/dsa.py): the
main rotary always interleaved, the indexer's rotate-half (V3.2) or interleaved (GLM-5), MLP
kinds from ``mlp_layer_types`` (by default the first ``first_k_dense_replace`` dense) and
GLM-5's per-layer ``indexer_types`` ("full" or "shared"; by default from
``index_topk_pattern`` or ``index_topk_freq`` / ``index_skip_topk_offset``, as transformers
derives them). A.X-K2 (`AXK2ForCausalLM`) is V3.2 with gated norms, an output gate in its
attention and its own router defaults (model/axk2.py); Dots3 Note's text model
(`Dots3NoteForCausalLM`) is V3.2 with GLM-5's indexer and Dots3's attention (`MlaConfig.dots`),
served where every layer is indexed (`check_dots3_layers`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pagoda.runtime.model.ops import rope_kind
from pagoda.runtime.model_configs import ExpertRouting, IndexerConfig, MlaConfig

ARCHITECTURES = {
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "YoutuForCausalLM": "youtu",  # Youtu-LLM: V3's latent attention, a dense MLP
    "Glm4MoeLiteForCausalLM": "glm4_moe_lite",  # GLM-4.7-Flash
    "DeepseekV32ForCausalLM": "deepseek_v32",  # DeepSeek Sparse Attention (model/dsa.py)
    "GlmMoeDsaForCausalLM": "glm_moe_dsa",  # GLM-5: V3.2's, its indexer shared across layers
    "AXK2ForCausalLM": "axk2",  # A.X-K2: V3.2's, gated norms and attention (model/axk2.py)
    "AXK1ForCausalLM": "axk1",  # A.X-K1: V3's, its experts' output normalised (model/axk1.py)
    "HYV4ForCausalLM": "hy_v4",  # HY V4: GLM-5's with hyper-connections (model/hy_v4.py)
    "Dots3NoteForCausalLM": "dots3_note_text",  # Dots3 Note's text model: its indexed layers
    "Dots3NoteForConditionalGeneration": "dots3_note_text",  # (its text model alone)
}
DSA = ("deepseek_v32", "glm_moe_dsa", "axk2", "hy_v4", "dots3_note_text")
# noaux_tc, sigmoid scores, correction bias
V3_ROUTER = ("deepseek_v3", "glm4_moe_lite", "axk1", *DSA)
# transformers' DeepseekV2Config / DeepseekV3Config defaults, where config.json leaves one out
DEFAULTS: dict[str, dict[str, Any]] = {
    "deepseek_v2": {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                    "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 64,
                    "n_shared_experts": 2, "moe_intermediate_size": 1407,
                    "routed_scaling_factor": 1.0, "topk_method": "greedy"},
    "deepseek_v3": {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                    "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256,
                    "n_shared_experts": 1, "moe_intermediate_size": 2048, "n_group": 8,
                    "topk_group": 4, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
                    "norm_topk_prob": True, "routed_scaling_factor": 2.5},
    # Youtu-LLM: V3's latent attention over a dense SwiGLU MLP in every layer (YoutuConfig
    # has no experts), tied embeddings
    "youtu": {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
              "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 128_256,
              "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 32,
              "num_attention_heads": 16, "num_key_value_heads": 16,
              "max_position_embeddings": 131_072, "bos_token_id": 128_000,
              "eos_token_id": 128_001, "tie_word_embeddings": True, "rope_interleave": True},
    "glm4_moe_lite": {"q_lora_rank": 768, "kv_lora_rank": 512, "qk_nope_head_dim": 192,
                      "qk_rope_head_dim": 64, "v_head_dim": 256, "n_routed_experts": 64,
                      "n_shared_experts": 1, "moe_intermediate_size": 1536, "n_group": 1,
                      "topk_group": 1, "num_experts_per_tok": 4, "norm_topk_prob": True,
                      "routed_scaling_factor": 1.8, "rms_norm_eps": 1e-5},
    # A.X-K1 (AXK1Config): no correction bias in its releases (zero: `bias_optional`)
    "axk1": {"vocab_size": 163_840, "hidden_size": 7168, "intermediate_size": 18_432,
             "num_hidden_layers": 61, "num_attention_heads": 64, "num_key_value_heads": 64,
             "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
             "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 192,
             "n_shared_experts": 1, "moe_intermediate_size": 2048, "n_group": 8, "topk_group": 4,
             "num_experts_per_tok": 8, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
             "max_position_embeddings": 32_768, "rms_norm_eps": 1e-6, "bos_token_id": 163_691,
             "eos_token_id": 163_691},
    "deepseek_v32": {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                     "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256,
                     "n_shared_experts": 1, "moe_intermediate_size": 2048, "n_group": 8,
                     "topk_group": 4, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
                     "norm_topk_prob": True, "routed_scaling_factor": 2.5, "rms_norm_eps": 1e-6,
                     "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 64},
    "glm_moe_dsa": {"q_lora_rank": 2048, "kv_lora_rank": 512, "qk_nope_head_dim": 192,
                    "qk_rope_head_dim": 64, "v_head_dim": 256, "n_routed_experts": 256,
                    "n_shared_experts": 1, "moe_intermediate_size": 2048, "n_group": 1,
                    "topk_group": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
                    "norm_topk_prob": True, "routed_scaling_factor": 2.5, "rms_norm_eps": 1e-5,
                    "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 32},
    # AXK2Config's (A.X-K2-Light's shape; no expert groups unless n_group is set)
    "axk2": {"vocab_size": 163_840, "hidden_size": 2048, "intermediate_size": 5120,
             "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 32,
             "max_position_embeddings": 131_072, "bos_token_id": 163_691,
             "eos_token_id": 163_691, "q_lora_rank": 384, "kv_lora_rank": 128,
             "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64,
             "n_routed_experts": 128, "n_shared_experts": 1, "moe_intermediate_size": 512,
             "num_experts_per_tok": 8, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
             "rms_norm_eps": 1e-6, "index_topk": 2048, "index_head_dim": 128,
             "index_n_heads": 16, "gated_norm_rank": 16},
    "hy_v4": {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 192,
              "qk_rope_head_dim": 64, "v_head_dim": 256, "n_routed_experts": 256,
              "n_shared_experts": 1, "moe_intermediate_size": 768, "n_group": 1,
              "topk_group": 1, "num_experts_per_tok": 8, "norm_topk_prob": True,
              "routed_scaling_factor": 2.827, "rms_norm_eps": 1e-5, "index_topk": 2048,
              "index_head_dim": 128, "index_n_heads": 16, "vocab_size": 120_832,
              "hidden_size": 2816, "intermediate_size": 6912, "num_hidden_layers": 34,
              "num_attention_heads": 32, "max_position_embeddings": 262_144,
              "bos_token_id": 120_000, "eos_token_id": 120_025, "pad_token_id": 120_002,
              "tie_word_embeddings": False, "hc_mult": 4, "hc_magnitude": 2.0, "hc_eps": 1e-6,
              "swiglu_limit": 10.0},
    # Dots3NoteTextConfig's (DeepseekV32Config's where it keeps them)
    "dots3_note_text": {"vocab_size": 152_064, "hidden_size": 5120, "intermediate_size": 13_824,
                        "num_hidden_layers": 46, "num_attention_heads": 128,
                        "max_position_embeddings": 524_288, "rms_norm_eps": 1e-5,
                        "bos_token_id": 151_643, "eos_token_id": 151_668, "q_lora_rank": 1024,
                        "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                        "v_head_dim": 128, "n_routed_experts": 256, "n_shared_experts": 1,
                        "moe_intermediate_size": 1536, "shared_experts_intermediate_size": 1536,
                        "num_experts_per_tok": 8, "n_group": 1, "topk_group": 1,
                        "norm_topk_prob": True, "routed_scaling_factor": 1.0,
                        "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 64},
}  # fmt: skip
DOTS3_THETA = 80_000_000.0  # Dots3NoteTextConfig's default_theta
NULLABLE = ("q_lora_rank",)  # null: q_proj (V2-Lite), not the default bottleneck


def yarn_mscale(factor: float, mscale: float) -> float:
    """DeepSeek's yarn_get_mscale."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def indexer_config(cfg: Mapping[str, Any], arch: str) -> IndexerConfig | None:
    """The lightning indexer of a V3.2 / GLM-5 config (None for the others)."""
    if arch not in (*DSA, "glm5_next"):  # (GLM-5-Next's: GLM-5's reading, k-pools)
        return None
    n = int(cfg["num_hidden_layers"])
    glm = arch in ("glm_moe_dsa", "glm5_next")
    kinds = cfg.get("indexer_types") if glm or arch == "hy_v4" else None
    pattern = cfg.get("index_topk_pattern") if glm else None
    if kinds is None and arch == "hy_v4":  # HYV4Config's: the first, then one in every four
        kinds = ["full" if i == 0 or (i - 1) % 4 == 0 else "shared" for i in range(n)]
    elif kinds is None and pattern is not None:  # transformers' GlmMoeDsaConfig, as it reads them
        letters = {"F": "full", "S": "shared"}
        kinds = [letters.get(c, c) for c in pattern] if isinstance(pattern, str) else pattern
    elif kinds is None:
        freq = max(int(cfg.get("index_topk_freq", 1)), 1) if glm else 1
        offset = int(cfg.get("index_skip_topk_offset", 2))
        kinds = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]
    if len(kinds) != n or set(kinds) - {"full", "shared"}:
        raise ValueError(f"indexer_types must name 'full' or 'shared' for each of the {n} "
                         f"layers, got {kinds}")  # fmt: skip
    return IndexerConfig(
        n_heads=int(cfg["index_n_heads"]),
        head_dim=int(cfg["index_head_dim"]),
        topk=int(cfg["index_topk"]),
        # V3.2's (and A.X-K2's) indexer: rotate-half; GLM-5's (HY V4's, Dots3 Note's): pairs
        rope_interleave=arch in ("glm_moe_dsa", "hy_v4", "dots3_note_text"),
        full_layers=tuple(k == "full" for k in kinds),
        # HY V4's: its last dims rotated, its key's LayerNorm with rms_norm_eps
        rope_last=arch == "hy_v4",
        key_norm_eps=float(cfg.get("rms_norm_eps") or 1e-5) if arch == "hy_v4" else 1e-6,
        kpool=int(cfg["index_kpool"]) if arch == "glm5_next" else 0,
    )


def mla_config(cfg: Mapping[str, Any], arch: str) -> MlaConfig:
    q_lora = cfg.get("q_lora_rank")
    if arch in DSA and q_lora is None:  # transformers' V3.2 attention always has the bottleneck
        raise ValueError(f"{arch} needs q_lora_rank (its indexer reads the q bottleneck)")
    if arch == "axk1" and q_lora is None:  # (AXK1Attention always has it)
        raise ValueError("axk1 needs q_lora_rank (its attention always has the q bottleneck)")
    return MlaConfig(
        kv_lora_rank=int(cfg["kv_lora_rank"]),
        qk_nope_head_dim=int(cfg["qk_nope_head_dim"]),
        qk_rope_head_dim=int(cfg["qk_rope_head_dim"]),
        v_head_dim=int(cfg["v_head_dim"]),
        q_lora_rank=None if q_lora is None else int(q_lora),
        # V2's complex rotary and V3.2's / GLM-5's (their configs have no such key) interleave
        rope_interleave=arch in ("deepseek_v2", *DSA) or bool(cfg.get("rope_interleave", True)),
        indexer=indexer_config(cfg, arch),
        output_gate=arch == "axk2",
        norm_eps=float(cfg.get("rms_norm_eps") or 1e-6)
        if arch in ("dots3_note_text", "glm5_next")
        else 1e-6,
        dots=arch == "dots3_note_text",
    )


def head_dim(cfg: Mapping[str, Any], arch: str) -> int:
    """The cache's head size: one latent row (`MlaConfig.cache_width`), in one KV head."""
    return mla_config(cfg, arch).cache_width


def moe_layers(cfg: Mapping[str, Any], arch: str, n: int) -> tuple[bool, ...]:
    """Which layers have experts: ``mlp_layer_types`` ("dense" / "sparse") where transformers
    reads it (GLM-4.7-Flash: by default its first layer dense; V3.2, GLM-5), else the first
    ``first_k_dense_replace`` layers dense."""
    kinds = cfg.get("mlp_layer_types")
    if arch in ("axk2", "dots3_note_text") and kinds is None:  # their configs': from the first
        dense, freq = int(cfg.get("first_k_dense_replace", 1)), cfg.get("moe_layer_freq", 1)
        if isinstance(freq, list):  # (Dots3 Note's: a flag per layer)
            return tuple(i >= dense and bool(freq[i]) for i in range(n))
        return tuple(i >= dense and i % int(freq) == 0 for i in range(n))
    if arch == "axk1" and kinds is None:  # AXK1Config's, from the legacy keys
        dense, freq = int(cfg.get("first_k_dense_replace", 1)), int(cfg.get("moe_layer_freq", 1))
        kinds = ["sparse" if i >= dense and i % freq == 0 else "dense" for i in range(n)]
    if arch not in ("glm4_moe_lite", "axk1", *DSA) or (
        kinds is None and arch in ("deepseek_v32", "glm_moe_dsa")
    ):
        dense = min(int(cfg.get("first_k_dense_replace") or 0), n)
        return tuple(i >= dense for i in range(n))
    kinds = kinds or ["dense"] + ["sparse"] * (n - 1)
    if len(kinds) != n or set(kinds) - {"dense", "sparse"}:
        raise ValueError(f"mlp_layer_types must name 'dense' or 'sparse' for each of the {n} "
                         f"layers, got {kinds}")  # fmt: skip
    return tuple(k == "sparse" for k in kinds)


def check_dots3_layers(cfg: Mapping[str, Any], n: int) -> None:
    """Dots3 Note's layers must all be DeepSeek Sparse Attention (`indexed_attention`): its
    sliding-window layers (their own latent sizes, heads and rotary) and plain full-attention
    ones are refused in one line."""
    types = cfg.get("layer_types")
    if types is None:  # Dots3NoteTextConfig's: a window on most layers unless switched off
        window = cfg.get("use_sliding_window", True)
        dsa = cfg.get("use_dsa", None if "per_layer_config" in cfg else True)
        types = ["indexed_attention" if not window or i < 2 or i % 4 == 1 else
                 "sliding_attention" for i in range(n)]  # fmt: skip
        if dsa is False:
            types = ["full_attention" if t == "indexed_attention" else t for t in types]
    other = sorted(set(types) - {"indexed_attention"})
    if other or len(types) != n:
        raise ValueError(f"Dots3 Note's {' and '.join(other) or 'layer_types'} layers are not "
                         "supported (only indexed_attention: DeepSeek Sparse Attention on "
                         "every layer)")  # fmt: skip


def dots3_rope(cfg: Mapping[str, Any]) -> tuple[float, None]:
    """Dots3 Note's rotary: ``rope_parameters.indexed_attention`` (its partial_rotary_factor
    names the qk_rope_head_dim of head_dim that rotate: all of the latent's rotary dims), else
    a flat rope_theta, else 80M; another rope_type is refused in one line."""
    params = cfg.get("rope_parameters") or {}
    params = params.get("indexed_attention", params) or {}
    if rope_kind(dict(params)) != "default" or cfg.get("rope_scaling"):
        raise ValueError("a rope_type other than default on Dots3 Note is not supported")
    return float(params.get("rope_theta") or cfg.get("rope_theta") or DOTS3_THETA), None


def family_fields(
    cfg: Mapping[str, Any], arch: str, n: int, scaling: Mapping[str, Any] | None
) -> dict[str, Any]:
    """`FamilyConfig` fields of a DeepSeek config.json (its layers: `n`), as transformers reads
    them; ValueError, one line, for what it does not run."""
    m = mla_config(cfg, arch)
    scale = m.qk_head_dim**-0.5  # transformers' yarn_apply_mscale
    if scaling and rope_kind(dict(scaling)) != "default" and scaling.get("mscale_all_dim"):
        mscale = yarn_mscale(float(scaling["factor"]), float(scaling["mscale_all_dim"]))
        scale *= mscale * mscale
    if arch == "dots3_note_text":
        check_dots3_layers(cfg, n)
        scale = m.qk_head_dim**-0.5  # (no yarn mscale)
    fields: dict[str, Any] = {"mla": m, "attention_multiplier": scale}
    if arch == "axk2":
        fields["gated_norm_rank"] = int(cfg["gated_norm_rank"])
    if cfg.get("mlp_bias"):
        raise ValueError("mlp_bias on a DeepSeek model is not supported")
    # (YoutuConfig has no experts: an n_routed_experts config.json may carry is not read)
    experts = 0 if arch == "youtu" else int(cfg.get("n_routed_experts") or 0)
    if not experts:
        return fields
    if int(cfg.get("moe_layer_freq") or 1) != 1 and arch not in (
        "axk1",
        "axk2",
        "dots3_note_text",
    ):  # (read by A.X-K1/K2 and Dots3 Note only)
        raise ValueError(f"moe_layer_freq {cfg['moe_layer_freq']} is not supported (experts "
                         "in every layer from first_k_dense_replace on: 1)")  # fmt: skip
    v3 = arch in V3_ROUTER
    method = "noaux_tc" if v3 else str(cfg.get("topk_method") or "greedy")
    scoring = "sigmoid" if v3 else "softmax"
    for key, want in (("topk_method", method), ("scoring_func", scoring)):
        if cfg.get(key) not in (None, want):  # transformers' V3 router is noaux_tc, sigmoid
            raise ValueError(f"{key} {cfg[key]!r} is not supported for {arch} ({want!r})")
    if not v3 and method == "noaux_tc":  # transformers' V2 router has no such branch
        raise ValueError("topk_method 'noaux_tc' is not supported for deepseek_v2 (greedy or "
                         "group_limited_greedy; noaux_tc is DeepseekV3's)")  # fmt: skip
    groups = int(cfg.get("n_group") or 1) if method != "greedy" else 1
    routing = ExpertRouting(
        scoring=scoring,
        topk_method=method,
        n_group=groups,
        topk_group=int(cfg.get("topk_group") or 1) if method != "greedy" else 1,
        routed_scaling_factor=float(cfg.get("routed_scaling_factor") or 1.0),
        zero_other_groups=arch == "axk2",
        bias_optional=arch == "axk1",
    )
    if method == "noaux_tc" and experts // groups < 2:
        raise ValueError(f"noaux_tc scores a group by its best two experts: n_group {groups} "
                         f"leaves {experts // groups} of {experts} per group")  # fmt: skip
    moe_width = int(cfg["moe_intermediate_size"])
    shared = moe_width * int(cfg.get("n_shared_experts") or 0)
    if arch == "dots3_note_text":  # its shared experts' own width
        shared = int(cfg["shared_experts_intermediate_size"]) * int(cfg["n_shared_experts"])
    return {
        **fields,
        "routing": routing,
        "num_experts": experts,
        "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
        "moe_intermediate_size": moe_width,
        # transformers' V2 router never renormalises (DeepSeek's own code did, with the flag)
        "norm_topk_prob": v3 and bool(cfg.get("norm_topk_prob", True)),
        "moe_layers": moe_layers(cfg, arch, n),
        "shared_expert_intermediate_size": shared,
    }
