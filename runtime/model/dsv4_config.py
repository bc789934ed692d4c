"""DeepSeek-V4's config.json and checkpoint names (`DeepseekV4ForCausalLM`), as transformers'
``DeepseekV4Config`` and its conversion mapping ("deepseek_v4") read them; kept apart from the
model code (docs/runtime.md, "DeepSeek-V4 in the engine": not served yet, no registry entry).

Config (`read`): ``layer_types`` (sliding / compressed_sparse / heavily_compressed; default two
HCA layers then CSA and HCA alternating; legacy ``compress_ratios`` 0/4/128 per layer),
``compress_rates`` (default CSA 4, HCA 128; legacy ``compress_rate_csa`` / ``_hca``),
``mlp_layer_types`` (hash_moe / moe; default the first ``num_hash_layers`` (3) hashed), the two
rotary bases (``rope_theta`` for the sliding layers' "main" table, ``compress_rope_theta`` with
the top-level yarn keys for the compressed layers' "compress" table, yarn's attention factor 1;
or an already nested ``rope_parameters`` {main, compress}), the rotary width
``head_dim * partial_rotary_factor`` (default ``qk_rope_head_dim`` / 64 of 512), the
hyper-connections (``hc_mult``, ``hc_sinkhorn_iters``, ``hc_eps``), ``o_groups`` / ``o_lora_rank``,
the indexer (``index_n_heads``, ``index_head_dim``, ``index_topk``) and the experts. What the
attention math cannot run is refused in one line (a ValueError naming the key).

Checkpoint names (`canonical`): the published files name tensors as DeepSeek's reference code
(``embed.weight``, ``layers.N.attn.wq_a.weight``, ``layers.N.ffn.experts.J.w1.weight``,
``hc_head_fn``, ``head.weight``), and a checkpoint transformers saves keeps those names under a
``model.`` prefix (its conversion reversed; ``model.embed_tokens.weight`` and ``head.weight``
as written). Both read as transformers' module names (its renames, in its order), except the
routed experts, kept one by one as DeepSeek-V3's (``mlp.experts.J.{gate,up,down}_proj``).
`expected_shapes` lists every tensor the model needs in those names; `check_headers` refuses a
missing or misshapen one in one line, naming it as the files store it.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from pagoda.runtime.model import dsv4_quant, ops
from pagoda.runtime.model_configs import HyperConfig

SLIDING, CSA, HCA = (
    "sliding_attention",
    "compressed_sparse_attention",
    "heavily_compressed_attention",
)
_BY_RATIO = {0: SLIDING, 4: CSA, 128: HCA}
MLP_KINDS = ("hash_moe", "moe")
_SCORING = ("sqrtsoftplus", "softmax", "sigmoid")

# transformers' conversion_mapping "deepseek_v4" renames, in its order (stored -> module)
_RENAMES = tuple((re.compile(a), b) for a, b in (
    (r"\.attn\.", ".self_attn."), (r"\.ffn\.", ".mlp."),
    (r"\.indexer\.compressor\.", ".compressor.indexer."),
    (r"^embed\.weight", "embed_tokens.weight"), (r"^head\.weight", "lm_head.weight"),
    (r"^hc_head_fn", "hc_head.hc_fn"), (r"^hc_head_base", "hc_head.hc_base"),
    (r"^hc_head_scale", "hc_head.hc_scale"),
    (r"\.attn_norm\.", ".input_layernorm."), (r"\.ffn_norm\.", ".post_attention_layernorm."),
    (r"\.hc_attn_fn", ".attn_hc.fn"), (r"\.hc_attn_base", ".attn_hc.base"),
    (r"\.hc_attn_scale", ".attn_hc.scale"), (r"\.hc_ffn_fn", ".ffn_hc.fn"),
    (r"\.hc_ffn_base", ".ffn_hc.base"), (r"\.hc_ffn_scale", ".ffn_hc.scale"),
    (r"\.attn_sink", ".sinks"),
    (r"\.indexer\.weights_proj\.", ".compressor.indexer.scorer.weights_proj."),
    (r"\.indexer\.wq_b\.", ".compressor.indexer.q_b_proj."),
    (r"\.norm\.", ".kv_norm."), (r"\.ape", ".position_bias"), (r"\.wq_a\.", ".q_a_proj."),
    (r"\.self_attn\.wq_b\.", ".self_attn.q_b_proj."), (r"\.wkv\.", ".kv_proj."),
    (r"\.wgate\.", ".gate_proj."), (r"\.wo_a\.", ".o_a_proj."), (r"\.wo_b\.", ".o_b_proj."),
    (r"\.q_norm\.", ".q_a_norm."), (r"\.gate\.bias", ".gate.e_score_correction_bias"),
    (r"\.shared_experts\.w1\.", ".shared_experts.gate_proj."),
    (r"\.shared_experts\.w2\.", ".shared_experts.down_proj."),
    (r"\.shared_experts\.w3\.", ".shared_experts.up_proj."),
    # the routed experts one by one (transformers stacks them; DeepSeek-V3's names here)
    (r"\.experts\.(\d+)\.w1\.", r".experts.\1.gate_proj."),
    (r"\.experts\.(\d+)\.w2\.", r".experts.\1.down_proj."),
    (r"\.experts\.(\d+)\.w3\.", r".experts.\1.up_proj."),
))  # fmt: skip


@dataclass(frozen=True)
class Rotary:
    """One rotary table: its base and, for yarn, its scaling (``attention_factor`` 1 unless set,
    as transformers forces for the compress table)."""

    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float = 1.0


@dataclass(frozen=True)
class Dsv4Config:
    """config.json read once (module docstring); `layer_types` / `mlp_layer_types` per layer."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    rope_dim: int  # the trailing dims rotated (qk_rope_head_dim)
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    sliding_window: int
    layer_types: tuple[str, ...]
    compress_rates: tuple[int, ...]  # per layer: 0 sliding, CSA's, HCA's
    mlp_layer_types: tuple[str, ...]
    main_rope: Rotary
    compress_rope: Rotary
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    num_experts: int
    experts_per_token: int
    moe_intermediate_size: int
    scoring: str
    norm_topk_prob: bool
    routed_scaling_factor: float
    swiglu_limit: float | None
    hyper: HyperConfig
    rms_norm_eps: float
    tie_word_embeddings: bool
    quant: dsv4_quant.Dsv4Quant | None = None  # block-wise FP8 / FP4 experts (dsv4_quant.py)

    def num_params(self) -> int:
        """`num_params` (ModelConfig.num_params reads it here: no import back)."""
        return num_params(self)


