"""Hybrid state-space models (Mamba2 layers among attention layers) against transformers, token
for token, on tiny random checkpoints transformers writes itself (tests/runtime/hf_oracle.py):
float32, logits within 1e-3 of transformers' plain greedy loop (its `torch_forward` scan over
the whole sequence) at every step.

- Granite 4.0 (`GraniteMoeHybridForCausalLM`): experts beside the shared MLP, rotary, Granite's
  multipliers, two groups of B/C; and a dense NoPE one, attention first;
- Bamba (`BambaForCausalLM`): half-rotary attention, a dense MLP with biases;
- Nemotron-H (`NemotronHForCausalLM`): single blocks (Mamba2, ReLU² MLP, attention without
  rotary), its checkpoint's `backbone.` names, the SSM state in float32; and Nemotron 3's MoE
  blocks (sigmoid-routed ReLU² experts with correction biases, latent projections);
- Falcon-H1 (`FalconH1ForCausalLM`): attention and Mamba2 side by side in every layer, its µP
  multipliers, the mixer's output norm before the gate, or no norm.
- Jamba (`JambaForCausalLM`): Mamba-1 mixers with weighted dt/B/C norms among attention
  layers, experts on some layers (its estimates and configs in test_jamba.py);
- Zamba2 (`Zamba2ForCausalLM`): Mamba2 mixers, shared blocks reused with per-use LoRA adapters
  (test_zamba2.py).

Each case (`hybrid_cases.SSM`: the rows of tests/runtime/hybrid_cases.py, checkpoints written
once a session by its `built` fixture) runs `hybrid_checks.check_chunked_batched_preempted`:
chunked, batched with two state slots, again in reverse order from the prefix cache (KV blocks
and Mamba state snapshots at every 16-token boundary, saved at the chunks' ends), a one-token
prompt, preempted. A warm batch after whole-prompt steps (the snapshots saved from inside the
scan) reports its cached tokens, and reads otherwise with the restore skipped.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from arch_cases import (
    NEW,
    SMALL_POOL,
    case_fixture,
    check,
    check_rotary_float32,
    generate,
    prompts,
)
from hf_oracle import hf_greedy_plain, make_tiny_model
from hybrid_cases import MAMBA, SSM, check_refused
from hybrid_checks import (
    check_chunked_batched_preempted,
    check_decode_slots_out_of_order,
    record_logits,
    zero_the_restore,
)
from live_bytes import LiveBytes
from pagoda.runtime import LLM
from pagoda.runtime.model.ssd import pack, scan_rows, scan_step, ssd_scan_bytes

transformers = pytest.importorskip("transformers")
case = case_fixture(SSM)


def test_greedy_matches_transformers_chunked_batched_and_preempted(case):
    check_chunked_batched_preempted(case)


@pytest.mark.parametrize("native", [True, False])
def test_decode_slots_out_of_order(built, monkeypatch, native):
    """The native CPU recurrence updates the out-of-order slots where they lie, the torch one
    gathers and scatters them back (a run: updated in place)."""
    _, model, loaded, _ = built("granite4-moe-rope")
    check_decode_slots_out_of_order(model, loaded, monkeypatch, native)


@pytest.mark.parametrize(
    "name", ["granite4-moe-rope", "nemotron-h", "falcon-h1-mup", "mamba1", "jamba", "zamba2"]
)
def test_mixed_lengths_in_one_step(built, monkeypatch, name):
    """One step holds a decode row (a one-token prompt), a long prompt (5 of the scan's
    8-token chunks) and short ones (1 to 11 tokens) in the packed layout, each sequence in
    chunks of its own; the next step prefills the last prompt beside their decodes. Every
    sequence reads as transformers'. Mamba-1's scan computes its decays 3 rows at a time (or
    a position's rows, where more), so that blocks end inside the step."""
    from pagoda.runtime.model import mamba1
    from pagoda.runtime.worker import mamba_state

    monkeypatch.setattr(mamba1, "BLOCK_ELEMENTS", 3 * 128 * 8)

    _, model, loaded, _ = built(name)
    steps = []
    step = mamba_state.MambaState.device_step

    def record(self, host, to_device):
        steps.append((host.num_decodes, host.query_lens[host.num_decodes :]))
        return step(self, host, to_device)

    monkeypatch.setattr(mamba_state.MambaState, "device_step", record)
    ps = [[7], [(5 * i + 1) % 290 + 5 for i in range(40)], [9, 4, 33], [60 + i for i in range(11)],
          [21], [8, 8, 2, 5, 90]]  # fmt: skip
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, max_num_seqs=6,
              max_num_batched_tokens=56)  # fmt: skip
    got = generate(llm, ps)
    assert steps[0] == (2, [40, 3, 11])  # the budget spent: the 5-token prompt next
    for i, p in enumerate(ps):
        check(got[i], hf_greedy_plain(model, p, NEW), f"{name}: prompt {i}")


