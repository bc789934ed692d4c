"""The checks the recurrent families' test files run against transformers on
`hybrid_cases`' checkpoints, each written once:

- `check_chunked_batched_preempted` (every row: test_hybrid_ssm.py for `SSM`, test_qwen3_next.py,
  test_olmo_hybrid.py and test_kimi_linear.py for `DELTA`), `check_decode_slots_out_of_order`
  and `check_warm_prefix` (a 140-token shared prefix: the DeltaNet and KDA rows' snapshots
  every 64 tokens; `warm_prompts`, `zero_the_restore`);
- `check_two_ranks_linear`: two ranks of a linear-attention hybrid (KDA, lightning)."""

from __future__ import annotations

import torch
from arch_cases import NEW, check, check_preempted, check_side_table_bytes, generate, prompts
from hf_oracle import hf_greedy_plain
from pagoda.runtime import LLM, SamplingParams


def check_chunked_batched_preempted(case) -> None:
    """`case` (the `case` fixture's: name, checkpoint directory, transformers model, loaded
    checkpoint, transformers' tokens and logits per prompt), the three prompts in 16-token steps (chunked prefill carries the states across chunks)
    sharing steps with two state slots (slots reused, zeroed for the new sequence), then again
    in reverse order on the same engine, whose prefix cache serves each prompt up to its last
    snapshot boundary before its end (KV blocks and state snapshots every
    `StateSnapshots.interval` tokens: 16 for Mamba2, Mamba-1 and short convs, 64 for the
    DeltaNet and KDA rules' chunks; prefix caching off where a family keeps no snapshots); a
    one-token prompt
    (its first step a decode row from a zeroed slot); then a KV pool so small that requests are
    preempted (their states rebuilt by recompute): transformers' tokens and logits each time,
    every slot given back, the pool whole."""
    name, _, model, loaded, reference = case
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, block_size=16,
              max_num_batched_tokens=16, max_num_seqs=2)  # fmt: skip
    snapshots = loaded.config.family.mamba.snapshots
    assert llm.engine.config.cache.enable_prefix_caching == snapshots
    cold = generate(llm, prompts())
    hits = llm.engine.kv.prefix_hits
    warm = generate(llm, prompts()[::-1])[::-1]
    for i, want in enumerate(reference):
        check(cold[i], want, f"{name}: prompt {i}, cold")
        check(warm[i], want, f"{name}: prompt {i}, again")
    every = llm.engine.kv.snapshots.interval if snapshots else None
    assert every in ((16, 64) if snapshots else (None,)), every
    # each prompt (48, 23, 53 tokens) up to its last boundary before its end: 32 + 16 + 48 at
    # 16, none at 64
    cached = sum((len(p) - 1) // every * every for p in prompts()) if snapshots else 0
    assert llm.engine.kv.prefix_hits - hits == cached
    assert llm.engine.runner.mamba.num_held == 0
    check_side_table_bytes(llm)
    one = [7]
    check(generate(llm, [one])[0], hf_greedy_plain(model, one, NEW), f"{name}: one token")
    check_preempted(loaded, reference, name)


def record_logits(llm: LLM) -> dict[str, list[torch.Tensor]]:
    """Each request's float32 logits per step (by request id), filled as `llm` generates."""
    seen: dict[str, list[torch.Tensor]] = {}
    llm.engine.runner.logits_hook = lambda reqs, lg: [
        seen.setdefault(r.request_id, []).append(row.clone()) for r, row in zip(reqs, lg.float())
    ]
    return seen


def check_decode_slots_out_of_order(model, loaded, monkeypatch, native: bool | None = None):
    """A request that finishes early (2 tokens of 4 requests' 6, 3 state slots) gives its slot
    to the next one: the decode rows' slots are then not one run (0, 2, 1: gathered and
    scattered back, or updated where they lie by the native CPU recurrence) where before they
    were (updated in place); every sequence still reads as transformers'. `native`: with the
    Mamba2 mixers' native recurrence (which must be built) or without it."""
    from pagoda.runtime.worker import mamba_state

    runs = []
    step = mamba_state.MambaState.device_step

    def record(self, host, to_device):
        out = step(self, host, to_device)
        runs.append(out.decode_run if out.num_decodes > 1 else "one")
        return out

    monkeypatch.setattr(mamba_state.MambaState, "device_step", record)
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, max_num_seqs=3)
    if native is not None:
        mixers = [layer.mixer for layer in llm.engine.runner.model.layers if layer.mixer]
        assert all(m.native is not None for m in mixers)  # (built here: a C compiler is needed)
        if not native:
            for m in mixers:
                m.native = None
    ps = [[5 + i, 17, 42 + i, 9] for i in range(4)]
    lens = [NEW, 2, NEW, NEW]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lens]
    seen = record_logits(llm)
    outs = llm.generate([{"prompt_token_ids": p} for p in ps], params)
    for i, (p, n, o) in enumerate(zip(ps, lens, outs)):
        check((o.outputs[0].token_ids, seen[o.request_id]), hf_greedy_plain(model, p, n), f"{i}")
    assert None in runs and any(r not in (None, "one") for r in runs)


