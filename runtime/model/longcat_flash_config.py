"""LongCat-Flash's config.json (`LongcatFlashForCausalLM`: meituan-longcat/LongCat-Flash-Chat) as
transformers' LongcatFlashConfig reads it, for `model/longcat_flash.py`.

Each of the ``num_layers`` decoder layers holds two attention sublayers (DeepSeek-V3's latent
attention with LoRA scales), two dense MLPs of ``ffn_hidden_size`` and one shortcut MoE. The
engine runs it as ``2 * num_layers`` sublayers (transformers' ``num_hidden_layers``): sublayer
``2l + j`` is layer ``l``'s attention ``j`` and MLP ``j``, each with its own KV cache, and the
tensors are listed under those sublayers' names at read (`rename_sublayers`): ``self_attn.{j}.``,
``input_layernorm.{j}``, ``post_attention_layernorm.{j}`` and ``mlps.{j}.`` as sublayer
``2l + j``'s ``self_attn.``, norms and ``mlp.``; the MoE (``mlp.``) as sublayer ``2l``'s
``moe.`` (its router ``moe.router.classifier`` with the correction bias beside it).

The MoE's router (`model_configs.ExpertRouting`, `moe_routing.GroupedRouter`): a float32 softmax
over ``n_routed_experts + zero_expert_num`` logits, the top ``moe_topk`` chosen with the
choice-only ``e_score_correction_bias``, weighted by their uncorrected scores (not renormalised)
times ``routed_scaling_factor``; a pick of a zero expert (id >= ``n_routed_experts``) returns its
input. Keys under transformers' names (its ``attribute_map``: `config_keys.ALIASES`); the MTP
layer (``model.mtp.``) is not read, as transformers skips it. Kept apart from the model so that
reading a config imports no layer code.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from pagoda.runtime.model import deepseek_config
from pagoda.runtime.model.ops import rope_kind
from pagoda.runtime.model_configs import ExpertRouting

ARCHITECTURES = {"LongcatFlashForCausalLM": "longcat_flash"}
MODEL_CLASSES = {"longcat_flash": ("longcat_flash", "LongcatFlashModel")}
# transformers' LongcatFlashConfig defaults (under the engine's names: `config_keys.ALIASES`)
DEFAULTS: dict[str, dict[str, Any]] = {
    "longcat_flash": {"vocab_size": 131_072, "hidden_size": 6144, "num_layers": 28,
                      "num_attention_heads": 64, "intermediate_size": 12_288,
                      "max_position_embeddings": 131_072, "rms_norm_eps": 1e-5,
                      "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
                      "rope_theta": 10_000_000.0, "q_lora_rank": 1536, "kv_lora_rank": 512,
                      "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
                      "num_experts_per_tok": 12, "n_routed_experts": 512,
                      "zero_expert_num": 256, "moe_intermediate_size": 2048,
                      "routed_scaling_factor": 6.0, "head_dim": 64},
}  # fmt: skip
# LongcatFlashConfig's attribute_map
ALIASES = {"ffn_hidden_size": "intermediate_size", "moe_topk": "num_experts_per_tok",
           "expert_ffn_hidden_size": "moe_intermediate_size",
           "num_local_experts": "n_routed_experts"}  # fmt: skip


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """`FamilyConfig` fields of a LongCat-Flash config.json (its sublayers: `n`), as
    transformers reads them; ValueError, one line, for what it does not run."""
    if cfg.get("q_lora_rank") is None:  # transformers' LongcatFlashMLA always has it
        raise ValueError("longcat_flash needs q_lora_rank (its queries go through the bottleneck)")
    if cfg.get("router_bias"):  # (transformers' router multiplies by the weight alone)
        raise ValueError("longcat_flash with router_bias is not supported (transformers' "
                         "LongcatFlashTopkRouter does not add the classifier's bias)")  # fmt: skip
    if cfg.get("zero_expert_type", "identity") != "identity":
        raise ValueError(f"longcat_flash zero_expert_type {cfg['zero_expert_type']!r} is not "
                         "supported (identity)")  # fmt: skip
    if cfg.get("attention_method", "MLA") != "MLA" or cfg.get("attention_bias"):
        raise ValueError("longcat_flash attention other than MLA without biases is not supported")
    if int(cfg["head_dim"]) != int(cfg["qk_rope_head_dim"]):  # (transformers' rotary table)
        raise ValueError(f"longcat_flash head_dim {cfg['head_dim']} must equal qk_rope_head_dim "
                         f"{cfg['qk_rope_head_dim']} (the rotary's width)")  # fmt: skip
    mla = dataclasses.replace(deepseek_config.mla_config(cfg, "deepseek_v3"),
                              rope_interleave=True)  # fmt: skip
    scale = mla.qk_head_dim**-0.5  # transformers' yarn_apply_mscale
    if scaling and rope_kind(dict(scaling)) != "default" and scaling.get("mscale_all_dim"):
        mscale = deepseek_config.yarn_mscale(float(scaling["factor"]),
                                             float(scaling["mscale_all_dim"]))  # fmt: skip
        scale *= mscale * mscale
    routing = ExpertRouting(
        scoring="softmax",
        routed_scaling_factor=float(cfg.get("routed_scaling_factor") or 1.0),
        correction_bias=True,
        zero_experts=int(cfg.get("zero_expert_num") or 0),
    )
    return {
        "mla": mla,
        "attention_multiplier": scale,
        "routing": routing,
        "num_experts": int(cfg["n_routed_experts"]),
        "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
        "moe_intermediate_size": int(cfg["moe_intermediate_size"]),
        "norm_topk_prob": False,
        "moe_layers": tuple(i % 2 == 0 for i in range(n)),  # (the shortcut MoE's sublayer)
    }


def lora_scales(c) -> tuple[float, float]:
    """(q's, the latent's) LoRA scale: sqrt(hidden / q_lora_rank), sqrt(hidden / kv_lora_rank)."""
    m = c.family.mla
    return (c.hidden_size / m.q_lora_rank) ** 0.5, (c.hidden_size / m.kv_lora_rank) ** 0.5


_SUB = re.compile(r"^model\.layers\.(\d+)\.(self_attn|input_layernorm|post_attention_layernorm|mlps)"
                  r"\.([01])\.(.*)$")  # fmt: skip
_MOE = re.compile(r"^model\.layers\.(\d+)\.mlp\.(.*)$")


def rename_sublayers(weights) -> None:
    """The checkpoint's tensors listed under the sublayers' names (module docstring)."""
    for name in list(weights):
        if m := _SUB.match(name):
            part = "mlp" if m[2] == "mlps" else m[2]
            weights.rename(name, f"model.layers.{2 * int(m[1]) + int(m[3])}.{part}.{m[4]}")
        elif m := _MOE.match(name):
            weights.rename(name, f"model.layers.{2 * int(m[1])}.moe.{m[2]}")


_SUBLAYER = re.compile(r"model\.layers\.(\d+)\.(self_attn|input_layernorm|post_attention_layernorm"
                       r"|mlp|moe)\.")  # fmt: skip


def stored_names(message: str) -> str:
    """`message` with the sublayers' tensor names as the checkpoint's (`rename_sublayers`
    undone): a missing tensor named as the files would hold it."""

    def back(m: re.Match) -> str:
        i, part = int(m[1]), m[2]
        if part == "moe":
            return f"model.layers.{i // 2}.mlp."
        return f"model.layers.{i // 2}.{'mlps' if part == 'mlp' else part}.{i % 2}."

    return _SUBLAYER.sub(back, message)


def expected_shapes(c, mla_shapes) -> dict[str, tuple[int, ...]]:
    """Every tensor the model reads, with its shape, under the sublayers' names
    (`checkpoint_shapes.expected_shapes`, which hands over its `mla_shapes`)."""
    f, h, i = c.family, c.hidden_size, c.intermediate_size
    e, z, m = f.num_experts, f.routing.zero_experts, f.moe_intermediate_size
    out = {"model.embed_tokens.weight": (c.vocab_size, h), "model.norm.weight": (h,)}
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = (c.vocab_size, h)
    for s in range(c.num_layers):
        p = f"model.layers.{s}."
        out.update(mla_shapes(c, p + "self_attn.", s))
        out.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                    p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                    p + "mlp.down_proj.weight": (h, i)})  # fmt: skip
        if s % 2 == 0:
            out.update({p + "moe.router.classifier.weight": (e + z, h),
                        p + "moe.router.e_score_correction_bias": (e + z,)})  # fmt: skip
            for x in range(e):
                q = f"{p}moe.experts.{x}."
                out.update({q + "gate_proj.weight": (m, h), q + "up_proj.weight": (m, h),
                            q + "down_proj.weight": (h, m)})  # fmt: skip
    return out


def weight_bytes(shapes: dict[str, tuple[int, ...]], item: int) -> int:
    """What the model holds, `expected_shapes`' tensors in bytes of `item`
    (`server/weights_from_shapes.from_shapes`): the routers and their correction biases in
    float32."""
    total = 0
    for name, shape in shapes.items():
        size = 4 if ".moe.router." in name else item
        for s in shape:
            size *= s
        total += size
    return total
