"""Decode throughput on nano-vllm's workload, with the step time against the memory floor.

Workload (nano-vllm's bench.py): 256 requests of random token ids, input and output lengths
uniform in 100-1024, temperature 0.6, ignore_eos. The model is a Llama of the chosen shape with
random weights (vocab 32k) written to a temporary Hugging Face directory, so nothing is
downloaded. Reported: output tok/s; the median decode step at full batch against the memory
floor of such a step (weights plus the K/V it reads, at the copy bandwidth measured here); and
HF transformers `generate` on the same model and requests as a floor baseline.

`--shape qwen3-30b-a3b` is a mixture-of-experts model of Qwen3-30B-A3B's shape (48 layers,
128 experts, top-8). Its 61 GB of random weights are drawn on the GPU as the engine reads them
(no checkpoint is written, so there is no HF baseline). Its floor counts the experts a
full batch activates (expected distinct experts under uniform routing, all 128 at 256
sequences). `--tune-moe` first sweeps the fused-MoE launch configs for that expert shape
(`runtime/tune/moe.py`, as `pagoda tune` does) and runs again with them: the packaged defaults
and the tuned configs side by side.

    python -P benchmarks/gpu_throughput.py --shape 1b        # on a GPU node
    python -P benchmarks/gpu_throughput.py --shape qwen3-30b-a3b --tune-moe --hf-requests 0
    python -P benchmarks/gpu_throughput.py --tiny            # CPU smoke run (seconds)
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch (and OpenMP) load

import argparse
import gc
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, random_weight_model, write_random_model
from kernel_profile import KernelProfile, print_top
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model.loader import load_model

_LLAMA = dict(vocab_size=32000, max_position_embeddings=4096, rope_theta=500000.0)
SHAPES = {
    "1b": dict(  # Llama-3.2-1B
        _LLAMA,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        tie_word_embeddings=True,
    ),
    "8b": dict(  # Llama-3.1-8B
        _LLAMA,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
    ),
    "qwen3-30b-a3b": dict(  # Qwen3-30B-A3B: 30.5B parameters, 3.3B active per token
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_experts=128,
        num_experts_per_tok=8,
        norm_topk_prob=True,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        max_position_embeddings=4096,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
    ),
    "tiny-moe": dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
    ),
    "tiny": dict(
        _LLAMA,
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,  # as the 1b shape
    ),
}

ARCHITECTURES = {"qwen3-30b-a3b": "Qwen3MoeForCausalLM", "tiny-moe": "Qwen3MoeForCausalLM"}
LAZY_WEIGHTS_BYTES = 16 << 30  # larger models draw their weights on the device, unwritten


# Engine options run beside the defaults (`--also-NAME`): the flag they stand for, the kwargs.
VARIANTS = {
    "fast": ("--no-batch-invariant", dict(batch_invariant=False)),
    "sync": ("--no-async-scheduling", dict(async_scheduling=False)),
    "async": ("--async-scheduling", dict(async_scheduling=True)),
    # FP8 weights (quantized at load) and FP8 KV cache: issue 39's target is >= 1.5x the
    # default's output tok/s at the 8b shape on Hopper
    "fp8": ("--quantization fp8 --kv-cache-dtype fp8",
            dict(quantization="fp8", kv_cache_dtype="fp8")),
}  # fmt: skip
PHASE_STEPS = (200, 230)  # steps whose phases are timed (mid-run: a full batch of decodes)


def workload(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[tuple[list[int], int]]:
    """(prompt token ids, output length) pairs, lengths uniform in [lo, hi] as in nano-vllm."""
    rng = random.Random(seed)
    return [
        ([rng.randrange(vocab) for _ in range(rng.randint(lo, hi))], rng.randint(lo, hi))
        for _ in range(n)
    ]


def copy_bandwidth(device: torch.device) -> float:
    """Bytes/s of a large device-to-device copy (read + write), best of a few."""
    n = (1 << 30) if device.type == "cuda" else (1 << 26)
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(5):
        sync(device)
        t = time.perf_counter()
        b.copy_(a)
        sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n / best


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_pagoda(loaded, reqs, args, prof: KernelProfile | None = None, **engine_kw) -> dict:
    llm = LLM(
        loaded=loaded,
        **engine_kw,
        kv_cache_memory=int(args.kv_cache_gib * (1 << 30)),
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=2 * args.max_len + 1,
    )
    llm.generate([reqs[0][0][:8]], SamplingParams(max_tokens=4))  # warm-up (compiles, graphs)
    engine = llm.engine
    kv_tokens = engine.runner.num_blocks * engine.runner.block_size  # what the fixed budget holds
    for i, (ids, out_len) in enumerate(reqs):
        p = SamplingParams(temperature=0.6, max_tokens=out_len, ignore_eos=True)
        engine.add_request(f"b{i}", ids, p)
    steps, n_out, phases = [], 0, {}
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        if len(steps) == PHASE_STEPS[0]:  # a window of synchronised, per-phase timed steps
            clock = engine.enable_step_clock()
        elif len(steps) == PHASE_STEPS[1]:
            phases, engine.clock = clock.per_step_ms(), None
            engine.runner.clock = None
        running = engine.scheduler.running
        all_decode = not engine.scheduler.waiting and all(
            r.num_tokens + r.num_pending - r.num_computed_tokens == 1 for r in running
        )
        context = sum(r.num_tokens for r in running)
        if prof is not None:
            prof.before_step(len(steps))
        t = time.perf_counter()
        outs = engine.step()
        steps.append((all_decode, len(running), context, time.perf_counter() - t))
        n_out += sum(len(o.new_token_ids) for o in outs)
        if prof is not None:
            prof.after_step(len(steps) - 1)
    wall = time.perf_counter() - t0
    if prof is not None:
        prof.after_step(-1)  # a run shorter than the window
    full = max((s[1] for s in steps if s[0]), default=0)
    at_full = [s for s in steps if s[0] and s[1] >= 0.9 * full]
    return {
        "seconds": wall,
        "output_tokens": n_out,
        "tok_s": n_out / wall,
        "full_batch": full,
        "step_ms": 1e3 * statistics.median(s[3] for s in at_full) if at_full else float("nan"),
        "context": statistics.median(s[2] for s in at_full) if at_full else 0,
        "num_steps": len(steps),
        "phases_ms": phases,
        "kv_tokens": kv_tokens,
    }


def active_experts(cfg: dict, batch: int) -> float:
    """Expected distinct experts per layer that `batch` tokens route to, each picking top-k of
    E uniformly: E (1 - (1 - k/E)^batch). 0 for a dense model."""
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or 0
    if not experts:
        return 0.0
    return experts * (1.0 - (1.0 - cfg["num_experts_per_tok"] / experts) ** max(batch, 1))


def memory_floor_ms(
    cfg: dict, dtype_bytes: int, context_tokens: float, bandwidth: float, batch: int = 1
) -> float:
    """Milliseconds to read every weight a step of `batch` sequences touches once (an MoE
    layer: the router and the active experts) plus the K/V of `context_tokens` tokens."""
    h, v, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    d = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    mlp = 3 * h * cfg["intermediate_size"]
    if active_experts(cfg, batch):
        n = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
        experts = cfg.get("num_experts") or cfg["num_local_experts"]
        mlp = h * experts + active_experts(cfg, batch) * 3 * h * n
    layer = h * (q + 2 * kv) + q * h + mlp
    weights = (L * layer + v * h) * dtype_bytes  # the LM head; embedding rows are gathered
    kv_bytes = context_tokens * L * 2 * kv * dtype_bytes
    return 1e3 * (weights + kv_bytes) / bandwidth


def run_hf(path: Path, reqs, batch: int, device: torch.device, dtype: torch.dtype) -> dict:
    """HF `generate`, length-sorted left-padded batches; each batch generates its longest
    output for every row (no per-row lengths), and only the requested tokens count."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    model.eval()
    order = sorted(reqs, key=lambda r: len(r[0]))
    n_out, t = 0, time.perf_counter()
    for s in range(0, len(order), batch):
        group = order[s : s + batch]
        width = max(len(p) for p, _ in group)
        ids = torch.tensor([[0] * (width - len(p)) + p for p, _ in group], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in group])
        new = max(o for _, o in group)
        with torch.no_grad():
            model.generate(
                input_ids=ids,
                attention_mask=mask.to(device),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=True,
                temperature=0.6,
                top_k=0,
                top_p=1.0,
                pad_token_id=0,
            )
        n_out += sum(o for _, o in group)
    sync(device)
    dt = time.perf_counter() - t
    return {"seconds": dt, "output_tokens": n_out, "tok_s": n_out / dt}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    ap.add_argument(
        "--tiny",
        action="store_true",
        help="CPU smoke run: tiny shape (tiny-moe for an MoE --shape), few requests",
    )
    ap.add_argument(
        "--tune-moe",
        action="store_true",
        help="MoE shapes on CUDA: sweep the fused-MoE configs for the expert shape first, then "
        "run again with them beside the packaged defaults",
    )
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--min-len", type=int, default=100)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=16384)
    ap.add_argument("--hf-requests", type=int, default=64, help="requests for HF (0: skip)")
    ap.add_argument("--hf-batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--kv-cache-gib",
        type=float,
        default=32.0,
        help="KV cache per engine (fixed, so two engines in one process get the same)",
    )
    for name, (flag, _) in VARIANTS.items():
        ap.add_argument(f"--also-{name}", action="store_true", help=f"also run with {flag}")
    ap.add_argument(
        "--kernel-profile",
        type=int,
        default=0,
        metavar="STEPS",
        help="torch.profiler over STEPS full-batch steps after the phase window: top kernels",
    )
    ap.add_argument(
        "--kernel-config-dir",
        metavar="DIR",
        help="also run the defaults with kernel configs searched in DIR first (a `pagoda tune` "
        "output folder), to see what tuning gains",
    )
    args = ap.parse_args(argv)
    if args.tune_moe and args.kernel_config_dir:
        ap.error("--tune-moe writes its own config directory; drop --kernel-config-dir")
    if args.tune_moe and args.shape not in ARCHITECTURES:
        ap.error(f"--tune-moe needs an MoE --shape ({', '.join(ARCHITECTURES)})")
    if args.tiny:
        args.shape = "tiny-moe" if args.shape in ARCHITECTURES else "tiny"
        args.num_requests, args.min_len, args.max_len = 8, 8, 32
        args.max_num_seqs, args.max_num_batched_tokens = 8, 256
        args.kv_cache_gib = 0.0625
        args.hf_requests, args.hf_batch = min(args.hf_requests, 4), 4
    return args


