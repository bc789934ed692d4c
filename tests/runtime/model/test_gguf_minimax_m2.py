"""llama.cpp GGUFs of MiniMax-M2 (`minimax-m2`, read by `model/gguf_minimax_m2.py`): a tiny
transformers checkpoint written as llama.cpp's converter writes it (its MiniMaxM2Model over
TextModel: `rope.dimension_count` its rotary_dim, the experts stacked, the correction bias as
`exp_probs_b.bias`, the router a sigmoid; Q8_0 matrices); the engine on the file matches
transformers on the checkpoint with the file's dequantized values, token for token, in a batch
of unequal prompts in 16-token steps; a softmax router is refused."""

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

MINIMAX = dict(head_dim=16, rotary_dim=8, num_local_experts=4, num_experts_per_tok=2,
               intermediate_size=32)  # fmt: skip


def convert(path, hf_dir, gating: int = 2) -> dict[str, torch.Tensor]:
    """The checkpoint as llama.cpp's converter writes it; its tensors as the file gives them."""
    from safetensors.torch import load_file

    c = transformers.AutoConfig.from_pretrained(hf_dir).to_dict()
    sd = {k: v.float().numpy() for k, v in load_file(str(hf_dir / "model.safetensors")).items()}
    n = c["num_hidden_layers"]
    w = gguf.GGUFWriter(str(path), "minimax-m2")
    w.add_block_count(n)  # TextModel's set_gguf_parameters, then MiniMaxM2Model's
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_rope_freq_base(c["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_expert_count(c["num_local_experts"])
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType(gating))
    w.add_expert_feed_forward_length(c["intermediate_size"])
    w.add_rope_dimension_count(c["rotary_dim"])
    tokens, types, merges = _byte_level_vocab(c["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("minimax-m2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(c["vocab_size"] - 1)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MINIMAXM2, n)
    expected: dict[str, np.ndarray] = {}
    experts: dict[tuple[str, str], dict[int, np.ndarray]] = {}
    for hf, arr in sd.items():
        layer = hf.split(".")[2] if hf.startswith("model.layers.") else None
        if m := re.match(
            r"^model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.(w\d)\.weight$", hf
        ):
            experts.setdefault((m[1], m[3]), {})[int(m[2])] = arr
            continue
        if hf.endswith("e_score_correction_bias"):
            expected[hf] = _store(w, f"blk.{layer}.exp_probs_b.bias", arr)
            continue
        gname = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        assert gname is not None, hf
        expected[hf] = _store(w, gname, arr)
    parts = {"w1": "ffn_gate_exps", "w3": "ffn_up_exps", "w2": "ffn_down_exps"}
    _store_experts(w, experts, expected, "block_sparse_moe.experts", parts)
    return _written(w, expected)


def test_gguf_minimax_m2_matches_transformers_on_its_dequantized_weights(tmp_path):
    make_tiny_model(tmp_path / "hf", "MiniMaxM2", **MINIMAX)
    path = tmp_path / "minimax.gguf"
    oracle = _oracle(tmp_path, convert(path, tmp_path / "hf"))
    config, _, _, _ = load_gguf(path)
    assert config.architecture == "minimax_m2"
    assert config.rope_scaling["partial_rotary_factor"] == 0.5
    want = [hf_greedy_plain(oracle, p, 6)[0] for p in PROMPTS]
    assert _generate(path, PROMPTS) == want
    _check_estimate(path, "bfloat16")


def test_gguf_minimax_m2_refuses_a_softmax_router(tmp_path):
    from pagoda.runtime.model.gguf_config import read_config
    from pagoda.runtime.model.gguf_reader import parse

    make_tiny_model(tmp_path / "hf", "MiniMaxM2", **MINIMAX)
    convert(tmp_path / "bad.gguf", tmp_path / "hf", gating=1)
    with pytest.raises(ValueError, match="expert_gating_func 1 is not supported"):
        read_config(parse(str(tmp_path / "bad.gguf")))