def _layer_types(cfg: Mapping[str, Any], n: int) -> list[str]:
    kinds = cfg.get("layer_types")
    if kinds is None and cfg.get("compress_ratios") is not None:
        ratios = list(cfg["compress_ratios"])
        bad = [r for r in ratios if r not in _BY_RATIO]
        if bad:
            raise ValueError(f"config.json compress_ratios: {bad[0]} is none of 0, 4, 128")
        kinds = [_BY_RATIO[r] for r in ratios]
    if kinds is None:  # V4-Pro's: two HCA layers, then CSA and HCA alternating
        kinds = [HCA] * min(n, 2) + [CSA if i % 2 else HCA for i in range(max(n - 2, 0))]
    return _kinds("layer_types", list(kinds)[:n], n, (SLIDING, CSA, HCA))


def _kinds(key: str, kinds: list, n: int, allowed: tuple[str, ...]) -> list[str]:
    if len(kinds) != n:
        raise ValueError(f"config.json {key} has {len(kinds)} entries for {n} layers")
    bad = [k for k in kinds if k not in allowed]
    if bad:
        raise ValueError(f"config.json {key}: {bad[0]!r} is none of {', '.join(allowed)}")
    return kinds


def _rotaries(cfg: Mapping[str, Any]) -> tuple[Rotary, Rotary]:
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if isinstance(rp.get("main"), dict) and isinstance(rp.get("compress"), dict):
        main, compress = rp["main"], rp["compress"]
    else:
        main = {"rope_type": "default", "rope_theta": cfg.get("rope_theta", 10000.0)}
        compress = {k: v for k, v in rp.items() if k not in ("main", "compress")}
        compress["rope_theta"] = cfg.get("compress_rope_theta", 160000.0)
    return _rotary(main, "main"), _rotary(compress, "compress")


