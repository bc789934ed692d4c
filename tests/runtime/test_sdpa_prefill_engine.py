"""The engine on the Triton backend in non-invariant mode: prompt rows through torch SDPA.

Greedy tokens over chunked, mixed decode/prefill steps (a tiny Llama on CPU, Triton's
interpreter for the decode kernel) equal the torch backend's, and the SDPA path really ran.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import pytest
from hf_oracle import make_tiny_llama
from pagoda.runtime import LLM
from pagoda.runtime.attention import sdpa_prefill
from pagoda.runtime.model.loader import load_model
from test_triton_engine import greedy

pytest.importorskip("triton")


@pytest.fixture
def calls(monkeypatch) -> list[int]:
    """One entry per call of the SDPA prefill path (which still runs)."""
    seen: list[int] = []
    real = sdpa_prefill.sdpa_prefill
    monkeypatch.setattr(
        sdpa_prefill, "sdpa_prefill", lambda *a, **k: seen.append(1) or real(*a, **k)
    )
    return seen


@pytest.mark.skipif(
    os.environ["TRITON_INTERPRET"] != "1",
    reason="CPU run of Triton kernels needs TRITON_INTERPRET=1",
)
def test_non_invariant_triton_engine_with_sdpa_prefill_matches_torch_backend(tmp_path, calls):
    make_tiny_llama(tmp_path)
    loaded = load_model(str(tmp_path))
    prompts = [[(5 * i + 1) % 300 for i in range(n)] for n in (3, 17, 40)]
    args = dict(dtype="float32", kv_cache_memory=4 << 20, max_num_batched_tokens=24, max_num_seqs=4)
    want = greedy(LLM(loaded=loaded, attention_backend="torch", **args), prompts)
    assert calls == []
    got = greedy(
        LLM(loaded=loaded, attention_backend="triton", batch_invariant=False, **args), prompts
    )
    assert calls, "the SDPA prefill path did not run"
    assert got == want


@pytest.mark.skipif(
    os.environ["TRITON_INTERPRET"] != "1",
    reason="CPU run of Triton kernels needs TRITON_INTERPRET=1",
)
def test_non_invariant_gemma3_window_layers_mix_sdpa_and_triton(tmp_path, calls):
    """Gemma 3's full layers through SDPA and its window layers through the Triton kernel, in
    one engine (chunked, a shared prefix from the cache): transformers' tokens and logits."""
    from arch_cases import build, check, generate

    loaded, prompts, reference, engine_args = build("gemma3-window", tmp_path)
    llm = LLM(
        loaded=loaded, attention_backend="triton", batch_invariant=False, dtype="float32",
        kv_cache_memory=8 << 20, max_num_batched_tokens=16, max_num_seqs=4, **engine_args,
    )  # fmt: skip
    for i, (got, want) in enumerate(zip(generate(llm, prompts), reference)):
        check(got, want, f"gemma3-window, no batch invariance: prompt {i}")
    assert calls


@pytest.mark.skipif(
    os.environ["TRITON_INTERPRET"] != "1",
    reason="CPU run of Triton kernels needs TRITON_INTERPRET=1",
)
def test_non_invariant_fp8_kv_cache_matches_the_invariant_kernel(tmp_path, calls):
    """An FP8 KV cache: SDPA reads the same rounded keys as the Triton kernel, so greedy tokens
    match the batch-invariant engine's (chunked prompts, shared steps)."""
    make_tiny_llama(tmp_path)
    loaded = load_model(str(tmp_path))
    prompts = [[(7 * i + 2) % 300 for i in range(n)] for n in (5, 19, 33)]
    args = dict(attention_backend="triton", kv_cache_dtype="fp8", dtype="float32",
                kv_cache_memory=1 << 20, max_num_batched_tokens=16, max_num_seqs=4)  # fmt: skip
    want = greedy(LLM(loaded=loaded, batch_invariant=True, **args), prompts)
    assert calls == []
    got = greedy(LLM(loaded=loaded, batch_invariant=False, **args), prompts)
    assert calls and got == want
