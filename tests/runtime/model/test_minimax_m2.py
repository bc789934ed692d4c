"""MiniMax-M2 (`MiniMaxM2ForCausalLM`) against transformers, token for token and logits within
1e-3 (float32), on tiny random checkpoints transformers writes itself: prompts chunked into
16-token steps, three prompts sharing steps, a warm prefix cache, and a pool small enough to
preempt.

- minimax-m2: q and k normalised over their whole projections, half of each head rotating (the
  released configs' `rotary_dim`), top-2 of 8 experts by sigmoid scores with a correction bias
  large enough to change the picks, renormalised;
- minimax-m2-full: the whole head rotating, top-3 of 6, one KV head.

Also: the released configs' `rotary_dim` read as transformers reads it, the weights estimate
against what the built model holds, and two tensor-parallel ranks (gloo: the q/k norms' sums
all-reduced).
"""

from __future__ import annotations

import json

import pytest
import torch
from arch_cases import (
    built_fixture,
    check_chunked_cached_batched,
    check_on_cuda_with_graphs,
    check_preempted,
    check_two_ranks,
)
from hf_oracle import make_tiny_model
from pagoda.runtime.model.loader import read_model_config

transformers = pytest.importorskip("transformers")
IDS = dict(bos_token_id=1, eos_token_id=2)
CASES = {
    "minimax-m2": dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=32,
                       head_dim=32, rotary_dim=16, num_hidden_layers=3, **IDS),
    "minimax-m2-full": dict(num_local_experts=6, num_experts_per_tok=3, intermediate_size=24,
                            head_dim=16, num_key_value_heads=1, **IDS),
}  # fmt: skip


def write_case(name: str, path):
    """Case `name`'s checkpoint written to `path` by transformers (float32, eval), with random
    correction biases; returns the model."""
    model = make_tiny_model(path, "MiniMaxM2", **CASES[name])
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for layer in model.model.layers:
            bias = layer.mlp.e_score_correction_bias
            bias.copy_(torch.randn(bias.shape, generator=g))
    model.save_pretrained(path)
    return model


built = built_fixture(write_case)


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_matches_transformers_chunked_cached_batched_and_preempted(built, name):
    _, _, loaded, reference = built(name)
    check_chunked_cached_batched(loaded, reference, name)
    check_preempted(loaded, reference, name)


def test_rotary_dim_reads_as_transformers(built, tmp_path):
    """A released config's `rotary_dim` beside a top-level rope_theta, no rope_parameters: the
    same partial rotary as transformers'."""
    path, _, _, _ = built("minimax-m2")
    c = read_model_config(str(path))
    assert c.architecture == "minimax_m2" and c.family.qk_norm_whole
    assert c.rope_scaling["partial_rotary_factor"] == 0.5 and c.family.routing.bias
    cfg = json.loads((path / "config.json").read_text())
    cfg.pop("rope_parameters")
    cfg.update(rope_theta=5e6, rotary_dim=8)
    (tmp_path / "config.json").write_text(json.dumps(cfg))  # a config alone: no weights read
    theirs = transformers.AutoConfig.from_pretrained(tmp_path).rope_parameters
    ours = read_model_config(str(tmp_path))
    assert ours.rope_scaling["partial_rotary_factor"] == theirs["partial_rotary_factor"] == 0.25
    assert ours.rope_theta == theirs["rope_theta"] == 5e6


