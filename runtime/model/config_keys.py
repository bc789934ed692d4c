"""What some families' config.json files say under other names, or leave to their transformers
config class to derive: `renamed` before the loader's defaults are merged (the older keys,
transformers' `attribute_map`), `derived` after (the values a `__post_init__` computes)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagoda.runtime.model import (
    inkling2_config,
    inkling_config,
    longcat_flash_config,
    modernbert_config,
)

# older config.json keys a family's config class reads as another (its `attribute_map`, or an
# init argument it renames)
ALIASES = {
    "exaone": {"num_layers": "num_hidden_layers", "layer_norm_epsilon": "rms_norm_eps",
               "activation_function": "hidden_act"},
    "internlm3": {"qkv_bias": "attention_bias", "bias": "mlp_bias"},
    "falcon": {"n_embed": "hidden_size", "activation": "hidden_act", "bias": "attention_bias"},
    "gpt_neox": {"rotary_pct": "partial_rotary_factor", "rotary_emb_base": "rope_theta"},
    "stablelm": {"use_qkv_bias": "attention_bias"},
    "gptj": {"n_embd": "hidden_size", "n_head": "num_attention_heads", "n_layer": "num_hidden_layers",
             "n_positions": "max_position_embeddings", "n_inner": "intermediate_size",
             "activation_function": "hidden_act"},
    "gpt2": {"n_embd": "hidden_size", "n_head": "num_attention_heads", "n_layer": "num_hidden_layers",
             "n_positions": "max_position_embeddings", "n_inner": "intermediate_size",
             "activation_function": "hidden_act"},
    "opt": {"ffn_dim": "intermediate_size", "activation_function": "hidden_act"},
    "bloom": {"n_layer": "num_hidden_layers", "n_head": "num_attention_heads",
              "n_embed": "hidden_size", "seq_length": "max_position_embeddings"},
    "mpt": {"d_model": "hidden_size", "n_heads": "num_attention_heads", "n_layers": "num_hidden_layers",
            "max_seq_len": "max_position_embeddings"},
    "jetmoe": {"kv_channels": "head_dim", "activation_function": "hidden_act"},
}  # fmt: skip
ALIASES["gpt_bigcode"] = ALIASES["gpt2"]
ALIASES["gpt_neox_japanese"] = ALIASES["gpt_neox"]
ALIASES["xglm"] = {"d_model": "hidden_size", "attention_heads": "num_attention_heads",
                   "num_layers": "num_hidden_layers", "ffn_dim": "intermediate_size",
                   "activation_function": "hidden_act"}  # fmt: skip
ALIASES["codegen"] = ALIASES["gptj"]
ALIASES["openai_gpt"] = {"n_embd": "hidden_size", "n_head": "num_attention_heads",
                         "n_layer": "num_hidden_layers",
                         "n_positions": "max_position_embeddings"}  # fmt: skip
ALIASES["ctrl"] = {**ALIASES["openai_gpt"], "dff": "intermediate_size"}
# OpenAIGPTConfig's `afn` -> transformers' activation (its ACT_FNS: "gelu" is gelu_new's tanh)
OPENAI_GPT_AFN = {"gelu": "gelu_new", "relu": "relu"}
ALIASES["gpt_neo"] = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
                      "activation_function": "hidden_act", "window_size": "sliding_window"}  # fmt: skip
ALIASES["kimi_linear"] = {  # KimiLinearConfig's attribute_map (model/kimi_linear_config.py)
    "model_max_length": "max_position_embeddings", "moe_renormalize": "norm_topk_prob",
    "num_expert_group": "n_group", "num_experts": "n_routed_experts",
    "num_experts_per_token": "num_experts_per_tok", "num_shared_experts": "n_shared_experts"}  # fmt: skip
ALIASES["bailing_hybrid"] = ALIASES["kimi_linear"]  # BailingHybridConfig's (the same keys)
ALIASES["dbrx"] = ALIASES["mpt"]
ALIASES["kolibri1_1"] = {"mlp_only_intermediate_size": "intermediate_size"}  # (its dense MLPs')
ALIASES["longcat_flash"] = longcat_flash_config.ALIASES  # LongcatFlashConfig's attribute_map
ALIASES["inkling"] = inkling_config.ALIASES  # InklingTextConfig's attribute_map
ALIASES["inkling2"] = inkling2_config.ALIASES  # Inkling2TextConfig's
ALIASES["modernbert"] = modernbert_config.ALIASES  # (older configs' global_rope_theta)
# families whose config classes read only the older keys (the newer are their attribute_map's
# names, or unknown extras config.json may carry): the older key wins where both are set
OLDER_WINS = ("gpt2", "gpt_bigcode", "opt", "bloom", "mpt", "dbrx", "gpt_neo", "xglm", "kolibri1_1",
              "openai_gpt", "ctrl")  # fmt: skip


def renamed(cfg: Mapping[str, Any], arch: str) -> dict[str, Any]:
    """`cfg` with a family's older keys under the names the engine reads (the newer name wins
    where both are set); Gemma's legacy `hidden_act` "gelu" read, as transformers' GemmaConfig
    reads it, as the tanh approximation (its `hidden_activation` is not read)."""
    out = dict(cfg)
    for old, new in ALIASES.get(arch, {}).items():
        if old in out and (out.get(new) is None or arch in OLDER_WINS):
            out[new] = out[old]
    if arch == "inkling2" and out.get("model_type") == "inkling2_loop_text":
        out = {**inkling2_config.LOOP_DEFAULTS, **out}  # (Inkling2Loop's own defaults)
    if arch == "gemma":
        out.pop("hidden_activation", None)
        if out.get("hidden_act") == "gelu":
            out["hidden_act"] = "gelu_pytorch_tanh"
    return out


def derived(cfg: Mapping[str, Any], arch: str) -> dict[str, Any]:
    """`cfg` (the family's defaults merged) with what its config class derives: MiniCPM3's
    `v_head_dim` (hidden / heads), Falcon's MLP width (`ffn_hidden_size`, else 4 x hidden) and
    the KV heads its attention runs (one for multi-query, else `num_kv_heads`; GPT-NeoX's:
    every head)."""
    out = dict(cfg)
    if arch == "minicpm3" and out.get("v_head_dim") is None:
        out["v_head_dim"] = int(out["hidden_size"]) // int(out["num_attention_heads"])
    if arch == "falcon":
        out["intermediate_size"] = out.get("ffn_hidden_size") or 4 * int(out["hidden_size"])
        grouped = out.get("new_decoder_architecture") or not out.get("multi_query")
        heads = out.get("num_kv_heads") or out["num_attention_heads"]
        out["num_key_value_heads"] = heads if grouped else 1
    if arch in ("gptj", "codegen"):  # the MLP 4 x hidden by default, `rotary_dim` rotated
        hidden, heads = int(out["hidden_size"]), int(out["num_attention_heads"])
        out["intermediate_size"] = out.get("intermediate_size") or 4 * hidden
        if out.get("rotary_dim"):
            rotary, head = int(out["rotary_dim"]), hidden // heads
            if rotary % 2 or rotary > head:  # (in config.json's own terms, not the factor's)
                raise ValueError(f"rotary_dim {rotary} must be even and at most the head size "
                                 f"{head} (n_embd {hidden} / n_head {heads})")  # fmt: skip
            out["partial_rotary_factor"] = rotary / head
    if arch == "gpt_neo":  # its MLP 4 x hidden by default; `attention_types` as layer_types
        out["intermediate_size"] = out.get("intermediate_size") or 4 * int(out["hidden_size"])
        out["layer_types"] = gpt_neo_layer_types(out)
    if arch == "gpt_neox_japanese":  # the MLP intermediate_multiple_size x hidden
        out["intermediate_size"] = int(int(out["hidden_size"]) * out.get(
            "intermediate_multiple_size", 4))  # fmt: skip
    if arch in ("gpt_neox", "gpt_neox_japanese", "gptj", "gpt2", "opt", "bloom", "mpt", "gpt_neo", "codegen",
                "persimmon", "xglm", "openai_gpt", "biogpt", "ctrl"):  # fmt: skip
        out["num_key_value_heads"] = out["num_attention_heads"]  # whatever config.json says
    if arch == "gpt_bigcode":  # StarCoder 1: one KV head with multi_query
        multi = out.get("multi_query", True)
        out["num_key_value_heads"] = 1 if multi else out["num_attention_heads"]
    if arch in ("gpt2", "gpt_bigcode"):  # the MLP 4 x hidden unless n_inner says
        out["intermediate_size"] = out.get("n_inner") or 4 * int(out["hidden_size"])
    if arch == "openai_gpt":  # GPT-1: the MLP 4 x hidden; `afn` as transformers' ACT_FNS read it
        out["intermediate_size"] = 4 * int(out["hidden_size"])
        afn = out.get("afn", "gelu")
        if afn not in OPENAI_GPT_AFN:
            raise ValueError(f"OpenAI GPT with afn {afn!r} is not supported "
                             f"({', '.join(OPENAI_GPT_AFN)})")  # fmt: skip
        out["hidden_act"] = OPENAI_GPT_AFN[afn]
    if arch == "bloom":  # (BloomConfig has no width: 4 x hidden)
        out["intermediate_size"] = 4 * int(out["hidden_size"])
    if arch == "mpt":
        out["intermediate_size"] = int(out.get("expansion_ratio", 4) * int(out["hidden_size"]))
    if arch == "cohere2_moe":  # the experts' width; the dense layers' own; one eps for the norms
        out["moe_intermediate_size"] = out["intermediate_size"]
        out["intermediate_size"] = out.get("prefix_dense_intermediate_size") or out[
            "intermediate_size"]  # fmt: skip
        rms = out.get("rms_norm_eps")  # (RMSNorm where set, else LayerNorm's eps)
        out["norm_eps"] = out["layer_norm_eps"] if rms is None else rms
    if arch == "dory":  # the published layout's attention and mlp blocks: one layer a pair
        from pagoda.runtime.model.dory_config import overrides as dory_overrides

        out.update(dory_overrides(out))
    if arch == "hrm_text":  # its two stacks' layers (hrm_text_config.py)
        from pagoda.runtime.model.hrm_text_config import overrides as hrm_overrides

        out.update(hrm_overrides(out))
    if arch == "gemma3n":  # its MLP widths by layer, its rotary by layer kind
        from pagoda.runtime.model.gemma3n_config import overrides as gemma3n_overrides

        out.update(gemma3n_overrides(out))
    if arch == "mllama":  # the self-attention layers alone (mllama_config.py)
        from pagoda.runtime.model.mllama_config import overrides as mllama_overrides

        out.update(mllama_overrides(out))
    if arch == "minimax_m3":  # widths by MLP kind, layer kinds from the released keys
        from pagoda.runtime.model.minimax_m3_config import overrides as minimax_m3_overrides

        out.update(minimax_m3_overrides(out))
    if arch == "ergo":  # the dense MLP's width, the window's published name, hidden / heads
        from pagoda.runtime.model.ergo_config import overrides

        out.update(overrides(out))
    if arch == "solar_open":  # no dense MLP (experts in every layer): the experts' width
        out.setdefault("intermediate_size", out["moe_intermediate_size"])
    if arch == "dbrx":  # nested in attn_config / ffn_config (DbrxConfig's defaults: 1, 3584)
        out["num_key_value_heads"] = int((out.get("attn_config") or {}).get("kv_n_heads", 1))
        out["intermediate_size"] = int((out.get("ffn_config") or {}).get("ffn_hidden_size", 3584))
    if arch == "longcat_flash":  # two attention sublayers a layer (longcat_flash_config.py)
        out["num_hidden_layers"] = 2 * int(out["num_layers"])
    if arch in ("bert", "roberta"):  # RoBERTa's context: its table less the offset rows
        from pagoda.runtime.model.bert_config import overrides as bert_overrides

        out.update(bert_overrides(out, arch))
    if arch == "jetmoe":  # JetMoeConfig's: the KV heads once per expert picked
        out["num_attention_heads"] = int(out["num_key_value_heads"]) * int(
            out["num_experts_per_tok"])  # fmt: skip
    return out


def gpt_neo_layer_types(cfg: Mapping[str, Any]) -> list[str]:
    """GPT-Neo's `attention_types` ([[kinds, repeats], ...], GPTNeoConfig's expansion: each
    list of kinds repeated) as layer_types: "local" layers slide (`window_size`), "global" ones
    attend to everything; ValueError, one line, for another kind or a count that is not
    `num_layers`."""
    types = [kind for kinds, times in cfg["attention_types"] for _ in range(int(times))
             for kind in kinds]  # fmt: skip
    unknown = sorted(set(types) - {"global", "local"})
    if unknown:
        raise ValueError(f"attention_types {unknown} are not supported in a gpt_neo model "
                         "(global or local)")  # fmt: skip
    if len(types) != int(cfg["num_hidden_layers"]):
        raise ValueError(f"attention_types name {len(types)} layers, the model has "
                         f"{cfg['num_hidden_layers']}")  # fmt: skip
    return ["sliding_attention" if t == "local" else "full_attention" for t in types]
