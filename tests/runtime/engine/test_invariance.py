"""Greedy output does not depend on the prefix cache, on chunking or on the rest of the batch.

The same prompts are generated (temperature 0) alone on a cold engine with caching and chunked
prefill off, then together on an engine that chunks prompts into small pieces and caches prefixes
(cold, then warm, then in another order beside other traffic). Every run must give exactly the same
tokens, in both dtypes: this is what `docs/runtime.md` promises, and it fails on any machine whose
kernels round a row differently depending on its neighbours.
"""

from __future__ import annotations

import pytest
import torch
from attention_testlib import step_meta
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model.linear import bf16_rows_invariant

LENGTHS = [1, 17, 40, 95, 230]
# 5 tokens: decodes already run beside other prompts' chunks (the busy engine's 48-token steps
# take the 634 prompt tokens in 14+), beside the warm run's partial blocks and the noise; each
# token more is one more step for every prompt alone (10 tokens: ~40% more steps per case)
GREEDY = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts(corpus_ids) -> list[list[int]]:
    base = [corpus_ids[i * 37 : i * 37 + n] for i, n in enumerate(LENGTHS)]
    shared = corpus_ids[500:600]  # two prompts sharing a 100-token prefix with each other
    return [*base, shared + corpus_ids[:20], shared + corpus_ids[900:931]]


def _tokens(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]


@pytest.mark.slow
@pytest.mark.parametrize(
    "dtype,kv_cache_dtype", [("bfloat16", "auto"), ("float32", "auto"), ("float32", "int8")]
)
def test_greedy_invariant_to_cache_chunks_and_batch(smol, prompts, dtype, kv_cache_dtype):
    if dtype == "bfloat16" and not bf16_rows_invariant():
        pytest.skip("bf16 GEMMs on AMX round a row by the row count (docs/runtime.md)")
    common = dict(
        loaded=smol,
        dtype=dtype,
        max_model_len=512,
        kv_cache_memory=64 << 20,
        kv_cache_dtype=kv_cache_dtype,
    )
    plain = LLM(**common, enable_prefix_caching=False, enable_chunked_prefill=False)
    alone = [_tokens(plain, [p])[0] for p in prompts]
    del plain

    busy = LLM(**common, enable_prefix_caching=True, max_num_batched_tokens=48, max_num_seqs=6)
    cold = _tokens(busy, prompts)  # chunked, batched with each other, nothing cached
    warm = _tokens(busy, prompts)  # every full block of every prompt now comes from the cache
    noise = [p[::-1] for p in prompts[1:3]]  # unrelated traffic in the same steps
    mixed = _tokens(busy, noise + prompts[::-1])[len(noise) :][::-1]
    for name, got in (("cold batch", cold), ("warm cache", warm), ("reordered + noise", mixed)):
        for i, (want, have) in enumerate(zip(alone, got)):
            assert have == want, f"{dtype} {name}: prompt {i} ({len(prompts[i])} tokens)"
    busy.engine.check_integrity()


