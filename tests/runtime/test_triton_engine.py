"""The Triton attention backend inside the whole engine.

On CPU (Triton's interpreter) a tiny model keeps it quick: greedy tokens with the Triton backend
equal the torch backend's over mixed decode/prefill steps. On CUDA (marked gpu): the same for
a SmolLM2-shaped random model, CUDA-graph decode equals eager decode, a decode step never syncs
with the host, and async scheduling (in-flight tokens gathered on the device, readback behind an
event) gives the same tokens and launches without a sync.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import pytest
import torch
from hf_oracle import make_tiny_llama
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model.loader import load_model

pytest.importorskip("triton")
INTERPRET = os.environ["TRITON_INTERPRET"] == "1"


def greedy(llm, prompts, n=6):
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    return [
        o.outputs[0].token_ids
        for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    ]


@pytest.mark.skipif(not INTERPRET, reason="CPU run of Triton kernels needs TRITON_INTERPRET=1")
def test_triton_backend_matches_torch_backend_on_cpu(tmp_path):
    make_tiny_llama(tmp_path)
    loaded = load_model(str(tmp_path))
    prompts = [[(5 * i + 1) % 300 for i in range(n)] for n in (3, 17, 40)]
    args = dict(dtype="float32", kv_cache_memory=4 << 20, max_num_batched_tokens=24, max_num_seqs=4)
    ours = greedy(LLM(loaded=loaded, attention_backend="torch", **args), prompts)
    theirs = greedy(LLM(loaded=loaded, attention_backend="triton", **args), prompts)
    assert ours == theirs


@pytest.mark.skipif(not INTERPRET, reason="CPU run of Triton kernels needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("name", ["gemma3-window", "qwen3moe-top8-d128"])
def test_new_architectures_on_the_triton_backend_match_transformers(tmp_path, name):
    """Sliding windows, Gemma's layer, experts (the CPU grouped path) and head size 128 through
    the Triton attention kernels, chunked and batched: transformers' tokens and logits."""
    from arch_cases import build, check, generate

    loaded, prompts, reference, engine_args = build(name, tmp_path)
    llm = LLM(
        loaded=loaded, attention_backend="triton", dtype="float32", kv_cache_memory=8 << 20,
        max_num_batched_tokens=16, max_num_seqs=4, **engine_args,
    )  # fmt: skip
    for i, (got, want) in enumerate(zip(generate(llm, prompts), reference)):
        check(got, want, f"{name}: prompt {i}")


gpu = pytest.mark.gpu


@pytest.fixture(scope="module")
def smol_gpu(tmp_path_factory):
    """SmolLM2's shape with random weights: GPU nodes have no copy of the embedded GGUF."""
    if not torch.cuda.is_available() or INTERPRET:
        pytest.skip("needs CUDA with compiled Triton kernels (TRITON_INTERPRET=0)")
    path = tmp_path_factory.mktemp("random-smol")
    make_tiny_llama(path, hidden_size=576, intermediate_size=1536, num_hidden_layers=8,
                    num_attention_heads=9, num_key_value_heads=3, vocab_size=8192,
                    max_position_embeddings=2048)  # fmt: skip
    return load_model(str(path))


@gpu
def test_gpu_triton_matches_torch_and_graphs_match_eager(smol_gpu):
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 8192, (n,), generator=g).tolist() for n in [1, 16, 33, 300, 900]]
    common = dict(
        dtype="float32", max_model_len=2048, max_num_batched_tokens=512, kv_cache_memory=1 << 30
    )
    torch_out = greedy(LLM(loaded=smol_gpu, attention_backend="torch", **common), prompts, 12)
    eager = greedy(
        LLM(loaded=smol_gpu, attention_backend="triton", enable_cuda_graphs=False, **common),
        prompts,
        12,
    )
    graphs_llm = LLM(loaded=smol_gpu, attention_backend="triton", **common)
    assert graphs_llm.engine.runner.cuda_graphs is not None
    graphs = greedy(graphs_llm, prompts, 12)
    assert eager == torch_out
    assert graphs == eager


@gpu
def test_gpu_decode_step_never_syncs(smol_gpu):
    llm = LLM(
        loaded=smol_gpu,
        attention_backend="triton",
        async_scheduling=False,  # a synchronous step; the async one has its own test below
        max_model_len=1024,
        kv_cache_memory=1 << 30,
    )
    engine = llm.engine
    for i in range(8):
        engine.add_request(
            f"r{i}",
            list(range(100 + i, 140 + i)),
            SamplingParams(max_tokens=20, ignore_eos=True, temperature=0.8, top_p=0.9, seed=i),
        )
    for _ in range(3):  # prefill, then plain decode steps
        engine.step()
    out = engine.scheduler.schedule()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        launched = engine.runner.execute_model(out)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert launched.sampler_output is not None and len(launched.requests) == 8


@gpu
def test_gpu_async_scheduling_matches_sync(smol_gpu):
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 8192, (n,), generator=g).tolist() for n in [1, 16, 33, 300, 900]]
    common = dict(max_model_len=2048, max_num_batched_tokens=512, kv_cache_memory=1 << 30)
    want = greedy(LLM(loaded=smol_gpu, async_scheduling=False, **common), prompts, 24)
    async_llm = LLM(loaded=smol_gpu, async_scheduling=True, **common)
    assert async_llm.engine.runner.cuda_graphs is not None
    assert greedy(async_llm, prompts, 24) == want
    params = [SamplingParams(temperature=0.8, max_tokens=16, seed=i, logprobs=1) for i in range(3)]
    sync_s = LLM(loaded=smol_gpu, async_scheduling=False, **common).generate(
        [{"prompt_token_ids": p} for p in prompts[:3]], params
    )
    async_s = async_llm.generate([{"prompt_token_ids": p} for p in prompts[:3]], params)
    assert [o.outputs[0].token_ids for o in async_s] == [o.outputs[0].token_ids for o in sync_s]

    def ranks(outs):  # the sampled tokens' ranks cross to the host with them (pinned copies)
        return [[{t: p.rank for t, p in d.items()} for d in o.outputs[0].logprobs] for o in outs]

    got = ranks(async_s)
    assert got == ranks(sync_s) and all(r for o in got for d in o for r in d.values())


