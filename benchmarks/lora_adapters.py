"""Multi-LoRA on the CPU, side by side in one run, on the embedded SmolLM2-135M:

1. The batched adapter product alone (`lora/layer.py`), one decoder layer's four wrapped
   linears at decode batch 8 and 32, the batch's rows spread over 4 adapters: every slot's
   product masked per token ("dense", the default), the gathered batched matmul ("bgmv") and
   the product grouped by adapter ("sgmv"), beside the base layers' own matmuls.
2. Engine output tok/s at batch 8 (greedy, ``--max-tokens`` each): an engine without
   ``--enable-lora``; one with it whose requests run no adapter; and every request on one of 4
   adapters (rank 16 on all seven projections, random weights), in each of the three modes.
   Engines alternate ``--reps`` times (the machine is shared), best run of each::

    OMP_WAIT_POLICY=PASSIVE python -P benchmarks/lora_adapters.py
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch (and OpenMP) load

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, markdown_table
from pagoda.runtime import LLM, LoRARequest, SamplingParams
from pagoda.runtime.lora.adapter import TARGETS, module_shapes
from pagoda.runtime.model.loader import load_model

QUESTIONS = ["Why is the sky blue?", "How do bees make honey?", "Explain how a rainbow forms.",
             "What should I pack for a hiking trip?"]  # fmt: skip


def write_adapter(path: Path, mc, rank: int, seed: int) -> None:
    """A PEFT adapter directory for `mc` (all seven projections, random A and B)."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(mc.num_layers):
        for module, (fin, fout) in module_shapes(mc).items():
            name = f"base_model.model.model.layers.{layer}.{TARGETS[module]}.{module}"
            tensors[f"{name}.lora_A.weight"] = torch.randn(rank, fin, generator=g) / fin**0.5
            tensors[f"{name}.lora_B.weight"] = torch.randn(fout, rank, generator=g) * 0.01
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    cfg = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(TARGETS)}
    (path / "adapter_config.json").write_text(json.dumps(cfg))


def _layer_times(wrapped, b: int, dtype: torch.dtype, reps: int) -> dict[str, float]:
    """ms of the base matmuls and of each product at batch `b` (best of `reps`, alternated)."""
    index = torch.arange(b) % 4 + 1  # the slots of 4 adapters, interleaved
    groups = [(s, torch.nonzero(index == s).flatten()) for s in range(1, 5)]
    slots = wrapped[0].a.shape[0]
    onehot = torch.nn.functional.one_hot(index, slots).to(dtype)[:, :, None]
    xs = [torch.randn(b, w.a.shape[2], dtype=dtype) for w in wrapped]
    ys = [w.base(x) for w, x in zip(wrapped, xs)]
    calls = {
        "base": lambda: [w.base(x) for w, x in zip(wrapped, xs)],
        "bgmv": lambda: [w._gathered(x, y, index) for w, x, y in zip(wrapped, xs, ys)],
        "sgmv": lambda: [w._grouped(x, y, groups) for w, x, y in zip(wrapped, xs, ys)],
        "dense": lambda: [w._dense(x, y, onehot) for w, x, y in zip(wrapped, xs, ys)],
    }
    times = dict.fromkeys(calls, float("inf"))
    for _ in range(reps):
        for name, call in calls.items():  # alternated: load changes hit all alike
            t = time.perf_counter()
            for _ in range(50):
                call()
            times[name] = min(times[name], (time.perf_counter() - t) / 50 * 1e3)
    return times


def product_costs(llm: LLM, batches: list[int], reps: int) -> list[list[object]]:
    """Part 1: ms per decoder layer of the base matmuls and of the adapters' product alone
    (`LoRALinear._dense`, `._gathered`, `._grouped`, into the base's output)."""
    runner = llm.engine.runner
    layer = runner.model.layers[0]
    wrapped = [layer.qkv, layer.o_proj, layer.mlp.gate_up, layer.mlp.down]
    rows = []
    with torch.inference_mode():
        for b in batches:
            t = _layer_times(wrapped, b, runner.dtype, reps)
            rows.append([b, f"{t['base']:.3f}", f"{t['dense']:.3f}", f"{t['bgmv']:.3f}",
                         f"{t['sgmv']:.3f}"])  # fmt: skip
    return rows