def zero_the_restore(monkeypatch) -> list[int]:
    """`MambaState.restore` replaced by zeroing the slots (what a prefix hit would compute
    without its snapshot): the list of how many slots each call restored, filled as it runs."""
    from pagoda.runtime.worker.mamba_state import MambaState

    restored = []

    def zeroed(self, slots, entries):
        restored.append(len(slots))
        for conv, state in self.states.values():
            conv.index_fill_(0, slots, 0)
            state.index_fill_(0, slots, 0)

    monkeypatch.setattr(MambaState, "restore", zeroed)
    return restored


_WARM: dict[int, list] = {}  # id(model) -> its reference of `warm_prompts`' second prompt


def warm_prompts(model):
    """A 153-token prompt, one sharing its first 140 tokens, transformers' reference of it
    (once a process for each of `Built`'s models)."""
    shared = [(11 * i + 3) % 290 + 5 for i in range(150)]
    second = [*shared[:140], 21, 22]
    if id(model) not in _WARM:
        _WARM[id(model)] = hf_greedy_plain(model, second, NEW)
    return [*shared, 7, 8, 9], second, _WARM[id(model)]


def check_two_ranks_linear(built, name: str) -> None:
    """Tensor parallelism for a linear-attention hybrid (case `name`; each family's one
    two-rank test) over gloo: two ranks give transformers' tokens and logits (1e-3, float32)
    on the checkpoint the family's other tests use (the session's `built`). The KDA layers
    (Kimi Linear, BailingHybrid, GLM-5-Next) and MiniMax's lightning layers split by heads
    (`model/kimi_linear.py`, `model/minimax.py`), the attention and experts as their parents'.

    KDA's 64-token chunks space its snapshots past the three prompts: a pool of 12 blocks of
    16 runs a 153-token prompt beside them (32-token steps, preempted and recomputed), then
    that prompt alone, then one sharing 140 tokens with it, which restores each rank's snapshot
    of its heads' states at 128. MiniMax's (snapshots every 16 tokens): the small pool, the
    prompts again in reverse order from the prefix cache."""
    from arch_cases import SMALL_POOL

    path, model, loaded, reference = built(name)
    m = loaded.config.family.mamba
    layer = next(i for i, x in enumerate(m.layers) if x)
    if m.snapshot_chunk < 64:  # MiniMax's block_size 8: snapshots every 16 tokens
        with LLM(str(path), loaded=loaded, tensor_parallel_size=2, **SMALL_POOL) as two:
            got = generate(two, prompts()) + generate(two, prompts()[::-1])[::-1]
            core = two.engine
            assert core.scheduler.num_preemptions > 0 and core.kv.prefix_hits > 0
            _, state = core.runner.mamba.states[layer]  # this rank's heads
            assert state.shape[1] == m.n_heads // 2
            core.check_integrity()
        for i, g in enumerate(got):
            check(g, reference[i % 3], f"{name}: prompt {i}, two ranks")
        return
    first, second, want = warm_prompts(model)
    pool = SMALL_POOL | dict(num_blocks_override=12, max_num_batched_tokens=32, max_model_len=176)
    with LLM(str(path), loaded=loaded, tensor_parallel_size=2, **pool) as two:
        got = generate(two, [first, *prompts()])[1:]
        core = two.engine
        assert core.scheduler.num_preemptions > 0
        generate(two, [first])  # (its snapshots again, evicted with its blocks when preempted)
        hits = core.kv.prefix_hits
        warm = generate(two, [second])[0]
        assert core.kv.prefix_hits - hits == 128  # each rank's snapshots of its heads' states
        conv, state = core.runner.mamba.states[layer]  # this rank's heads
        assert state.shape[1] == m.n_heads // 2 and conv.shape[1] == m.conv_dim // 2
        core.check_integrity()
    for i, g in enumerate(got):
        check(g, reference[i], f"{name}: prompt {i}, two ranks")
    check(warm, want, f"{name}: two ranks, warm")


def check_warm_prefix(name: str, model, loaded, monkeypatch, budgets=(256, 16)) -> None:
    """Prefix caching with snapshots every 64 tokens (the 16-token blocks' and the DeltaNet
    and KDA rules' 64-token chunks' common multiple), saved from inside the chunked rule (a
    whole 153-token prompt in one step: its packed chunks' start states, the conv inputs
    before them; `budgets` 256) or from the slots (16-token steps: boundaries at a chunk's
    end). A prompt sharing 140 tokens then restores the one at 128 and computes the rest:
    transformers' tokens and logits, 128 cached tokens; with the restore replaced by zeros, it
    does not."""
    first, second, want = warm_prompts(model)
    for budget in budgets:
        llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, block_size=16,
                  max_num_batched_tokens=budget, max_num_seqs=2, max_model_len=256)  # fmt: skip
        generate(llm, [first])
        hits = llm.engine.kv.prefix_hits
        check(generate(llm, [second])[0], want, f"{name}: warm after {budget}-token steps")
        assert llm.engine.kv.prefix_hits - hits == 128
    restored = zero_the_restore(monkeypatch)
    try:
        check(generate(llm, [second])[0], want, "restore skipped")
    except AssertionError:
        pass
    else:
        raise AssertionError(f"{name}: the warm prompt reads alike without its restored state")
    assert restored == [1]