def _rotary(p: Mapping[str, Any], name: str) -> Rotary:
    kind = p.get("rope_type", p.get("type", "default"))
    if kind not in ("default", "yarn"):
        raise ValueError(f"config.json rope_parameters ({name}): rope_type {kind!r} is not served "
                         "for DeepSeek-V4 (default or yarn)")  # fmt: skip
    theta = float(p["rope_theta"])
    if kind == "default":
        return Rotary(theta)
    orig = p.get("original_max_position_embeddings")
    return Rotary(theta, "yarn", float(p.get("factor", 1.0)), None if orig is None else int(orig),
                  float(p.get("beta_fast", 32.0)), float(p.get("beta_slow", 1.0)),
                  float(p.get("attention_factor") or 1.0))  # fmt: skip


def read(cfg: Mapping[str, Any]) -> Dsv4Config:
    """transformers' ``DeepseekV4Config`` defaults and legacy keys (module docstring)."""
    g = cfg.get
    n, head_dim, heads = (
        int(g("num_hidden_layers", 43)),
        int(g("head_dim", 512)),
        int(g("num_attention_heads", 64)),
    )
    rates = {CSA: 4, HCA: 128, **(g("compress_rates") or {})}
    if g("compress_rate_csa") is not None:
        rates[CSA] = g("compress_rate_csa")
    if g("compress_rate_hca") is not None:
        rates[HCA] = g("compress_rate_hca")
    kinds = _layer_types(cfg, n)
    mlp = g("mlp_layer_types")
    if mlp is None:
        hashed = int(g("num_hash_layers", 3) if g("num_hash_layers") is not None else 3)
        mlp = ["hash_moe"] * min(n, hashed) + ["moe"] * max(0, n - hashed)
    mlp = _kinds("mlp_layer_types", list(mlp)[:n], n, MLP_KINDS)
    factor = g("partial_rotary_factor")
    if factor is None:
        factor = g("qk_rope_head_dim", 64) / head_dim if g("qk_rope_head_dim") else 64 / 512
    rope_dim = int(head_dim * factor)
    if rope_dim % 2 or not 0 < rope_dim <= head_dim:
        raise ValueError(f"config.json: a rotary width of {rope_dim} of head_dim {head_dim} "
                         "(partial_rotary_factor) is not an even width within the head")  # fmt: skip
    if int(g("num_key_value_heads", 1)) != 1:
        raise ValueError("config.json num_key_value_heads: DeepSeek-V4 shares one KV head")
    o_groups = int(g("o_groups", 8))
    if heads % o_groups:
        raise ValueError(f"config.json o_groups {o_groups} does not divide {heads} heads")
    for kind in set(kinds) - {SLIDING}:
        r = rates.get(kind)
        if not isinstance(r, int) or r < 1:
            raise ValueError(f"config.json compress_rates[{kind!r}] is {r!r}, not a positive int")
    scoring = g("scoring_func", "sqrtsoftplus")
    if scoring not in _SCORING:
        raise ValueError(f"config.json scoring_func {scoring!r} is none of {', '.join(_SCORING)}")
    if g("attention_bias") or g("mlp_bias"):
        raise ValueError("config.json attention_bias / mlp_bias: DeepSeek-V4 has no biases")
    limit = float(g("swiglu_limit", 10.0))
    main, compress = _rotaries(cfg)
    eps = float(g("rms_norm_eps", 1e-6))
    return Dsv4Config(
        vocab_size=int(g("vocab_size", 129280)), hidden_size=int(g("hidden_size", 4096)),
        num_layers=n, num_heads=heads, head_dim=head_dim, rope_dim=rope_dim,
        q_lora_rank=int(g("q_lora_rank", 1024)), o_groups=o_groups,
        o_lora_rank=int(g("o_lora_rank", 1024)), sliding_window=int(g("sliding_window", 128)),
        layer_types=tuple(kinds), compress_rates=tuple(rates.get(k, 0) for k in kinds),
        mlp_layer_types=tuple(mlp), main_rope=main, compress_rope=compress,
        index_n_heads=int(g("index_n_heads", 64)), index_head_dim=int(g("index_head_dim", 128)),
        index_topk=int(g("index_topk", 512)), num_experts=int(g("n_routed_experts", 256)),
        experts_per_token=int(g("num_experts_per_tok", 6)),
        moe_intermediate_size=int(g("moe_intermediate_size", 2048)), scoring=scoring,
        norm_topk_prob=bool(g("norm_topk_prob", True)),
        routed_scaling_factor=float(g("routed_scaling_factor", 1.5)),
        swiglu_limit=limit if limit > 0 else None,
        hyper=HyperConfig(int(g("hc_mult", 4)), int(g("hc_sinkhorn_iters", 20)),
                          float(g("hc_eps", 1e-6)), eps),
        rms_norm_eps=eps, tie_word_embeddings=bool(g("tie_word_embeddings", False)),
        quant=dsv4_quant.read(cfg),
    )  # fmt: skip


