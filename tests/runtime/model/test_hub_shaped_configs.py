"""Checkpoints shaped as published ones (config.json as on the hub, shrunk), against
transformers: a bf16 checkpoint's rank holding its rows only, and the hub's config format
(transformers 4's keys, which transformers 5 converts on load) read as transformers reads it."""

from __future__ import annotations

import pytest
import torch
from hf_oracle import make_tiny_model

transformers = pytest.importorskip("transformers")


def test_a_rank_of_a_bf16_checkpoint_holds_only_its_embedding_rows(tmp_path):
    """A bfloat16 checkpoint (Command R's tied 256k-row table, say) served in bfloat16 by two
    ranks on a CPU: a rank's rows of the embedding came out of `DeviceWeights.part` as a view of
    the whole table (no dtype or device change copied them), so every rank held all of it. The
    start-up estimate (one rank's share) is what the rank holds."""
    from model_bytes import build, held_bytes
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.distributed.group import TPGroup
    from pagoda.runtime.distributed.layout import TPLayout
    from pagoda.runtime.model.loader import read_model_config
    from pagoda.runtime.server import weights

    model = make_tiny_model(tmp_path, "Cohere", num_hidden_layers=1, use_qk_norm=True)
    model.to(torch.bfloat16).save_pretrained(tmp_path)
    group = TPGroup(TPLayout(0, 2), torch.device("cpu"), None, None)
    built = build(tmp_path, torch.bfloat16, tp=group)
    table = built.embed.table
    assert table.untyped_storage().nbytes() == table.nbytes == 150 * 64 * 2
    cfg = EngineConfig.create(str(tmp_path), device="cpu", dtype="bfloat16",
                              tensor_parallel_size=2)  # fmt: skip
    got = weights.estimate(read_model_config(str(tmp_path)), cfg, tmp_path)
    assert got.bytes == held_bytes(built)


S, F = "sliding_attention", "full_attention"
# config.json as published (transformers 4's format: top-level rope_theta and rope_scaling, no
# layer_types where the family derives them), shrunk; transformers 5 converts these on load, so
# the checkpoints it writes itself (test_glm_cohere.py) never reach these branches
HUB = {
    "c4ai-command-r7b-12-2024": dict(  # layers from sliding_window_pattern; head_dim forced
        architectures=["Cohere2ForCausalLM"], model_type="cohere2", hidden_size=64, head_dim=8,
        intermediate_size=96, num_attention_heads=4, num_key_value_heads=1, num_hidden_layers=8,
        layer_norm_eps=1e-05, logit_scale=0.25, max_position_embeddings=8192, rope_theta=50000,
        rope_scaling=None, sliding_window=4096, sliding_window_pattern=4, vocab_size=300,
        position_embedding_type="rope_gptj", order_of_interleaved_layers="local_attn_first"),
    "Olmo-3-1025-7B": dict(  # yarn on the global layers only; no layer_types: 3 window to 1
        architectures=["Olmo3ForCausalLM"], model_type="olmo3", hidden_size=64,
        intermediate_size=96, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=8,
        max_position_embeddings=65536, rms_norm_eps=1e-06, rope_theta=500000, sliding_window=4096,
        rope_scaling={"attention_factor": 1.2079441541679836, "beta_fast": 32, "beta_slow": 1,
                      "factor": 8.0, "original_max_position_embeddings": 8192, "rope_type": "yarn"},
        vocab_size=300),
    "SmolLM3-3B-yarn": dict(  # NoPE layers listed; the model card's yarn for 128k
        architectures=["SmolLM3ForCausalLM"], model_type="smollm3", hidden_size=64,
        intermediate_size=96, num_attention_heads=4, num_key_value_heads=1, num_hidden_layers=8,
        layer_types=[F] * 8, no_rope_layer_interval=4, no_rope_layers=[1, 1, 1, 0, 1, 1, 1, 0],
        max_position_embeddings=65536, rms_norm_eps=1e-06, rope_theta=5000000.0,
        rope_scaling={"factor": 2.0, "original_max_position_embeddings": 65536, "type": "yarn"},
        sliding_window=None, use_sliding_window=False, tie_word_embeddings=True, vocab_size=300),
    "GLM-Z1-Rumination-32B-0414": dict(  # yarn over GLM's half-head rotary
        architectures=["Glm4ForCausalLM"], model_type="glm4", hidden_size=96, head_dim=64,
        intermediate_size=80, num_attention_heads=3, num_key_value_heads=1, num_hidden_layers=2,
        max_position_embeddings=131072, partial_rotary_factor=0.5, rms_norm_eps=1e-05,
        rope_theta=10000.0, attention_bias=True, eos_token_id=[151329, 151336, 151338],
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
        vocab_size=300),
}  # fmt: skip


