"""Doge (`DogeForCausalLM`, model/doge.py) against transformers, token for token and logits
within 1e-3 (float32), on tiny random checkpoints transformers writes itself, A drawn so that
the dynamic mask's key biases change the tokens (`write`): the dense model against transformers' plain
greedy loop (chunked into 16-token steps, three prompts sharing steps, a warm prefix cache, a
pool small enough to preempt); the cross-domain MoE against transformers' one-token forward
fed the prompt token by token (its full forward mixes the router's logits across tokens,
transformers' own note), chunked and batched; the checkpoint check, the weights estimate and
what is refused; two tensor-parallel ranks (KV heads split, and replicated)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from arch_cases import (
    built_fixture,
    case_fixture,
    check,
    generate,
    gpu_test,
    greedy_test,
    prompts,
)
from hf_oracle import make_tiny_model
from pagoda.runtime import LLM
from pagoda.runtime.model.loader import load_model, read_model_config

transformers = pytest.importorskip("transformers")
CASES = {"doge": {}}
MOE = dict(is_moe=True, num_experts=64, num_experts_per_tok=4, num_hidden_layers=1)
VARIANTS = {"doge-mqa": dict(num_key_value_heads=1)}  # (two ranks: its one KV head replicated)


def write(name: str, path, **overrides):
    """A tiny Doge with A drawn in [0.5, 1] (transformers initialises it to zeros, where the
    biases are all 1 and the softmax does not see them; measured: with these, 10 of the dense
    case's 18 greedy tokens differ from A = 0's, 2 of its 3 prompts)."""
    model = make_tiny_model(
        path, "Doge", **{**CASES.get(name, {}), **VARIANTS.get(name, {})}, **overrides
    )
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.A.copy_(0.5 + 0.5 * torch.rand(layer.self_attn.A.shape, generator=g))
    model.save_pretrained(path)
    return model


built = built_fixture(write)
case = case_fixture(CASES)

test_greedy_matches_transformers_chunked_cached_batched_and_preempted = greedy_test()
# the Triton kernels over the padded key/value width, CUDA graphs
test_gpu_matches_transformers_with_graphs = gpu_test()


def hf_greedy_stepwise(model, prompt: list[int], n: int):
    """transformers' greedy tokens and logits, every token (the prompt's too) through its
    one-token forward on the cache."""
    tokens, logits, cache = [], [], None
    with torch.no_grad():
        for tok in prompt:
            out = model(torch.tensor([[tok]]), cache=cache, use_cache=True)
            cache = out.cache
        for _ in range(n):
            logits.append(out.logits[0, -1].float())
            tokens.append(int(logits[-1].argmax()))
            out = model(torch.tensor([tokens[-1:]]), cache=cache, use_cache=True)
            cache = out.cache
    return tokens, logits


def test_cross_domain_moe_matches_transformers_token_by_token(tmp_path):
    """Product-key experts beside the dense MLP (64 experts, 4 a token): transformers'
    one-token forward's tokens and logits, prompts of 20, 9 and 17 tokens chunked in 16-token
    steps and batched."""
    model = write("doge-moe", tmp_path, **MOE)
    short = [p[:n] for p, n in zip(prompts(), (20, 9, 17))]
    reference = [hf_greedy_stepwise(model, p, 4) for p in short]
    llm = LLM(loaded=load_model(str(tmp_path)), dtype="float32", kv_cache_memory=8 << 20,
              block_size=16, max_num_batched_tokens=16, max_num_seqs=4)  # fmt: skip
    for i, (got, want) in enumerate(zip(generate(llm, short, 4), reference)):
        check(got, want, f"doge moe: prompt {i}")


def test_checkpoint_check_estimate_and_refusals(built):
    """The checkpoint check naming a missing A, dt_proj or residual scale; the weights estimate;
    the cache's key/value width; a tensor-parallel size that does not divide the heads, FP8, a
    quantized KV cache and a context past keep_window_size refused in one line."""
    from hybrid_cases import check_missing_refused
    from model_bytes import check_estimate
    from pagoda.runtime.distributed.layout import check as check_tp
    from pagoda.runtime.engine.start_checks import check_dtype

    path, _, loaded, _ = built("doge")
    mc = loaded.config
    assert mc.family.doge.keep_window == 2048 and mc.family.qk_norm
    assert mc.kv_layer_shapes == ((2, 32),) * 2  # head 16, its bias column, zeros to 32
    check_estimate(path, rel=1e-6)
    check_missing_refused(loaded, ["model.layers.1.self_attn.A", "model.layers.0.input_residual",
                                   "model.layers.0.self_attn.dt_proj.weight"])  # fmt: skip
    with pytest.raises(ValueError, match="tensor-parallel-size 3 does not divide the model's 4"):
        check_tp(mc, 3)
    for option, words in (("quantization", "fp8 is not supported for a doge"),
                          ("kv", "kv-cache-dtype int8 is not supported for a doge")):  # fmt: skip
        engine = SimpleNamespace(quantization="fp8" if option == "quantization" else None,
                                 torch_dtype=lambda: torch.bfloat16,
                                 cache=SimpleNamespace(kv_cache_dtype="int8" if option == "kv"
                                                       else "auto"))  # fmt: skip
        with pytest.raises(ValueError, match=words):
            check_dtype(engine, mc)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "keep_window_size": 32}))
    try:
        assert read_model_config(str(path)).context_length == 32
        words = r"max_model_len 64 is more than the model's context length \(32 tokens"
        with pytest.raises(ValueError, match=words):
            LLM(loaded=load_model(str(path)), dtype="float32", max_model_len=64)
    finally:
        (path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.slow  # second processes (gloo)
@pytest.mark.parametrize(("name", "kv_heads"), [("doge", 1), ("doge-mqa", 1)])
def test_two_ranks_match_transformers(built, name, kv_heads):
    """Two ranks (gloo), the small pool (preempted) then a warm cache: each rank its query heads
    and KV heads (two split; one replicated), dt_proj's input columns of its KV heads summed
    over the ranks (a replicated head's once) before its heads' biases; transformers' tokens
    and logits; rank 0's weights estimate."""
    from arch_cases import check_two_ranks
    from model_bytes import check_estimate

    path, _, loaded, reference = built(name)
    check_two_ranks(path, loaded, reference, name, kv_heads=kv_heads)
    check_estimate(path, 2, rel=1e-6)


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        ({"attention_bias": True}, "doge attention_bias is not supported"),
        ({"sliding_window": 64}, "doge sliding_window is not supported"),
        ({"hidden_act": "gelu"}, "doge hidden_act 'gelu' is not supported"),
        ({"is_moe": True, "num_experts": 16, "num_experts_per_tok": 17}, "within 1..16"),
    ],
)
def test_what_it_does_not_run_is_refused_in_one_line(tmp_path, edit, words):
    cfg = {"architectures": ["DogeForCausalLM"], "model_type": "doge", **edit}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=words) as e:
        read_model_config(str(tmp_path))
    assert "\n" not in str(e.value)