def _step(seqs, bs=16):
    """Attention metadata for (context length, query length, block table) triples."""
    slots = [t[p // bs] * bs + p % bs for s, n, t in seqs for p in range(s - n, s)]
    return step_meta(seqs, slots, bs)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_row_does_not_depend_on_how_it_is_batched(dtype, kv_cache_dtype):
    """One query row (the last of a 300-token sequence) gives bit-identical output as a decode,
    as the last row of a chunk on cached context, as the last row of a fresh prompt, and beside
    other sequences of other lengths (other buckets, other key padding)."""
    from pagoda.runtime.attention.torch_backend import TorchAttentionBackend

    g = torch.Generator().manual_seed(0)
    h, hkv, d, bs, n = 6, 2, 32, 16, 300
    k_all = torch.randn(n, hkv, d, generator=g).to(dtype)
    v_all = torch.randn(n, hkv, d, generator=g).to(dtype)
    q_all = torch.randn(n, h, d, generator=g).to(dtype)
    table = list(range(1, 1 + (n + bs - 1) // bs))
    other = list(range(40, 40 + 1000 // bs + 1))
    be = TorchAttentionBackend(h, hkv, d, d**-0.5, kv_cache_dtype)

    def last_row(seqs, new: int, extra_q: int = 0) -> torch.Tensor:
        cache = list(be.allocate_kv_cache(128, bs, dtype, torch.device("cpu")))
        cached = torch.tensor([table[p // bs] * bs + p % bs for p in range(n - new)])
        be.write_kv(k_all[: n - new], v_all[: n - new], *cache, cached)  # the cached context
        meta = _step(seqs)
        rows = torch.randn(extra_q, h, d, generator=g).to(dtype)
        kx = torch.randn(extra_q, hkv, d, generator=g).to(dtype)
        q = torch.cat(
            [rows[: meta.num_decodes - 1], q_all[n - new :], rows[meta.num_decodes - 1 :]]
        )
        k = torch.cat([kx[: meta.num_decodes - 1], k_all[n - new :], kx[meta.num_decodes - 1 :]])
        v = torch.cat([kx[: meta.num_decodes - 1], v_all[n - new :], kx[meta.num_decodes - 1 :]])
        be.prepare(meta)
        out = be.forward(q, k, v, *cache, meta)
        return out[meta.num_decodes - 1 + new - 1 if meta.num_decodes else new - 1]

    decode = last_row([(n, 1, table)], 1)
    chunk = last_row([(n, 40, table)], 40)
    fresh = last_row([(n, n, table)], n)
    beside = last_row([(1000, 1, other), (n, 1, table), (64, 7, [100, 101, 102, 103])], 1, 8)
    for name, got in (("chunk", chunk), ("fresh prompt", fresh), ("beside others", beside)):
        assert torch.equal(got, decode), name


@pytest.fixture(scope="module")
def random_model_gpu(tmp_path_factory):
    """A SmolLM2-shaped model with random weights (the GGUF does not travel to GPU nodes)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    pytest.importorskip("triton")
    from hf_oracle import make_tiny_llama
    from pagoda.runtime.model.loader import load_model

    path = tmp_path_factory.mktemp("random-smol")
    make_tiny_llama(path, hidden_size=576, intermediate_size=1536, num_hidden_layers=6,
                    num_attention_heads=9, num_key_value_heads=3, vocab_size=8192,
                    max_position_embeddings=4096)  # fmt: skip
    return load_model(str(path))


def _logits_and_tokens(llm: LLM, prompts: list[list[int]]):
    """Greedy tokens per prompt, and every logits row keyed by (prompt, tokens generated so far)."""
    rows: dict[tuple[tuple[int, ...], int], torch.Tensor] = {}

    def observe(reqs, logits):
        for r, row in zip(reqs, logits.float().cpu()):
            rows[(tuple(r.prompt_token_ids), r.num_output_tokens)] = row

    llm.engine.runner.logits_hook = observe
    tokens = _tokens(llm, prompts)
    llm.engine.runner.logits_hook = None
    return tokens, rows


@pytest.mark.gpu
def test_gpu_logits_invariant_to_cache_chunks_batch_and_graphs(random_model_gpu):
    """On CUDA with the defaults (Triton kernels, CUDA graphs, batch-invariant mode): the same
    bits for every logits row, alone and cold vs chunked, cached, batched and padded."""
    g = torch.Generator().manual_seed(0)
    lengths = [1, 17, 40, 95, 230, 700, 1500]
    prompts = [torch.randint(3, 8192, (n,), generator=g).tolist() for n in lengths]
    shared = torch.randint(3, 8192, (300,), generator=g).tolist()
    prompts += [shared + prompts[1], shared + prompts[3]]
    # A fixed KV budget: each engine would otherwise take 90% of what the last one left free.
    common = dict(
        loaded=random_model_gpu, dtype="bfloat16", max_model_len=2048, kv_cache_memory=1 << 30
    )
    plain = LLM(**common, enable_prefix_caching=False, enable_chunked_prefill=False)
    alone = [_logits_and_tokens(plain, [p]) for p in prompts]
    del plain
    busy = LLM(**common, enable_prefix_caching=True, max_num_batched_tokens=64, max_num_seqs=8)
    assert busy.engine.runner.cuda_graphs is not None
    for name, order in (("cold", prompts), ("warm", prompts), ("reordered", prompts[::-1])):
        noise = [p[::-1] for p in prompts[2:5]]
        tokens, rows = _logits_and_tokens(busy, noise + order)
        for i, p in enumerate(prompts):
            want_tokens, want_rows = alone[i]
            assert tokens[len(noise) + order.index(p)] == want_tokens[0], f"{name}: prompt {i}"
            for key, row in want_rows.items():
                assert torch.equal(rows[key], row), f"{name}: prompt {i} logits at {key[1]}"
    busy.engine.check_integrity()