def test_block_wise_fp8_checkpoint_as_minimax_publishes_it(tmp_path):
    """MiniMax-M2's release format: attention's projections and every expert's w1/w2/w3 in
    E4M3 with a float32 `weight_scale_inv` per tile, the router, its bias, the norms, the
    embedding and the head in 16 bits, its quantization_config naming the format
    `float8_e4m3fn` and the modules left out: it loads dequantized and gives transformers'
    tokens and logits on its dequantized weights."""
    import json

    from arch_cases import NEW, check, generate, prompts
    from fp8_testlib import quantize_blocks
    from hf_oracle import hf_greedy_plain
    from pagoda.runtime import LLM
    from pagoda.runtime.model.loader import load_model
    from safetensors.torch import load_file, save_file

    write_case("minimax-m2", tmp_path / "orig")
    tensors = load_file(str(tmp_path / "orig" / "model.safetensors"))
    quant, dense = {}, {}
    for name, t in tensors.items():
        if not name.endswith(("proj.weight", ".w1.weight", ".w2.weight", ".w3.weight")):
            quant[name] = dense[name] = t
            continue
        codes, scales, dense[name] = quantize_blocks(t.float(), (16, 16))
        quant[name], quant[name.removesuffix("weight") + "weight_scale_inv"] = codes, scales
    for d, ts in (("fp8", quant), ("dequantized", dense)):
        (tmp_path / d).mkdir()
        for f in (tmp_path / "orig").iterdir():
            if f.name != "model.safetensors":
                (tmp_path / d / f.name).write_bytes(f.read_bytes())
        save_file(ts, str(tmp_path / d / "model.safetensors"))
    config = json.loads((tmp_path / "fp8" / "config.json").read_text())
    config["quantization_config"] = {
        "activation_scheme": "dynamic", "fmt": "float8_e4m3fn", "quant_method": "fp8",
        "weight_block_size": [16, 16],
        "modules_to_not_convert": ["gate", "e_score_correction_bias", "lm_head"]}  # fmt: skip
    (tmp_path / "fp8" / "config.json").write_text(json.dumps(config))
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "dequantized").eval()
    reference = [hf_greedy_plain(model, p, NEW) for p in prompts()]
    loaded = load_model(str(tmp_path / "fp8"))
    assert loaded.fp8_scheme.block == (16, 16)
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20,
              max_num_batched_tokens=16, max_num_seqs=4)  # fmt: skip
    for i, (got, want) in enumerate(zip(generate(llm, prompts()), reference)):
        check(got, want, f"FP8 MiniMax-M2: prompt {i}")


@pytest.mark.parametrize("tp", [1, 2])
def test_the_weights_estimate_is_what_the_model_holds(built, tp):
    """`server/weights.py` against the built model, bf16 from float32 files: the float32
    router and correction bias under `block_sparse_moe`, the whole q/k norms."""
    from model_bytes import check_estimate

    path, _, _, _ = built("minimax-m2")
    check_estimate(path, tp)


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("fp8", [False, True])
def test_the_weights_from_shapes_as_from_its_tensors(built, tp, fp8):
    """`fit`'s count from config.json alone (`from_shapes`) against the headers' on a GPU:
    the q/k norms over all heads (whole on every rank) counted; they were left out"""
    from pagoda.runtime.quantization.fp8 import ONLINE_SCHEME
    from pagoda.runtime.server import weights

    path, _, _, _ = built("minimax-m2")
    mc = read_model_config(str(path))
    ckpt = weights.read_checkpoint(path, mc.architecture)
    place = weights.Placement(torch.bfloat16, "cuda", tp, ONLINE_SCHEME if fp8 else None)
    got, _ = weights.resident(ckpt, mc, place)
    assert got == pytest.approx(weights.from_shapes(mc, torch.bfloat16, fp8, tp), rel=1e-6)


@pytest.mark.slow  # a second process (gloo): ~10 s on 2 busy cores
def test_two_tensor_parallel_ranks_match_transformers(built):
    path, _, loaded, reference = built("minimax-m2")
    check_two_ranks(path, loaded, reference, "minimax-m2", kv_heads=1)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_gpu_matches_transformers_with_graphs(built, name):
    _, _, loaded, reference = built(name)
    runner = check_on_cuda_with_graphs(loaded, reference, name).engine.runner
    assert runner.model.layers[-1].mlp.fused is not None


@pytest.mark.parametrize("tensor", ["model.layers.2.block_sparse_moe.e_score_correction_bias",
                                    "model.layers.0.block_sparse_moe.experts.3.w3.weight",
                                    "model.layers.1.self_attn.k_norm.weight"])  # fmt: skip
def test_a_checkpoint_without_one_of_its_tensors_is_refused_at_config_time(built, tmp_path, tensor):
    from safetensors.torch import load_file, save_file

    path, _, _, _ = built("minimax-m2")
    tensors = load_file(str(path / "model.safetensors"))
    del tensors[tensor]
    (tmp_path / "config.json").write_bytes((path / "config.json").read_bytes())
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=f"missing tensor '{tensor}'"):
        read_model_config(str(tmp_path))