def run(llm: LLM, prompts, params, loras) -> tuple[float, list[list[int]]]:
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False, lora_request=loras)
    return time.perf_counter() - t, [o.outputs[0].token_ids for o in outs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--dtype", default="auto")
    args = ap.parse_args()
    print(machine())
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at start, {os.cpu_count()} CPUs")
    loaded = load_model("smollm2-135m")
    tmp = Path(tempfile.mkdtemp(prefix="pagoda-lora-bench-"))
    loras = []
    for i in range(4):
        write_adapter(tmp / f"a{i}", loaded.config, args.rank, i)
        loras.append(LoRARequest(f"a{i}", i + 1, str(tmp / f"a{i}")))
    common = dict(loaded=loaded, dtype=args.dtype, max_model_len=1024, max_num_seqs=args.batch,
                  kv_cache_memory=128 << 20)  # fmt: skip
    plain = LLM(**common)
    lora = LLM(**common, enable_lora=True, max_loras=4, max_lora_rank=args.rank)
    print(f"dtype {lora.engine.runner.dtype}")
    print("\n1. adapter product per decoder layer (4 wrapped linears, rows over 4 adapters), ms")
    print(markdown_table(["batch", "base matmuls", "dense", "bgmv", "sgmv"],
                         product_costs(lora, [8, 32], 3 * args.reps)))  # fmt: skip
    tok = loaded.tokenizer
    prompts = [tok.encode(f"<|im_start|>user\n{QUESTIONS[i % 4]}<|im_end|>\n<|im_start|>"
                          "assistant\n", add_special_tokens=False) for i in range(args.batch)]  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    four = [loras[i % 4] for i in range(args.batch)]
    cases = {"no --enable-lora": (plain, None, None), "--enable-lora, no adapter": (lora, None, None),
             "4 adapters, dense": (lora, four, "dense"), "4 adapters, bgmv": (lora, four, "bgmv"),
             "4 adapters, sgmv": (lora, four, "sgmv")}  # fmt: skip
    for llm, ls, _ in cases.values():  # warm
        run(llm, prompts[:2], SamplingParams(temperature=0, max_tokens=4), ls and ls[:2])
    best, outs = dict.fromkeys(cases, float("inf")), {}
    for _ in range(args.reps):
        for name, (llm, ls, mode) in cases.items():
            if mode is not None:
                llm.engine.runner.lora.step.mode = mode
            secs, outs[name] = run(llm, prompts, params, ls)
            best[name] = min(best[name], secs)
    lora.engine.runner.lora.step.mode = "dense"
    tokens = args.batch * args.max_tokens
    ref = best["no --enable-lora"]
    rows = [[name, tokens, f"{s:.2f}", f"{tokens / s:.1f}", f"{ref / s:.2f}x"]
            for name, s in best.items()]  # fmt: skip
    print(f"\n2. engine, batch {args.batch} x {args.max_tokens} greedy tokens, best of {args.reps}")
    print(markdown_table(["engine", "tokens", "s", "tok/s", "vs no LoRA"], rows))
    print("no-adapter tokens equal without LoRA:",
          outs["--enable-lora, no adapter"] == outs["no --enable-lora"])  # fmt: skip
    dense = outs["4 adapters, dense"]
    print("dense tokens equal bgmv's and sgmv's:",
          dense == outs["4 adapters, bgmv"] == outs["4 adapters, sgmv"])  # fmt: skip
    print("adapters change tokens:", dense != outs["no --enable-lora"])
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at end")


if __name__ == "__main__":
    main()