@pytest.mark.parametrize("name", list(HUB))
def test_a_published_config_reads_as_transformers_reads_it(tmp_path, name):
    """Per-layer windows and rotary, head size, rotary base and scaling and the context vLLM
    derives, from config.json alone, against transformers' own reading of the same file."""
    import json

    from pagoda.runtime.model.loader import read_model_config

    (tmp_path / "config.json").write_text(json.dumps(HUB[name]))
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    ours = read_model_config(str(tmp_path))
    f, n = ours.family, theirs.num_hidden_layers
    types = list(getattr(theirs, "layer_types", None) or [F] * n)
    assert list(f.window_layers or [False] * n) == [t == S for t in types]
    nope = getattr(theirs, "no_rope_layers", None)  # SmolLM3's; Cohere 2's global layers
    rotated = [bool(x) for x in nope] if nope else [t == S for t in types]
    if nope or name.startswith("c4ai"):
        assert list(f.rope_layers) == rotated
    heads = theirs.num_attention_heads
    assert ours.head_dim == (getattr(theirs, "head_dim", None) or theirs.hidden_size // heads)
    params = theirs.rope_parameters
    full = params.get(F, params)  # by layer kind (OLMo 3) or one for all
    assert ours.rope_theta == full["rope_theta"]
    kind, scaling = full.get("rope_type", "default"), ours.rope_scaling or {}
    assert scaling.get("rope_type", scaling.get("type", "default")) == kind
    if kind == "yarn":
        assert ours.rope_scaling["factor"] == full["factor"]
        want = full["original_max_position_embeddings"] * full["factor"]
        assert ours.context_length == max(want, theirs.max_position_embeddings)
    if S in params:  # OLMo 3's window layers: the plain base, unscaled
        assert params[S]["rope_type"] == "default"
        assert (f.local_rope_theta or ours.rope_theta) == params[S]["rope_theta"]


def test_a_gguf_s_named_tool_use_template_renders_a_chat_with_tools(tmp_path):
    """llama.cpp's converter writes a tokenizer's named templates as
    `tokenizer.chat_template.<name>` (Hermes 2 Pro's `tool_use`): a chat with tools renders
    that one, one without the default, as transformers renders the checkpoint it came from."""
    from pagoda.runtime.model.gguf_loader import load_gguf
    from test_gguf_families import write_gguf

    default = "{% for m in messages %}{{ m.content }}{% endfor %}"
    tool_use = "{% for t in tools %}<tool>{{ t.function.name }}</tool>{% endfor %}" + default
    named = [{"name": "default", "template": default}, {"name": "tool_use", "template": tool_use}]
    make_tiny_model(tmp_path / "hf", "Llama", num_hidden_layers=1)
    write_gguf(
        tmp_path / "m.gguf", tmp_path / "hf", "llama", extra=lambda w: w.add_chat_template(named)
    )
    tok = load_gguf(tmp_path / "m.gguf")[2]
    ask, tools = (
        [{"role": "user", "content": "hi"}],
        [{"type": "function", "function": {"name": "f"}}],
    )
    assert tok.apply_chat_template(ask, tools=tools) == "<tool>f</tool>hi"
    assert tok.apply_chat_template(ask) == "hi"
