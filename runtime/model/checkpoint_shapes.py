"""The tensors a model's config.json says its safetensors checkpoint holds, with their shapes
(`expected_shapes`, from the config alone: the embedding, attention, norms, routers and the
tensors beside them, each family's changes from its *_config.py), and the (gate, up, down) names
of every MLP (`mlp_triples`: their width comes from the weights). `checkpoint_check.py` holds a
checkpoint's headers against them; `server/weights_from_shapes.py` counts them."""

from __future__ import annotations

from pagoda.runtime.config import ModelConfig
from pagoda.runtime.model import (
    bert_config,
    classifier_config,
    mamba_config,
    modernbert_config,
    moe_families,
    moe_names,
)

EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"

# what a family changes in the tensors `expected_shapes` lists (its *_config.py's
# `checkpoint_shapes`), (c, out) -> None
_FAMILY_SHAPES = {**moe_families.CHECKPOINT_SHAPES, **mamba_config.CHECKPOINT_SHAPES,
                  **dict.fromkeys(("bert", "roberta"), bert_config.checkpoint_shapes),
                  "modernbert": modernbert_config.checkpoint_shapes}  # fmt: skip

LLAMA4 = ("llama4", "llama4_vision")  # Llama 4's text model, with images or without


def expected_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The tensors every layer of `c` needs, with their shapes (the MLPs' and experts' widths
    come from the weights: `mlp_triples` names them, `checkpoint_check` checks they agree)."""
    if c.family.gemma4 is not None:  # head sizes, KV sharing, MLP widths by layer
        from pagoda.runtime.model.gemma4_config import expected_shapes as gemma4_shapes

        return gemma4_shapes(c)
    if c.architecture == "longcat_flash":  # its sublayers, the shortcut MoE's zero experts
        from pagoda.runtime.model.longcat_flash_config import expected_shapes as longcat_shapes

        return longcat_shapes(c, mla_shapes)
    h, d = c.hidden_size, c.head_dim
    q, kv = c.num_heads * d, c.num_kv_heads * d
    out: dict[str, tuple[int, ...]] = {EMBED: (c.vocab_size, h), "model.norm.weight": (h,)}
    if c.family.qwen4 is not None:  # Qwen4-Exp: hyper-connections' norms (qwen4_exp_config.py)
        del out["model.norm.weight"]
    for i in range(c.num_layers):
        a = f"model.layers.{i}.self_attn."
        if c.family.mamba is not None:  # a hybrid: its Mamba2 mixer or attention, its MLP
            out.update(_hybrid_layer(c, i))
            continue
        if c.architecture == "jetmoe":  # its routed attention and MLP (jetmoe_config.py)
            from pagoda.runtime.model import jetmoe_config

            out.update(jetmoe_config.expected_shapes(c, i), **_layer_norms(c, i))
            continue
        if c.family.mla is not None:  # DeepSeek's latent attention
            out.update(mla_shapes(c, a, i))
        else:
            out.update({a + "q_proj.weight": (q, h), a + "k_proj.weight": (kv, h),
                        a + "v_proj.weight": (kv, h), a + "o_proj.weight": (h, q)})  # fmt: skip
        if c.family.attention_sinks:  # a logit per head (gpt-oss's, GraniteSWA's)
            out[a + "sinks"] = (c.num_heads,)
        if c.family.hyper is not None:  # HY V4's hyper-connections, gate, sinks, experts
            from pagoda.runtime.model.hy_v4_config import expected_shapes as hy_v4_shapes

            out.update(hy_v4_shapes(c, i))
        if c.family.mimo is not None:  # KV heads and sinks by layer kind, narrower values
            from pagoda.runtime.model.mimo_v2_flash_config import attention_shapes

            out.update(attention_shapes(c, i))
        out.update(_layer_norms(c, i))
        if c.family.gated_norm_rank:  # A.X-K2's gated norms (model/axk2.py)
            _gate_norms(c, i, out)
        out.update(_router_and_experts(c, i))
        if c.architecture == "axk1" and c.family.has_experts(i):  # its experts' output norm
            out[f"model.layers.{i}.post_mlp_layernorm.weight"] = (h,)
        if c.family.laguna is not None:  # query heads by layer, attention's softplus gate
            g, qi = c.family.laguna, c.family.laguna.heads[i] * d
            out.update({a + "q_proj.weight": (qi, h), a + "o_proj.weight": (h, qi),
                        a + "g_proj.weight": (qi // d if g.gate_per_head else qi, h)})  # fmt: skip
        if c.family.qk_norm and c.family.cohere_layer:  # a weight per head
            out[a + "q_norm.weight"] = (c.num_heads, d)
            out[a + "k_norm.weight"] = (c.num_kv_heads, d)
        elif c.family.qk_norm:
            out[a + "q_norm.weight"] = out[a + "k_norm.weight"] = (d,)
    if not c.tie_word_embeddings:
        out[HEAD] = (c.family.head_rows or c.vocab_size, h)  # (Apertus 1.5's pruned head)
    return _family_tensors(c, out)


def _layer_norms(c: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """Layer `i`'s norms around attention and the MLP (and OLMo's q/k norms over the whole
    projections), by the family's layout."""
    h, a, n = c.hidden_size, f"model.layers.{i}.self_attn.", {}
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    one_norm = (
        c.family.cohere_layer
        or c.architecture in ("phi", "gptj", "codegen")
        or c.family.falcon_norms == "one"
    )
    if not one_norm:  # (Cohere's, Phi's, Falcon's parallel layers: one norm)
        n[f"model.layers.{i}.post_attention_layernorm.weight"] = (h,)
    if not c.family.olmo2_norms:  # OLMo 2 has no norm before attention
        n[f"model.layers.{i}.input_layernorm.weight"] = (h,)
    else:  # but one after the MLP
        n[f"model.layers.{i}.post_feedforward_layernorm.weight"] = (h,)
    if c.family.glm4_norms:  # GLM-4's norms on attention's and the MLP's outputs
        for norm in ("post_self_attn_layernorm", "post_mlp_layernorm"):
            n[f"model.layers.{i}.{norm}.weight"] = (h,)
    if c.family.qk_norm_whole:  # q/k norms over the whole projections
        n[a + "q_norm.weight"], n[a + "k_norm.weight"] = (q,), (kv,)
    if c.architecture == "vaultgemma":  # before attention and before the MLP only
        del n[f"model.layers.{i}.post_attention_layernorm.weight"]
        n[f"model.layers.{i}.pre_feedforward_layernorm.weight"] = (h,)
    elif c.family.gemma_norms and c.architecture != "gemma":  # (Gemma v1: Llama's two)
        for norm in ("pre_feedforward_layernorm", "post_feedforward_layernorm"):
            n[f"model.layers.{i}.{norm}.weight"] = (h,)
    return n


