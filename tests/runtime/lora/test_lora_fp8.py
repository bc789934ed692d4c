"""LoRA adapters on an FP8 base (``--quantization fp8``: the decoder's linears in the FP8 GEMM,
here under Triton's interpreter): the base output is the FP8 GEMM's, the adapter's product is
computed in the model's dtype on the unquantized input and added (`lora/layer.py`).

* a zero adapter (B = 0) gives the FP8 base's tokens and logits bit for bit;
* at a layer, the wrapped FP8 layer's output minus the FP8 GEMM's alone is x A^T B^T (scaled)
  computed by hand from the adapter's files, in each mode, part by part (q/k/v, gate/up);
* a mixed batch (two adapters and the base) gives each request's logits alone, bit for bit;
* an FP8 checkpoint (per-channel scales) takes adapters as online FP8 does, bit for bit;
* end to end, the prompt's logits are within FP8's activation error of peft's over the FP8
  weights dequantized.
Block-wise FP8 checkpoints are dequantized at load (`quantization/fp8.py`): plain layers, as
`test_lora_oracle.py` tests.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import numpy as np
import pytest
import torch
from fp8_testlib import PROMPTS, write_fp8_pair
from lora_testlib import ADAPTERS, make_adapter
from pagoda.runtime import LLM, LoRARequest, SamplingParams
from pagoda.runtime.lora.layer import MODES
from pagoda.runtime.lora.slots import WRAPPED
from safetensors.torch import load_file, save_file

pytestmark = pytest.mark.skipif(
    os.environ["TRITON_INTERPRET"] != "1",
    reason="the CPU run of the FP8 GEMM needs TRITON_INTERPRET=1",
)
STEPS = 2  # the prompt's step and a decode step (the KV cache read back)
ENGINE = dict(dtype="float32", kv_cache_memory=2 << 20, max_num_batched_tokens=16, max_num_seqs=4)


def _run(llm: LLM, prompts, loras) -> list[tuple[list[int], torch.Tensor]]:
    """(greedy tokens, every step's logits [STEPS, vocab]) per prompt."""
    seen: dict[str, list[torch.Tensor]] = {}
    llm.engine.runner.logits_hook = lambda reqs, rows: [
        seen.setdefault(r.request_id, []).append(row.float().clone()) for r, row in zip(reqs, rows)
    ]
    p = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True)
    outs = llm.generate(prompts, p, use_tqdm=False, lora_request=loras)
    return [(o.outputs[0].token_ids, torch.stack(seen[o.request_id])) for o in outs]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The tiny Llama with ``quantization="fp8"``, with and without --enable-lora, and its FP8
    checkpoint (`fp8_testlib.write_fp8_pair`: the same E4M3 codes and scales) with it; the runs
    the tests compare: the base alone; a1, a2, the base and a zero adapter in one batch; a1 and
    a2 alone; a1 alone on the checkpoint."""
    import transformers

    root = tmp_path_factory.mktemp("lora-fp8")
    orig, ckpt, deq = write_fp8_pair(root)
    base = transformers.AutoModelForCausalLM.from_pretrained(str(deq), dtype=torch.float32)
    reqs, peft = {}, {None: base}
    for i, (name, r, alpha, targets, rslora) in enumerate(ADAPTERS):
        peft[name] = make_adapter(base, root / name, r, alpha, targets, rslora, seed=i)
        reqs[name] = LoRARequest(name, i + 1, str(root / name))
    zero = root / "zero"  # a1 with B = 0: A random, the product zero
    zero.mkdir()
    (zero / "adapter_config.json").write_bytes((root / "a1" / "adapter_config.json").read_bytes())
    t = load_file(str(root / "a1" / "adapter_model.safetensors"))
    save_file({k: torch.zeros_like(v) if "lora_B" in k else v for k, v in t.items()},
              str(zero / "adapter_model.safetensors"))  # fmt: skip
    reqs["zero"] = LoRARequest("zero", 3, str(zero))
    lora = dict(enable_lora=True, max_loras=3, max_lora_rank=8, **ENGINE)
    plain = LLM(str(orig), quantization="fp8", **ENGINE)
    llm = LLM(str(orig), quantization="fp8", **lora)
    from_ckpt = LLM(str(ckpt), **lora)
    a1, a2, z = reqs["a1"], reqs["a2"], reqs["zero"]
    p0, p1, p2 = PROMPTS
    runs = {"base": _run(plain, PROMPTS, None),
            "mixed": _run(llm, [p0, p1, p2, p1], [a1, a2, None, z]),
            "a1": _run(llm, [p0], a1), "a2": _run(llm, [p1], a2),
            "checkpoint a1": _run(from_ckpt, [p0], a1)}  # fmt: skip
    return llm, from_ckpt, root, reqs, runs, peft


def test_the_adapters_wrap_fp8_layers(served):
    """Online FP8 and the FP8 checkpoint alike: every wrapped linear's base is the FP8 GEMM."""
    from pagoda.runtime.model.fp8_linear import Fp8Linear

    for llm in served[:2]:
        layer = llm.engine.runner.model.layers[0]
        for w in (layer.qkv, layer.o_proj, layer.mlp.gate_up, layer.mlp.down):
            assert type(w).__name__ == "LoRALinear" and isinstance(w.base, Fp8Linear)


