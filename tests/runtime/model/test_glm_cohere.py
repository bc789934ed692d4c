"""SmolLM3, OLMo 3, GLM-4 (and GLM) and Cohere / Cohere 2 against transformers, token for token,
on tiny random checkpoints transformers writes itself (tests/runtime/hf_oracle.py): float32,
prompts chunked into 16-token steps, three prompts sharing steps, a warm prefix cache on the
second pass, and a KV pool so small that requests are preempted; logits within 1e-3 of
transformers' plain greedy loop at every step.

- SmolLM3: NoPE layers (every `no_rope_layer_interval`-th by default) that also slide;
- OLMo 3: OLMo 2's layer with three window layers to a global one, the global layers' rotary
  scaled and the window layers' not;
- GLM-4 (and GLM): gate and up fused, a partial rotary (half of each head) in the interleaved
  layout, q/k/v biases; GLM-4's norms on attention's and the MLP's outputs;
"""

from __future__ import annotations

import pytest
from arch_cases import check, generate, prompts
from hf_oracle import hf_greedy_plain, make_tiny_model
from pagoda.runtime import LLM
from pagoda.runtime.model.loader import load_model, read_model_config

transformers = pytest.importorskip("transformers")
SLIDING, FULL = "sliding_attention", "full_attention"
# name: (transformers config class prefix, config overrides)
CASES = {
    # NoPE on layers 1 and 3 (interval 2), which slide (transformers' default layer_types)
    "smollm3-nope-window": (
        "SmolLM3",
        dict(num_hidden_layers=4, no_rope_layer_interval=2, use_sliding_window=True,
             sliding_window=10, attention_bias=True),
    ),
    # three window layers to a global one (transformers' default layer_types); the global
    # layer's rotary scaled (linear), the window layers' not
    "olmo3-window-linear": (
        "Olmo3",
        dict(num_hidden_layers=4, sliding_window=10, rope_parameters={
            FULL: {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
            SLIDING: {"rope_type": "default", "rope_theta": 10000.0}}),
    ),
    # fused gate_up_proj, half of each head rotating in pairs, q/k/v biases, four norms a layer
    "glm4-partial-interleaved": ("Glm4", dict(head_dim=32)),
    "glm-partial-interleaved": ("Glm", dict(head_dim=32, num_key_value_heads=1)),  # GLM-4-chat
}  # fmt: skip


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    arch, overrides = CASES[request.param]
    model = make_tiny_model(path, arch, **overrides)
    reference = [hf_greedy_plain(model, p, 6) for p in prompts()]
    return request.param, path, model, load_model(str(path)), reference


def test_greedy_matches_transformers_chunked_cached_batched_and_preempted(case):
    name, _, _, loaded, reference = case
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, block_size=16,
              max_num_batched_tokens=16, max_num_seqs=4)  # fmt: skip
    cold = generate(llm, prompts())
    warm = generate(llm, prompts()[::-1])[::-1]
    for i, want in enumerate(reference):
        check(cold[i], want, f"{name}: prompt {i}, cold")
        check(warm[i], want, f"{name}: prompt {i}, warm")
    assert llm.engine.kv.prefix_hits > 0
    small = LLM(loaded=loaded, dtype="float32", num_blocks_override=7, block_size=16,
                max_model_len=96, max_num_batched_tokens=16, max_num_seqs=3)  # fmt: skip
    got = generate(small, prompts())
    assert small.engine.scheduler.num_preemptions > 0
    for i, want in enumerate(reference):
        check(got[i], want, f"{name}: prompt {i}, preempted")
    small.engine.check_integrity()


def test_per_layer_rotary_and_windows_read_as_transformers(case):
    name, path, model, _, _ = case
    f = read_model_config(str(path)).family
    types = getattr(model.config, "layer_types", None)
    assert list(f.window_layers) == ([t == SLIDING for t in types] if f.window_layers else [])
    if name.startswith("smollm3"):
        assert list(f.rope_layers) == [bool(x) for x in model.config.no_rope_layers]
        assert f.rope_layers == (True, False, True, False) and f.sliding_window == 10
    if name.startswith("olmo3"):
        assert f.window_layers == (True, True, True, False) and f.local_rope_theta == 10000.0