def test_a_warm_prefix_restores_the_mamba_state(built, monkeypatch):
    """Whole prompts a step (max_num_batched_tokens 64): the shared prompt's snapshots at 16
    and 32 are saved from inside the scan (its chunk boundaries), at 48 from the slot. Then a
    batch of four sharing that prefix reports its cached tokens (a whole-prompt hit stops at
    a boundary before its last token; one with a token left after its hit runs as a decode
    row) and reads as transformers'; with the restore replaced by
    zeroing, the same warm batch does not."""
    from pagoda.runtime import SamplingParams

    name = "granite4-moe-rope"
    _, model, loaded, reference = built(name)
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, block_size=16,
              max_num_batched_tokens=64, max_num_seqs=4)  # fmt: skip
    shared = prompts()[2]
    other, one_left = [*shared, 20, 21, 22], [*shared, 30]  # (a decode row after its hit)
    batch = [prompts()[0], other, shared, one_left]
    want = [reference[0], *(hf_greedy_plain(model, p, NEW) for p in (other, one_left))]
    want.insert(2, reference[2])
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
    cold = llm.generate([{"prompt_token_ids": shared}], params)[0]
    assert cold.num_cached_tokens == 0
    seen = record_logits(llm)

    def warm():
        seen.clear()
        outs = llm.generate([{"prompt_token_ids": p} for p in batch], params)
        return [((o.outputs[0].token_ids, seen[o.request_id]), o.num_cached_tokens) for o in outs]

    got = warm()
    assert [cached for _, cached in got] == [48, 48, 32, 48]
    for i, (g, _) in enumerate(got):
        check(g, want[i], f"{name}: prompt {i}, warm")
    restored = zero_the_restore(monkeypatch)
    wrong = warm()
    assert sum(restored) == 4
    with pytest.raises(AssertionError):
        for i, (g, _) in enumerate(wrong):
            check(g, want[i], "restore skipped")
    llm.engine.check_integrity()


@pytest.mark.parametrize("name", ["nemotron-h", "falcon-h1-gate-only"])
def test_snapshots_saved_inside_the_scan_are_the_states_a_chunk_end_leaves(built, name):
    """Two prompts (48 and 23 tokens) in one step save the states at 16 and 32 from inside
    the scan (its chunk boundaries in the two sequences' packed layout, the conv inputs before
    them); in 16-token steps, at the chunks' ends, from the slots. Both hold the same conv and
    SSM states (within the scan's rounding) for every Mamba layer; so does the one at 48, the
    chunk's end either way."""
    from pagoda.runtime import SamplingParams
    from pagoda.runtime.core.kv_cache_manager import hash_block

    _, _, loaded, _ = built(name)
    shared, other = prompts()[2], prompts()[1]
    hashes = []
    for p, n in ((shared, 3), (other, 1)):
        h = None
        for i in range(n):
            h = hash_block(h, p[16 * i : 16 * (i + 1)])
            hashes.append(h)

    def snapshots(budget: int) -> list[torch.Tensor]:
        llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, block_size=16,
                  max_num_batched_tokens=budget, max_num_seqs=2)  # fmt: skip
        llm.generate([{"prompt_token_ids": p} for p in (shared, other)],
                     SamplingParams(max_tokens=1))  # fmt: skip
        entries = torch.tensor([llm.engine.kv.snapshots.entry(h) for h in hashes])
        snaps = llm.engine.runner.mamba.snaps.values()
        return [t.index_select(0, entries) for pair in snaps for t in pair]

    for a, b in zip(snapshots(80), snapshots(16), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_snapshots_leave_an_explicit_context_its_blocks(built):
    """The snapshots take at most a quarter of the cache budget, but never the blocks an
    explicit `--max-model-len` that the budget holds needs: a budget of the 512-token context's
    32 blocks and two snapshots gives two snapshots (a quarter would be four, leaving 28
    blocks: the context capped to 448). A context the budget does not hold (`pagoda serve`
    passes the model's where `--max-model-len` is left out) is capped either way: the
    snapshots take their quarter (they took none: prefix caching was off)."""
    from pagoda.runtime.server.memory import kv_bytes_per_token

    _, _, loaded, _ = built("falcon-h1-mup")
    mc = loaded.config
    block = 16 * kv_bytes_per_token(mc, torch.float32, "auto")
    snap = mc.family.mamba.state_bytes(torch.float32, 1)
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=32 * block + 2 * snap + block // 2,
              block_size=16, max_model_len=512)  # fmt: skip
    assert llm.engine.max_model_len == 512 and llm.engine.runner.num_snapshots == 2
    assert llm.engine.config.cache.enable_prefix_caching
    short = LLM(loaded=loaded, dtype="float32", kv_cache_memory=20 * block, block_size=16,
                max_model_len=512)  # fmt: skip
    assert short.engine.runner.num_snapshots == 2  # a quarter of 20 blocks' bytes
    assert short.engine.max_model_len == 16 * 16 and short.engine.config.cache.enable_prefix_caching


