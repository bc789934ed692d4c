"""llama.cpp GGUFs of MiMo-V2-Flash (`mimo2`, `model/gguf_mimo.py`): a tiny transformers
checkpoint written as llama.cpp's converter writes it from the published config (its
MimoV2Model: the layer kinds as `attention.sliding_window_pattern`, the KV heads a value per
layer, the published `sliding_window` (transformers' window less one), the value scale, the
rotary bases and dims, the sinks as `attn_sinks`, the experts stacked, one multi-token-
prediction block after the decoder's; Q8_0 matrices); the engine on the file matches
transformers on the checkpoint with the file's dequantized values, token for token, in a
batch of unequal prompts in 16-token steps; what it cannot read back refused in one line."""

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

# test_mimo_v2_flash's checkpoint as llama.cpp runs it: one expert group, no routed scale
# (the published config's null)
MIMO = dict(
    head_dim=24, v_head_dim=16, num_attention_heads=4, num_key_value_heads=1,
    n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, n_group=1, topk_group=1,
    num_hidden_layers=3, sliding_window=5, attention_value_scale=0.6,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    tie_word_embeddings=False,
    rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.334},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.334},
    },
)  # fmt: skip
_EXPERT = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(\w+)\.weight$")
MTP = 1  # multi-token-prediction blocks after the decoder's (not read)


def _metadata(w, c: dict, **drop) -> None:
    """TextModel's and MimoV2Model's `set_gguf_parameters` from the published config (its
    `sliding_window`: transformers' less one; the MTP blocks sliding)."""
    n, kv = c["num_hidden_layers"], c["num_key_value_heads"]
    swa = [int(t == "sliding_attention") for t in c["layer_types"]] + [1] * MTP
    w.add_block_count(n + MTP)
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_key_length(c["head_dim"])
    w.add_rope_freq_base(c["rope_parameters"]["full_attention"]["rope_theta"])
    w.add_rope_freq_base_swa(c["rope_parameters"]["sliding_attention"]["rope_theta"])
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_head_count_kv([2 * kv if s else (drop.get("kv") or kv) for s in swa])
    if not drop.get("window"):
        w.add_sliding_window(c["sliding_window"] - 1)
    w.add_sliding_window_pattern(swa)
    w.add_value_length(c["v_head_dim"])
    w.add_expert_count(c["n_routed_experts"])
    w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    partial = c["rope_parameters"]["full_attention"]["partial_rotary_factor"]
    w.add_rope_dimension_count(int(c["head_dim"] * partial))
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    if not drop.get("scale"):
        w.add_float32(f"{w.arch}.attention.value_scale", c["attention_value_scale"])
    w.add_nextn_predict_layers(MTP)


def convert(path, hf_dir, **drop) -> dict[str, torch.Tensor]:
    """The checkpoint in `hf_dir` as llama.cpp's converter writes it; its tensors as the file
    gives them back, by the checkpoint's names."""
    from safetensors.torch import load_file

    c = transformers.AutoConfig.from_pretrained(hf_dir).to_dict()
    sd = {k: v.float().numpy() for k, v in load_file(str(hf_dir / "model.safetensors")).items()}
    n = c["num_hidden_layers"]
    w = gguf.GGUFWriter(str(path), "mimo2")
    _metadata(w, c, **drop)
    tokens, types, merges = _byte_level_vocab(c["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(c["vocab_size"] - 1)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MIMO2, n + MTP)
    expected: dict[str, np.ndarray] = {}
    experts: dict[tuple[str, str], dict[int, np.ndarray]] = {}
    for hf, arr in sd.items():
        layer = hf.split(".")[2] if hf.startswith("model.layers.") else None
        if m := _EXPERT.match(hf):
            experts.setdefault((m[1], m[3]), {})[int(m[2])] = arr
        elif hf.endswith(".e_score_correction_bias"):
            expected[hf] = _store(w, f"blk.{layer}.exp_probs_b.bias", arr)
        elif hf.endswith(".attention_sink_bias"):
            expected[hf] = _store(w, f"blk.{layer}.attn_sinks.weight", arr)
        else:
            gname = names.get_name(hf, try_suffixes=(".weight", ".bias"))
            assert gname is not None, hf
            expected[hf] = _store(w, gname, arr)
    if drop.get("qkv"):  # MiMo-V2.5's fused projection
        _store(w, "blk.0.attn_qkv.weight", np.zeros((176, c["hidden_size"]), np.float32))
    if drop.get("sink"):  # a sink on the full-attention layer
        _store(w, "blk.1.attn_sinks.weight", np.zeros(c["num_attention_heads"], np.float32))
    parts = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps"}
    _store_experts(w, experts, expected, "mlp.experts", parts)
    last = f"blk.{n - 1}."  # the MTP block: a copy of the last layer and its own tensors
    for name, ti in list(w.tensors[-1].items()):
        if name.startswith(last):
            w.add_tensor(f"blk.{n}." + name[len(last) :], ti.tensor, raw_shape=ti.tensor.shape,
                         raw_dtype=ti.dtype)  # fmt: skip
    hidden = c["hidden_size"]
    w.add_tensor(f"blk.{n}.nextn.eh_proj.weight", np.ones((hidden, 2 * hidden), np.float32))
    return _written(w, expected)


def test_gguf_mimo2_matches_transformers_on_its_dequantized_weights(tmp_path):
    model = make_tiny_model(tmp_path / "hf", "MiMoV2Flash", **MIMO)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # correction biases and sinks large enough to matter (not zeros)
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                bias = layer.mlp.gate.e_score_correction_bias
                bias.copy_(torch.randn(bias.shape, generator=g))
            sinks = getattr(layer.self_attn, "attention_sink_bias", None)
            if sinks is not None:
                sinks.copy_(2 * torch.randn(sinks.shape, generator=g))
    model.save_pretrained(tmp_path / "hf")
    path = tmp_path / "mimo.gguf"
    oracle = _oracle(tmp_path, convert(path, tmp_path / "hf"))
    config, _, _, _ = load_gguf(path)
    assert config.architecture == "mimo_v2_flash" and config.num_layers == 3
    assert config.family.window_layers == (True, False, True) and config.family.sliding_window == 5
    assert config.family.mimo.swa_kv_heads == 2
    assert config.family.mimo.v_scale == pytest.approx(0.6)  # (float32 in the file)
    assert (config.rope_theta, config.family.local_rope_theta) == (5e6, 1e4)
    # prompts longer than the window
    want = [hf_greedy_plain(oracle, p, 6)[0] for p in PROMPTS]
    assert _generate(path, PROMPTS) == want
    _check_estimate(path, "bfloat16")


@pytest.mark.parametrize(
    ("drop", "message"),
    [({"scale": True}, "without attention.value_scale"), ({"kv": 2}, "twice the full"),
     ({"sink": True}, "sinks on a full-attention layer"),
     ({"window": True}, "needs attention.sliding_window"), ({"qkv": True}, "attn_qkv in its")],
)  # fmt: skip
def test_gguf_mimo2_refuses_what_it_cannot_read_back_in_one_line(tmp_path, drop, message):
    make_tiny_model(tmp_path / "hf", "MiMoV2Flash", **MIMO)
    path = tmp_path / "mimo.gguf"
    convert(path, tmp_path / "hf", **drop)
    with pytest.raises(ValueError, match=message) as e:
        load_gguf(path)
    assert "\n" not in str(e.value)
