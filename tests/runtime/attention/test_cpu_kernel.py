"""Building, caching and choosing the CPU attention kernel; both CPU paths end to end."""

from __future__ import annotations

import pytest
import torch
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.attention import cpu_kernel


def test_build_compiles_once_per_cache_dir_and_loads(tmp_path):
    first = cpu_kernel.build(tmp_path)
    stamp = first.stat().st_mtime_ns
    again = cpu_kernel.build(tmp_path)
    assert again == first and again.stat().st_mtime_ns == stamp  # cached, not rebuilt
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary files left
    assert cpu_kernel.CpuKernel(first).lib.pagoda_attention is not None


def test_without_a_compiler_the_build_says_so(tmp_path, monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing to run there
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler"):
        cpu_kernel.build(tmp_path / "cache")


def test_the_switch_picks_the_path_and_rejects_unknown_values(monkeypatch):
    monkeypatch.setenv(cpu_kernel.ENV_SWITCH, "torch")
    assert cpu_kernel.load() is None
    monkeypatch.setenv(cpu_kernel.ENV_SWITCH, "sdpa")
    with pytest.raises(ValueError, match="kernel or torch"):
        cpu_kernel.load()


@pytest.mark.slow
def test_both_paths_generate_the_same_greedy_tokens_in_float32(smol, corpus_ids, monkeypatch):
    """The engine end to end on each path: float32 keeps their rounding differences far below
    the gaps between top logits, so greedy tokens agree (prefill chunks and decodes included)."""
    prompts = [corpus_ids[:40], corpus_ids[100:400], corpus_ids[50:51]]
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    tokens = {}
    for path, rank in (("kernel", 5), ("torch", 4)):  # the packed layout, or head-major
        monkeypatch.setenv(cpu_kernel.ENV_SWITCH, path)
        llm = LLM(loaded=smol, dtype="float32", max_model_len=512, max_num_batched_tokens=128)
        assert llm.engine.runner.kv_caches[0][0].dim() == rank
        tokens[path] = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)]
        del llm
    assert tokens["kernel"] == tokens["torch"]


def test_a_block_outside_the_cache_is_an_error_not_a_stray_read():
    kernel = cpu_kernel.load()
    assert kernel is not None, "the CPU attention kernel did not build (is g++ installed?)"
    kc = torch.zeros(2, 8, 16, 16, 2, dtype=torch.bfloat16)  # 8 blocks of 16, D = 32
    vc = torch.zeros(2, 8, 8, 32, 2, dtype=torch.bfloat16)
    q = torch.zeros(1, 4, 32, dtype=torch.bfloat16)
    qstart, lens = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([20], dtype=torch.int32)
    ok = torch.tensor([[3, 7]], dtype=torch.int32)
    assert kernel.attention(q, kc, vc, ok, qstart, lens, 0.1).shape == (1, 4, 32)
    with pytest.raises(ValueError, match="outside the cache"):
        kernel.attention(q, kc, vc, torch.tensor([[3, 8]], dtype=torch.int32), qstart, lens, 0.1)