def test_parallel_samples_each_prefill_their_own_state(built):
    """`n` > 1: without prefix caching the siblings of a request share their prompt's KV
    blocks (one salt); a hybrid's siblings must not, or a sibling's Mamba state would skip the
    prompt tokens it found cached. Each of the three samples reads as transformers'."""
    from pagoda.runtime import SamplingParams

    _, model, loaded, _ = built("bamba")
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, max_num_seqs=3)
    p = prompts()[0]
    seen = record_logits(llm)
    params = SamplingParams(temperature=0, n=3, max_tokens=NEW, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": p}], params)[0]
    want = hf_greedy_plain(model, p, NEW)
    assert len(seen) == 3
    for i, sample in enumerate(out.outputs):
        rid = next(r for r in seen if r.endswith(f"#{i}"))
        check((sample.token_ids, seen[rid]), want, f"sample {i}")


def _granite_4_micro(path):
    """Granite-4.0-Micro's shape: `GraniteMoeHybridForCausalLM` with attention in every layer
    (rotary, tied, Granite's multipliers, no experts): (transformers model, loaded, its greedy
    tokens and logits per prompt)."""
    from pagoda.runtime.model.loader import load_model

    model = make_tiny_model(
        path, "GraniteMoeHybrid", num_hidden_layers=2, layer_types=["attention", "attention"],
        **MAMBA, num_local_experts=0, shared_intermediate_size=64, position_embedding_type="rope",
        tie_word_embeddings=True, embedding_multiplier=12.0, residual_multiplier=0.22,
        attention_multiplier=0.0078125, logits_scaling=6.0,
    )  # fmt: skip
    return model, load_model(str(path)), [hf_greedy_plain(model, p, NEW) for p in prompts()]


def test_granite_4_micro_all_attention_keeps_prefix_caching(tmp_path):
    """No layer of Granite-4.0-Micro keeps a recurrent state, so prefix caching stays on: a
    second pass over the prompts hits the cache and still reads as transformers'."""
    from arch_cases import check_chunked_cached_batched

    _, loaded, reference = _granite_4_micro(tmp_path)
    llm = check_chunked_cached_batched(loaded, reference, "granite-4.0-micro")
    assert llm.engine.config.cache.enable_prefix_caching and llm.engine.kv.prefix_hits > 0


@pytest.mark.slow  # a second process (gloo): ~6 s on 2 busy cores
def test_granite_4_micro_on_two_ranks(tmp_path):
    """Granite-4.0-Micro (attention alone) splits over two ranks as Granite does: the small
    pool (chunked, preempted), then a warm cache; tokens and logits as transformers'."""
    from arch_cases import check_two_ranks

    _, loaded, reference = _granite_4_micro(tmp_path)
    check_two_ranks(tmp_path, loaded, reference, "granite-4.0-micro")


def test_state_slots_and_kv_layers(built):
    """The KV cache holds the attention layers only; each Mamba layer one conv and one SSM
    state slot per sequence (max_num_seqs of them)."""
    _, _, loaded, _ = built("granite4-moe-rope")
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, max_num_seqs=3,
              block_size=16)  # fmt: skip
    runner = llm.engine.runner
    assert loaded.config.num_kv_layers == 1
    conv, ssm = runner.mamba.states[0]
    assert conv.shape == (3, 128 + 2 * 2 * 16, 3) and ssm.shape == (3, 4, 32, 16)
    assert runner.mamba.states[2][1].shape == ssm.shape and 1 not in runner.mamba.states
    assert len(runner.kv_caches) == 3 and runner.kv_caches[0] == runner.kv_caches[2] == ()
    assert runner.bytes_per_block == 16 * runner.backend.bytes_per_token(torch.float32)


def test_the_slot_column_is_written_only_when_a_request_joins(built, monkeypatch):
    """A step reads its slots from the persistent column (one per block-table row): a slot is
    claimed once per request (the first step it runs), not per step; with 2 slots for 4
    requests, the slots of finished requests' rows are taken back for the later ones."""
    from pagoda.runtime import SamplingParams
    from pagoda.runtime.worker import mamba_state

    _, _, loaded, _ = built("granite4-moe-rope")
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, max_num_seqs=2)
    mamba = llm.engine.runner.mamba
    claims, steps = [], []
    claim, prepare = mamba_state.MambaState._claim, mamba_state.MambaState.prepare

    def spy_prepare(self, rows, *args):
        host = prepare(self, rows, *args)
        steps.append((rows.tolist(), host.slots.tolist()))
        return host

    monkeypatch.setattr(mamba_state.MambaState, "_claim", lambda self, row: claims.append(row)
                        or claim(self, row))  # fmt: skip
    monkeypatch.setattr(mamba_state.MambaState, "prepare", spy_prepare)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    llm.generate([{"prompt_token_ids": [5 + i, 17, 42]} for i in range(4)], params)
    assert len(claims) == 4 and len(steps) >= 16  # 4 requests of 8 tokens, 2 at a time
    for _, slots in steps:
        assert len(set(slots)) == len(slots) and all(0 <= s < 2 for s in slots)
    assert (mamba.slot_of_row >= 0).sum() == 2 and mamba.num_held == 0


def test_tensor_parallel_sizes_that_do_not_split_the_mixers(built):
    """A --tensor-parallel-size that does not split the Mamba2 heads or groups
    (`layout.mamba_problem`), in `pagoda serve`'s checks before it binds (one line, exit 2); two
    ranks run in tests/runtime/distributed/test_tp_hybrid.py."""
    from pagoda.runtime.distributed.layout import check
    from pagoda.runtime.distributed.layout import mamba_problem as problem

    _, _, loaded, _ = built("granite4-dense-nope")
    m = loaded.config.family.mamba  # 4 heads, 1 group
    assert problem(m, 2) is None and problem(m, 4) is None
    assert "does not divide the Mamba2 heads (mamba n_heads 4)" in problem(m, 8)
    six = dataclasses.replace(m, n_heads=12, n_groups=4)  # 6 ranks: 4 groups neither way
    assert problem(six, 2) is None and "n_groups 4" in problem(six, 6)
    c = loaded.config
    wide = dataclasses.replace(c, num_heads=12, num_kv_heads=6, intermediate_size=96,
                               family=dataclasses.replace(c.family, mamba=six))  # fmt: skip
    check(wide, 2)
    with pytest.raises(ValueError, match="neither divides the Mamba2 groups"):
        check(wide, 6)  # (attention and the MLP split over 6; the 12 Mamba2 heads too)


def test_a_missing_mamba_tensor_is_refused_in_one_line(built):
    from pagoda.runtime.model.checkpoint_check import check_checkpoint
    from safetensors import safe_open

    path, _, loaded, _ = built("bamba")
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        headers = {k: ("F32", list(f.get_slice(k).get_shape())) for k in f.keys()}  # noqa: SIM118
    check_checkpoint(loaded.config, headers)
    del headers["model.layers.2.mamba.dt_bias"]
    with pytest.raises(
        ValueError, match=re.escape("missing tensor 'model.layers.2.mamba.dt_bias'")
    ):
        check_checkpoint(loaded.config, headers)
    headers["model.layers.2.mamba.dt_bias"] = ("F32", [5])
    with pytest.raises(ValueError, match=re.escape("mamba.dt_bias is [5]")):
        check_checkpoint(loaded.config, headers)


