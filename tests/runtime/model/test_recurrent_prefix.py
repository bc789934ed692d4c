"""Prefix caching for the recurrent families without a chunked scan: Mamba-1
(`MambaForCausalLM`), Jamba (Mamba-1 mixers among attention layers), LFM2 (short convs
among attention layers), RecurrentGemma (RG-LRU blocks beside local attention) and RWKV-4 (the
wkv recurrence and token shifts), on the tiny checkpoints of tests/runtime/hybrid_cases.py that
transformers writes (float32; xLSTM's scan saves its snapshots as theirs: left to
test_hybrid_ssm.py's chunk-end case for CI time). Their states hold at every token, so snapshots are taken every
block (`MambaConfig.snapshot_chunk` 1): inside a whole-prompt step from the scans' position
loops and the conv segments, at a chunk's end from the slots
(test_hybrid_ssm.py's chunked, batched and preempted case covers those).

- A warm batch sharing a 48-token prefix reads as transformers' (tokens, logits within 1e-3),
  reports its cached tokens and computes only the rest; with the restore replaced by zeros it
  does not read so.
- The snapshots saved inside a step (three prompts in one step, boundaries at different
  positions of different sequences) hold the states that 16-token steps leave in the slots.
- On CUDA (gpu-marked, benchmarks/gpu_check.sh's families3): cold and warm, transformers'
  tokens, and no step's launch syncs with the host, the snapshot copies included.
"""

from __future__ import annotations

import pytest
import torch
from arch_cases import NEW, built_fixture, check, generate, prompts
from hf_oracle import hf_greedy_plain, make_tiny_model
from hybrid_cases import CASES
from hybrid_checks import zero_the_restore
from pagoda.runtime import LLM, SamplingParams

transformers = pytest.importorskip("transformers")

NAMES = ["mamba1", "jamba", "lfm2", "recurrent-gemma", "rwkv"]


def _make(name: str, path):
    arch, overrides = CASES[name]
    return make_tiny_model(path, arch, **overrides)


built = built_fixture(_make)


def _engine(loaded, budget: int) -> LLM:
    return LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, block_size=16,
               max_num_batched_tokens=budget, max_num_seqs=4)  # fmt: skip


@pytest.mark.parametrize("name", NAMES)
def test_a_warm_prefix_gives_transformers_tokens(built, monkeypatch, name):
    """The shared 48-token prompt alone in one step saves its snapshots at 16 and 32 from
    inside the step, at 48 from the slot. A batch of four sharing it then hits (a whole-prompt
    hit stops at the boundary before its last token; one with a token left after its hit runs
    as a decode row), computes 48 tokens fewer each (but the 48-token prompt, 32), and reads as
    transformers', as do two longer prompts (the second resumes from the snapshots the first
    saved inside its step after its own restore); with the restore replaced by zeroing, the
    same warm batch does not."""

    _, model, loaded, reference = built(name)
    llm = _engine(loaded, 64)
    assert llm.engine.config.cache.enable_prefix_caching and llm.engine.kv.snapshots.every == 1
    shared = prompts()[2]
    other, one_left = [*shared, 20, 21, 22], [*shared, 30]
    batch = [prompts()[0], other, shared, one_left]
    want = [reference[0], hf_greedy_plain(model, other, NEW), reference[2],
            hf_greedy_plain(model, one_left, NEW)]  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
    cold = llm.generate([{"prompt_token_ids": shared}], params)[0]
    assert cold.num_cached_tokens == 0 and llm.engine.kv.snapshots.num_cached == 3
    seen: dict[str, list[torch.Tensor]] = {}
    llm.engine.runner.logits_hook = lambda reqs, lg: [
        seen.setdefault(r.request_id, []).append(row.clone()) for r, row in zip(reqs, lg.float())
    ]
    steps = []
    schedule = llm.engine.scheduler.schedule
    llm.engine.scheduler.schedule = lambda: steps.append(out := schedule()) or out

    def warm():
        seen.clear()
        steps.clear()
        hits = llm.engine.kv.prefix_hits
        outs = llm.generate([{"prompt_token_ids": p} for p in batch], params)
        got = [((o.outputs[0].token_ids, seen[o.request_id]), o.num_cached_tokens) for o in outs]
        return got, llm.engine.kv.prefix_hits - hits, steps[0].num_batched_tokens

    got, hits, first = warm()
    assert [cached for _, cached in got] == [48, 48, 32, 48] and hits == 176
    assert first == sum(map(len, batch)) - 176  # the first step computes what is not cached
    for i, (g, _) in enumerate(got):
        check(g, want[i], f"{name}: prompt {i}, warm")
    # after a restore, the boundaries its step reaches (64 and 80) are saved inside it; the
    # next prompt resumes from 80
    long = [*shared, *range(100, 140)]
    for p, cached in ((long, 48), ([*long, 7, 8], 80)):
        seen.clear()
        out = llm.generate([{"prompt_token_ids": p}], params)[0]
        assert out.num_cached_tokens == cached
        check((out.outputs[0].token_ids, seen[out.request_id]), hf_greedy_plain(model, p, NEW),
              f"{name}: {len(p)} tokens from {cached}")  # fmt: skip
    restored = zero_the_restore(monkeypatch)  # what a hit would compute without the snapshot
    wrong, _, _ = warm()
    assert sum(restored) == 4
    with pytest.raises(AssertionError):
        for i, (g, _) in enumerate(wrong):
            check(g, want[i], "restore skipped")
    llm.engine.check_integrity()