def rotary(
    rot: Rotary, rope_dim: int, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos, sin [..., rope_dim / 2] of one table at ``positions`` (one angle per
    interleaved pair, `dsv4_compressor.rotate_trailing`'s form), times yarn's attention factor,
    as transformers' ``DeepseekV4RotaryEmbedding``."""
    inv, scale = _inv_freq(rot, rope_dim, positions.device)
    angles = positions[..., None].float() * inv
    return angles.cos() * scale, angles.sin() * scale


@functools.lru_cache(maxsize=16)
def _inv_freq(rot: Rotary, rope_dim: int, device: torch.device) -> tuple[torch.Tensor, float]:
    """One table's inverse frequencies on ``device`` (made once: no copy to it each step)."""
    scaling = None
    if rot.rope_type == "yarn":
        scaling = {"rope_type": "yarn", "factor": rot.factor, "beta_fast": rot.beta_fast,
                   "beta_slow": rot.beta_slow, "attention_factor": rot.attention_factor,
                   "original_max_position_embeddings": rot.original_max_position_embeddings}  # fmt: skip
    inv, scale = ops.rope_inv_freq(rope_dim, rot.theta, scaling)
    return inv.to(device), scale


def canonical(name: str) -> str:
    """A stored tensor's name as the model reads it (module docstring)."""
    bare = name.removeprefix("model.")
    for pattern, repl in _RENAMES:
        bare = pattern.sub(repl, bare)
    return bare if bare == "lm_head.weight" else "model." + bare


def rename_canonical(weights) -> None:
    """List the checkpoint's tensors (the published and the saved names) by their `canonical`
    names."""
    for name in list(weights):
        if canonical(name) != name:
            weights.rename(name, canonical(name))


def expected_shapes(c: Dsv4Config) -> dict[str, tuple[int, ...]]:
    """Every tensor `c`'s model reads, by its `canonical` name, with its shape."""
    h, d, n, e = c.hidden_size, c.head_dim, c.hyper.mult, c.num_experts
    w, q = c.moe_intermediate_size, c.q_lora_rank
    out: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (c.vocab_size, h), "model.norm.weight": (h,),
        "model.hc_head.hc_fn": (n, n * h), "model.hc_head.hc_base": (n,),
        "model.hc_head.hc_scale": (1,),
    }  # fmt: skip
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = (c.vocab_size, h)
    mix = 2 * n + n * n  # pre, post and the comb's logits
    for i, kind in enumerate(c.layer_types):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        out.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                    a + "sinks": (c.num_heads,), a + "q_a_proj.weight": (q, h),
                    a + "q_a_norm.weight": (q,), a + "q_b_proj.weight": (c.num_heads * d, q),
                    a + "kv_proj.weight": (d, h), a + "kv_norm.weight": (d,),
                    a + "o_a_proj.weight": (c.o_groups * c.o_lora_rank,
                                            c.num_heads * d // c.o_groups),
                    a + "o_b_proj.weight": (h, c.o_groups * c.o_lora_rank)})  # fmt: skip
        for block in ("attn_hc.", "ffn_hc."):
            out.update({p + block + "fn": (mix, n * h), p + block + "base": (mix,),
                        p + block + "scale": (3,)})  # fmt: skip
        rate = c.compress_rates[i]
        if kind != SLIDING:  # CSA's windows overlap: kv and gate rows twice as wide
            k = a + "compressor."
            width = (2 if kind == CSA else 1) * d
            out.update({k + "kv_proj.weight": (width, h), k + "gate_proj.weight": (width, h),
                        k + "position_bias": (rate, width), k + "kv_norm.weight": (d,)})  # fmt: skip
        if kind == CSA:  # the lightning indexer: its own compressor at index_head_dim
            x, ih = a + "compressor.indexer.", c.index_head_dim
            out.update({x + "kv_proj.weight": (2 * ih, h), x + "gate_proj.weight": (2 * ih, h),
                        x + "position_bias": (rate, 2 * ih), x + "kv_norm.weight": (ih,),
                        x + "q_b_proj.weight": (c.index_n_heads * ih, q),
                        x + "scorer.weights_proj.weight": (c.index_n_heads, h)})  # fmt: skip
        m = p + "mlp."
        out[m + "gate.weight"] = (e, h)
        if c.mlp_layer_types[i] == "hash_moe":
            out[m + "gate.tid2eid"] = (c.vocab_size, c.experts_per_token)
        else:
            out[m + "gate.e_score_correction_bias"] = (e,)
        for j in [*range(e), "shared"]:
            x = m + ("shared_experts." if j == "shared" else f"experts.{j}.")
            out.update({x + "gate_proj.weight": (w, h), x + "up_proj.weight": (w, h),
                        x + "down_proj.weight": (h, w)})  # fmt: skip
    return out