@pytest.mark.parametrize(
    "name", ["granite4-moe-rope", "bamba", "nemotron-h", "nemotron-h-moe", "falcon-h1-mup"]
)
def test_the_weights_and_state_estimates(built, name):
    """`server/weights.py` against the built model (bf16), and the memory estimate's state
    slots: max_num_seqs x the Mamba layers' conv and SSM states (Nemotron-H's SSM state in
    float32); the KV cache's bytes per token count the attention layers only."""
    from model_bytes import check_estimate
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.distributed.layout import mamba_problem
    from pagoda.runtime.model import mamba_shard
    from pagoda.runtime.server import memory
    from pagoda.runtime.server.weights import estimate, from_shapes

    path, _, loaded, _ = built(name)
    # Nemotron-H's exactly (its float32 block and final norms counted)
    check_estimate(path, rel=0 if name.startswith("nemotron-h") else 0.02)
    shapes = from_shapes(loaded.config, torch.bfloat16, False)  # a config.json alone
    stored = sum(t.numel() for t in loaded.weights.values()) * 2  # every tensor, in bf16
    assert shapes == pytest.approx(stored, rel=0.02)
    mc = loaded.config
    if mamba_problem(mc.family.mamba, 2) is None:  # rank 0 of two: its heads' share
        check_estimate(path, tp=2)
        two = EngineConfig.create(str(path), device="cpu", dtype="bfloat16", max_num_seqs=8,
                                  tensor_parallel_size=2)  # fmt: skip
        unpacked = estimate(mc, two, path, device=torch.device("cuda"))  # (no CPU packing)
        assert from_shapes(mc, torch.bfloat16, False, 2) == pytest.approx(unpacked.bytes, rel=0.02)
        local = mamba_shard.local(mc.family.mamba, 2)  # every rank's slots, on this host
        want = 2 * local.state_bytes(torch.bfloat16, 8)
        assert memory.estimate(mc, two, path, torch.device("cpu")).parts()["Mamba state"] == want
    cfg = EngineConfig.create(str(path), device="cpu", dtype="bfloat16", max_num_seqs=8)
    fp = memory.estimate(mc, cfg, path, torch.device("cpu"))
    m = mc.family.mamba
    ssm = 4 if name.startswith("nemotron-h") else 2
    per_seq = m.num_layers * (m.conv_dim * 3 * 2 + m.n_heads * m.head_dim * m.d_state * ssm)
    assert fp.parts()["Mamba state"] == 8 * per_seq
    assert mc.num_kv_layers == (2 if name.startswith("falcon") else 1)
    per_token = mc.num_kv_layers * 2 * mc.num_kv_heads * mc.head_dim * 2  # K and V, bf16
    assert memory.kv_bytes_per_token(mc, torch.bfloat16, "auto") == per_token


def test_nemotron_h_configs_of_the_hub(tmp_path):
    """The older `hybrid_override_pattern` (Nemotron-H 8B's config.json) reads as
    `layers_block_type`; an unknown block type is refused in one line."""
    import json

    from pagoda.runtime.model.loader import read_model_config

    cfg = {"architectures": ["NemotronHForCausalLM"], "vocab_size": 300, "hidden_size": 64,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "intermediate_size": 128, "mamba_num_heads": 4, "mamba_head_dim": 32,
           "ssm_state_size": 16, "n_groups": 2, "num_hidden_layers": 4,
           "hybrid_override_pattern": "M-*-"}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    mc = read_model_config(str(tmp_path))
    m = mc.family.mamba
    assert m.layers == (True, False, False, False)
    assert m.mlp_layers == (False, True, False, True) and mc.num_kv_layers == 1
    assert m.ssm_float32 and mc.family.hidden_act == "relu2" and not mc.family.gated_mlp
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "hybrid_override_pattern": "M*X-"}))
    with pytest.raises(ValueError, match="unknown block types \\['X'\\]"):
        read_model_config(str(tmp_path))


