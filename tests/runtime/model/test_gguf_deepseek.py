"""llama.cpp's ``deepseek2`` GGUFs, written here as its converter writes a DeepSeek checkpoint
(MQA-over-the-latent key/value lengths with the model's own in ``*_mla``, ``kv_b_proj`` split
per head into a transposed ``attn_k_b`` and ``attn_v_b`` (or whole, as older converters left
it), stacked experts, ``exp_probs_b``, the router's gating function, groups, norm and scale as
metadata, yarn's mscale as ``yarn_log_multiplier`` (which holds mscale_all_dim alone: DeepSeek's
checkpoints set mscale to the same value) and its betas where set (Kimi K2's 1 and 1), Q8_0
matrices): the engine matches transformers running on exactly the dequantized weights, token
for token."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from arch_cases import NEW, check, generate, prompts
from gguf import GGMLQuantizationType as Q
from hf_oracle import hf_greedy_plain
from pagoda.runtime import LLM
from pagoda.runtime.model.loader import load_model
from test_deepseek import CASES, YARN, write_case
from test_gguf_families import add_byte_level_tokenizer

transformers = pytest.importorskip("transformers")
NAMES = {  # HF suffix under model.layers.{i}. -> llama.cpp's
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.q_a_proj": "attn_q_a",
    "self_attn.q_a_layernorm": "attn_q_a_norm", "self_attn.q_b_proj": "attn_q_b",
    "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa", "self_attn.kv_a_layernorm": "attn_kv_a_norm",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "mlp.gate": "ffn_gate_inp",
    "mlp.shared_experts.gate_proj": "ffn_gate_shexp", "mlp.shared_experts.up_proj": "ffn_up_shexp",
    "mlp.shared_experts.down_proj": "ffn_down_shexp",
}  # fmt: skip


def write_deepseek2(path, hf_dir, split_kv_b: bool) -> dict[str, torch.Tensor]:
    """The checkpoint in `hf_dir` as llama.cpp's converter writes it; returns its tensors as
    the file dequantizes them, under the Hugging Face names (for the oracle)."""
    from safetensors.torch import load_file

    c = transformers.AutoConfig.from_pretrained(hf_dir)
    sd = {k: v.float().numpy() for k, v in load_file(str(hf_dir / "model.safetensors")).items()}
    w = gguf.GGUFWriter(str(path), "deepseek2")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(1)  # the converter's MQA over the latent
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_leading_dense_block_count(c.first_k_dense_replace)
    w.add_vocab_size(c.vocab_size)
    if c.q_lora_rank:
        w.add_q_lora_rank(c.q_lora_rank)
    w.add_kv_lora_rank(c.kv_lora_rank)
    if split_kv_b:
        w.add_key_length(c.kv_lora_rank + c.qk_rope_head_dim)
        w.add_value_length(c.kv_lora_rank)
        w.add_key_length_mla(c.qk_nope_head_dim + c.qk_rope_head_dim)
        w.add_value_length_mla(c.v_head_dim)
    else:  # the older converter: the model's head sizes
        w.add_key_length(c.qk_nope_head_dim + c.qk_rope_head_dim)
        w.add_value_length(c.v_head_dim)
    w.add_expert_feed_forward_length(c.moe_intermediate_size)
    w.add_expert_count(c.n_routed_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    w.add_expert_shared_count(c.n_shared_experts)
    w.add_expert_weights_scale(c.routed_scaling_factor)
    v3 = c.model_type == "deepseek_v3"
    if v3 and c.norm_topk_prob:
        w.add_expert_weights_norm(True)
    if c.n_group:
        w.add_expert_group_count(c.n_group)
        w.add_expert_group_used_count(c.topk_group)
    w.add_expert_gating_func(
        gguf.ExpertGatingFuncType.SIGMOID if v3 else gguf.ExpertGatingFuncType.SOFTMAX
    )
    w.add_rope_dimension_count(c.qk_rope_head_dim)
    rope = c.rope_parameters
    if rope.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])
        if rope.get("beta_fast") is not None:  # the converter's TextModel writes them if set
            w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        if rope.get("beta_slow") is not None:
            w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    add_byte_level_tokenizer(w, c.vocab_size)
    back: dict[str, np.ndarray] = {}

    def put(name: str, arr: np.ndarray) -> np.ndarray:
        if arr.ndim == 1 or arr.shape[-1] % 32:
            data, qtype, got = arr.astype(np.float32), Q.F32, arr.astype(np.float32)
        else:
            data, qtype = gguf.quants.quantize(arr, Q.Q8_0), Q.Q8_0
            got = gguf.quants.dequantize(data, Q.Q8_0).reshape(arr.shape)
        w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
        return got

    back["model.embed_tokens.weight"] = put("token_embd.weight", sd["model.embed_tokens.weight"])
    back["model.norm.weight"] = put("output_norm.weight", sd["model.norm.weight"])
    back["lm_head.weight"] = put("output.weight", sd["lm_head.weight"])
    heads, n, dv = c.num_attention_heads, c.qk_nope_head_dim, c.v_head_dim
    for i in range(c.num_hidden_layers):
        pre, blk = f"model.layers.{i}.", f"blk.{i}."
        for hf, gname in NAMES.items():
            if f"{pre}{hf}.weight" in sd:
                back[f"{pre}{hf}.weight"] = put(f"{blk}{gname}.weight", sd[f"{pre}{hf}.weight"])
        kv_b = sd[f"{pre}self_attn.kv_b_proj.weight"]
        if split_kv_b:  # the converter: per head, k_b transposed
            k_b, v_b = np.split(kv_b.reshape(heads, n + dv, -1), [n], axis=1)
            k_b = put(f"{blk}attn_k_b.weight", np.ascontiguousarray(k_b.transpose(0, 2, 1)))
            v_b = put(f"{blk}attn_v_b.weight", np.ascontiguousarray(v_b))
            joined = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1)
            back[f"{pre}self_attn.kv_b_proj.weight"] = joined.reshape(kv_b.shape)
        else:
            back[f"{pre}self_attn.kv_b_proj.weight"] = put(f"{blk}attn_kv_b.weight", kv_b)
        bias = f"{pre}mlp.gate.e_score_correction_bias"
        if bias in sd:
            back[bias] = put(f"{blk}exp_probs_b.bias", sd[bias])
        for name, gname in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"),
                            ("down_proj", "ffn_down_exps")):  # fmt: skip
            per = [f"{pre}mlp.experts.{e}.{name}.weight" for e in range(c.n_routed_experts)]
            if per[0] in sd:
                stacked = put(f"{blk}{gname}.weight", np.stack([sd[x] for x in per]))
                back.update(zip(per, stacked))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in back.items()}


# Kimi K2's yarn: beta_fast and beta_slow 1 (not yarn's 32 and 1), one expert group
KIMI_K2 = dict(rope_parameters={**YARN, "beta_fast": 1.0, "beta_slow": 1.0}, n_group=1,
               topk_group=1)  # fmt: skip


@pytest.mark.parametrize(
    ("name", "split_kv_b", "extra"),
    [
        ("v2-grouped-yarn", True, {}),
        ("v3", True, {}),
        ("v2-lite", False, {}),
        ("v3", True, KIMI_K2),
    ],
    ids=["v2-grouped-yarn", "v3", "v2-lite", "kimi-k2-yarn-betas"],
)
def test_deepseek2_gguf_matches_transformers_on_its_dequantized_weights(
    tmp_path, name, split_kv_b, extra
):
    arch, overrides = CASES[name]
    overrides = {**overrides, **extra}
    changes = dict(extra)
    if "rope_parameters" in overrides:  # the file holds mscale_all_dim alone: DeepSeek's
        rope = overrides["rope_parameters"]
        changes["rope_parameters"] = {**rope, "mscale": rope["mscale_all_dim"]}
    hf = write_case(name, tmp_path / "hf", **changes)
    path = tmp_path / "model.gguf"
    dequantized = write_deepseek2(path, tmp_path / "hf", split_kv_b)
    rest = {k: v for k, v in dequantized.items() if ".experts." not in k}
    missing, unexpected = hf.load_state_dict(rest, strict=False)
    assert not unexpected and all(".experts." in m for m in missing), (missing, unexpected)
    with torch.no_grad():  # transformers 5 holds the experts stacked
        for i, layer in enumerate(hf.model.layers):
            experts = getattr(layer.mlp, "experts", None)
            if experts is None:
                continue
            p = f"model.layers.{i}.mlp.experts."
            for e in range(experts.gate_up_proj.shape[0]):
                gate, up = (dequantized[f"{p}{e}.{x}_proj.weight"] for x in ("gate", "up"))
                experts.gate_up_proj[e].copy_(torch.cat([gate, up]))
                experts.down_proj[e].copy_(dequantized[f"{p}{e}.down_proj.weight"])
    reference = [hf_greedy_plain(hf, p, NEW) for p in prompts()]
    loaded = load_model(str(path))
    config = loaded.config
    assert config.architecture == ("deepseek_v3" if arch == "DeepseekV3" else "deepseek_v2")
    assert config.family.mla.q_lora_rank == overrides["q_lora_rank"]
    if "rope_parameters" in overrides:
        assert config.family.attention_multiplier == pytest.approx(
            hf.model.layers[0].self_attn.scaling
        )
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20,
              max_num_batched_tokens=16, max_num_seqs=4)  # fmt: skip
    for i, (got, want) in enumerate(zip(generate(llm, prompts()), reference)):
        check(got, want, f"{name} GGUF: prompt {i}")
    # the start-up estimate counts what the engine holds: the split kv_b joined into one dense
    # float32 layer (not the blocks it was stored in), the Q8_0 experts as `qgemm`'s blocks
    from model_bytes import held_bytes
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.server import weights

    cfg = EngineConfig.create(str(path), device="cpu", dtype="float32")
    got = weights.estimate(config, cfg, path)
    assert got.bytes == pytest.approx(held_bytes(llm.engine.runner.model), rel=0.02), got


def test_the_deepseek_v3_pre_tokenizer_splits_as_llama_cpp():
    """``tokenizer.ggml.pre`` deepseek-v3 (DeepSeek-V3/R1 GGUFs): llama.cpp's three regexes in
    turn: digits in threes, a CJK/kana run apart from the space before it, punctuation with the
    newlines after it (the GPT-2 fallback kept "12345" and " 日本語" whole)."""
    from pagoda.runtime.model import pre_tokenizers

    text = "x = 12345 日本語テキスト Hello, world!!\n\nok"
    pieces = [
        p
        for p, _ in pre_tokenizers.build(pre_tokenizers.lookup("deepseek-v3")).pre_tokenize_str(
            text
        )
    ]
    byte = {"Ġ": " ", "Ċ": "\n"}  # byte-level spellings of the two ASCII bytes used here
    plain = ["".join(byte.get(c, c) for c in p) for p in pieces]
    assert plain[:5] == ["x", " =", " ", "123", "45"]
    assert plain[-5:] == [" Hello", ",", " world", "!!\n\n", "ok"]
    assert len(plain) == 12 and plain[5] == " "  # the CJK/kana run is one piece of its own
