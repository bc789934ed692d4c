"""GGUFs of the older families llama.cpp converts with classes of their own (`gguf_classic.py`):
Gemma 1, Phi-2, StableLM, GPT-2, StarCoder 1 (GPTBigCode), GPT-NeoX, Falcon, BLOOM and MPT,
written here as llama.cpp's converter writes them (gguf-py's tensor names for the architecture,
its metadata keys, and its transforms: Gemma's norms + 1, GPT-2's Conv1D matrices transposed,
GPT-NeoX's and BLOOM's per-head q/k/v regrouped, Falcon's by KV group, StableLM's per-head q/k
norms stacked; Q8_0 matrices): the engine matches transformers running on exactly the
dequantized weights, token for token, and the start-up weights estimate is what the built
model holds."""

from __future__ import annotations

import dataclasses
import re

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from hf_oracle import hf_greedy_plain, make_tiny_model
from pagoda.runtime.model.gguf_loader import load_gguf
from pagoda.runtime.model.hf_loader import check_weights, read_config, read_weights
from test_gguf_archs import PROMPTS, _check_estimate, _generate, _unpermute
from test_gguf_families import _oracle, _permute, add_byte_level_tokenizer

transformers = pytest.importorskip("transformers")


def _regroup(w: np.ndarray, heads: int) -> np.ndarray:
    """GPT-NeoX's / BLOOM's converter: q, k, v of each head in turn -> every q head, every k
    head, every v head (`_ungroup`: back)."""
    rows = w.reshape(heads, 3, -1, *w.shape[1:])
    return np.concatenate([rows[:, i].reshape(-1, *w.shape[1:]) for i in range(3)])


def _ungroup(w: np.ndarray, heads: int) -> np.ndarray:
    parts = w.reshape(3, heads, -1, *w.shape[1:])
    return np.stack([parts[0], parts[1], parts[2]], axis=1).reshape(w.shape)