def test_granite_4_h_1b_config_of_the_hub(tmp_path):
    """Granite-4.0-H-1B's config.json shape (its layer_types, 36 Mamba2 layers and 4 of
    attention under the hub's "mamba" / "attention" names, its Mamba sizes; the MLP widths and
    scalars filled in here; NoPE, an infinite time-step limit as Python's json writes it):
    read without weights, the KV cache per token counts 4 layers, the state slots 36, and the
    start-up checks work from the shapes alone."""
    import json

    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.model.loader import read_model_config
    from pagoda.runtime.server import fit, memory

    types = (["mamba"] * 5 + ["attention"] + ["mamba"] * 9 + ["attention"] + ["mamba"] * 9
             + ["attention"] + ["mamba"] * 9 + ["attention"] + ["mamba"] * 4)  # fmt: skip
    cfg = {"architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid",
           "hidden_size": 1536, "num_hidden_layers": 40, "vocab_size": 100352,
           "max_position_embeddings": 131072, "num_attention_heads": 12,
           "num_key_value_heads": 4, "intermediate_size": 4096, "shared_intermediate_size": 4096,
           "num_local_experts": 0, "mamba_n_heads": 48, "mamba_d_head": 64, "mamba_d_state": 128,
           "mamba_chunk_size": 256, "mamba_n_groups": 1, "layer_types": types,
           "position_embedding_type": "nope", "time_step_limit": [0.0, float("inf")],
           "embedding_multiplier": 12.0, "residual_multiplier": 0.22, "logits_scaling": 6.0,
           "attention_multiplier": 0.0078125, "tie_word_embeddings": True}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    mc = read_model_config(str(tmp_path))
    m = mc.family.mamba
    assert m.num_layers == 36 and mc.num_kv_layers == 4 and m.dt_max == float("inf")
    assert m.d_inner == 3072 and m.conv_dim == 3072 + 2 * 128 and mc.family.rope_layers[5] is False
    cfg_e = EngineConfig.create(str(tmp_path), device="cpu", dtype="bfloat16", max_num_seqs=16,
                                max_model_len=4096)  # fmt: skip
    per_seq = 36 * ((3072 + 256) * 3 + 48 * 64 * 128) * 2
    assert memory.estimate(mc, cfg_e, tmp_path, torch.device("cpu")).state == 16 * per_seq
    assert memory.kv_bytes_per_token(mc, torch.bfloat16, "auto") == 4 * 2 * 4 * 128 * 2
    plan = fit.check(mc, cfg_e, tmp_path)
    assert plan.state_bytes(mc) == 16 * per_seq
    # the largest step's activations count the chunked scan's temporaries and the conv's
    attention_only = dataclasses.replace(mc, family=dataclasses.replace(mc.family, mamba=None))
    tokens = min(cfg_e.scheduler.max_num_batched_tokens, 16 * 4096)
    scan = memory.step_bytes(mc, cfg_e, torch.bfloat16, None) - memory.step_bytes(
        attention_only, cfg_e, torch.bfloat16, None
    )
    assert scan == ssd_scan_bytes(cfg_e.scheduler.max_num_batched_tokens, 16, 48, 64, 128, 1,
                                  256) + tokens * 2 * (3072 + 256) * 4  # fmt: skip
    from pagoda.runtime.model.shape_fingerprint import shape_fingerprint

    print_ = shape_fingerprint(mc, "none")  # a tuned profile's: the Mamba layers' shapes too
    assert (print_["mamba_layers"], print_["attention_layers"], print_["mamba_heads"]) == (
        36,
        4,
        48,
    )
    # embedding 0.15B + 36 mixers 0.53B + 4 attention layers 0.03B + MLPs 0.75B
    assert 1.4e9 < mc.num_params < 1.5e9


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["granite4-moe-rope", "nemotron-h-moe", "falcon-h1-mup"])
def test_gpu_matches_transformers_without_host_syncs(built, name):
    """On CUDA (the Triton attention, CUDA graphs off for these models): transformers' tokens
    and logits, chunked and preempted; no step's launch syncs with the host
    (`arch_cases.tokens_without_host_syncs`: the Mamba layers' slots, prefill layout and state
    zeroing are all built on the host and copied without a sync)."""
    import os

    from arch_cases import tokens_without_host_syncs

    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("needs CUDA with compiled Triton kernels (TRITON_INTERPRET=0)")
    _, _, loaded, reference = built(name)
    common = dict(loaded=loaded, dtype="float32", kv_cache_memory=256 << 20,
                  max_num_batched_tokens=16, max_num_seqs=4)  # fmt: skip
    llm = LLM(**common)
    assert llm.engine.runner.cuda_graphs is None and llm.engine.runner.device.type == "cuda"
    got = generate(llm, prompts())
    for i, want in enumerate(reference):
        check(got[i], want, f"{name}: prompt {i}, cuda")
    tokens = [t for t, _ in got]
    assert tokens_without_host_syncs(LLM(**common, async_scheduling=False), prompts()) == tokens
    small = LLM(loaded=loaded, **{**SMALL_POOL, "device": "cuda"})
    for i, (want, g) in enumerate(zip(reference, generate(small, prompts()))):
        check(g, want, f"{name}: prompt {i}, cuda, preempted")


def _scan_peak(lens, heads, head_dim, d_state, groups, chunk) -> int:
    """The measured peak of the step's scan (`ssd.scan_step`: each group of sequences packed
    and scanned) of prompts of `lens` tokens, its inputs and output counted."""
    import types

    g = torch.Generator().manual_seed(0)
    p = pack(lens, chunk, 4)
    assert all(q.num_chunks * chunk <= scan_rows(sum(lens), chunk) for q in p.groups)
    order = torch.from_numpy(p.order)
    scan = [types.SimpleNamespace(**{**q.__dict__, "slots": order[slice(*q.seqs)]})
            for q in p.groups]  # fmt: skip
    for q in scan:
        for f in ("tokens", "rows", "chunk_of", "in_chunk"):
            setattr(q, f, torch.from_numpy(getattr(q, f)))
    A = -torch.rand(heads, generator=g)
    ssm = torch.zeros(len(lens), heads, head_dim, d_state)
    t = sum(lens)
    with LiveBytes([A, ssm]) as live:
        x = torch.randn(t, heads, head_dim, generator=g)
        dt = torch.rand(t, heads, generator=g)
        B = torch.randn(t, groups, d_state, generator=g)
        C = torch.randn(t, groups, d_state, generator=g)
        y = scan_step(x, dt, A, B, C, ssm, scan, chunk)
        del x, dt, B, C, y
    return live.peak


@pytest.mark.parametrize(
    "lens, heads, head_dim, d_state, groups, chunk",
    [
        ([512], 8, 32, 64, 1, 64),
        ([300], 4, 16, 128, 2, 32),
        ([256], 4, 64, 32, 4, 128),
        ([193, 1, 65, 1, 1], 8, 32, 64, 2, 64),
    ],  # fmt: skip  (2 groups)
)
def test_the_scan_temporaries_estimate_bounds_the_measured_peak(
    lens, heads, head_dim, d_state, groups, chunk
):
    """`ssd_scan_bytes` (the memory estimate's, the fit check's and the CUDA runner's term for
    the chunked scan) is at least the scan's measured peak and at most twice it."""
    peak = _scan_peak(lens, heads, head_dim, d_state, groups, chunk)
    est = ssd_scan_bytes(sum(lens), len(lens), heads, head_dim, d_state, groups, chunk)
    assert peak <= est <= 2 * peak, (peak, est)