def test_zero_adapter_and_base_rows_are_the_fp8_base_bit_for_bit(served):
    """B = 0: the adapter's path runs and adds exact zeros to the FP8 GEMM's output, and a base
    request beside adapters keeps its rows: tokens and every step's logits are those of the
    FP8 model without --enable-lora."""
    *_, runs, _ = served
    for got, want in ((runs["mixed"][3], runs["base"][1]), (runs["mixed"][2], runs["base"][2])):
        assert got[0] == want[0] and torch.equal(got[1], want[1])


def test_mixed_batch_matches_each_alone(served):
    """a1, a2, the base and the zero adapter in one batch (the longest prompt chunked beside
    the others): each adapter's request has its logits alone, bit for bit (the FP8 GEMM and
    the dense mode's matmuls are row-invariant), and the adapters change them."""
    *_, runs, _ = served
    for got, alone, base in ((runs["mixed"][0], runs["a1"][0], runs["base"][0]),
                             (runs["mixed"][1], runs["a2"][0], runs["base"][1])):  # fmt: skip
        assert got[0] == alone[0] and torch.equal(got[1], alone[1])
        assert (got[1] - base[1]).abs().max() > 0.1


def test_fp8_checkpoint_takes_adapters_as_online_fp8(served):
    """The FP8 checkpoint (per-channel scales, the codes ``quantization="fp8"`` makes of its
    original) with a1: the online FP8 model's tokens and logits with a1, bit for bit."""
    *_, runs, _ = served
    (got,), (want,) = runs["checkpoint a1"], runs["a1"]
    assert got[0] == want[0] and torch.equal(got[1], want[1])


def _hand_delta(adapter: dict, module: str, x: torch.Tensor):
    """x A^T B^T times the adapter's scaling (alpha / r, or alpha / sqrt(r) with rslora), in
    float64, from layer 1's tensors as peft writes them; None where it does not target
    `module`."""
    cfg, t = adapter
    block = "mlp" if module in ("gate_proj", "up_proj", "down_proj") else "self_attn"
    key = f"base_model.model.model.layers.1.{block}.{module}"
    if f"{key}.lora_A.weight" not in t:
        return None
    a, b, r = t[f"{key}.lora_A.weight"], t[f"{key}.lora_B.weight"], cfg["r"]
    scale = cfg["lora_alpha"] / (r**0.5 if cfg.get("use_rslora") else r)
    return (x.double() @ a.double().T @ b.double().T * scale).float()