def _profiled_run(loaded, reqs, args, label: str, **engine_kw) -> dict:
    """`run_pagoda`, with the kernel profile of `--kernel-profile` printed under `label`."""
    start = 2 if args.tiny else PHASE_STEPS[1] + 5
    prof = KernelProfile(start, args.kernel_profile, _device()) if args.kernel_profile else None
    res = run_pagoda(loaded, reqs, args, prof, **engine_kw)
    if prof is not None:
        res["kernels"] = prof.top()
        print_top(res["kernels"], prof.steps, f"steps from {start}, {label}")
    return res


def _variant(loaded, reqs, args, default: dict, flag: str, **engine_kw) -> dict:
    """Run the workload again with one engine option changed; print it beside the default."""
    other = _profiled_run(loaded, reqs, args, flag, **engine_kw)
    print(
        f"Pagoda {flag}: {other['tok_s']:.1f} tok/s, {other['step_ms']:.2f} ms/step at "
        f"{other['full_batch']} running (defaults: {default['tok_s']:.1f} tok/s, "
        f"{default['step_ms']:.2f} ms) -> {other['tok_s'] / default['tok_s']:.2f}x; KV cache "
        f"{other['kv_tokens']} tokens in {args.kv_cache_gib:g} GiB (defaults: "
        f"{default['kv_tokens']})"
    )
    if other["phases_ms"]:
        parts = ", ".join(f"{k} {v:.2f}" for k, v in other["phases_ms"].items())
        print(f"  {flag} phases (ms/step): {parts}")
    gc.collect()
    return other


