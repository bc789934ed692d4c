"""Aria's language model (`AriaTextForCausalLM`) beyond the tiny checkpoints of
test_moe_families.py's "aria-text" case: the published text_config of rhymes-ai/Aria read as
transformers reads it, its parameter count transformers' own on the meta device; what is
refused."""

from __future__ import annotations

import json

import pytest
from pagoda.runtime.model.loader import read_model_config

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "AriaTextConfig"):
    pytest.skip("transformers without Aria", allow_module_level=True)

# rhymes-ai/Aria's text_config (transcribed: no hub access here), as a causal LM's config.json
ARIA = {"architectures": ["AriaTextForCausalLM"], "model_type": "aria_text",
        "hidden_size": 2560, "intermediate_size": 1664, "max_position_embeddings": 65536,
        "moe_num_experts": 64, "moe_num_shared_experts": 2, "moe_topk": 6,
        "num_attention_heads": 20, "num_hidden_layers": 28, "num_key_value_heads": 20,
        "rope_theta": 5000000, "vocab_size": 100352}  # fmt: skip


def test_arias_text_config_reads_as_transformers_reads_it(tmp_path):
    """The shapes, experts (64 of 1664, top 6, two experts' width shared), the ids and eps
    AriaTextConfig fills in; the parameter count transformers' (24.9 B, the language model of
    Aria's 25.3 B)."""
    import torch

    (tmp_path / "config.json").write_text(json.dumps(ARIA))
    t = transformers.AutoConfig.from_pretrained(tmp_path)
    o = read_model_config(str(tmp_path))
    assert o.architecture == "aria_text"
    assert (o.hidden_size, o.num_layers, o.num_heads, o.num_kv_heads, o.head_dim) == (
        t.hidden_size, t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads,
        t.head_dim)  # fmt: skip
    assert (o.rms_norm_eps, o.rope_theta, o.max_position_embeddings) == (
        t.rms_norm_eps, t.rope_parameters["rope_theta"], t.max_position_embeddings)  # fmt: skip
    assert (o.bos_token_id, list(o.eos_token_ids), o.tie_word_embeddings) == (
        t.bos_token_id, [t.eos_token_id], t.tie_word_embeddings)  # fmt: skip
    f = o.family
    assert (f.num_experts, f.num_experts_per_tok, f.moe_intermediate_size) == (64, 6, 1664)
    assert f.shared_expert_intermediate_size == 2 * 1664 and f.norm_topk_prob
    assert o.num_params == 24_869_091_840  # (transformers' count of all 28 layers: 6.5 s)
    two = {**ARIA, "num_hidden_layers": 2}  # (transformers' count, built in a fraction of it)
    (tmp_path / "config.json").write_text(json.dumps(two))
    with torch.device("meta"):
        hf = transformers.AriaTextForCausalLM(transformers.AutoConfig.from_pretrained(tmp_path))
    assert read_model_config(str(tmp_path)).num_params == sum(p.numel() for p in hf.parameters())


def test_another_activation_is_refused_in_one_line(tmp_path):
    """The routed experts are SiLU-gated whatever `hidden_act` says (the shared MLP follows
    it): another one is refused."""
    (tmp_path / "config.json").write_text(json.dumps({**ARIA, "hidden_act": "gelu"}))
    with pytest.raises(ValueError, match="aria_text hidden_act 'gelu' is not supported") as e:
        read_model_config(str(tmp_path))
    assert "\n" not in str(e.value)
