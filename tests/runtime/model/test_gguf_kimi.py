"""llama.cpp GGUFs of Kimi Linear (`kimi-linear`, `model/gguf_kimi.py`): a tiny transformers
checkpoint written as llama.cpp's converter writes it (its KimiLinearModel: the layer kinds as a
per-layer `attention.head_count_kv`, the KDA convs reshaped [1, C, 1, K], A as -exp(A_log),
dt_bias as `ssm_dt.bias`, kv_b_proj split into `attn_k_b` (transposed) and `attn_v_b`, the
experts stacked; Q8_0 matrices); the engine on the file matches transformers on the checkpoint
with the file's dequantized values, token for token, in a batch of unequal prompts in 16-token
steps; a file llama.cpp's graph would run otherwise refused in one line."""

from __future__ import annotations

import re

import gguf
import numpy as np
import pytest
import torch
from hf_oracle import hf_greedy_plain, make_tiny_model
from pagoda.runtime.model.gguf_loader import load_gguf
from test_gguf_archs import PROMPTS, _check_estimate, _generate
from test_gguf_classic import _store, _store_experts, _written
from test_gguf_families import _byte_level_vocab, _oracle

transformers = pytest.importorskip("transformers")

# hybrid_cases' "kimi-linear" as llama.cpp can hold it: as many KDA heads as attention heads
# (it keeps no count of its own), one expert group (it runs none)
KIMI = dict(
    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32,
    q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    linear_attn_config={"full_attn_layers": [2], "kda_layers": [1, 3], "head_dim": 16,
                        "num_heads": 4, "short_conv_kernel_size": 4},
    num_experts=8, num_experts_per_token=2, num_shared_experts=1, moe_intermediate_size=32,
    first_k_dense_replace=1, num_expert_group=1, topk_group=1, routed_scaling_factor=2.0,
)  # fmt: skip
_DENSE = re.compile(r"\.block_sparse_moe\.(gate_proj|up_proj|down_proj)\.")  # (layer 0's MLP)
_EXPERT = re.compile(r"^model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight$")


