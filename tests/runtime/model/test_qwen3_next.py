"""Qwen3-Next and Qwen3.5 (Gated DeltaNet layers among gated attention layers,
`model/qwen3_next.py`) against transformers, token for token, on tiny random checkpoints
transformers writes itself (tests/runtime/hf_oracle.py): float32, logits within 1e-3 of
transformers' plain greedy loop (its torch chunked delta rule over the whole sequence; no
flash-linear-attention here) at every step.

- Qwen3-Next: experts with the shared expert and its gate, a dense layer (`mlp_only_layers`),
  two value heads per key head, top-k not renormalised;
- Qwen3.5: a dense MLP, as many key heads as value heads, key heads wider than value heads, a
  conv of 3, tied;
- Qwen3.5-MoE: attention first, experts in every layer;
- Qwen3.5's multimodal checkpoint read text-only (its `text_config`, `model.language_model.`).

Each runs its prompts in 16-token steps (chunked prefill carries the conv and delta states
across steps), three prompts sharing steps with two state slots, then again in reverse order
(prefix caching is off for these layers: the same tokens recomputed), then a KV pool so small
that requests are preempted (their states rebuilt by recompute); a one-token prompt.
"""

from __future__ import annotations

import pytest
import torch
from arch_cases import NEW, SMALL_POOL, built_fixture, case_fixture, check, generate, prompts
from hf_oracle import hf_greedy_plain, make_tiny_model, save_word_tokenizer
from pagoda.runtime import LLM

transformers = pytest.importorskip("transformers")

LIN, FULL = "linear_attention", "full_attention"
SMALL = dict(head_dim=16, num_attention_heads=4, num_key_value_heads=2)
CASES = {
    "qwen3-next": ("Qwen3Next", dict(
        **SMALL, num_hidden_layers=3, layer_types=[LIN, FULL, LIN], linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, mlp_only_layers=[2], norm_topk_prob=False)),
    "qwen3.5": ("Qwen3_5Text", dict(
        **SMALL, num_hidden_layers=3, layer_types=[LIN, LIN, FULL], linear_num_key_heads=2,
        linear_num_value_heads=2, linear_key_head_dim=32, linear_value_head_dim=16,
        linear_conv_kernel_dim=3, tie_word_embeddings=True)),
    "qwen3.5-moe": ("Qwen3_5MoeText", dict(
        **SMALL, num_hidden_layers=2, layer_types=[FULL, LIN], linear_num_key_heads=1,
        linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=32,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32)),
}  # fmt: skip


def _conditional(path):
    """Qwen3_5ForConditionalGeneration with a tiny vision tower, saved as the published
    checkpoints are (config.json's text_config, `model.language_model.` tensors)."""
    text = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                layer_types=[LIN, FULL], linear_num_key_heads=2, linear_num_value_heads=2,
                linear_key_head_dim=16, linear_value_head_dim=16, **SMALL,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                 "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 0],
                                 "mrope_interleaved": True})  # fmt: skip
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64,
                  patch_size=4, num_position_embeddings=16)  # fmt: skip
    cfg = transformers.Qwen3_5Config(text_config=text, vision_config=vision)
    torch.manual_seed(0)
    model = transformers.Qwen3_5ForConditionalGeneration(cfg).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0) if p.dim() > 1 else p.add_(0.2 * torch.randn(p.shape, generator=g))
    model.save_pretrained(path)
    save_word_tokenizer(path, 300)
    return model


def _make(name: str, path):
    if name == "qwen3.5-vl":
        return _conditional(path)
    arch, overrides = CASES[name]
    return make_tiny_model(path, arch, **overrides)


built = built_fixture(_make)
case = case_fixture(CASES)


def test_greedy_matches_transformers_chunked_batched_and_preempted(case):
    name, _, model, loaded, reference = case
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, block_size=16,
              max_num_batched_tokens=16, max_num_seqs=2)  # fmt: skip
    assert not llm.engine.config.cache.enable_prefix_caching  # (its states: no snapshots)
    cold = generate(llm, prompts())
    warm = generate(llm, prompts()[::-1])[::-1]
    for i, want in enumerate(reference):
        check(cold[i], want, f"{name}: prompt {i}, cold")
        check(warm[i], want, f"{name}: prompt {i}, again")
    assert llm.engine.runner.mamba.num_held == 0
    one = [7]  # a one-token prompt: its first step is a decode row
    check(generate(llm, [one])[0], hf_greedy_plain(model, one, NEW), f"{name}: one token")
    small = LLM(loaded=loaded, **SMALL_POOL)
    got = generate(small, prompts())
    assert small.engine.scheduler.num_preemptions > 0
    for i, want in enumerate(reference):
        check(got[i], want, f"{name}: prompt {i}, preempted")
    small.engine.check_integrity()
