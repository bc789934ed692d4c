"""llama.cpp GGUFs of Gemma 4's text model (`model/gguf_gemma4.py`): a tiny transformers
checkpoint written as llama.cpp's converter writes it (its Gemma4Model over Gemma3Model: gguf-py's
names for the architecture, the per-layer head sizes, KV heads and widths, the layer pattern,
the proportional rotary as `rope_freqs`, the router's scales as `.scale` tensors, no norm
shifted, the lm_head left out; Q8_0 matrices, a `gemma4` BPE vocabulary with its merges); the
engine on the file matches transformers on the checkpoint with the file's dequantized values,
token for token, in a batch of unequal prompts in 16-token steps."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from hf_oracle import hf_greedy_plain
from pagoda.runtime.model.gguf_loader import load_gguf
from test_gguf_archs import PROMPTS, _check_estimate, _generate
from test_gguf_classic import _store, _written
from test_gguf_families import _oracle, _spm_vocab

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Gemma4TextConfig"):
    pytest.skip("transformers without Gemma 4", allow_module_level=True)

S, F = "sliding_attention", "full_attention"
TEXT = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
            layer_types=[S, F, S, F], sliding_window=9, max_position_embeddings=512,
            hidden_size_per_layer_input=8, vocab_size_per_layer_input=300, eos_token_id=1,
            bos_token_id=2, pad_token_id=0, final_logit_softcapping=6.0)  # fmt: skip
CASES = {
    # per-layer inputs; the last two layers read layers 0 and 1's KV, keys as values in the
    # full layers with one KV head there, the shared layers' MLPs double wide
    "ple-kv-shared": dict(num_kv_shared_layers=2, use_double_wide_mlp=True,
                          attention_k_eq_v=True, num_global_key_value_heads=1),
    # the MoE block beside every MLP (router scales, per-expert scales), no per-layer inputs
    "moe": dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=16,
                hidden_size_per_layer_input=0, num_hidden_layers=3, layer_types=[S, S, F]),
}  # fmt: skip
# the config.json keys the converter reads, as the published configs hold them
DEFAULTS = dict(num_kv_shared_layers=0, use_double_wide_mlp=False, num_global_key_value_heads=None,
                enable_moe_block=False, rms_norm_eps=1e-6)  # fmt: skip
ROPE = {
    S: {"rope_type": "default", "rope_theta": 10_000.0},
    F: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
}
MERGES = ["\u2581 t", "h e", "\u2581t he", "n d", "a n", "\u2581 a", "\u2581a nd", "a t"]


def _write_hf(path, case: str):
    torch.manual_seed(0)
    config = transformers.Gemma4TextConfig(**{**TEXT, **CASES[case]})
    model = transformers.Gemma4ForCausalLM(config).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # matrices x 3, noise on every vector, each layer's scalar its own
        for p in model.parameters():
            p.mul_(3.0) if p.dim() > 1 else p.add_(0.2 * torch.randn(p.shape, generator=g))
        for i, layer in enumerate(model.model.layers):
            layer.layer_scalar.fill_(0.8 + 0.15 * i)
    model.save_pretrained(path)
    return {**DEFAULTS, **TEXT, **CASES[case], "rope_parameters": ROPE}


def _metadata(w, c) -> None:
    """TextModel's, Gemma3Model's and Gemma4Model's `set_gguf_parameters`."""
    n, types = c["num_hidden_layers"], c["layer_types"]
    swa = [t == S for t in types]
    shared = c["num_kv_shared_layers"]
    w.add_block_count(n)
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    if c["use_double_wide_mlp"]:
        ff = c["intermediate_size"]
        w.add_feed_forward_length([ff if i < n - shared else 2 * ff for i in range(n)])
    else:
        w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    if c["num_global_key_value_heads"] is not None:
        w.add_head_count_kv([c["num_key_value_heads"] if s else c["num_global_key_value_heads"]
                             for s in swa])  # fmt: skip
    else:
        w.add_head_count_kv(c["num_key_value_heads"])
    w.add_rope_freq_base(c["rope_parameters"][F]["rope_theta"])
    w.add_rope_freq_base_swa(c["rope_parameters"][S]["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_final_logit_softcapping(c["final_logit_softcapping"])
    w.add_sliding_window(c["sliding_window"])
    w.add_shared_kv_layers(shared)
    w.add_embedding_length_per_layer_input(c.get("hidden_size_per_layer_input") or 0)
    w.add_sliding_window_pattern(swa)
    w.add_key_length(c["global_head_dim"])
    w.add_value_length(c["global_head_dim"])
    w.add_key_length_swa(c["head_dim"])
    w.add_value_length_swa(c["head_dim"])
    if c["enable_moe_block"]:
        w.add_expert_count(c["num_experts"])
        w.add_expert_used_count(c["top_k_experts"])
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    w.add_rope_dimension_count(c["global_head_dim"])
    w.add_rope_dimension_count_swa(c["head_dim"])


def convert(path, hf_dir, c) -> dict[str, torch.Tensor]:
    """The checkpoint in `hf_dir` as llama.cpp's converter writes it; its tensors as the file
    gives them back (the checkpoint's names and layout: nothing to undo)."""
    from safetensors.torch import load_file

    sd = {k: v.float().numpy() for k, v in load_file(str(hf_dir / "model.safetensors")).items()}
    w = gguf.GGUFWriter(str(path), "gemma4")
    _metadata(w, c)
    tokens, types = _spm_vocab(c["vocab_size"])
    w.add_tokenizer_model("gemma4")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_add_space_prefix(False)
    w.add_add_bos_token(True)
    w.add_bos_token_id(c["bos_token_id"])
    w.add_eos_token_id(c["eos_token_id"])
    full = c["rope_parameters"][F]  # `generate_extra_tensors`: the proportional rotary's factors
    rot = int(c["global_head_dim"] * full["partial_rotary_factor"] / 2)
    factors = [1.0] * rot + [1e30] * (c["global_head_dim"] // 2 - rot)
    w.add_tensor("rope_freqs.weight", np.array(factors, dtype=np.float32))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA4, c["num_hidden_layers"])
    expected: dict[str, np.ndarray] = {}
    for hf, arr in sd.items():
        if hf == "lm_head.weight":  # (Gemma3Model's filter_tensors)
            continue
        name = hf  # Gemma4Model's filter_tensors and modify_tensors
        if hf.endswith(("router.scale", "router.per_expert_scale")):
            layer = hf.split(".")[2]
            part = "ffn_gate_inp" if hf.endswith("router.scale") else "ffn_down_exps"
            expected[hf] = _store(w, f"blk.{layer}.{part}.scale", arr)
            continue
        if hf.endswith("layer_scalar") or (".experts." in hf and not hf.endswith(".weight")):
            name += ".weight"
        gname = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gname is not None, hf
        expected[hf] = _store(w, gname, arr)
    return _written(w, expected)


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_gemma4_matches_transformers_on_its_dequantized_weights(tmp_path, case):
    c = _write_hf(tmp_path / "hf", case)
    path = tmp_path / f"{case}.gguf"
    expected = convert(path, tmp_path / "hf", c)
    oracle = _oracle(tmp_path, expected)
    config, _, tokenizer, _ = load_gguf(path)
    assert config.architecture == "gemma4"
    want = [hf_greedy_plain(oracle, p, 6)[0] for p in PROMPTS]
    assert _generate(path, PROMPTS) == want, case
    _check_estimate(path, "bfloat16")
    if case == "moe":  # the file's merges, not the vocabulary's order (which makes "▁cat")
        tokens = _spm_vocab(c["vocab_size"])[0]
        ids = tokenizer.encode("the cat and hat", add_special_tokens=False)
        sp = "\u2581"
        assert [tokens[i] for i in ids] == ["t", "he", sp, "c", "at", sp + "and", sp, "h", "at"]


def test_gguf_gemma4_refuses_a_partial_rotary_on_its_sliding_layers(tmp_path):
    from pagoda.runtime.model.gguf_config import read_config
    from pagoda.runtime.model.gguf_reader import parse

    c = {**DEFAULTS, **TEXT, **CASES["moe"], "rope_parameters": ROPE}
    w = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "gemma4")
    _metadata(w, c)
    w.add_rope_dimension_count_swa(8)  # (the key written twice: the reader keeps the last)
    w.add_tokenizer_model("gemma4")
    w.add_token_list(_spm_vocab(c["vocab_size"])[0])
    w.add_tensor("token_embd.weight", np.zeros((c["vocab_size"], c["hidden_size"]), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=r"rope\.dimension_count_swa 8"):
        read_config(parse(str(tmp_path / "bad.gguf")))