def _gate_norms(c: ModelConfig, i: int, out: dict[str, tuple[int, ...]]) -> None:
    """Layer `i`'s norms in `out` where A.X-K2 gates them: before attention, and before the
    experts in an expert layer (`<norm>.norm.weight` and the gate's W_down / W_up)."""
    h, r, p = c.hidden_size, c.family.gated_norm_rank, f"model.layers.{i}."
    for norm in ("input_layernorm", "post_attention_layernorm")[: 1 + c.family.has_experts(i)]:
        del out[f"{p}{norm}.weight"]
        out.update({f"{p}{norm}.norm.weight": (h,), f"{p}{norm}.W_down.weight": (r, h),
                    f"{p}{norm}.W_up.weight": (h, r)})  # fmt: skip


def _router_and_experts(c: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """Layer `i`'s router and the tensors beside it that `mlp_triples` does not name: gpt-oss's
    sinks and biases, Llama 4's and GraniteMoe's stacked experts, a shared expert's gate, a
    choice-only bias."""
    h, out = c.hidden_size, {}
    if c.architecture == "gpt_oss":  # sinks, biases, its router (experts: checkpoint_check)
        out.update(_gpt_oss_shapes(c, i))
    elif c.architecture in LLAMA4 and c.family.has_experts(i):  # router, experts stacked
        e, n, p = c.family.num_experts, c.family.moe_intermediate_size, f"model.layers.{i}."
        out.update({p + "feed_forward.router.weight": (e, h),
                    p + "feed_forward.experts.gate_up_proj": (e, h, 2 * n),
                    p + "feed_forward.experts.down_proj": (e, n, h)})  # fmt: skip
    elif c.architecture in ("granitemoe", "granitemoe_swa"):  # its router, experts stacked
        e, n, p = c.family.num_experts, c.family.moe_intermediate_size, _moe_block(c, i)
        out.update({p + "router.layer.weight": (e, h), p + "input_linear.weight": (e, 2 * n, h),
                    p + "output_linear.weight": (e, h, n)})  # fmt: skip
        if s := c.family.shared_expert_intermediate_size:  # GraniteMoeShared's shared_mlp
            p = f"model.layers.{i}.shared_mlp."
            out.update({p + "input_linear.weight": (2 * s, h), p + "output_linear.weight": (h, s)})
    elif c.family.has_experts(i):
        e, names = c.family.num_experts, moe_names.of(c.architecture)
        out[_moe_block(c, i) + names.router] = (e, h)  # the router
        routing = c.family.routing
        if c.family.shared_expert_intermediate_size and routing is None:  # its sigmoid gate
            out[_moe_block(c, i) + "shared_expert_gate.weight"] = (1, h)
        if routing is not None and routing.bias and not routing.bias_optional:  # choice-only
            # bias (V3's, ERNIE's, ...; A.X-K1's may be left out)
            out[_moe_block(c, i) + names.bias] = (1, e) if names.bias_rows else (e,)
    return out


def _hybrid_layer(c: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """Layer `i` of a hybrid (Granite 4.0, Bamba): its mixer, norms and Granite's MLP."""
    h, p = c.hidden_size, f"model.layers.{i}."
    m = c.family.mamba
    if m.zamba2 is not None or m.zaya is not None or m.inkling or m.inkling2:  # (its layers'
        # tensors all named there)
        return mamba_config.expected_shapes(c, i)
    out: dict[str, tuple[int, ...]] = {}
    if c.family.mamba.attention(i) and c.family.mla is not None:  # (Kimi Linear's)
        out.update(mla_shapes(c, p + "self_attn.", i))
    elif c.family.mamba.attention(i):
        q, kv, a = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, p + "self_attn."
        out.update({a + "q_proj.weight": (q, h), a + "k_proj.weight": (kv, h),
                    a + "v_proj.weight": (kv, h), a + "o_proj.weight": (h, q)})  # fmt: skip
    out.update(mamba_config.expected_shapes(c, i))  # (Qwen3-Next's wider q_proj: its own)
    if c.family.qwen4 is not None:  # (the hyper-connections' norms: `mamba_config`'s)
        return out
    if not (c.family.olmo2_norms and c.family.mamba.attention(i)):  # (OLMo Hybrid's: after)
        out[p + "input_layernorm.weight"] = (h,)
    if c.architecture not in ("nemotron_h", "mamba2", "mamba", "falcon_mamba"):  # (one norm
        pre_ff = c.architecture in ("bamba", "falcon_h1", "jamba")
        norm = "pre_ff_layernorm" if pre_ff else "post_attention_layernorm"
        out[f"{p}{norm}.weight"] = (h,)
    return out


# Apertus' names for the norms before attention and before the MLP
_APERTUS_NORMS = {"input_layernorm": "attention_layernorm",
                  "post_attention_layernorm": "feedforward_layernorm"}  # fmt: skip
_XIELU = {"alpha_p": (1,), "alpha_n": (1,), "beta": (), "eps": ()}  # mlp.act_fn.'s


def _family_tensors(c: ModelConfig, out: dict[str, tuple[int, ...]]):
    """`out` with what Apertus (its norms' names, xIELU's parameters) and StarCoder2 (its
    LayerNorms' biases) change."""
    if c.architecture == "bitnet":  # sub-norms; packed matrices (model/bitnet_config.py)
        from pagoda.runtime.model.bitnet_config import expected_shapes as bitnet_shapes

        bitnet_shapes(c, out)
    if c.architecture in ("bamba", "falcon_h1", "jamba", "zamba2", "zamba"):  # final norm name
        out["model.final_layernorm.weight"] = out.pop("model.norm.weight")
    if c.architecture in ("apertus", "apertus1p5"):
        for old, new in _APERTUS_NORMS.items():
            for i in range(c.num_layers):
                out[f"model.layers.{i}.{new}.weight"] = out.pop(f"model.layers.{i}.{old}.weight")
    if c.family.hidden_act == "xielu":
        for i in range(c.num_layers):
            out.update({f"model.layers.{i}.mlp.act_fn.{p}": s for p, s in _XIELU.items()})
    if c.architecture == "stablelm" and c.family.qk_norm:  # a weight per head, stored apart
        for i in range(c.num_layers):
            a = f"model.layers.{i}.self_attn."
            for kind, heads in (("q", c.num_heads), ("k", c.num_kv_heads)):
                del out[f"{a}{kind}_norm.weight"]
                out.update({f"{a}{kind}_layernorm.norms.{h}.weight": (c.head_dim,)
                            for h in range(heads)})  # fmt: skip
    if (family := _FAMILY_SHAPES.get(c.architecture)) is not None:
        family(c, out)
    classifier_config.checkpoint_shapes(
        c, out
    )  # (a decoder classifier's `score`)  # (Dory's, Aria's, Zaya's, Inkling's, ...: their *_config.py)
    if c.architecture == "ctrl":  # its head's bias (model/positions.py)
        out["lm_head.bias"] = (c.vocab_size,)
    if c.family.kolibri11 is not None:  # Kolibri 1.1's KV-shared layers: q alone (kolibri1.py)
        for i in filter(c.family.kolibri11.shares_kv, range(c.num_layers)):
            for n in ("k_proj.weight", "v_proj.weight", "k_norm.weight"):
                del out[f"model.layers.{i}.self_attn.{n}"]
    if c.family.diff_attention:  # DiffLlama's four vectors a layer (model/diffllama.py)
        for i in range(c.num_layers):
            out.update({f"model.layers.{i}.self_attn.{n}": (c.head_dim,)
                        for n in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")})  # fmt: skip
    if c.architecture in ("phi", "persimmon"):  # their final norm's name
        out["model.final_layernorm.weight"] = out.pop("model.norm.weight")
    f = c.family
    if f.positions == "learned":  # the table of positions (model/positions.py)
        out["model.embed_positions.weight"] = (c.max_position_embeddings + f.position_offset,
                                               c.hidden_size)  # fmt: skip
    if f.embed_proj_dim:  # OPT's embeddings narrower than hidden, projected in and out
        out[EMBED] = (c.vocab_size, f.embed_proj_dim)
        out["model.project_in.weight"] = (c.hidden_size, f.embed_proj_dim)
        out["model.project_out.weight"] = (f.embed_proj_dim, c.hidden_size)
        if HEAD in out:
            out[HEAD] = (c.vocab_size, f.embed_proj_dim)
    if f.post_norm:  # (opt-350m: no final norm)
        del out["model.norm.weight"]
    if c.architecture == "bloom":  # the embeddings' LayerNorm
        out["model.embed_layernorm.weight"] = (c.hidden_size,)
    if c.architecture in ("olmo", "nanochat"):  # its norms have no parameters
        for name in [n for n in out if n.endswith("norm.weight")]:
            del out[name]
    if c.family.layer_norm_bias:
        out.update({n[: -len("weight")] + "bias": s for n, s in list(out.items())
                    if n.endswith("norm.weight")})  # fmt: skip
    return out


def mla_shapes(c: ModelConfig, a: str, i: int) -> dict[str, tuple[int, ...]]:
    """The tensors of latent attention layer `i` (`model_configs.MlaConfig`) under prefix `a`,
    its lightning indexer's where it runs one (DeepSeek Sparse Attention: model/dsa.py)."""
    m, h, heads = c.family.mla, c.hidden_size, c.num_heads
    q = heads * m.qk_head_dim
    out = {a + "kv_a_proj_with_mqa.weight": (m.kv_lora_rank + m.qk_rope_head_dim, h),
           a + "kv_a_layernorm.weight": (m.kv_lora_rank,),
           a + "kv_b_proj.weight": (heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank),
           a + "o_proj.weight": (h, heads * m.v_head_dim)}  # fmt: skip
    if m.q_lora_rank is None:
        out[a + "q_proj.weight"] = (q, h)
    else:
        out.update({a + "q_a_proj.weight": (m.q_lora_rank, h),
                    a + "q_a_layernorm.weight": (m.q_lora_rank,),
                    a + "q_b_proj.weight": (q, m.q_lora_rank)})  # fmt: skip
    if m.dots:  # Dots3 Note's rotary key norm and gate per head
        out.update({a + "k_rope_only_layernorm.weight": (m.qk_rope_head_dim,),
                    a + "g_proj.weight": (heads, h)})  # fmt: skip
    if m.output_gate:  # A.X-K2's: each head's query and gate, of [normed | raw] bottleneck
        out[a + "q_b_proj.weight"] = (heads * (m.qk_head_dim + m.v_head_dim), 2 * m.q_lora_rank)
    ix = m.indexer
    if ix is not None and ix.full_layers[i]:
        p = a + "indexer."
        out.update({p + "wq_b.weight": (ix.n_heads * ix.head_dim, m.q_lora_rank),
                    p + "wk.weight": (ix.head_dim, h), p + "k_norm.weight": (ix.head_dim,),
                    p + "k_norm.bias": (ix.head_dim,),
                    p + "weights_proj.weight": (ix.n_heads, h)})  # fmt: skip
        if ix.kpool:  # GLM-5-Next's pools: a position's weight, the gate scores' projection
            out.update({p + "index_kpool_compress_ape": (ix.kpool, ix.head_dim),
                        p + "index_kpool_compress_gate": (ix.head_dim, h)})  # fmt: skip
    return out


def _gpt_oss_shapes(c: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    h, d, e, n = c.hidden_size, c.head_dim, c.family.num_experts, c.family.moe_intermediate_size
    a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
    return {a + "sinks": (c.num_heads,), a + "q_proj.bias": (c.num_heads * d,),
            a + "k_proj.bias": (c.num_kv_heads * d,), a + "v_proj.bias": (c.num_kv_heads * d,),
            a + "o_proj.bias": (h,), m + "router.weight": (e, h), m + "router.bias": (e,),
            m + "experts.gate_up_proj_bias": (e, 2 * n), m + "experts.down_proj_bias": (e, h)}  # fmt: skip


def _moe_block(c: ModelConfig, layer: int) -> str:
    mixtral = c.architecture in ("mixtral", "granitemoe", "granitemoe_swa")
    block = "block_sparse_moe." if mixtral else moe_names.of(c.architecture).block
    return f"model.layers.{layer}.{block}"


# experts checked by the family (per expert or stacked: `qwen3_next_config.check_experts`)
OWN_EXPERTS = ("qwen3_next", "qwen3_5_moe", "lara_mini")
_STACKED = ("hy_v4", "aria_text", "qwen3_vl_moe")  # experts stacked, in `expected_shapes`
_UP_DOWN = ("up_proj", "down_proj")  # an ungated MLP's matrices (`FamilyConfig.gated_mlp`)
_UNGATED_NAMES = {"starcoder2": ("c_fc", "c_proj")}


def mlp_triples(c: ModelConfig) -> list[tuple[str, str, str]]:
    """(gate, up, down) weight names of every MLP: each layer's, or each of its experts'; an
    ungated MLP's (up, up, down)."""
    out = []
    for i in range(c.num_layers):
        if c.architecture in (
            "gemma4",
            "gemma4_unified",
            "gemma3n",
            "granitemoe",
            "granitemoe_swa",
            "jetmoe",
            "gpt_oss",
            "granitemoehybrid",
            "nemotron_h",
            "lfm2",
            "lfm2_moe",
            "lfm3",
            "mamba2",
            "mamba",
            "falcon_mamba",
            "zamba2",
            "zamba",
            "rwkv",
            "xlstm",
            "zaya",
            "inkling",
            "inkling2",
            "bitnet",
            "longcat_flash",
            "minimax_m3",
        ):
            continue  # stacked, or checked with their layer (`_hybrid_layer`)
        if c.architecture == "ergo" and c.family.has_experts(i):
            continue  # stacked, ungated (`ergo_config.expected_shapes`)
        dense_jamba = c.architecture == "jamba" and not c.family.has_experts(i)
        if c.architecture in ("bamba", "falcon_h1") or dense_jamba:
            p = f"model.layers.{i}.feed_forward."
            out.append((p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight"))
            continue
        if not c.family.has_experts(i) and not c.family.gated_mlp:  # its up stands for a gate
            p, (up, down) = f"model.layers.{i}.mlp.", _UNGATED_NAMES.get(c.architecture, _UP_DOWN)
            out.append((f"{p}{up}.weight", f"{p}{up}.weight", f"{p}{down}.weight"))
            continue
        if c.architecture in LLAMA4:  # Llama 4's dense MLP, or its shared expert
            shared = "shared_expert." if c.family.has_experts(i) else ""
            p = f"model.layers.{i}.feed_forward.{shared}"
            out.append((p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight"))
            continue
        if not c.family.has_experts(i):
            p = f"model.layers.{i}.mlp."
            out.append((p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight"))
            continue
        names = ("w1", "w3", "w2") if c.architecture == "mixtral" else (
            moe_names.of(c.architecture).experts)  # fmt: skip
        own = c.architecture in OWN_EXPERTS + _STACKED
        for e in range(c.family.num_experts if not own else 0):
            p = f"{_moe_block(c, i)}experts.{e}."
            out.append(tuple(f"{p}{n}.weight" for n in names))
        if c.family.shared_expert_intermediate_size:
            shared = "shared_expert." if c.family.routing is None else moe_names.of(
                c.architecture).shared  # fmt: skip
            p = f"{_moe_block(c, i)}{shared}"
            out.append(tuple(f"{p}{n}.weight" for n in names))
    return out
