"""DeepSeek's latent KV cache, before and after, on a tiny DeepSeek-V3-shaped model (CPU).

A random-weight `DeepseekV3ForCausalLM` with V3's attention widths (kv_lora_rank 512,
qk_rope_head_dim 64, qk_nope_head_dim 128, v_head_dim 128) but 16 heads (V3: 128), a 512-wide
q bottleneck (V3: 1536), 4 layers and 8 experts, so that it runs on a few CPU cores. Reported
for Pagoda as of now and as of ``--old-ref`` (a child process importing that commit's runtime,
alternating for ``--rounds`` rounds so that drift hits both alike):

* KV-cache bytes per token and the tokens a ``--kv-cache-mib`` budget holds;
* output tok/s of one batch: ``--batch`` prompts of ``--prompt-len`` random tokens,
  ``--output-len`` new tokens each (greedy, ignore_eos);
* seconds to prefill one ``--prefill-len``-token prompt (one output token).

``--forms`` instead times one layer's attention (V3's widths, 16 heads, bf16) in the two forms a
latent cache allows, on this tree: absorbed (the torch backend on the latent cache, with the
W_UK / W_UV products) against expanded per head (kv_b_proj over the latents, then the CPU
attention kernel on per-head K/V, or torch's SDPA), for one ``--prefill-len``-token prompt and
for a decode step of ``--batch`` x ``--decode-context``.

    .venv/bin/python -P benchmarks/mla_cache.py --old-ref REF    # ~6 min on 2 cores
    .venv/bin/python -P benchmarks/mla_cache.py --forms          # ~1 min
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch (docs/benchmarks.md)

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, markdown_table, write_random_model

V3_SHAPED = dict(
    vocab_size=8192, hidden_size=1024, intermediate_size=2048, num_hidden_layers=4,
    num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=512, q_lora_rank=512,
    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=8,
    num_experts_per_tok=2, n_group=4, topk_group=2, n_shared_experts=1,
    moe_intermediate_size=256, first_k_dense_replace=1, max_position_embeddings=4096,
)  # fmt: skip


def measure(path: str, args) -> dict:
    """One engine on the checkpoint at `path`: its cache size, a timed batch, a timed prefill
    (public API and attributes only: the old commit has them too)."""
    import pagoda.runtime
    from pagoda.runtime import LLM, SamplingParams

    llm = LLM(path, dtype=args.dtype, kv_cache_memory=args.kv_cache_mib << 20,
              max_num_seqs=args.batch, max_num_batched_tokens=2048)  # fmt: skip
    runner = llm.engine.runner
    row = {
        "bytes_per_token": runner.bytes_per_block // runner.block_size,
        "cache_tokens": runner.num_blocks * runner.block_size,
        "runtime": str(Path(pagoda.runtime.__file__).resolve().parent),
    }
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(
        3, V3_SHAPED["vocab_size"], (args.batch + 1, args.prefill_len), generator=gen
    )
    prompts = [{"prompt_token_ids": p[: args.prompt_len].tolist()} for p in ids[1:]]
    llm.generate(prompts[:1], SamplingParams(max_tokens=2))  # warm-up
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    t = time.perf_counter()
    outs = llm.generate(prompts, params)
    row["tok_s"] = sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t)
    t = time.perf_counter()
    llm.generate([{"prompt_token_ids": ids[0].tolist()}], SamplingParams(max_tokens=1))
    row["prefill_s"] = time.perf_counter() - t
    return row


def attention_forms(args) -> None:
    """`--forms` (module docstring): best of 3 per form, after one untimed call."""
    import torch.nn.functional as F
    from pagoda.runtime.attention import AttentionMetadata, get_attention_backend

    h, c, r = V3_SHAPED["num_attention_heads"], V3_SHAPED["kv_lora_rank"], 64
    n, v, bs, dt, cpu = 128, 128, 16, torch.bfloat16, torch.device("cpu")
    scale = (n + r) ** -0.5
    w_kv_b = torch.randn(h * (n + v), c, dtype=dt) * 0.05
    w_uk = w_kv_b.view(h, n + v, c)[:, :n].contiguous()
    w_uv = w_kv_b.view(h, n + v, c)[:, n:].transpose(1, 2).contiguous()

    def case(seqs: int, context: int, new: int):
        per = context // bs + 1
        tables = torch.arange(seqs * per, dtype=torch.int32).view(seqs, per)
        pos = torch.arange(context - new, context)
        slots = (tables[:, pos // bs] * bs + pos % bs).reshape(-1).long()
        t = seqs * new
        meta = dict(num_seqs=seqs, num_decodes=seqs if new == 1 else 0, num_tokens=t,
                    max_query_len=new, max_seq_len=context,
                    query_start_loc=torch.arange(seqs + 1, dtype=torch.int32) * new,
                    seq_lens=torch.full((seqs,), context, dtype=torch.int32),
                    block_tables=tables, slot_mapping=slots, block_size=bs,
                    query_lens_host=[new] * seqs, seq_lens_host=[context] * seqs)  # fmt: skip
        q, rows = torch.randn(t, h, n + r, dtype=dt), torch.randn(t, c + r, dtype=dt)
        absorbed_b = get_attention_backend("torch", cpu, h, 1, c + r, scale, latent=c)
        expanded_b = get_attention_backend("torch", cpu, h, h, n + r, scale)
        caches = {b: b.allocate_kv_cache(seqs * per, bs, dt, cpu) for b in (absorbed_b, expanded_b)}
        for k_cache, v_cache in caches.values():  # the context before the new tokens
            k_cache.normal_(), v_cache.normal_()

        def absorbed():
            m = AttentionMetadata(**meta)
            absorbed_b.prepare(m)
            qf = q.new_empty(t, h, c + r)
            qf[..., :c] = torch.bmm(q[..., :n].transpose(0, 1), w_uk).transpose(0, 1)
            qf[..., c:] = q[..., n:]
            o = absorbed_b.forward(qf, rows[:, None], rows[:, None], *caches[absorbed_b], m)
            return torch.bmm(o.transpose(0, 1), w_uv)

        def per_head():
            kv = (rows[:, :c] @ w_kv_b.T).view(t, h, n + v)
            k = torch.cat([kv[..., :n], rows[:, None, c:].expand(t, h, r)], dim=-1)
            return k, kv[..., n:]

        def expanded_kernel():
            m = AttentionMetadata(**meta)
            expanded_b.prepare(m)
            k, val = per_head()
            return expanded_b.forward(q, k, F.pad(val, (0, n + r - v)), *caches[expanded_b], m)

        def expanded_sdpa():  # a fresh prompt only: its keys are the step's
            k, val = per_head()
            return F.scaled_dot_product_attention(
                q.transpose(0, 1), k.transpose(0, 1), val.transpose(0, 1), is_causal=True,
                scale=scale)  # fmt: skip

        forms = {"absorbed (latent cache)": absorbed,
                 "expanded (CPU attention kernel)": expanded_kernel}  # fmt: skip
        if seqs == 1 and new == context:
            forms["expanded (SDPA)"] = expanded_sdpa
        out = []
        for name, fn in forms.items():
            fn()
            times = []
            for _ in range(3):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            out.append((name, min(times) * 1e3))
        return out

    rows_out = []
    for what, shape in ((f"prefill {args.prefill_len}", (1, args.prefill_len, args.prefill_len)),
                        (f"decode {args.batch} x {args.decode_context}",
                         (args.batch, args.decode_context, 1))):  # fmt: skip
        for name, ms in case(*shape):
            rows_out.append([what, name, f"{ms:.1f}"])
    print(markdown_table(["one layer's attention", "form", "ms (best of 3)"], rows_out))


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--old-ref", help="also run Pagoda as of this git commit (before/after)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--prefill-len", type=int, default=2048)
    ap.add_argument("--kv-cache-mib", type=int, default=512)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--forms", action="store_true", help="time the attention forms (docstring)")
    ap.add_argument("--decode-context", type=int, default=1024)
    ap.add_argument("--child", metavar="CHECKPOINT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(measure(args.child, args)), flush=True)
        return 0
    print(machine())
    if args.forms:
        attention_forms(args)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "v3-shaped"
        write_random_model(path, V3_SHAPED, torch.bfloat16, "DeepseekV3ForCausalLM")
        runs: dict[str, list[dict]] = {"after": []}
        old = None
        if args.old_ref:
            from long_context import _old_tree

            (Path(tmp) / "old").mkdir()
            old = _old_tree(args.old_ref, Path(tmp) / "old")
            runs["before"] = []
        for r in range(args.rounds):
            if old is not None:
                runs["before"].append(_child(path, args, old))
            runs["after"].append(measure(str(path), args))
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]}" for k, v in runs.items()))
    rows = []
    for name, rs in sorted(runs.items(), reverse=True):  # before, after
        label = f"{name} ({args.old_ref})" if name == "before" else name
        rows.append([label, f"{rs[0]['bytes_per_token'] / 1024:.1f} KiB", rs[0]["cache_tokens"],
                     " / ".join(f"{x['tok_s']:.1f}" for x in rs),
                     " / ".join(f"{x['prefill_s']:.2f}" for x in rs)])  # fmt: skip
    print(markdown_table(["Pagoda", "KV bytes / token", f"tokens in {args.kv_cache_mib} MiB",
                          f"output tok/s (batch {args.batch})",
                          f"{args.prefill_len}-token prefill (s)"], rows))  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "runs": runs}, indent=2))
    return 0


def _child(path: Path, args, tree: Path) -> dict:
    cmd = [sys.executable, "-P", __file__, "--child", str(path)]
    for flag in ("batch", "prompt_len", "output_len", "prefill_len", "kv_cache_mib", "dtype"):
        cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    res = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(tree)), capture_output=True,
                         text=True)  # fmt: skip
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
    if res.returncode or not lines:
        raise RuntimeError(f"Pagoda at {args.old_ref} failed:\n{res.stderr[-3000:]}")
    row = json.loads(lines[-1][len("RESULT ") :])
    if not row["runtime"].startswith(str(tree.parent.resolve())):
        raise RuntimeError(f"the child imported {row['runtime']}, not {args.old_ref}'s runtime")
    return row


if __name__ == "__main__":
    sys.exit(main())