@pytest.mark.parametrize("name", ["mamba1", "lfm2"])
def test_snapshots_saved_inside_a_step_are_the_states_a_chunk_end_leaves(built, name):
    """Three prompts (53, 23 and 48 tokens, the first and last sharing 48) in one step save
    the states at 16 and 32 of the first (its position loop's 16th and 32nd positions beside
    the second's 16th: two sequences at one position) and 48 of the first from inside the
    step, 16 of the second too; in 16-token steps every one comes from a slot at a chunk's
    end. Every Mamba layer's conv and SSM states agree."""
    from pagoda.runtime.core.kv_cache_manager import hash_block

    _, _, loaded, _ = built(name)
    ps = prompts()
    hashes = []
    for p, n in ((ps[0], 3), (ps[1], 1)):
        h = None
        for i in range(n):
            h = hash_block(h, p[16 * i : 16 * (i + 1)])
            hashes.append(h)

    def snapshots(budget: int) -> list[torch.Tensor]:
        llm = _engine(loaded, budget)
        llm.generate([{"prompt_token_ids": p} for p in ps], SamplingParams(max_tokens=1))
        entries = torch.tensor([llm.engine.kv.snapshots.entry(h) for h in hashes])
        snaps = llm.engine.runner.mamba.snaps.values()
        return [t.index_select(0, entries) for pair in snaps for t in pair]

    inside, ends = snapshots(128), snapshots(16)
    assert all(t.abs().sum() > 0 for t in inside if t.numel())  # (every one written)
    for a, b in zip(inside, ends, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_gpu_warm_prefix_without_host_syncs(built, name):
    """On CUDA: the three prompts in one step (snapshots saved inside it), then again on the
    warm cache (restored), read as transformers'; on an engine scheduling synchronously, the
    same cold and warm, no step's launch syncs with the host (`tokens_without_host_syncs`:
    the snapshot plan is host arrays copied with the step's slots, the scan's positions that
    save one are known on the host)."""
    import os

    from arch_cases import tokens_without_host_syncs

    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("needs CUDA with compiled Triton kernels (TRITON_INTERPRET=0)")
    _, _, loaded, reference = built(name)
    common = dict(loaded=loaded, dtype="float32", kv_cache_memory=256 << 20, block_size=16,
                  max_num_batched_tokens=128, max_num_seqs=4)  # fmt: skip
    llm = LLM(**common)
    assert llm.engine.runner.device.type == "cuda"
    cold = generate(llm, prompts())
    warm = generate(llm, prompts()[::-1])[::-1]
    assert llm.engine.kv.prefix_hits == 32 + 16 + 48
    for i, want in enumerate(reference):
        check(cold[i], want, f"{name}: prompt {i}, cuda, cold")
        check(warm[i], want, f"{name}: prompt {i}, cuda, warm")
    tokens = [t for t, _ in cold]
    synced = LLM(**common, async_scheduling=False)
    assert tokens_without_host_syncs(synced, prompts()) == tokens
    assert tokens_without_host_syncs(synced, prompts()[::-1])[::-1] == tokens
    assert synced.engine.kv.prefix_hits == 32 + 16 + 48
