"""Structured outputs on CUDA (a prepared check: run it on a GPU node; unmeasured so far).

1. Mask correctness on the CUDA path: `apply_bitmask_torch` on device tensors equals xgrammar's
   CPU kernel; random JSON-Schema walks through `GrammarBitmask` (device masks, pinned copies)
   and the CUDA sampler only ever sample tokens the grammar allows, and end as valid JSON.
2. Async scheduling (on by default on CUDA) defers constrained rows' sampling until the in-flight
   step is read back: same tokens as without it, greedy, on a random-weight Llama-shaped model
   written on the node (byte-level vocabulary, so JSON has tokens).
3. Cost: 64 requests at once, none vs half constrained, output tok/s side by side; the host
   time a constrained step spends in its bitmasks while the forward runs.

Needs, besides what the node has: xgrammar, apache-tvm-ffi, pydantic (+ pydantic-core,
annotated-types, typing-inspection), jsonschema (+ referencing, rpds-py, attrs,
jsonschema-specifications) as cp312 wheels: `pip download --only-binary=:all: --python-version
3.12 --platform manylinux2014_x86_64 --no-deps -d wheels <names>`, then on the node
`pip install --no-index --no-deps --target /tmp/site wheels/*.whl` and PYTHONPATH=/tmp/site.

    python -P benchmarks/structured_outputs_gpu.py            # ~2 min on an H200
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "runtime"))
from common import machine, markdown_table, write_random_model

CONFIG = dict(vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
              num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096)  # fmt: skip


def byte_level_tokenizer(path: Path, vocab_size: int) -> None:
    """tokenizer.json: GPT-2's 256 byte tokens, JSON-ish pieces, then filler up to the vocab."""
    from pagoda.runtime.model.byte_stream import _char_bytes
    from pagoda.runtime.model.tokenizer import build_bpe_tokenizer

    byte_tokens = list(_char_bytes())  # GPT-2's byte alphabet, in its bytes_to_unicode order
    pieces = ['{"', '":', 'Ġ"', '",', "name", "city", "true", "false", "null", "Ġ{", "}]", "ĠParis"]
    tokens = ["<unk>", "<s>", "</s>", *byte_tokens, *pieces]
    tokens += [f"w{i}" for i in range(vocab_size - len(tokens))]
    types = [3, 3, 3] + [1] * (vocab_size - 3)
    build_bpe_tokenizer(tokens, [], types, None).save(str(path / "tokenizer.json"))


def mask_checks() -> None:
    import xgrammar as xgr
    from pagoda.runtime.structured.bitmask import apply_bitmask_torch

    g = torch.Generator().manual_seed(0)
    vocab, n = 32000, 48
    logits = torch.randn(n, vocab, generator=g)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (n, (vocab + 31) // 32), generator=g,
                            dtype=torch.int32)  # fmt: skip
    rows = list(range(0, n, 3))
    want = logits.clone()
    xgr.apply_token_bitmask_inplace(want, bitmask, indices=rows)
    for dtype in (torch.float32, torch.bfloat16):
        got = logits.to("cuda", dtype)
        apply_bitmask_torch(got, bitmask[rows].cuda(), torch.tensor(rows, device="cuda"))
        assert torch.equal(torch.isinf(got.float().cpu()), torch.isinf(want)), dtype
    print("apply_bitmask_torch on CUDA equals xgrammar's CPU kernel: ok")


def engine_checks(model_dir: Path) -> list[list[object]]:
    import jsonschema
    from pagoda.runtime import LLM, SamplingParams
    from pagoda.runtime.structured.params import StructuredOutputsParams as Spec
    from structured_testlib import random_schema

    rng = random.Random(0)
    schemas = [random_schema(rng) for _ in range(32)]
    prompts = [[5 + i % 60, 17, 40, 10 + i % 80] for i in range(64)]  # ASCII bytes: whole text

    def params(i: int, constrained: bool):
        spec = Spec(json=schemas[i // 2]) if constrained and i % 2 else None
        kw = dict(max_tokens=128, temperature=0.0 if i % 4 < 2 else 0.8, seed=i)
        return SamplingParams(**kw, structured_outputs=spec, ignore_eos=spec is None)

    rows = []
    outs = {}
    sync = torch.cuda.synchronize if torch.cuda.is_available() else lambda: None  # CPU: dry run
    for async_ in (True, False):
        llm = LLM(str(model_dir), async_scheduling=async_, max_model_len=512)
        llm.generate(prompts[:2], [params(0, True), params(1, True)])  # warm-up, compiles
        for constrained in (False, True):
            ps = [params(i, constrained) for i in range(64)]
            sync()
            t = time.perf_counter()
            res = llm.generate(prompts, ps)
            sync()
            secs = time.perf_counter() - t
            toks = sum(len(o.outputs[0].token_ids) for o in res)
            outs[(async_, constrained)] = res
            rows.append([f"async {async_}", "half" if constrained else "none",
                         f"{toks / secs:.0f}", toks])  # fmt: skip
            if constrained:
                for i, o in enumerate(res):
                    if i % 2:
                        c = o.outputs[0]
                        assert c.finish_reason == "stop", (i, c.text)
                        jsonschema.validate(json.loads(c.text), schemas[i // 2])
        del llm
    for i in range(0, 64, 4):  # greedy rows: the same tokens with and without async scheduling
        a, b = outs[(True, True)][i].outputs[0], outs[(False, True)][i].outputs[0]
        assert a.token_ids == b.token_ids, i
    print("constrained outputs valid; async == sync for greedy rows: ok")
    return rows


def main() -> None:
    assert torch.cuda.is_available(), "needs a CUDA device"
    print(f"machine: {machine()}")
    mask_checks()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        write_random_model(path, CONFIG)
        byte_level_tokenizer(path, CONFIG["vocab_size"])
        rows = engine_checks(path)
    print(markdown_table(["scheduling", "constrained", "output tok/s", "tokens"], rows))
    by = {(r[0], r[1]): float(r[2]) for r in rows}
    for mode in ("async True", "async False"):
        print(f"{mode}: half constrained / none = {by[(mode, 'half')] / by[(mode, 'none')]:.3f}")


if __name__ == "__main__":
    main()