@pytest.mark.parametrize("mode", MODES)
def test_adapter_delta_at_a_layer_is_x_a_b(served, mode):
    """Layer 1's four wrapped FP8 linears on tokens of a1, the base and a2: the output minus
    the FP8 GEMM's (`base(x)`) is each token's adapter product on its parts' columns, by hand
    in float64 from the unquantized x, A and B. Tolerance: the float32 shrink and expand
    (sums of K <= 128 terms: at most ~K x 6e-8 relative) and the add, y = base + delta rounded
    once (6e-8 of |y|): 1e-5 of max(|base| + |delta|) bounds both (measured: 3e-7 of it). An
    adapter fed the GEMM's E4M3-quantized x (off by up to 0.1 here) would miss by ~3e-2 of
    |delta|. The base token's rows are the GEMM's bit for bit."""
    llm, _, root, reqs, *_ = served
    slots = llm.engine.runner.lora
    slot = {n: slots.slot_of[reqs[n].lora_int_id] for n in ("a1", "a2")}
    index = np.array([slot["a1"], 0, slot["a2"], slot["a1"], slot["a2"]])
    files = {n: (json.loads((root / n / "adapter_config.json").read_text()),
                 load_file(str(root / n / "adapter_model.safetensors"))) for n in slot}  # fmt: skip
    slots.step.mode = mode
    slots.device_step(index, torch.as_tensor)
    try:
        layer = llm.engine.runner.model.layers[1]
        wrapped = {"q_proj": layer.qkv, "o_proj": layer.o_proj,
                   "gate_proj": layer.mlp.gate_up, "down_proj": layer.mlp.down}  # fmt: skip
        g = torch.Generator().manual_seed(0)
        for first, names in WRAPPED.items():
            w = wrapped[first]
            x = torch.randn(len(index), w.a.shape[2], generator=g)
            base = w.base(x)
            got = w(x) - base
            want = torch.zeros_like(got)
            for (lo, hi), name in zip(w.bounds, names):
                for n, adapter in files.items():
                    rows = torch.from_numpy(index == slot[n])
                    d = _hand_delta(adapter, name, x[rows])
                    if d is not None:
                        want[rows, lo:hi] = d
            assert want.abs().max() > 0.1, first
            tol = 1e-5 * (base.abs() + want.abs()).max().item()
            torch.testing.assert_close(got, want, atol=tol, rtol=0)
            assert torch.equal(got[1], torch.zeros_like(got[1]))  # the base token
    finally:
        slots.step.mode = "dense"
        slots.device_step(None, torch.as_tensor)


def test_prompt_logits_within_fp8_error_of_peft_on_the_dequantized_weights(served):
    """peft over the FP8 weights dequantized (transformers, float32; `write_fp8_pair`'s twin):
    the engine's logits at each prompt's last token (the same input on both sides) with a1, a2
    and no adapter are within FP8's activation error of peft's (relative L2). That error, the
    per-token E4M3 activations alone, is what the base row shows against its own dequantized
    model: 0.045 measured; bound 0.1. A missing or wrong adapter is off by more than 1 (the
    adapters move these logits by 1.2-1.5 of their norm, measured), so the bound tells."""
    from hf_oracle import hf_greedy_plain

    *_, runs, peft = served
    p0, p1, _ = PROMPTS
    first = {}
    for name, prompt, (_, got) in (("a1", p0, runs["a1"][0]), ("a2", p1, runs["a2"][0]),
                                   (None, p0, runs["base"][0])):  # fmt: skip
        want = hf_greedy_plain(peft[name], prompt, 1)[1][0]
        first[name] = want
        assert (got[0] - want).norm() / want.norm() < 0.1, name
    for name, prompt in (("a1", p0), ("a2", p1)):  # the adapter's effect: far beyond the bound
        base = hf_greedy_plain(peft[None], prompt, 1)[1][0]
        assert (first[name] - base).norm() / base.norm() > 1.0, name