def test_seventeen_4k_prompts_fit_the_step_estimate():
    """A step of 17 prompts of 4000 tokens (none a whole number of chunks): each pads to 4096
    in the packed layout, beyond one sequence's padding of 68000 tokens, so they are scanned in
    two groups; the estimate of a 68000-token step of up to 17 sequences (what the fit check
    keeps free) bounds the peak."""
    lens, shape = [4000] * 17, (2, 8, 16, 1, 256)
    peak = _scan_peak(lens, *shape)
    assert peak <= ssd_scan_bytes(sum(lens), 17, *shape)
    assert 17 * 4096 > scan_rows(sum(lens), 256) == 68096  # scanned in 2 groups
    assert len(pack(lens, 256, 4).groups) == 2


def test_the_scan_is_kept_free_on_cuda_for_the_step_token_budget(tmp_path, monkeypatch):
    """Nemotron-Nano-9B-v2's shapes (128 Mamba heads of 80, d_state 128, chunk 128): an
    8k-token step's scan needs ~4.4 GiB, which the fit check (and the runner) keep free on CUDA
    beside the flat 1 GiB, and which the memory estimate's activations count."""
    import json

    from pagoda.runtime import config
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.model import mamba2
    from pagoda.runtime.model.loader import read_model_config
    from pagoda.runtime.server import fit, memory

    cfg = {"architectures": ["NemotronHForCausalLM"], "vocab_size": 131072, "hidden_size": 4480,
           "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
           "intermediate_size": 15680, "mamba_num_heads": 128, "mamba_head_dim": 80,
           "ssm_state_size": 128, "n_groups": 8, "chunk_size": 128, "num_hidden_layers": 4,
           "hybrid_override_pattern": "M-*-"}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    mc = read_model_config(str(tmp_path))
    scan = mamba2.scan_bytes(mc, 8192, 64)  # max_num_seqs 64: the default
    assert 4 << 30 < scan < 5 << 30
    assert mamba2.scan_bytes(dataclasses.replace(mc, family=dataclasses.replace(
        mc.family, mamba=None)), 8192, 64) == 0  # fmt: skip
    monkeypatch.setattr(memory, "device_available", lambda d: (80 << 30, 80 << 30))
    monkeypatch.setattr(config, "fp8_runs_on", lambda d: False)
    monkeypatch.setattr(fit, "fp8_runs_on", lambda d: False)
    run = dict(device="cuda", max_model_len=4096, max_num_batched_tokens=8192)
    plan = fit.check(mc, EngineConfig.create(str(tmp_path), **run), tmp_path)
    have, _ = fit.usable(EngineConfig.create(str(tmp_path), **run), torch.device("cuda"))
    assert have - scan > plan.weight_bytes(mc)  # fits, with the scan kept free
    # a GPU whose usable memory the scan takes: refused, the scan named
    small = int((plan.weight_bytes(mc) + 2 * scan // 3) / 0.9) + (1 << 30)
    monkeypatch.setattr(memory, "device_available", lambda d: (small, small))
    with pytest.raises(Exception, match="for the Mamba scan of a 8192-token step"):
        fit.check(mc, EngineConfig.create(str(tmp_path), **run), tmp_path)
    fp = memory.estimate(mc, EngineConfig.create(str(tmp_path), device="cpu",
                                                 max_num_batched_tokens=8192),
                         tmp_path, torch.device("cpu"))  # fmt: skip
    assert fp.activations >= scan


def test_lfm2_estimates_checks_and_refusals(built, tmp_path):
    """LFM2's short convs in the start-up arithmetic: the weights estimate against the built
    model (LFM2-MoE's too), state slots of a conv state alone (no SSM state, no scan), the checkpoint check
    naming a conv tensor (tensor parallelism refused: below); LFM2-1.2B's config.json
    (its older keys beside the new) read without weights; an unknown layer type refused."""
    import json

    from model_bytes import check_estimate
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.model import mamba2
    from pagoda.runtime.model.checkpoint_check import check_checkpoint
    from pagoda.runtime.model.loader import read_model_config
    from pagoda.runtime.server import memory
    from pagoda.runtime.server.weights import from_shapes

    for name in ("lfm2-moe", "lfm2-bias"):
        path, _, loaded, _ = built(name)
        mc = loaded.config
        check_estimate(path, rel=0.02)
        stored = sum(t.numel() for t in loaded.weights.values()) * 2
        assert from_shapes(mc, torch.bfloat16, False) == pytest.approx(stored, rel=0.02)
    cfg = EngineConfig.create(str(path), device="cpu", dtype="bfloat16", max_num_seqs=8)
    state = memory.estimate(mc, cfg, path, torch.device("cpu")).parts()["Mamba state"]
    assert state == 8 * 2 * 64 * 3 * 2 and mamba2.scan_bytes(mc, 256, 8) == 0  # 2 conv layers
    headers = {n: loaded.weights.dtype_and_shape(n) for n in loaded.weights}  # (read as Llama's)
    check_checkpoint(mc, headers)
    del headers["model.layers.1.conv.conv.bias"]
    with pytest.raises(
        ValueError, match=re.escape("missing tensor 'model.layers.1.conv.conv.bias'")
    ):
        check_checkpoint(mc, headers)
    types = ["conv", "conv", "full_attention", "conv", "conv", "full_attention", "conv", "conv",
             "full_attention", "conv", "full_attention", "conv", "full_attention", "conv",
             "full_attention", "conv"]  # fmt: skip
    hub = {"architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2", "block_dim": 2048,
           "block_ff_dim": 12288, "block_auto_adjust_ff_dim": True, "block_multiple_of": 256,
           "block_ffn_dim_multiplier": 1.0, "conv_L_cache": 3, "conv_bias": False,
           "hidden_size": 2048, "intermediate_size": 12288, "layer_types": types,
           "max_position_embeddings": 128000, "norm_eps": 1e-05, "num_attention_heads": 32,
           "num_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
           "rope_theta": 1000000.0, "tie_embedding": True, "vocab_size": 65536}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(hub))
    hub_mc = read_model_config(str(tmp_path))
    assert hub_mc.intermediate_size == 8192 and hub_mc.tie_word_embeddings
    assert hub_mc.family.mamba.num_layers == 10 and hub_mc.num_kv_layers == 6
    assert hub_mc.rms_norm_eps == 1e-5 and hub_mc.rope_theta == 1e6
    assert 1.1e9 < hub_mc.num_params < 1.3e9  # LFM2-1.2B
    (tmp_path / "config.json").write_text(json.dumps({**hub, "layer_types": ["mamba"] * 16}))
    with pytest.raises(ValueError, match=re.escape("layer_types ['mamba'] are not supported")):
        read_model_config(str(tmp_path))


def test_lfm3_estimate_checkpoint_check_and_published_config(built, tmp_path):
    """LFM3: the weights estimate against the built model (its head gates and sandwich norms
    counted), the checkpoint check naming a missing gate (`gate_proj`, as published: transformers
    reads it as g_proj); LFM3-1.7B's config.json (transformers' Lfm3Config defaults) read without
    weights: its layer kinds, rotary by kind, window, ids and transformers' parameter count on
    the meta device (less the attention layers' q/k norms, which `num_params` leaves out for the hybrids)."""
    import json

    from pagoda.runtime.model.checkpoint_check import check_checkpoint
    from pagoda.runtime.model.loader import read_model_config
    from pagoda.runtime.server.weights import from_shapes

    _, _, loaded, _ = built("lfm3", reference=False)
    mc = loaded.config
    stored = sum(t.numel() for t in loaded.weights.values()) * 2
    assert from_shapes(mc, torch.bfloat16, False) == pytest.approx(stored, rel=0.02)
    headers = {n: loaded.weights.dtype_and_shape(n) for n in loaded.weights}
    check_checkpoint(mc, headers)
    gate = "model.layers.1.self_attn.gate_proj.weight"
    del headers[gate]
    with pytest.raises(ValueError, match=re.escape(f"missing tensor '{gate}'")):
        check_checkpoint(mc, headers)
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["Lfm3ForCausalLM"], "model_type": "lfm3"})
    )
    t = transformers.AutoConfig.from_pretrained(tmp_path)
    o = read_model_config(str(tmp_path))
    kinds = [
        {"conv": "c", "sliding_attention": "s", "full_attention": "f"}[k] for k in t.layer_types
    ]
    ours = ["c" if o.family.mamba.layers[i] else "s" if o.family.window(i) else "f"
            for i in range(o.num_layers)]  # fmt: skip
    assert ours == kinds and o.family.sliding_window == t.sliding_window == 256
    assert o.rope_scaling == t.rope_parameters["full_attention"] and o.rope_theta == 1e6
    assert o.family.local_rope_theta == t.rope_parameters["sliding_attention"]["rope_theta"]
    assert (o.bos_token_id, list(o.eos_token_ids)) == (t.bos_token_id, [t.eos_token_id])
    assert o.family.glm4_norms and o.family.mamba.attn_head_gate and o.tie_word_embeddings
    with torch.device("meta"):
        hf = transformers.Lfm3ForCausalLM(t)
    norms = 2 * o.num_kv_layers * o.head_dim  # the attention layers' q/k norms
    assert o.num_params + norms == sum(p.numel() for p in hf.parameters()) == 1_728_801_536


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lfm3s_rotary_is_transformers_bit_for_bit(dtype):
    """LFM3's rotary (`lfm2.rotary_float32`: rotate-half, the proportional table: half the
    angles) against transformers' own (`arch_cases.check_rotary_float32`)."""
    from pagoda.runtime.model.lfm2 import rotary_float32
    from transformers.models.lfm3 import modeling_lfm3 as hf

    scaling = {"rope_type": "proportional", "partial_rotary_factor": 0.5}
    check_rotary_float32(rotary_float32, hf, dtype, 1e6, scaling)


