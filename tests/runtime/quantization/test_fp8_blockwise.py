"""Block-wise FP8 checkpoints (HF FineGrainedFP8 / DeepSeek-V3 / Qwen3-FP8: `weight_block_size`
and `weight_scale_inv`; compressed-tensors' `block` and `group` strategies): one scale per weight
tile, partial tiles at the edges. They load dequantized on every device (the FP8 GEMM takes one
scale per channel or per tensor) and give the same tokens and logits, bit for bit in float32,
as the checkpoint of their dequantized weights; a malformed block is refused in one line."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import pytest
import torch
from fp8_testlib import greedy, quantize_blocks, write_block_pair
from pagoda.runtime import LLM
from pagoda.runtime.model.loader import load_model
from pagoda.runtime.quantization import fp8

ENGINE = dict(dtype="float32", kv_cache_memory=4 << 20, max_num_batched_tokens=16, max_num_seqs=4)
HF_BLOCK = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
            "weight_block_size": [48, 32], "modules_to_not_convert": ["lm_head"]}  # fmt: skip
CT_GROUP = {
    "quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "strategy": "group", "group_size": 48,
                    "symmetric": True, "dynamic": False},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "group",
                              "group_size": 48, "dynamic": True, "symmetric": True},
    }},
}  # fmt: skip


def test_block_dequantization_against_a_tile_loop():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(70, 50, generator=gen) * torch.logspace(-2, 2, 50)  # scales far apart
    codes, scales, dense = quantize_blocks(w, (32, 16))
    assert scales.shape == (3, 4)
    got = fp8.dequantize_blocks(codes, scales, (32, 16), torch.float32)
    assert torch.equal(got, dense)
    assert float(((got - w).abs() / w.abs().clamp(min=1e-3)).median()) < 0.05
    with pytest.raises(ValueError, match="must be 3x4, got"):
        fp8.dequantize_blocks(codes, scales[:, :3], (32, 16), torch.float32)


@pytest.mark.parametrize(
    ("qc", "block", "suffix"),
    [(HF_BLOCK, (48, 32), "weight_scale_inv"), (CT_GROUP, (1, 48), "weight_scale")],
    ids=["weight_block_size", "compressed-tensors-group"],
)
def test_block_wise_checkpoint_matches_its_dequantized_twin(tmp_path, qc, block, suffix):
    q, deq = write_block_pair(tmp_path, qc, block, suffix)
    loaded = load_model(str(q))
    assert loaded.fp8_scheme.block == block
    llm = LLM(loaded=loaded, **ENGINE)
    assert llm.engine.runner.model.layers[0].qkv.__class__.__name__ == "Linear"  # dequantized
    first, first_dense = [], []
    assert greedy(llm, first=first) == greedy(
        LLM(loaded=load_model(str(deq)), **ENGINE), first=first_dense
    )
    assert all(torch.equal(a, b) for a, b in zip(first, first_dense))


def test_block_schemes_and_their_refusals():
    s = fp8.scheme_from_hf_config({"quantization_config": HF_BLOCK})
    assert (s.block, s.serialized) == ((48, 32), True)
    assert fp8.engine_scheme(None, s, fp8_runs=True) is None  # dequantized where FP8 runs too
    assert fp8.engine_scheme("fp8", s, fp8_runs=True) == fp8.ONLINE_SCHEME  # then requantized
    with pytest.raises(ValueError, match="needs a GPU with FP8 tensor cores"):
        fp8.engine_scheme("fp8", s, fp8_runs=False)
    assert fp8.scheme_from_hf_config({"quantization_config": CT_GROUP}).block == (1, 48)
    bad = ({**HF_BLOCK, "weight_block_size": [128]}, {**HF_BLOCK, "weight_block_size": [0, 8]})
    for qc in bad:
        with pytest.raises(ValueError, match="weight_block_size must be two positive") as e:
            fp8.scheme_from_hf_config({"quantization_config": qc})
        assert "\n" not in str(e.value)
    group = CT_GROUP["config_groups"]["group_0"]
    no_structure = {**group, "weights": {**group["weights"], "strategy": "block"}}
    with pytest.raises(ValueError, match="block_structure must be two positive"):
        fp8.scheme_from_hf_config(
            {"quantization_config": {**CT_GROUP, "config_groups": {"g": no_structure}}}
        )


@pytest.mark.skipif(
    os.environ["TRITON_INTERPRET"] != "1" and not torch.cuda.is_available(),
    reason="the FP8 kernels run on CUDA or in Triton's interpreter",
)
def test_quantization_fp8_requantizes_a_block_wise_checkpoint_per_channel(tmp_path):
    """Where FP8 runs, `--quantization fp8` on a block-wise checkpoint quantizes its dequantized
    weights one scale per output channel: the FP8 GEMM runs, and its codes (hence tokens) are
    those of `--quantization fp8` on the dequantized twin."""
    q, deq = write_block_pair(tmp_path, HF_BLOCK, (48, 32), "weight_scale_inv")
    fp8_engine = {**ENGINE, "quantization": "fp8"}
    llm = LLM(loaded=load_model(str(q)), **fp8_engine)
    twin = LLM(loaded=load_model(str(deq)), **fp8_engine)
    ours, theirs = (e.engine.runner.model.layers[0].qkv for e in (llm, twin))
    assert ours.__class__.__name__ == "Fp8Linear"
    assert torch.equal(ours.weight.view(torch.uint8), theirs.weight.view(torch.uint8))
    assert torch.equal(ours.weight_scale, theirs.weight_scale)
    # two tokens: the prompts' chunked prefill steps and a decode step, in the FP8 GEMM (each
    # step is seconds in Triton's interpreter; the codes are asserted equal above)
    assert greedy(llm, 2) == greedy(twin, 2)


def test_the_fit_check_counts_a_block_wise_checkpoint_at_its_16_bit_size(tmp_path, monkeypatch):
    """The start-up fit check counts weights as the loader holds them: block-wise FP8 ones
    dequantized (16-bit) even where FP8 runs; per-channel ones as FP8."""
    import json

    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.server import fit

    monkeypatch.setattr(fit, "fp8_runs_on", lambda device: True)
    cfg = EngineConfig.create("m", device="cpu", dtype="bfloat16")
    for qc, fp8_weights in ((HF_BLOCK, False), ({"quant_method": "fp8"}, True)):
        config = {"architectures": ["LlamaForCausalLM"], "quantization_config": qc}
        (tmp_path / "config.json").write_text(json.dumps(config))
        assert fit.plan_of(cfg, tmp_path).fp8_weights is fp8_weights
