"""FP8 for the hybrids' linear layers (Granite 4.0, Bamba, Nemotron-H, Falcon-H1), as vLLM runs
them: the Mamba2 mixers' in_proj and out_proj, attention's projections and the dense MLPs (and
Nemotron-H's experts, each a linear layer of its own) in FP8; the conv, A, D, dt_bias and the
norms, the embedding, the LM head, routers and Granite's stacked experts high precision.

* An FP8 checkpoint written by hand (per-channel E4M3 codes and scales of those projections,
  `quant_method` fp8) loads where the FP8 kernels do not run (a CPU) by dequantizing at load:
  the same greedy tokens as the 16-bit checkpoint of its dequantized weights, bit for bit
  (float32).
* Where they run (here Triton's interpreter), the same checkpoint runs those projections in the
  FP8 GEMM and ``--quantization fp8`` on the 16-bit original quantizes the same codes at load:
  the same tokens, the prompts' logits within FP8's error of the dense twin's.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import re

import pytest
import torch
from fp8_testlib import PROMPTS, _write_pair, greedy, quantize_blocks
from hf_oracle import make_tiny_model
from pagoda.kernels import fp8 as math
from pagoda.runtime import LLM
from pagoda.runtime.model.loader import load_model
from safetensors.torch import load_file

transformers = pytest.importorskip("transformers")
MAMBA = dict(mamba_n_heads=4, mamba_d_state=16, mamba_chunk_size=8)
CASES = {
    "granite4-moe": (
        "GraniteMoeHybrid",
        dict(num_hidden_layers=2, layer_types=["mamba", "attention"], **MAMBA, mamba_n_groups=2,
             num_local_experts=4, num_experts_per_tok=2, intermediate_size=32,
             shared_intermediate_size=48),
    ),
    "bamba": ("Bamba", dict(num_hidden_layers=2, attn_layer_indices=[1], **MAMBA, mamba_d_head=32)),
    "nemotron-h-moe": (
        "NemotronH",
        dict(layers_block_type=["mamba", "moe", "attention", "mlp"], num_hidden_layers=4,
             mamba_num_heads=4, mamba_head_dim=32, ssm_state_size=16, n_groups=2, chunk_size=8,
             head_dim=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
             moe_shared_expert_intermediate_size=48),
    ),
    "falcon-h1": (
        "FalconH1",
        dict(num_hidden_layers=2, mamba_d_ssm=128, mamba_n_heads=4, mamba_d_state=16,
             mamba_chunk_size=8, mamba_rms_norm=True, head_dim=16, ssm_in_multiplier=1.2,
             ssm_multipliers=[1.1, 0.9, 1.2, 0.8, 1.3]),
    ),
}  # fmt: skip
# the projections the engine runs in FP8 (2-D matrices; Granite's stacked experts are 3-D)
LINEAR = re.compile(r"\.(in_proj|out_proj|[qkvo]_proj|gate_proj|up_proj|down_proj|"
                    r"input_linear|output_linear)\.weight$")  # fmt: skip
ENGINE = dict(dtype="float32", max_num_batched_tokens=16, max_num_seqs=4, kv_cache_memory=4 << 20)
# the FP8 GEMM's runs (Triton's interpreter on a CPU: its time goes with the launches): the
# prompts' 34 tokens in one step, the attention backend the device's default (torch's here)
GEMM = dict(ENGINE, max_num_batched_tokens=64)


def write_fp8_hybrid(root, name: str, block: tuple[int, int] | None = None):
    """(the 16-bit original, its FP8 export, the export dequantized), as `write_fp8_pair`;
    `block`: block-wise scales (`weight_scale_inv` per tile, DeepSeek-V3's form)."""
    orig, q, deq = root / "orig", root / "fp8", root / "dequantized"
    arch, overrides = CASES[name]
    make_tiny_model(orig, arch, **overrides)
    quant, dense = {}, {}
    for key, t in load_file(str(orig / "model.safetensors")).items():
        if t.dim() != 2 or not LINEAR.search(key):
            quant[key] = dense[key] = t
            continue
        if block is not None:
            codes, scales, dense[key] = quantize_blocks(t.float(), block)
            quant[key], quant[key.removesuffix("weight") + "weight_scale_inv"] = codes, scales
            continue
        codes, scale = math.quantize_weight(t)
        quant[key], quant[key.removesuffix("weight") + "weight_scale"] = codes, scale
        dense[key] = math.dequantize(codes, scale.reshape(-1, 1))
    config = {"quant_method": "fp8", "activation_scheme": "dynamic", "ignored_layers": ["lm_head"]}
    if block is not None:
        config["weight_block_size"] = list(block)
    _write_pair(orig, (q, quant, config), (deq, dense))
    return orig, q, deq


@pytest.fixture
def no_fp8_kernels(monkeypatch):
    from pagoda.runtime import config
    from pagoda.runtime.worker import model_build

    monkeypatch.setattr(config, "fp8_runs_on", lambda device: False)
    monkeypatch.setattr(model_build, "fp8_runs_on", lambda device: False)


@pytest.mark.parametrize("name", CASES)
def test_fp8_checkpoint_dequantized_on_a_cpu_matches_its_dense_twin(tmp_path, name, no_fp8_kernels):
    _, q, deq = write_fp8_hybrid(tmp_path, name)
    fp8 = LLM(loaded=load_model(str(q)), **ENGINE)
    assert greedy(fp8, 4) == greedy(LLM(loaded=load_model(str(deq)), **ENGINE), 4)


def test_block_wise_fp8_checkpoint_loads_dequantized(tmp_path):
    """A block-wise FP8 export (16 x 16 tiles, partial ones at in_proj's edge: 2 x 128 + 2 x 2 x
    16 + 4 rows) of Nemotron-H under its `backbone.` names: dequantized at load on every
    device, the tokens of its dequantized twin."""
    _, q, deq = write_fp8_hybrid(tmp_path, "nemotron-h-moe", block=(16, 16))
    loaded = load_model(str(q))
    assert loaded.fp8_scheme.block == (16, 16)
    assert greedy(LLM(loaded=loaded, **ENGINE), 4) == greedy(
        LLM(loaded=load_model(str(deq)), **ENGINE), 4
    )


@pytest.mark.slow  # Triton's interpreter for every FP8 GEMM: ~10 s a case on 2 busy cores
@pytest.mark.skipif(os.environ["TRITON_INTERPRET"] != "1" and not torch.cuda.is_available(),
                    reason="FP8 GEMM: CUDA or Triton's interpreter")  # fmt: skip
@pytest.mark.parametrize("name", ["granite4-moe", "nemotron-h-moe", "falcon-h1"])
def test_fp8_gemm_serves_the_checkpoint_and_online_quantization_alike(tmp_path, name):
    from pagoda.runtime.model.fp8_linear import Fp8Linear

    orig, q, deq = write_fp8_hybrid(tmp_path, name)
    served = LLM(loaded=load_model(str(q)), **GEMM)
    online = LLM(loaded=load_model(str(orig)), quantization="fp8", **GEMM)
    mixers = [llm.engine.runner.model.layers[0].mixer for llm in (served, online)]
    for a in ("in_proj", "out_proj"):
        x, y = (getattr(m, a) for m in mixers)
        assert isinstance(x, Fp8Linear) and isinstance(y, Fp8Linear)
        assert torch.equal(x.weight.view(torch.uint8), y.weight.view(torch.uint8))
        assert torch.equal(x.weight_scale, y.weight_scale)
    assert mixers[0].conv_weight.dtype == torch.float32  # the conv and SSM parameters: not FP8
    ours, theirs = [], []
    assert greedy(served, 3, first=ours) == greedy(online, 3)
    greedy(LLM(loaded=load_model(str(deq)), **GEMM), 1, first=theirs)
    # within FP8's error of the dense twin's logits, the same pick where its top two are
    # further apart than that (the tiny models' logits are close: not every prompt's are)
    ours, theirs = torch.stack(ours), torch.stack(theirs)
    assert ours.shape[0] == len(PROMPTS)
    err = (ours - theirs).abs().max()
    assert 0 < err < 0.1 * theirs.abs().max()
    top2 = theirs.topk(2, dim=-1).values
    clear = top2[:, 0] - top2[:, 1] > 2 * err
    assert (ours.argmax(-1) == theirs.argmax(-1))[clear].all()


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("name", CASES)
def test_fp8_weights_estimate(tmp_path, name, tp):
    """`server/weights.py` with FP8 projections: the config's shapes as the checkpoint's tensors
    (on CUDA: no packing), one rank of `tp`; where the FP8 kernels run (the interpreter), the
    estimate from the tensors against what rank 0 of the model built from them holds."""
    from model_bytes import build, held_bytes
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.distributed.group import TPGroup
    from pagoda.runtime.distributed.layout import TPLayout
    from pagoda.runtime.model.loader import read_model_config
    from pagoda.runtime.quantization.fp8 import ONLINE_SCHEME
    from pagoda.runtime.server import weights

    arch, overrides = CASES[name]
    make_tiny_model(tmp_path, arch, **overrides)
    mc = read_model_config(str(tmp_path))
    ckpt = weights.read_checkpoint(tmp_path, mc.architecture)
    place = weights.Placement(torch.bfloat16, "cuda", tp, ONLINE_SCHEME)
    got, notes = weights.resident(ckpt, mc, place)
    assert int(notes["fp8"]) >= 2 * mc.family.mamba.num_layers  # in_proj and out_proj too
    assert got == pytest.approx(weights.from_shapes(mc, torch.bfloat16, True, tp), rel=0.02)
    if os.environ["TRITON_INTERPRET"] != "1":
        return
    group = None if tp == 1 else TPGroup(TPLayout(0, tp), torch.device("cpu"), None, None)
    held = held_bytes(build(tmp_path, torch.bfloat16, tp=group, fp8=ONLINE_SCHEME))
    cfg = EngineConfig.create(str(tmp_path), device="cpu", dtype="bfloat16", quantization="fp8",
                              tensor_parallel_size=tp)  # fmt: skip
    assert weights.estimate(mc, cfg, tmp_path).bytes == pytest.approx(held, rel=0.02)


@pytest.mark.slow  # two ranks (gloo) through the interpreter's FP8 GEMM: ~20 s
@pytest.mark.skipif(os.environ["TRITON_INTERPRET"] != "1", reason="the CPU run of FP8 kernels")
@pytest.mark.parametrize("name", ["bamba"])
def test_two_ranks_in_fp8_give_one_ranks_tokens(tmp_path, name):
    """``--quantization fp8`` over two ranks: each rank's in_proj rows (its z, x, B, C and dt
    parts) and out_proj columns quantized as one rank's (`parallel_linear.fp8_rows`); the
    tokens of one rank's FP8 engine, the prompts' logits close (each rank scales its slice of a
    row-parallel input by its own amax, as vLLM)."""
    orig, _, _ = write_fp8_hybrid(tmp_path, name)
    args = dict(quantization="fp8", **GEMM)
    one, two_logits = [], []
    want = greedy(LLM(loaded=load_model(str(orig)), **args), 3, first=one)
    with LLM(str(orig), loaded=load_model(str(orig)), tensor_parallel_size=2, **args) as two:
        assert greedy(two, 3, first=two_logits) == want
    one, two_logits = torch.stack(one), torch.stack(two_logits)
    assert (one - two_logits).abs().max() < 0.05 * one.abs().max()