def _tuned_variant(loaded, reqs, args, default: dict) -> dict:
    """The defaults again with the kernel configs of ``args.kernel_config_dir`` searched first."""
    from pagoda.kernels.config import set_config_dirs

    before = set_config_dirs([args.kernel_config_dir])
    try:
        return _variant(loaded, reqs, args, default, f"kernels from {args.kernel_config_dir}")
    finally:
        set_config_dirs(before)


def kv_capacity_line(mc, dtype: torch.dtype, device: torch.device, args) -> str:
    """KV tokens one engine would get here with the default budget (gpu_memory_utilization 0.9
    of this GPU, less the weights and headroom, as the runner computes it), bf16 vs FP8 weights
    and KV (`pagoda.runtime.server.fit.Plan`'s sizes)."""
    from pagoda.runtime.server.fit import Plan
    from pagoda.runtime.server.memory import GPU_HEADROOM

    total = torch.cuda.get_device_properties(device).total_memory
    parts = []
    for name, fp8 in (("bf16", False), ("fp8", True)):
        plan = Plan(dtype, fp8, fp8, 1, 2 * args.max_len + 1)
        room = int(total * 0.9) - plan.weight_bytes(mc) - GPU_HEADROOM
        parts.append(f"{name} {room // plan.kv_bytes_per_token(mc)} tokens "
                     f"(weights {plan.weight_bytes(mc) / 2**30:.1f} GiB)")  # fmt: skip
    return f"KV capacity at the default budget on this GPU (computed): {', '.join(parts)}"


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _load(path: Path, args, cfg: dict, dtype: torch.dtype, device: torch.device):
    """(the model, whether HF can load it): a checkpoint written to `path`, or for models over
    `LAZY_WEIGHTS_BYTES` random weights drawn on the device as the engine reads them."""
    from common import checkpoint_shapes

    arch = ARCHITECTURES.get(args.shape, "LlamaForCausalLM")
    size = sum(s.numel() for s in checkpoint_shapes(cfg, arch).values()) * dtype.itemsize
    if size > LAZY_WEIGHTS_BYTES:
        print(f"{size / 1e9:.1f} GB of random weights drawn on {device}, not written")
        return random_weight_model(path, cfg, arch, dtype, device), False
    write_random_model(path, cfg, dtype, arch)
    gc.collect()
    return load_model(str(path)), True


