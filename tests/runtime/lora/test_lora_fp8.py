"""LoRA adapters on an FP8 base (``--quantization fp8``: the decoder's linears in the FP8 GEMM,
here under Triton's interpreter): the base output is the FP8 GEMM's, the adapter's product is
computed in the model's dtype on the unquantized input and added (`lora/layer.py`).

* a zero adapter (B = 0) gives the FP8 base's tokens and logits bit for bit;
* at a layer, the wrapped FP8 layer's output minus the FP8 GEMM's alone is x A^T B^T (scaled)
  computed by hand from the adapter's files, in each mode, part by part (q/k/v, gate/up);
* a mixed batch (two adapters and the base) gives each request's logits alone, bit for bit.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import numpy as np
import pytest
import torch
from fp8_testlib import PROMPTS
from lora_testlib import ADAPTERS, make_adapter, make_base
from pagoda.runtime import LLM, LoRARequest, SamplingParams
from pagoda.runtime.lora.layer import MODES
from pagoda.runtime.lora.slots import WRAPPED
from safetensors.torch import load_file, save_file

pytestmark = pytest.mark.skipif(
    os.environ["TRITON_INTERPRET"] != "1",
    reason="the CPU run of the FP8 GEMM needs TRITON_INTERPRET=1",
)
STEPS = 3
ENGINE = dict(dtype="float32", quantization="fp8", kv_cache_memory=2 << 20,
              max_num_batched_tokens=16, max_num_seqs=4)  # fmt: skip


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
    """The FP8 base with and without --enable-lora, and the runs the tests compare: the base
    alone; a zero adapter beside the base; a1, the base and a2 in one batch; a1 and a2 alone."""
    root = tmp_path_factory.mktemp("lora-fp8")
    base = make_base(root / "base")
    reqs = {}
    for i, (name, r, alpha, targets, rslora) in enumerate(ADAPTERS):
        make_adapter(base, root / name, r, alpha, targets, rslora, seed=i)
        reqs[name] = LoRARequest(name, i + 1, str(root / name))
    zero = root / "zero"  # a1 with B = 0: A random, the product zero
    zero.mkdir()
    (zero / "adapter_config.json").write_bytes((root / "a1" / "adapter_config.json").read_bytes())
    t = load_file(str(root / "a1" / "adapter_model.safetensors"))
    save_file({k: torch.zeros_like(v) if "lora_B" in k else v for k, v in t.items()},
              str(zero / "adapter_model.safetensors"))  # fmt: skip
    reqs["zero"] = LoRARequest("zero", 3, str(zero))
    plain = LLM(str(root / "base"), **ENGINE)
    llm = LLM(str(root / "base"), enable_lora=True, max_loras=3, max_lora_rank=8, **ENGINE)
    a1, a2, z = reqs["a1"], reqs["a2"], reqs["zero"]
    runs = {"base": _run(plain, PROMPTS, None), "zero": _run(llm, PROMPTS, [z, None, z]),
            "mixed": _run(llm, PROMPTS, [a1, None, a2]),
            "a1": _run(llm, PROMPTS[:1], a1), "a2": _run(llm, PROMPTS[2:], a2)}  # fmt: skip
    return llm, root, reqs, runs


def test_the_adapters_wrap_fp8_layers(served):
    from pagoda.runtime.model.fp8_linear import Fp8Linear

    llm, *_ = served
    layer = llm.engine.runner.model.layers[0]
    for w in (layer.qkv, layer.o_proj, layer.mlp.gate_up, layer.mlp.down):
        assert type(w).__name__ == "LoRALinear" and isinstance(w.base, Fp8Linear)


def test_zero_adapter_is_the_fp8_base_bit_for_bit(served):
    """B = 0: the adapter's path runs (its rows and the base row beside them) and adds exact
    zeros to the FP8 GEMM's output: tokens and every step's logits are the FP8 base's."""
    *_, runs = served
    for (tokens, logits), (want, want_logits) in zip(runs["zero"], runs["base"]):
        assert tokens == want and torch.equal(logits, want_logits)


def test_mixed_batch_matches_each_alone(served):
    """a1, the base and a2 in one batch (the longest prompt chunked beside the others): each
    request's logits are its own alone, bit for bit (the FP8 GEMM and the dense mode's matmuls
    are row-invariant), and the adapters change them."""
    *_, runs = served
    (t1, l1), (tb, lb), (t2, l2) = runs["mixed"]
    assert (t1, tb, t2) == (runs["a1"][0][0], runs["base"][1][0], runs["a2"][0][0])
    assert torch.equal(l1, runs["a1"][0][1]) and torch.equal(l2, runs["a2"][0][1])
    assert torch.equal(lb, runs["base"][1][1])
    for (_, got), (_, base) in ((runs["a1"][0], runs["base"][0]), (runs["a2"][0], runs["base"][2])):
        assert (got - base).abs().max() > 0.1


def _hand_delta(root, req: LoRARequest, layer: int, module: str, x: torch.Tensor):
    """x A^T B^T times the adapter's scaling (alpha / r, or alpha / sqrt(r) with rslora), from
    its safetensors and config as peft writes them; None where it does not target `module`."""
    import json

    cfg = json.loads((root / req.lora_name / "adapter_config.json").read_text())
    t = load_file(str(root / req.lora_name / "adapter_model.safetensors"))
    block = "mlp" if module in ("gate_proj", "up_proj", "down_proj") else "self_attn"
    key = f"base_model.model.model.layers.{layer}.{block}.{module}"
    if f"{key}.lora_A.weight" not in t:
        return None
    a, b, r = t[f"{key}.lora_A.weight"], t[f"{key}.lora_B.weight"], cfg["r"]
    scale = cfg["lora_alpha"] / (r**0.5 if cfg.get("use_rslora") else r)
    return (x.double() @ a.double().T @ b.double().T * scale).float()


@pytest.mark.parametrize("mode", MODES)
def test_adapter_delta_at_a_layer_is_x_a_b(served, mode):
    """Layer 1's four wrapped FP8 linears on tokens of a1, the base and a2: the output minus
    the FP8 GEMM's (`base(x)`) is each token's adapter product on its parts' columns, by hand
    in float64 from x, A and B. Tolerance: the float32 products' rounding (K <= 128 terms of
    |x| ~ 1) and the add's, y = base + delta rounded once more: ~1e-6 of the base's values;
    2e-5 of them holds it with room. The base token's rows are the GEMM's bit for bit."""
    llm, root, reqs, _ = served
    slots = llm.engine.runner.lora
    slot = {n: slots.slot_of[reqs[n].lora_int_id] for n in ("a1", "a2")}
    index = np.array([slot["a1"], 0, slot["a2"], slot["a1"], slot["a2"]])
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
            for lo, name in zip((lo for lo, _ in w.bounds), names):
                for row, s in enumerate(index):
                    n = {slot["a1"]: "a1", slot["a2"]: "a2"}.get(int(s))
                    d = None if n is None else _hand_delta(root, reqs[n], 1, name, x[row : row + 1])
                    if d is not None:
                        want[row, lo : lo + d.shape[1]] = d[0]
            assert want.abs().max() > 0.1, first
            tol = 2e-5 * base.abs().max().item()
            torch.testing.assert_close(got, want, atol=tol, rtol=0)
            assert torch.equal(got[1], torch.zeros_like(got[1]))  # the base token
    finally:
        slots.step.mode = "dense"
        slots.device_step(None, torch.as_tensor)