def test_mamba2_alone_sizes_and_the_hub_config(built, tmp_path):
    """Mamba2ForCausalLM has no attention layer (nor Granite 4.0 with transformers' default
    layer_types, "granite4-all-mamba", checked against transformers above): the memory check
    counts no KV cache and the state slots alone (with prefix caching, the snapshots' share of
    the budget), the engine's blocks are positions only (0 bytes; enough for every sequence's
    context), the scheduler runs at most its state slots' sequences; the weights
    estimate matches the built model. Mamba-Codestral-7B's config.json reads without weights:
    7.3B parameters, 64 Mamba layers, no KV."""
    import json

    from model_bytes import check_estimate
    from pagoda.runtime import SamplingParams, options
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.model.loader import read_model_config
    from pagoda.runtime.server import fit, memory

    path, _, loaded, _ = built("mamba2")
    mc = loaded.config
    check_estimate(path, rel=0.02)
    cfg = EngineConfig.create(str(path), device="cpu", dtype="float32", max_num_seqs=8,
                              enable_prefix_caching=False)  # fmt: skip
    parts = memory.check(mc, cfg, path, 256).parts()
    per_seq = 2 * ((128 + 2 * 2 * 16) * 3 + 4 * 32 * 16) * 4  # 2 layers: conv, SSM (float32)
    assert parts["KV cache"] == 0 and parts["Mamba state"] == 8 * per_seq
    # with prefix caching, the state snapshots' share of the budget is all the cache counts
    cached = dataclasses.replace(
        cfg, cache=dataclasses.replace(cfg.cache, enable_prefix_caching=True)
    )
    budget = options.DEFAULT_CPU_KV_CACHE_MEMORY * options.SNAPSHOT_SHARE
    assert memory.check(mc, cached, path, 256).parts()["KV cache"] == budget
    assert fit.check(mc, cfg, path).state_bytes(mc) == parts["Mamba state"]
    llm = LLM(loaded=loaded, dtype="float32", max_num_seqs=2, max_model_len=256)
    assert llm.engine.runner.bytes_per_block == 0 and llm.engine.runner.num_blocks == 2 * 17
    steps = []
    schedule = llm.engine.scheduler.schedule
    llm.engine.scheduler.schedule = lambda: steps.append(out := schedule()) or out
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    llm.generate([{"prompt_token_ids": [5 + i, 9]} for i in range(5)], params)
    assert max(len(s.scheduled) for s in steps) == 2  # 5 requests, 2 state slots
    assert llm.engine.runner.mamba.num_held == 0
    hub = {"architectures": ["Mamba2ForCausalLM"], "chunk_size": 256, "conv_kernel": 4,
           "expand": 2, "head_dim": 64, "hidden_act": "silu", "hidden_size": 4096,
           "layer_norm_epsilon": 1e-05, "model_type": "mamba2", "n_groups": 8,
           "norm_before_gate": False, "num_heads": 128, "num_hidden_layers": 64,
           "residual_in_fp32": True, "rms_norm": True, "state_size": 128,
           "tie_word_embeddings": False, "time_step_limit": [0.0, float("inf")],
           "time_step_rank": 256, "use_bias": False, "use_conv_bias": True,
           "vocab_size": 32768}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(hub))
    hub_mc = read_model_config(str(tmp_path))
    m = hub_mc.family.mamba
    assert m.num_layers == 64 and hub_mc.num_kv_layers == 0 and m.conv_dim == 8192 + 2 * 8 * 128
    assert memory.kv_bytes_per_token(hub_mc, torch.bfloat16, "auto") == 0
    assert 7.2e9 < hub_mc.num_params < 7.4e9
    (tmp_path / "config.json").write_text(json.dumps({**hub, "hidden_act": "gelu"}))
    with pytest.raises(ValueError, match="hidden_act 'gelu' is not supported in a mamba2 model"):
        read_model_config(str(tmp_path))