def _tune_moe(args, cfg: dict, dtype: torch.dtype, device: torch.device, out: Path) -> None:
    """The fused-MoE sweep of `pagoda tune` for this shape alone, saved under `out`."""
    from pagoda.kernels.config import device_name
    from pagoda.runtime.tune.moe import MoeShape, write_moe_configs
    from pagoda.runtime.tune.sweep import cuda_graph_timer

    if device.type != "cuda":
        print("--tune-moe: skipped, no CUDA device (the interpreter is no timing target)")
        return
    moe = MoeShape(
        cfg["num_experts"], cfg["moe_intermediate_size"], cfg["hidden_size"],
        cfg["num_experts_per_tok"],
    )  # fmt: skip
    t = time.perf_counter()
    reports = write_moe_configs(
        moe, dtype, device, out, label=device_name(device), timer=cuda_graph_timer,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
    )  # fmt: skip
    for r in reports:
        print(
            f"fused_moe {r['shape']}: default {r['default_ms']} ms, tuned {r['median_ms']} ms "
            f"({r['speedup']}x) with {r['config']}; {len(r['rejected'])}/{r['candidates']} "
            f"rejected [{time.perf_counter() - t:.0f} s]"
        )
    args.kernel_config_dir = str(out)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    device = _device()
    dtype = torch.bfloat16
    cfg = SHAPES[args.shape]
    print(f"machine: {machine()}")
    print(f"shape {args.shape}: {cfg}")
    reqs = workload(args.num_requests, args.min_len, args.max_len, cfg["vocab_size"], args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model"
        path.mkdir()
        loaded, hf_readable = _load(path, args, cfg, dtype, device)
        if args.tune_moe:
            _tune_moe(args, cfg, dtype, device, Path(tmp) / "configs")
        res = _profiled_run(loaded, reqs, args, "defaults")
        gc.collect()
        for name, (flag, kw) in VARIANTS.items():
            if getattr(args, f"also_{name}"):
                res[name] = _variant(loaded, reqs, args, res, flag, **kw)
        if args.kernel_config_dir:
            res["tuned"] = _tuned_variant(loaded, reqs, args, res)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        bw = copy_bandwidth(device)
        floor = memory_floor_ms(cfg, 2, res["context"], bw, batch=res["full_batch"])
        print(
            f"Pagoda: {res['output_tokens']} output tokens in {res['seconds']:.2f} s = "
            f"{res['tok_s']:.1f} tok/s ({res['num_steps']} steps)"
        )
        if device.type == "cuda":
            print(kv_capacity_line(loaded.config, dtype, device, args))
        active = active_experts(cfg, res["full_batch"])
        experts = f", {active:.1f} experts active per layer" if active else ""
        print(
            f"steady state at {res['full_batch']} running: {res['step_ms']:.2f} ms/step; memory "
            f"floor {floor:.2f} ms ({res['context']:.0f} context tokens{experts}, "
            f"{bw / 1e9:.0f} GB/s copy bandwidth) -> {res['step_ms'] / floor:.2f}x the floor"
        )
        for name in ("tuned", "fast"):
            if name in res:
                other = res[name]
                print(f"  {name}: {other['step_ms']:.2f} ms/step -> "
                      f"{other['step_ms'] / floor:.2f}x the floor")  # fmt: skip
        res.update(floor_ms=floor, bandwidth=bw, active_experts=active)
        if res["phases_ms"]:
            parts = ", ".join(f"{k} {v:.2f}" for k, v in res["phases_ms"].items())
            print(f"phases of steps {PHASE_STEPS} (ms/step, device synced at each mark): {parts}")
        if args.hf_requests and not hf_readable:
            print("HF generate: skipped (the weights were never written)")
        elif args.hf_requests:
            hf = run_hf(path, reqs[: args.hf_requests], args.hf_batch, device, dtype)
            print(
                f"HF generate (batch {args.hf_batch}, first {args.hf_requests} requests): "
                f"{hf['tok_s']:.1f} tok/s -> Pagoda {res['tok_s'] / hf['tok_s']:.2f}x"
            )
            res["hf_tok_s"] = hf["tok_s"]
    return res


if __name__ == "__main__":
    main()