@gpu
def test_gpu_async_step_launches_without_a_sync(smol_gpu):
    """With a step in flight, the next one (its decode ids gathered on the device) and the
    event-guarded readback of the first never block the host on the device."""
    llm = LLM(loaded=smol_gpu, async_scheduling=True, max_model_len=1024, kv_cache_memory=1 << 30)
    engine = llm.engine
    for i in range(8):
        engine.add_request(
            f"r{i}", list(range(100 + i, 140 + i)), SamplingParams(max_tokens=20, seed=i)
        )
    for _ in range(3):
        engine.step()
    assert engine._inflight is not None
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = engine.scheduler.schedule()
        launched = engine.runner.execute_model(out)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(launched.requests) == 8 and launched.ready is not None
    engine.scheduler.update_after_step(out)
    for r in launched.requests:
        r.num_pending += 1
    engine._finish(engine._inflight)
    engine._inflight = launched
    while engine.has_unfinished_requests():
        engine.step()
    engine.check_integrity()


@gpu
@pytest.mark.parametrize("name", ["gemma3-window", "mixtral-top2-window", "qwen3moe-top8-d128",
                                  "qwen2moe-shared-dense1", "granitemoe-top2", "olmo2",
                                  "granite-scalars", "olmoe-top3"])  # fmt: skip
def test_gpu_new_architectures_match_transformers_with_graphs(tmp_path, name):
    """On CUDA in float32 with the defaults (Triton attention with sliding windows, the fused
    MoE kernel, CUDA graphs): transformers' greedy tokens and logits (within 1e-3), and graph
    decode equal to eager decode."""
    if not torch.cuda.is_available() or INTERPRET:
        pytest.skip("needs CUDA with compiled Triton kernels (TRITON_INTERPRET=0)")
    from arch_cases import build, check, generate

    loaded, prompts, reference, engine_args = build(name, tmp_path)
    common = dict(loaded=loaded, dtype="float32", kv_cache_memory=256 << 20,
                  max_num_batched_tokens=16, max_num_seqs=4, **engine_args)  # fmt: skip
    llm = LLM(**common)
    assert llm.engine.runner.cuda_graphs is not None
    got = generate(llm, prompts)
    for i, (g, want) in enumerate(zip(got, reference)):
        check(g, want, f"{name}: prompt {i}")
    eager = generate(LLM(**common, enable_cuda_graphs=False), prompts)
    assert [t for t, _ in eager] == [t for t, _ in got]


@pytest.mark.skipif(not INTERPRET, reason="CPU run of Triton kernels needs TRITON_INTERPRET=1")
def test_triton_backend_logits_invariant_to_chunks_cache_and_batch_on_cpu(tmp_path, monkeypatch):
    """Batch-invariant mode (the default) on the Triton backend: every logits row has the same
    bits alone and cold as when its prompt is chunked mid-block, read from the prefix cache, and
    batched with other traffic (decodes in the prefill kernel's one-token launch, prompt rows in
    its 128-row launch). The interpreter's dot is made row-independent, as a GPU's MMA is (see
    tests/kernels/conftest.py, ``row_independent_dot``)."""
    from triton.runtime import interpreter

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        prod = a.data.astype(d.data.dtype)[..., :, :, None] * b.data.astype(d.data.dtype)
        return interpreter.TensorHandle(prod.sum(axis=-2) + d.data, d.dtype.scalar)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)
    make_tiny_llama(tmp_path)
    loaded = load_model(str(tmp_path))
    shared = [(3 * i + 7) % 290 + 5 for i in range(35)]
    prompts = [[(5 * i + n) % 290 + 5 for i in range(n)] for n in (1, 17, 40)]
    prompts += [shared + prompts[1], [*shared, 9, 8, 7]]
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    common = dict(loaded=loaded, attention_backend="triton", dtype="float32", max_model_len=128,
                  kv_cache_memory=4 << 20)  # fmt: skip

    def run(llm, batch):
        rows = {}

        def observe(reqs, logits):
            for r, row in zip(reqs, logits.float(), strict=True):
                rows[(tuple(r.prompt_token_ids), r.num_output_tokens)] = row.clone()

        llm.engine.runner.logits_hook = observe
        outs = llm.generate([{"prompt_token_ids": p} for p in batch], params)
        return [o.outputs[0].token_ids for o in outs], rows

    plain = LLM(**common, enable_prefix_caching=False, enable_chunked_prefill=False)
    alone = [run(plain, [p]) for p in prompts]
    busy = LLM(**common, enable_prefix_caching=True, max_num_batched_tokens=24, max_num_seqs=4)
    for name in ("cold", "warm"):
        noise = [p[::-1] for p in prompts[1:3]]
        tokens, rows = run(busy, noise + prompts)
        for i, (want_tokens, want_rows) in enumerate(alone):
            assert tokens[len(noise) + i] == want_tokens[0], f"{name}: prompt {i}"
            for key, row in want_rows.items():
                assert torch.equal(rows[key], row), f"{name}: prompt {i} logits at {key[1]}"
