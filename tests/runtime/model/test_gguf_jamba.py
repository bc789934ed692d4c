"""llama.cpp GGUFs of Jamba (`jamba`, read by `model/gguf_jamba.py`): a tiny transformers
checkpoint written as llama.cpp's converter writes it (its JambaModel: the attention layers as a
per-layer `attention.head_count_kv`, the Mamba-1 mixer's sizes as `ssm.*`, A as -exp(A_log),
the conv squeezed, the experts stacked apart; Q8_0 matrices); the engine on the file matches
transformers on the checkpoint with the file's dequantized values, token for token, in a batch
of unequal prompts in 16-token steps; a layer pattern without a period is refused."""

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
from test_gguf_families import _oracle, _spm_vocab

transformers = pytest.importorskip("transformers")

JAMBA = dict(num_hidden_layers=4, attn_layer_offset=1, attn_layer_period=2,
             expert_layer_offset=1, expert_layer_period=2, num_experts=4, num_experts_per_tok=2,
             intermediate_size=96, mamba_d_state=8, mamba_dt_rank=8)  # fmt: skip


def _metadata(w, c: dict, kv: list[int]) -> None:
    """JambaModel's `set_gguf_parameters` (`kv`: its per-layer KV heads, 0 on Mamba layers)."""
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(kv)
    w.add_ssm_conv_kernel(c["mamba_d_conv"])
    w.add_ssm_inner_size(c["mamba_expand"] * c["hidden_size"])
    w.add_ssm_state_size(c["mamba_d_state"])
    w.add_ssm_time_step_rank(c["mamba_dt_rank"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_expert_count(c["num_experts"])
    w.add_expert_used_count(c["num_experts_per_tok"])


def convert(path, hf_dir, kv: list[int] | None = None) -> dict[str, torch.Tensor]:
    """The checkpoint as llama.cpp's converter writes it; its tensors as the file gives them
    back, in the checkpoint's layout."""
    from safetensors.torch import load_file

    c = transformers.AutoConfig.from_pretrained(hf_dir).to_dict()
    sd = {k: v.float().numpy() for k, v in load_file(str(hf_dir / "model.safetensors")).items()}
    n = c["num_hidden_layers"]
    if kv is None:
        kv = [c["num_key_value_heads"] if i % c["attn_layer_period"] == c["attn_layer_offset"]
              else 0 for i in range(n)]  # fmt: skip
    w = gguf.GGUFWriter(str(path), "jamba")
    _metadata(w, c, kv)
    tokens, types = _spm_vocab(c["vocab_size"])
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(len(tokens))])
    w.add_token_types(types)
    w.add_bos_token_id(c["bos_token_id"])
    w.add_eos_token_id(c["eos_token_id"])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.JAMBA, n)
    expected: dict[str, np.ndarray] = {}
    experts: dict[tuple[str, str], dict[int, np.ndarray]] = {}
    for hf, arr in sd.items():
        layer = hf.split(".")[2] if hf.startswith("model.layers.") else None
        if m := re.match(
            r"^model\.layers\.(\d+)\.feed_forward\.experts\.(\d+)\.(\w+)\.weight$", hf
        ):
            experts.setdefault((m[1], m[3]), {})[int(m[2])] = arr
            continue
        if hf.endswith(".A_log"):
            expected[hf] = np.log(-_store(w, f"blk.{layer}.ssm_a", -np.exp(arr)))
            continue
        if hf.endswith(".D"):
            expected[hf] = _store(w, f"blk.{layer}.ssm_d", arr)
            continue
        gname = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        assert gname is not None, hf
        if hf.endswith("conv1d.weight"):
            expected[hf] = _store(w, gname, arr.squeeze(1))[:, None, :]
            continue
        expected[hf] = _store(w, gname, arr)
    parts = {p: f"ffn_{p.split('_')[0]}_exps" for p in ("gate_proj", "up_proj", "down_proj")}
    _store_experts(w, experts, expected, "feed_forward.experts", parts)
    return _written(w, expected)


def test_gguf_jamba_matches_transformers_on_its_dequantized_weights(tmp_path):
    make_tiny_model(tmp_path / "hf", "Jamba", **JAMBA)
    path = tmp_path / "jamba.gguf"
    oracle = _oracle(tmp_path, convert(path, tmp_path / "hf"))
    config, _, _, _ = load_gguf(path)
    assert config.architecture == "jamba"
    assert config.family.mamba.layers == (True, False, True, False)
    assert config.family.moe_layers == (False, True, False, True)
    want = [hf_greedy_plain(oracle, p, 6)[0] for p in PROMPTS]
    assert _generate(path, PROMPTS) == want
    _check_estimate(path, "bfloat16")


def test_gguf_jamba_refuses_attention_layers_without_a_period(tmp_path):
    from pagoda.runtime.model.gguf_config import read_config
    from pagoda.runtime.model.gguf_reader import parse

    make_tiny_model(tmp_path / "hf", "Jamba", **JAMBA)
    convert(tmp_path / "bad.gguf", tmp_path / "hf", kv=[0, 2, 2, 0])
    with pytest.raises(ValueError, match=r"attn layers \[1, 2\] are not every period-th"):
        read_config(parse(str(tmp_path / "bad.gguf")))