def _falcon_qkv(w: np.ndarray, heads: int, kv: int) -> np.ndarray:
    """Falcon's converter ("jploski"): per KV group its q heads, k, v -> every q, k, v."""
    d = w.shape[0] // (heads + 2 * kv)
    g = w.reshape(kv, heads // kv + 2, d, *w.shape[1:])
    q = g[:, :-2].reshape(-1, *w.shape[1:])
    return np.concatenate([q, g[:, -2].reshape(-1, *w.shape[1:]),
                           g[:, -1].reshape(-1, *w.shape[1:])])  # fmt: skip


def _falcon_back(w: np.ndarray, heads: int, kv: int) -> np.ndarray:
    d = w.shape[0] // (heads + 2 * kv)
    q = w[: heads * d].reshape(kv, heads // kv, d, *w.shape[1:])
    k = w[heads * d : (heads + kv) * d].reshape(kv, 1, d, *w.shape[1:])
    v = w[(heads + kv) * d :].reshape(kv, 1, d, *w.shape[1:])
    return np.concatenate([q, k, v], axis=1).reshape(w.shape)


def _store(w, gname: str, arr: np.ndarray) -> np.ndarray:
    """`arr` written (Q8_0 where 2-D and not a norm, else F32); what the file gives back."""
    if arr.ndim == 1 or "norm" in gname or arr.shape[-1] % 32:  # (Q8_0's blocks: 32 a row)
        data = back = np.ascontiguousarray(arr, dtype=np.float32)
        w.add_tensor(gname, data)
        return back
    data = gguf.quants.quantize(np.ascontiguousarray(arr, dtype=np.float32), Q.Q8_0)
    w.add_tensor(gname, data, raw_shape=data.shape, raw_dtype=Q.Q8_0)
    return gguf.quants.dequantize(data, Q.Q8_0).reshape(arr.shape)


def _store_experts(w, experts: dict, expected: dict, prefix: str, parts: dict) -> None:
    """Per-expert matrices (`experts[(layer, part)][e]`) written as the converter stacks them,
    `blk.{layer}.{parts[part]}.weight` [E, N, K]; each expert's slice of what the file gives
    back into `expected` under `model.layers.{layer}.{prefix}.{e}.{part}.weight`."""
    for (layer, part), per in experts.items():
        stacked = _store(w, f"blk.{layer}.{parts[part]}.weight",
                         np.stack([per[e] for e in sorted(per)]))  # fmt: skip
        for e in sorted(per):
            expected[f"model.layers.{layer}.{prefix}.{e}.{part}.weight"] = stacked[e]


def _written(w, expected: dict) -> dict:
    """The GGUF writer's file finished and closed; `expected` (what the file gives back, by
    Hugging Face name) as tensors."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in expected.items()}


_ENUM = {"gemma": "GEMMA", "phi2": "PHI2", "stablelm": "STABLELM", "gpt2": "GPT2",
         "starcoder": "STARCODER", "gptneox": "GPTNEOX", "falcon": "FALCON", "bloom": "BLOOM",
         "mpt": "MPT", "olmo": "OLMO", "exaone": "EXAONE", "nemotron": "NEMOTRON",
         "jais2": "JAIS2", "minicpm3": "MINICPM3", "hunyuan-dense": "HUNYUAN_DENSE",
         "lfm2": "LFM2", "lfm2moe": "LFM2MOE", "ernie4_5-moe": "ERNIE4_5_MOE",
         "hunyuan-moe": "HUNYUAN_MOE", "dots1": "DOTS1", "mamba": "MAMBA", "mamba2": "MAMBA2",
         "exaone-moe": "EXAONE_MOE"}  # fmt: skip
_PRE = {"gemma": None, "phi2": "phi-2", "stablelm": "stablelm2", "gpt2": "gpt-2",
        "starcoder": "starcoder", "gptneox": "gpt-2", "falcon": "falcon", "bloom": "bloom",
        "mpt": "mpt", "olmo": "olmo", "exaone": "exaone", "nemotron": "default",
        "jais2": "jais-2", "minicpm3": "default", "hunyuan-dense": "hunyuan-dense",
        "lfm2": "lfm2", "lfm2moe": "lfm2", "ernie4_5-moe": "default",
        "hunyuan-moe": "hunyuan", "dots1": "qwen2", "mamba": "gpt-2", "mamba2": "gpt-2",
        "exaone-moe": "exaone-moe"}  # fmt: skip
# the converters' stacked experts: (HF expert tensor) -> llama.cpp's [E, N, K] tensor
_EXPERTS = {
    "w1": "ffn_gate_exps",
    "w3": "ffn_up_exps",
    "w2": "ffn_down_exps",
    "gate_proj": "ffn_gate_exps",
    "up_proj": "ffn_up_exps",
    "down_proj": "ffn_down_exps",
}
# the converters built on TextModel's `set_gguf_parameters` (the base's keys first)
_BASE = (
    "olmo",
    "exaone",
    "nemotron",
    "jais2",
    "hunyuan-dense",
    "lfm2",
    "lfm2moe",
    "ernie4_5-moe",
    "hunyuan-moe",
    "dots1",
    "exaone-moe",
)


def _base_metadata(w, c: dict) -> None:
    """TextModel.set_gguf_parameters: the common keys, the rotary's type and base, the eps."""
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    if c.get("num_key_value_heads"):
        w.add_head_count_kv(c["num_key_value_heads"])
    if c.get("num_experts"):
        w.add_expert_count(c["num_experts"])
    if c.get("num_experts_per_tok"):
        w.add_expert_used_count(c["num_experts_per_tok"])
    rope = c.get("rope_parameters") or {}
    if rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    if rope.get("rope_theta") is not None:
        w.add_rope_freq_base(rope["rope_theta"])
    eps = next((c[k] for k in ("rms_norm_eps", "norm_eps") if c.get(k) is not None), None)
    if eps is not None:
        w.add_layer_norm_rms_eps(eps)
    eps = next((c[k] for k in ("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon")
                if c.get(k) is not None), None)  # fmt: skip
    if eps is not None:
        w.add_layer_norm_eps(eps)
    if c.get("head_dim") is not None:
        w.add_key_length(c["head_dim"])
        w.add_value_length(c["head_dim"])


def _metadata(w, arch: str, cfg) -> None:
    """The keys the family's converter writes (its `set_gguf_parameters`)."""
    c = cfg.to_dict()
    hidden = c.get("hidden_size") or c.get("n_embd") or c.get("d_model")
    heads = c.get("num_attention_heads") or c.get("n_head") or c.get("n_heads")
    layers = c.get("num_hidden_layers") or c.get("n_layer") or c.get("n_layers")
    rope = c.get("rope_parameters") or {}
    partial = rope.get("partial_rotary_factor", 1.0)
    if arch in ("mamba", "mamba2"):
        _mamba_metadata(w, arch, c)
        return
    head_dim = c.get("head_dim") or hidden // heads
    if arch in ("lfm2", "lfm2moe"):
        kv = c["num_key_value_heads"]
        c = {**c, "num_key_value_heads": [0 if t == "conv" else kv for t in c["layer_types"]]}
    if arch in _BASE:
        _base_metadata(w, c)
    if arch == "olmo":
        w.add_layer_norm_eps(1e-5)
        if c.get("clip_qkv") is not None:
            w.add_clamp_kqv(c["clip_qkv"])
    if arch == "exaone":
        w.add_rope_dimension_count(int(partial * (hidden // heads)))
        if rope.get("rope_type") == "llama3":
            from test_gguf_families import _llama3_rope_freqs

            w.add_tensor("rope_freqs.weight", _llama3_rope_freqs(rope, head_dim))
    if arch == "nemotron":
        w.add_vocab_size(c["vocab_size"])
        w.add_layer_norm_eps(c["norm_eps"])
        w.add_rope_dimension_count(int(partial * hidden) // heads)
        w.add_rope_scaling_type(gguf.RopeScalingType.NONE)
    if arch == "jais2":
        w.add_rope_dimension_count(head_dim)
    if arch in ("lfm2", "lfm2moe"):  # KV heads a layer (0: a conv); the conv's width
        w.add_vocab_size(c["vocab_size"])
        w.add_shortconv_l_cache(c["conv_L_cache"])
    if arch == "lfm2":  # its MLP's width as Lfm2MLP adjusts it
        from pagoda.runtime.model.lfm2_config import _mlp_width

        w.add_feed_forward_length(_mlp_width(c))
    if arch == "lfm2moe":
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
        w.add_leading_dense_block_count(c["num_dense_layers"])
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    if arch == "ernie4_5-moe":
        w.add_expert_count(c["moe_num_experts"])
        w.add_expert_used_count(c["moe_k"])
        w.add_interleave_moe_layer_step(c["moe_layer_interval"])
        w.add_leading_dense_block_count(c["moe_layer_start_index"])
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
        w.add_expert_shared_count(c["moe_num_shared_experts"])
    if arch == "exaone-moe":  # Exaone4Model's window, ExaoneMoEModel's experts
        w.add_expert_count(c["num_experts"])
        w.add_expert_group_count(c["n_group"])
        w.add_expert_group_used_count(c["topk_group"])
        w.add_sliding_window(c["sliding_window"])
        w.add_sliding_window_pattern([t == "sliding_attention" for t in c["layer_types"]])
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
        w.add_expert_shared_count(c["num_shared_experts"])
        w.add_expert_shared_feed_forward_length(c["moe_intermediate_size"]
                                                * c["num_shared_experts"])  # fmt: skip
        w.add_expert_weights_scale(c["routed_scaling_factor"])
        w.add_expert_weights_norm(c["norm_topk_prob"])
        w.add_leading_dense_block_count(c["first_k_dense_replace"])
        w.add_nextn_predict_layers(0)
        w.add_rope_scaling_type(gguf.RopeScalingType.NONE)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    if arch == "dots1":  # Qwen2MoeModel's keys (its base: the experts, the groups), its own
        w.add_expert_count(c["n_routed_experts"])
        w.add_expert_group_count(c["n_group"])
        w.add_expert_group_used_count(c["topk_group"])
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
        w.add_leading_dense_block_count(c["first_k_dense_replace"])
        w.add_expert_shared_count(c["n_shared_experts"])
        w.add_expert_weights_scale(c["routed_scaling_factor"])
        w.add_expert_weights_norm(c["norm_topk_prob"])
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    if arch == "hunyuan-moe":  # (its lists' first values)
        first = [v[0] if isinstance(v, list) else v for v in
                 (c["moe_intermediate_size"], c["moe_topk"], c["num_shared_expert"])]  # fmt: skip
        w.add_expert_shared_feed_forward_length(c["intermediate_size"])
        w.add_expert_feed_forward_length(first[0])
        w.add_expert_used_count(first[1])
        w.add_expert_shared_count(first[2])
    if arch.startswith("hunyuan"):  # the NTK alpha baked into the base
        w.add_rope_freq_base(rope["rope_theta"] * rope["alpha"] ** (head_dim / (head_dim - 2)))
        w.add_rope_scaling_type(gguf.RopeScalingType.NONE)
        w.add_rope_scaling_factor(1)
    if arch == "minicpm3":
        w.add_context_length(c["max_position_embeddings"])
        w.add_embedding_length(hidden)
        w.add_block_count(layers)
        w.add_head_count(heads)
        w.add_feed_forward_length(c["intermediate_size"])
        w.add_head_count_kv(c["num_key_value_heads"])
        w.add_layer_norm_rms_eps(c["rms_norm_eps"])
        w.add_vocab_size(c["vocab_size"])
        w.add_q_lora_rank(c["q_lora_rank"])
        w.add_kv_lora_rank(c["kv_lora_rank"])
        w.add_key_length(c["qk_nope_head_dim"] + c["qk_rope_head_dim"])
        w.add_rope_dimension_count(c["qk_rope_head_dim"])
        for kind in ("long", "short"):
            if rope.get(f"{kind}_factor"):
                w.add_tensor(f"rope_factors_{kind}.weight",
                             np.array(rope[f"{kind}_factor"], dtype=np.float32))  # fmt: skip
    if arch in (*_BASE, "minicpm3"):
        return
    w.add_block_count(layers)
    w.add_embedding_length(hidden)
    w.add_head_count(heads)
    if arch == "gemma":
        w.add_context_length(c["max_position_embeddings"])
        w.add_feed_forward_length(c["intermediate_size"])
        w.add_head_count_kv(c["num_key_value_heads"])
        w.add_layer_norm_rms_eps(c["rms_norm_eps"])
        w.add_key_length(c["head_dim"])
        w.add_value_length(c["head_dim"])
    if arch == "phi2":
        w.add_context_length(c["max_position_embeddings"])
        w.add_feed_forward_length(4 * hidden)
        w.add_head_count_kv(heads)
        w.add_layer_norm_eps(c["layer_norm_eps"])
        w.add_rope_dimension_count(int(partial * hidden) // heads)
        w.add_add_bos_token(False)
    if arch == "stablelm":
        w.add_context_length(c["max_position_embeddings"])
        w.add_feed_forward_length(c["intermediate_size"])
        w.add_rope_dimension_count(int(partial * (hidden // heads)))
        w.add_head_count_kv(c["num_key_value_heads"])
        w.add_parallel_residual(c["use_parallel_residual"])
        w.add_layer_norm_eps(c["layer_norm_eps"])
    if arch in ("gpt2", "starcoder"):
        w.add_context_length(c["n_positions"])
        w.add_feed_forward_length(4 * hidden)
        w.add_layer_norm_eps(c["layer_norm_epsilon"])
        if arch == "starcoder":
            w.add_head_count_kv(1)
    if arch == "gptneox":
        w.add_context_length(c["max_position_embeddings"])
        w.add_feed_forward_length(c["intermediate_size"])
        w.add_rope_dimension_count(int(partial * (hidden // heads)))
        w.add_parallel_residual(c.get("use_parallel_residual", True))
        w.add_layer_norm_eps(c["layer_norm_eps"])
    if arch == "falcon":
        w.add_context_length(2048)
        w.add_tensor_data_layout("jploski")
        w.add_feed_forward_length(4 * hidden)
        w.add_head_count_kv(c["num_kv_heads"] if c["new_decoder_architecture"] else 1)
        w.add_layer_norm_eps(c["layer_norm_epsilon"])
    if arch == "bloom":
        w.add_context_length(c.get("seq_length", hidden))
        w.add_feed_forward_length(4 * hidden)
        w.add_head_count_kv(heads)
        w.add_layer_norm_eps(c["layer_norm_epsilon"])
    if arch == "mpt":
        a = c["attn_config"]
        w.add_context_length(c["max_seq_len"])
        w.add_feed_forward_length(4 * hidden)
        w.add_layer_norm_eps(1e-5)
        if a["clip_qkv"] is not None:
            w.add_clamp_kqv(a["clip_qkv"])
        w.add_max_alibi_bias(a["alibi_bias_max"])


def _mamba_metadata(w, arch: str, c: dict) -> None:
    """MambaModel's / Mamba2Model's keys: the `ssm.*` sizes (Mamba2's heads as the time-step
    rank), no heads nor MLP, an arbitrary context; Falcon-Mamba's `ssm.dt_b_c_rms`."""
    inner = c.get("intermediate_size") or c["expand"] * c["hidden_size"]
    w.add_context_length(2**20)
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_block_count(c["num_hidden_layers"])
    w.add_ssm_conv_kernel(c["conv_kernel"])
    w.add_ssm_inner_size(inner)
    w.add_ssm_state_size(c["state_size"])
    if arch == "mamba":
        w.add_ssm_time_step_rank(c["time_step_rank"])
    else:
        w.add_ssm_time_step_rank(inner // c["head_dim"])
        w.add_ssm_group_count(c["n_groups"])
    w.add_layer_norm_rms_eps(c["layer_norm_epsilon"])
    if arch == "mamba":
        w.add_ssm_dt_b_c_rms(c["model_type"] == "falcon_mamba")


def _mamba_tensor(hf: str, arr: np.ndarray, arch: str, c: dict):
    """The converter's forms of a Mamba mixer's tensor (`hf` renamed where it renames it): A
    as -exp(A_log), the conv squeezed; Mamba2's A and D [n, 1], its norm [groups, -1], its
    dt_bias as `dt_proj.bias`; with the function giving the checkpoint's form back."""
    if hf.endswith(".dt_bias"):
        hf = hf.replace(".dt_bias", ".dt_proj.bias")
    if hf.endswith(".A_log"):
        stored = -np.exp(arr)
        return hf, (stored.reshape(-1, 1) if arch == "mamba2" else stored), \
            lambda a, s=arr.shape: np.log(-a).reshape(s)  # fmt: skip
    if hf.endswith(".D") and arch == "mamba2":
        return hf, arr.reshape(-1, 1), lambda a, s=arr.shape: a.reshape(s)
    if hf.endswith("conv1d.weight"):
        return hf, arr.squeeze(1), lambda a: a[:, None, :]
    if hf.endswith("mixer.norm.weight"):
        return hf, arr.reshape(c["n_groups"], -1), lambda a, s=arr.shape: a.reshape(s)
    return hf, arr, lambda a: a


def convert(path, hf_dir, arch: str, spm: bool = False, extra=None) -> dict[str, torch.Tensor]:
    """The checkpoint in `hf_dir` as llama.cpp's converter writes it for `arch` (module
    docstring; `spm`: Gemma's SentencePiece vocabulary, as its converter writes it, else a
    byte-level BPE); the checkpoint's tensors as the file gives them back, in its layout."""
    from safetensors.torch import load_file

    cfg = transformers.AutoConfig.from_pretrained(hf_dir)
    sd = {k: v.float().numpy() for k, v in load_file(str(hf_dir / "model.safetensors")).items()}
    c = cfg.to_dict()
    heads = c.get("num_attention_heads") or c.get("n_head") or c.get("n_heads")
    w = gguf.GGUFWriter(str(path), arch)
    _metadata(w, arch, cfg)
    if extra is not None:  # keys written over the converter's
        extra(w)
    if spm:
        from test_gguf_families import add_gemma_tokenizer

        add_gemma_tokenizer(w, c["vocab_size"])
        w.add_add_space_prefix(False)
    else:
        add_byte_level_tokenizer(w, c["vocab_size"], _PRE[arch] or "default")
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[_ENUM[arch]], cfg.num_hidden_layers)
    expected: dict[str, np.ndarray] = {}
    norms: dict[str, dict[int, np.ndarray]] = {}
    experts: dict[tuple[str, str], dict[int, np.ndarray]] = {}
    for hf, arr in sd.items():
        if m := re.match(r"^model\.layers\.(\d+)\..*experts\.(\d+)\.(\w+)\.weight$", hf):
            experts.setdefault((m[1], m[3]), {})[int(m[2])] = arr
            continue
        if hf.endswith("e_score_correction_bias"):  # the base's rename: `.bias`
            layer = hf.split(".")[2]
            expected[hf] = _store(w, f"blk.{layer}.exp_probs_b.bias", arr)
            continue
        if hf.endswith(".feed_forward.expert_bias"):  # (renamed `expert_bias.bias`)
            layer = hf.split(".")[2]
            expected[hf] = _store(w, f"blk.{layer}.exp_probs_b.bias", arr)
            continue
        if arch in ("lfm2", "lfm2moe") and hf.endswith("conv.conv.weight"):
            expected[hf] = _store(w, names.get_name(hf, try_suffixes=(".weight",)),
                                  arr.squeeze(1))[:, None, :]  # fmt: skip
            continue
        if arch == "gemma" and hf == "lm_head.weight":  # skipped by the converter (tied)
            continue
        if hf.endswith((".attn.bias", ".attn.masked_bias")):
            continue
        if ".norms." in hf:  # StableLM's per-head q/k norms: stacked [heads, head_dim]
            whole, head = hf.rsplit(".norms.", 1)
            norms.setdefault(whole + ".weight", {})[int(head.split(".")[0])] = arr
            continue
        stored, back = arr, lambda a: a
        key = hf.replace("transformer.", "", 1) if arch == "bloom" else hf
        if arch in ("mamba", "mamba2"):
            key, stored, back = _mamba_tensor(hf, arr, arch, c)
        if arch == "olmo" and hf.endswith(("q_proj.weight", "k_proj.weight")):  # LlamaModel's
            n = heads if "q_proj" in hf else c["num_key_value_heads"]
            stored, back = _permute(arr, n), lambda a, n=n: _unpermute(a, n)
        if arch in ("gemma", "nemotron") and hf.endswith("norm.weight"):
            stored, back = arr + 1, lambda a: a - 1
        if arch == "gpt2" and hf.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight")):
            stored, back = arr.T, lambda a: a.T
        if "query_key_value" in hf and arch in ("gptneox", "bloom"):
            stored, back = _regroup(arr, heads), lambda a: _ungroup(a, heads)
        if "query_key_value" in hf and arch == "falcon":
            kv = c["num_kv_heads"] if c["new_decoder_architecture"] else 1
            stored, back = _falcon_qkv(arr, heads, kv), lambda a, kv=kv: _falcon_back(a, heads, kv)
        gname = names.get_name(key, try_suffixes=(".weight", ".bias"))
        assert gname is not None, hf
        expected[hf] = back(_store(w, gname, stored))
    for (layer, part), per in experts.items():
        stacked = _store(w, f"blk.{layer}.{_EXPERTS[part]}.weight",
                         np.stack([per[e] for e in sorted(per)]))  # fmt: skip
        for e in sorted(per):
            hf = next(n for n in sd if n.startswith(f"model.layers.{layer}.")
                      and n.endswith(f"experts.{e}.{part}.weight"))  # fmt: skip
            expected[hf] = stacked[e]
    for whole, per in norms.items():
        gname = names.get_name(whole, try_suffixes=(".weight",))
        stacked = _store(w, gname, np.stack([per[h] for h in sorted(per)]))
        for h in sorted(per):
            expected[whole.replace(".weight", f".norms.{h}.weight")] = stacked[h]
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in expected.items()}


FALCON = dict(ffn_hidden_size=256, num_key_value_heads=None)
LLAMA3 = {"rope_type": "llama3", "rope_theta": 1e6, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}  # fmt: skip
# MiniCPM3-4B's longrope (its original context the model's: short factors below it), shrunk
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 512,
            "short_factor": [1.0, 1.1, 1.5, 2.0], "long_factor": [1.2, 2.0, 4.0, 9.0]}  # fmt: skip
# case: (transformers config prefix, overrides, llama.cpp arch, the engine's architecture)
CASES = {
    "gemma": ("Gemma", dict(head_dim=32, num_key_value_heads=1), "gemma", "gemma"),
    "phi2": ("Phi", dict(num_key_value_heads=4), "phi2", "phi"),
    "stablelm": ("StableLm", dict(use_qkv_bias=True), "stablelm", "stablelm"),
    # StableLM 2 12B: one norm in parallel, per-head q/k LayerNorms
    "stablelm-parallel-qk-norms": ("StableLm", dict(use_parallel_residual=True,
                                                    qk_layernorm=True), "stablelm", "stablelm"),
    "gpt2": ("GPT2", dict(num_key_value_heads=None), "gpt2", "gpt2"),
    "starcoder": ("GPTBigCode", dict(multi_query=True), "starcoder", "gpt_bigcode"),
    "gptneox": ("GPTNeoX", dict(num_key_value_heads=None), "gptneox", "gpt_neox"),
    "gptneox-sequential": ("GPTNeoX", dict(num_key_value_heads=None,
                                           use_parallel_residual=False), "gptneox", "gpt_neox"),
    "falcon-7b": ("Falcon", dict(FALCON, multi_query=True), "falcon", "falcon"),
    "falcon-40b": ("Falcon", dict(FALCON, new_decoder_architecture=True, num_kv_heads=2),
                   "falcon", "falcon"),
    "bloom": ("Bloom", dict(hidden_size=96, num_attention_heads=6), "bloom", "bloom"),
    "mpt": ("Mpt", dict(hidden_size=96, num_attention_heads=6, attn_config={"clip_qkv": 0.5}),
            "mpt", "mpt"),
    "olmo": ("Olmo", dict(clip_qkv=0.5, tie_word_embeddings=True), "olmo", "olmo"),
    "exaone-llama3": ("Exaone", dict(tie_word_embeddings=True, rope_parameters=LLAMA3), "exaone",
                      "exaone"),
    "nemotron": ("Nemotron", dict(head_dim=16, attention_bias=True, mlp_bias=True,
                                  rope_parameters={"rope_type": "default", "rope_theta": 20000.0,
                                                   "partial_rotary_factor": 0.5}),
                 "nemotron", "nemotron"),
    "jais2": ("Jais2", dict(), "jais2", "jais2"),
    # llama.cpp's constants (scale_emb 12, scale_depth 1.4, dim_model_base 256) as MiniCPM3-4B's
    "minicpm3": ("MiniCPM3", dict(num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=32,
                                  qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=None,
                                  scale_emb=12, scale_depth=1.4, dim_model_base=256,
                                  tie_word_embeddings=False, rope_parameters=LONGROPE),
                 "minicpm3", "minicpm3"),
    "hunyuan-dense": ("HunYuanDenseV1", dict(head_dim=16, rope_parameters={
        "rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 10000.0}),
        "hunyuan-dense", "hunyuan_v1_dense"),
    # gated short convs among attention layers (q/k norms), the MLP's width adjusted
    "lfm2": ("Lfm2", dict(num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"],
                          block_multiple_of=16, block_ffn_dim_multiplier=1.5), "lfm2", "lfm2"),
    # a dense layer, then sigmoid-routed experts with the choice-only bias
    "lfm2moe": ("Lfm2Moe", dict(num_hidden_layers=3, layer_types=["conv", "full_attention",
                                                                  "conv"],
                                num_dense_layers=1, num_experts=8, num_experts_per_tok=3,
                                moe_intermediate_size=32), "lfm2moe", "lfm2_moe"),
    # experts after a dense layer, a biased choice, two shared experts; interleaved rotary
    "ernie4_5-moe": ("Ernie4_5_Moe", dict(moe_num_experts=8, moe_k=2, moe_intermediate_size=32),
                     "ernie4_5-moe", "ernie4_5_moe"),
    # experts beside a shared MLP, q/k norms after rotary, the NTK alpha baked into the base
    "hunyuan-moe": ("HunYuanMoEV1", dict(num_experts=6, moe_topk=[3, 3], intermediate_size=32,
                                         moe_intermediate_size=[32, 32], num_shared_expert=[1, 1],
                                         use_mixed_mlp_moe=True, use_qk_norm=True, head_dim=16,
                                         rope_parameters={"rope_type": "dynamic", "alpha": 1000.0,
                                                          "factor": 1.0, "rope_theta": 1e4}),
                    "hunyuan-moe", "hunyuan_v1_moe"),
    # DeepSeek-V3's sigmoid router with its correction bias after a dense layer, a shared
    # expert, q/k norms
    "dots1": ("Dots1", dict(head_dim=32, n_routed_experts=8, num_experts_per_tok=2, n_group=1,
                            topk_group=1, routed_scaling_factor=2.0, norm_topk_prob=True,
                            n_shared_experts=1, moe_intermediate_size=32, first_k_dense_replace=1,
                            num_hidden_layers=3, sliding_window=None), "dots1", "dots1"),
    # Mamba-1: A [d_inner, d_state] as -exp(A_log), dt from a rank-4 projection, biases
    "mamba": ("Mamba", dict(num_hidden_layers=2, state_size=8, time_step_rank=4, use_bias=True,
                            expand=2, vocab_size=304), "mamba", "mamba"),
    # Falcon-Mamba: weightless norms on B, C and dt (`ssm.dt_b_c_rms`), no conv bias
    "falcon-mamba": ("FalconMamba", dict(num_hidden_layers=2, state_size=8, use_conv_bias=False,
                                         vocab_size=304), "mamba", "falcon_mamba"),
    # Mamba2 alone: two groups of B/C, biased projections, its gated norm by group
    "mamba2": ("Mamba2", dict(num_hidden_layers=2, num_heads=4, head_dim=32, state_size=16,
                              n_groups=2, chunk_size=8, use_bias=True, vocab_size=304),
               "mamba2", "mamba2"),
    # V3's grouped sigmoid router after a dense layer, shared experts; window layers (every
    # second global, NoPE)
    "exaone-moe": ("ExaoneMoe", dict(head_dim=32, num_experts=8, num_experts_per_tok=2, n_group=4,
                                     topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5,
                                     num_shared_experts=1, moe_intermediate_size=32,
                                     first_k_dense_replace=1, num_hidden_layers=4,
                                     sliding_window=11, sliding_window_pattern=2),
                   "exaone-moe", "exaone_moe"),
}  # fmt: skip


def _scramble_choice_biases(model, path) -> None:
    """The routers' choice-only biases (zero as transformers makes them) drawn large enough to
    change the experts picked; the model saved again."""
    g = torch.Generator().manual_seed(2)
    biases = [(n, p) for n, p in model.named_buffers() if n.endswith(_BIASES)]
    biases += [(n, p) for n, p in model.named_parameters() if n.endswith(_BIASES)]
    with torch.no_grad():
        for _, bias in biases:
            bias.copy_(torch.randn(bias.shape, generator=g))
    if biases:
        model.save_pretrained(path)


_BIASES = ("e_score_correction_bias", "expert_bias")


def _expert(weights, name: str) -> torch.Tensor:
    """Expert e's matrix `<prefix>.experts.<e>.<part>.weight` from the file's stacked tensor."""
    m = re.match(r"^(.*\.experts)\.(\d+)\.(\w+)\.weight$", name)
    return weights[f"{m[1]}.{m[3]}.weight"][int(m[2])]


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_classic_family_matches_transformers_on_its_dequantized_weights(tmp_path, case):
    hf_arch, overrides, arch, engine = CASES[case]
    model = make_tiny_model(tmp_path / "hf", hf_arch, **overrides)
    _scramble_choice_biases(model, tmp_path / "hf")
    path = tmp_path / f"{case}.gguf"
    expected = convert(path, tmp_path / "hf", arch)
    oracle = _oracle(tmp_path, expected)
    config, weights, _, _ = load_gguf(path)
    assert config.architecture == engine
    hf_config = read_config(tmp_path / "oracle")  # the checkpoint under the engine's names
    hf_weights = check_weights(tmp_path / "oracle", hf_config, read_weights(tmp_path / "oracle"))
    gemma = arch == "gemma"  # its norms as the file stores them: 1 + w
    want_family = dataclasses.replace(hf_config.family, norms_hold_one_plus_w=gemma)
    if arch == "mamba2":  # the scan's chunk: the file has none (Mamba2Config's 256)
        mamba = dataclasses.replace(want_family.mamba, chunk_size=config.family.mamba.chunk_size)
        want_family = dataclasses.replace(want_family, mamba=mamba)
    assert config.family == want_family
    for name in hf_weights:  # every tensor the checkpoint gives the engine, as the file has it
        shift = 1.0 if gemma and name.endswith("norm.weight") else 0.0
        got = weights[name] if name in weights else _expert(weights, name)
        torch.testing.assert_close(got - shift, hf_weights[name].float(), rtol=0,
                                   atol=1e-6, msg=name)  # fmt: skip
    want = [hf_greedy_plain(oracle, p, 6)[0] for p in PROMPTS]
    assert _generate(path, PROMPTS) == want, case
    if arch != "mpt":  # (MPT's zero LayerNorm biases the model makes: uncounted, as from HF)
        _check_estimate(path, "bfloat16")


def test_gemma_gguf_sentencepiece_vocabulary_tokenizes_as_transformers_reads_it(tmp_path):
    """Gemma 1's file carries Gemma's SentencePiece vocabulary (read as Gemma 2's and 3's)."""
    make_tiny_model(tmp_path / "hf", "Gemma", head_dim=32, vocab_size=320, num_hidden_layers=1)
    path = tmp_path / "gemma.gguf"
    convert(path, tmp_path / "hf", "gemma", spm=True)
    config, _, ours, _ = load_gguf(path)
    assert config.bos_token_id == 2 and config.eos_token_ids[:1] == (1,)
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        convert_gguf_tokenizer,
        get_gguf_tokenizer,
    )

    theirs, _ = convert_gguf_tokenizer(*get_gguf_tokenizer(str(path))[:2])
    for text in ["the cat and the hat", "  two  spaces   and\ttabs", "that hat, \u00e9clair",
                 "<start_of_turn>user\nthe cat<end_of_turn>"]:  # fmt: skip
        want = theirs.encode(text, add_special_tokens=False).ids
        assert ours.encode(text, add_special_tokens=False) == want, text
    assert ours.encode("the cat")[:1] == [2]  # <bos>, as llama.cpp adds it


@pytest.mark.parametrize(
    ("case", "extra", "words"),
    [
        ("dots1", lambda w: w.add_expert_gating_func(gguf.ExpertGatingFuncType.SOFTMAX),
         "expert_gating_func"),
        ("exaone-moe", lambda w: w.add_sliding_window_pattern([True]), "sliding_window_pattern"),
        ("lfm2", lambda w: w.add_head_count_kv(2), "head_count_kv"),
        ("mpt", lambda w: w.add_max_alibi_bias(0.0), "alibi"),  # llama.cpp: learned positions
    ],
)  # fmt: skip
def test_gguf_classic_variants_the_engine_does_not_run_are_refused(tmp_path, case, extra, words):
    from pagoda.runtime.model.loader import read_model_config

    hf_arch, overrides, arch, _ = CASES[case]
    make_tiny_model(tmp_path / "hf", hf_arch, **overrides)
    convert(tmp_path / "m.gguf", tmp_path / "hf", arch, extra=extra)
    with pytest.raises(ValueError, match=words):  # from the metadata: before a server binds
        read_model_config(str(tmp_path / "m.gguf"))