def num_params(c: Dsv4Config) -> int:
    """Every tensor the model reads (`expected_shapes`): transformers' parameters and its
    persistent buffers (``tid2eid``, the correction biases). DeepSeek-V4-Flash-Base's shape
    (transformers' defaults): 284,328,206,295."""
    return sum(math.prod(s) for s in expected_shapes(c).values())


def check_headers(c: Dsv4Config, headers: Mapping[str, tuple[str, list[int]]]) -> dict[str, str]:
    """The files' tensors (stored name -> (dtype, shape)) against `expected_shapes`: a missing
    or misshapen tensor is refused in one line naming it as stored (ValueError). Returns the
    canonical name -> stored name of every tensor read (MTP's ``mtp.`` layers, the
    ``num_nextn_predict_layers`` the released files hold, are not read). A block-wise FP8 or
    FP4 matrix is checked with its scales (`dsv4_quant.check`)."""
    stored = {canonical(k): k for k in headers if not k.removeprefix("model.").startswith("mtp.")}
    for name, shape in expected_shapes(c).items():
        if name not in stored:
            raise ValueError(f"checkpoint is missing tensor {name!r} (DeepSeek-V4, "
                             f"{c.num_layers} layers, {c.num_experts} experts)")  # fmt: skip
        dsv4_quant.check(
            c.quant, name, stored[name], tuple(headers[stored[name]][1]), headers, shape
        )  # (a quantized matrix's scales too)
    return stored


def model_config(cfg: Mapping[str, Any], eos: tuple[int, ...]):
    """The engine's `ModelConfig` of a DeepSeek-V4 config.json (architecture "deepseek_v4"):
    the sizes the runner and the estimates read (one KV head of ``head_dim``: the token row),
    the whole config in ``family.dsv4`` (`read`)."""
    from pagoda.runtime.config import FamilyConfig, ModelConfig

    c = read(cfg)
    return ModelConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size,
        intermediate_size=c.moe_intermediate_size, num_layers=c.num_layers,
        num_heads=c.num_heads, num_kv_heads=1, head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
        rope_theta=c.main_rope.theta,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 1048576)),
        tie_word_embeddings=c.tie_word_embeddings, bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=eos, architecture="deepseek_v4", family=FamilyConfig(dsv4=c),
    )  # fmt: skip
