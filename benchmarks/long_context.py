"""Long-context case of the offline benchmark: one prompt of N tokens, then single-stream decode.

Decode speed at long context is dominated by reading the sequence's K/V every step (the weights
are read once per step whatever the context). Pagoda's number is the decode rate after the prompt
is in the cache (the second request for the same prompt recomputes only its last partial block);
HF `generate` (bf16, its KV cache grown in place) is the baseline, measured the same way: the time
for `out_len + 1` new tokens minus the time for one.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from pagoda.runtime import LLM, SamplingParams


def pagoda_long_context(loaded, ids: list[int], ctx: int, out_len: int, dtype: str) -> dict:
    llm = LLM(loaded=loaded, dtype=dtype, max_model_len=ctx + out_len + 16, max_num_seqs=4)
    prompt = {"prompt_token_ids": ids[:ctx]}
    t = time.perf_counter()
    llm.generate(prompt, SamplingParams(temperature=0, max_tokens=1))
    prefill = time.perf_counter() - t
    t = time.perf_counter()
    llm.generate(prompt, SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True))
    decode = time.perf_counter() - t
    return {
        "system": f"pagoda ({dtype}), {ctx}-token context",
        "prefill_s": prefill,
        "decode_tok_s": out_len / decode,
    }


def hf_long_context(path: str, ids: list[int], ctx: int, out_len: int) -> dict:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.bfloat16
    ).eval()
    x = torch.tensor([ids[:ctx]])

    def run(n: int) -> float:
        t = time.perf_counter()
        with torch.no_grad():
            model.generate(input_ids=x, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        return time.perf_counter() - t

    one = run(1)
    many = run(out_len + 1)
    return {
        "system": f"HF generate (bf16), {ctx}-token context",
        "prefill_s": one,
        "decode_tok_s": out_len / max(1e-9, many - one),
    }


def long_context_ids(tokenizer, ctx: int) -> list[int]:
    """Real text (this repository's docs), repeated to `ctx` tokens."""
    root = Path(__file__).resolve().parent.parent
    text = "".join(
        (root / p).read_text(encoding="utf-8")
        for p in ("README.md", "docs/runtime.md", "docs/operator.md")
    )
    ids = tokenizer.encode(text)
    while len(ids) < ctx:
        ids = ids + ids
    return ids[:ctx]