def test_mamba1_estimates_and_the_hub_configs(built, tmp_path):
    """Mamba-1: the weights estimate against the built model, state slots of a conv state
    [d_inner, 3] and an SSM state [d_inner, d_state] per layer, no KV cache (one rank only: below);
    mamba-130m-hf's and Falcon-Mamba-7B's config.json read without weights."""
    import json

    from model_bytes import check_estimate
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.model.loader import read_model_config
    from pagoda.runtime.server import memory, weights
    from pagoda.runtime.server.placement import Placement

    path, _, loaded, _ = built("falcon-mamba")
    mc = loaded.config
    check_estimate(path, rel=0.02)
    table = weights.read_checkpoint(path, mc.architecture)  # the config-only count exactly
    got, _ = weights.resident(table, mc, Placement(torch.bfloat16, "cuda", 1, None))
    assert weights.from_shapes(mc, torch.bfloat16, False) == got  # (one norm a layer; A, D f32)
    cfg = EngineConfig.create(str(path), device="cpu", dtype="float32", max_num_seqs=8,
                              enable_prefix_caching=False)  # fmt: skip
    parts = memory.check(mc, cfg, path, 256).parts()
    assert parts["KV cache"] == 0 and parts["Mamba state"] == 8 * 2 * (128 * 3 + 128 * 8) * 4
    hub = {"architectures": ["MambaForCausalLM"], "conv_kernel": 4, "d_inner": 1536,
           "d_model": 768, "expand": 2, "hidden_act": "silu", "hidden_size": 768,
           "intermediate_size": 1536, "layer_norm_epsilon": 1e-05, "model_type": "mamba",
           "n_layer": 24, "num_hidden_layers": 24, "residual_in_fp32": True, "rms_norm": True,
           "state_size": 16, "time_step_rank": 48, "use_bias": False, "use_conv_bias": True,
           "vocab_size": 50280}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(hub))
    small = read_model_config(str(tmp_path))
    assert small.family.mamba.dt_rank == 48 and small.num_kv_layers == 0
    assert small.tie_word_embeddings and 1.25e8 < small.num_params < 1.35e8  # mamba-130m
    falcon = {**hub, "architectures": ["FalconMambaForCausalLM"], "model_type": "falcon_mamba",
              "hidden_size": 4096, "intermediate_size": 8192, "num_hidden_layers": 64,
              "time_step_rank": 256,
              "vocab_size": 65024, "tie_word_embeddings": False, "mixer_rms_eps": 1e-06}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(falcon))
    big = read_model_config(str(tmp_path))
    assert big.family.mamba.bcdt_eps == 1e-6 and big.family.mamba.d_inner == 8192
    assert 7.1e9 < big.num_params < 7.4e9  # Falcon-Mamba-7B


@pytest.mark.parametrize("name", ["lfm2", "lfm2-bias", "lfm3", "mamba1", "falcon-mamba"])
def test_tensor_parallelism_and_fp8_are_refused_for_short_convs_and_mamba1(built, name):
    """`--tensor-parallel-size 2` and `--quantization fp8` on LFM2's (LFM3's) or Mamba-1's layers:
    refused in one line at start (`layout.check`, `start_checks.check_dtype`, which `pagoda serve`
    runs before it binds), not served untested (`hybrid_cases.REFUSED`)."""
    check_refused(name, built(name, reference=False)[2].config)