def _metadata(w, c: dict, **drop) -> None:
    """TextModel's and KimiLinearModel's `set_gguf_parameters` (`drop`: keys left out)."""
    n, lin = c["num_hidden_layers"], c["linear_attn_config"]
    w.add_block_count(n)
    w.add_context_length(c["model_max_length"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    if not drop.get("experts"):
        w.add_expert_count(c["num_experts"])
    w.add_expert_used_count(c["num_experts_per_token"])
    w.add_vocab_size(c["vocab_size"])
    w.add_head_count_kv([1 if i + 1 in lin["full_attn_layers"] else 0 for i in range(n)])
    w.add_ssm_conv_kernel(lin["short_conv_kernel_size"])
    w.add_kda_head_dim(lin["head_dim"])
    w.add_kv_lora_rank(c["kv_lora_rank"])
    w.add_rope_dimension_count(c["qk_rope_head_dim"])
    w.add_key_length(c["kv_lora_rank"] + c["qk_rope_head_dim"])
    if not drop.get("mla"):
        w.add_key_length_mla(c["qk_nope_head_dim"] + c["qk_rope_head_dim"])
    w.add_value_length_mla(c["v_head_dim"])
    w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    w.add_expert_shared_count(c["num_shared_experts"])
    w.add_leading_dense_block_count(c["first_k_dense_replace"])
    w.add_expert_weights_scale(c["routed_scaling_factor"])
    if drop.get("gating"):
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SOFTMAX)


def convert(path, hf_dir, **drop) -> dict[str, torch.Tensor]:
    """The checkpoint in `hf_dir` as llama.cpp's converter writes it; its tensors as the file
    gives them back, in the checkpoint's layout, by the checkpoint's names."""
    from safetensors.torch import load_file

    c = transformers.AutoConfig.from_pretrained(hf_dir).to_dict()
    sd = {k: v.float().numpy() for k, v in load_file(str(hf_dir / "model.safetensors")).items()}
    heads, nope, dv = c["num_attention_heads"], c["qk_nope_head_dim"], c["v_head_dim"]
    w = gguf.GGUFWriter(str(path), "kimi-linear")
    _metadata(w, c, **drop)
    tokens, types, merges = _byte_level_vocab(c["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("kimi-k2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(c["vocab_size"] - 1)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.KIMI_LINEAR, c["num_hidden_layers"])
    expected: dict[str, np.ndarray] = {}
    experts: dict[tuple[str, str], dict[int, np.ndarray]] = {}
    for hf, arr in sd.items():
        layer = hf.split(".")[2] if hf.startswith("model.layers.") else None
        if m := _EXPERT.match(hf):
            experts.setdefault((m[1], m[3]), {})[int(m[2])] = arr
            continue
        if hf.endswith(".A_log"):  # [1, 1, H, 1] as -exp(A_log)
            expected[hf] = np.log(-_store(w, f"blk.{layer}.ssm_a", -np.exp(arr)))
        elif hf.endswith(".dt_bias"):
            expected[hf] = _store(w, f"blk.{layer}.ssm_dt.bias", arr)
        elif hf.endswith(".e_score_correction_bias"):
            if not drop.get("bias"):
                expected[hf] = _store(w, f"blk.{layer}.exp_probs_b.bias", arr)
        elif hf.endswith("_conv1d.weight"):  # [C, 1, K] -> (1, C, 1, K)
            gname = names.get_name(hf, try_suffixes=(".weight",))
            stored = _store(w, gname, arr.reshape(1, arr.shape[0], 1, arr.shape[-1]))
            expected[hf] = stored.reshape(arr.shape)
        elif hf.endswith("kv_b_proj.weight"):  # split per head, k_b transposed
            kv_b = arr.reshape(heads, nope + dv, -1)
            k_b = _store(w, f"blk.{layer}.attn_k_b.weight",
                         np.ascontiguousarray(kv_b[:, :nope].transpose(0, 2, 1)))  # fmt: skip
            v_b = _store(w, f"blk.{layer}.attn_v_b.weight", np.ascontiguousarray(kv_b[:, nope:]))
            expected[hf] = np.concatenate([k_b.transpose(0, 2, 1), v_b], 1).reshape(arr.shape)
        else:
            gname = names.get_name(_DENSE.sub(r".mlp.\1.", hf), try_suffixes=(".weight", ".bias"))
            assert gname is not None, hf
            expected[hf] = _store(w, gname, arr)
    if drop.get("latent"):  # a tensor of another variant's
        _store(w, "blk.1.ffn_latent_down.weight", np.zeros((16, c["hidden_size"]), np.float32))
    parts = {"w1": "ffn_gate_exps", "w2": "ffn_down_exps", "w3": "ffn_up_exps"}
    _store_experts(w, experts, expected, "block_sparse_moe.experts", parts)
    return _written(w, expected)


def test_gguf_kimi_linear_matches_transformers_on_its_dequantized_weights(tmp_path):
    model = make_tiny_model(tmp_path / "hf", "KimiLinear", **KIMI)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # correction biases large enough to change the picks (not zeros)
        for layer in model.model.layers[1:]:
            bias = layer.mlp.gate.e_score_correction_bias
            bias.copy_(torch.randn(bias.shape, generator=g))
    model.save_pretrained(tmp_path / "hf")
    path = tmp_path / "kimi.gguf"
    oracle = _oracle(tmp_path, convert(path, tmp_path / "hf"))
    config, _, _, _ = load_gguf(path)
    assert config.architecture == "kimi_linear"
    assert config.family.mamba.layers == (True, False, True)
    want = [hf_greedy_plain(oracle, p, 6)[0] for p in PROMPTS]
    assert _generate(path, PROMPTS) == want
    _check_estimate(path, "bfloat16")


@pytest.mark.parametrize(
    ("drop", "message"),
    [({"experts": True}, "needs expert_count"), ({"gating": True}, "expert_gating_func 1"),
     ({"bias": True}, "needs exp_probs_b"), ({"mla": True}, "needs attention.key_length_mla"),
     ({"latent": True}, "blk.1.ffn_latent_down.weight")],
)  # fmt: skip
def test_gguf_kimi_linear_refuses_what_it_cannot_run_in_one_line(tmp_path, drop, message):
    make_tiny_model(tmp_path / "hf", "KimiLinear", **KIMI)
    path = tmp_path / "kimi.gguf"
    convert(path, tmp_path / "hf", **drop)
    with pytest.raises(ValueError, match=message) as e:
        load_gguf(path)
    assert "\n" not in str(e.value)
