"""Qwen4-Exp (`model/qwen4_exp.py`: Qwen3.5-MoE's Gated DeltaNet and gated attention layers
between hyper-connection streams, Per-Layer Embeddings of hashed n-grams) against transformers,
token for token, on the tiny random checkpoint of tests/runtime/hybrid_cases.py's "qwen4-exp"
row (written once a session by its `built` fixture), float32, logits within 1e-3:

- chunked (16-token steps: the PLE conv's inputs and the n-gram history carried across
  chunks), batched with two state slots, again in reverse order, a one-token prompt, and a pool
  so small that requests are preempted (`hybrid_checks.check_chunked_batched_preempted`);
- a warm prefix: 64 tokens restored from a snapshot saved inside a whole-prompt step and at a
  chunk's end (the PLE conv's inputs in it); without the restore it does not read so;
- the multimodal checkpoint (`Qwen4ExpForConditionalGeneration`) read as its text model;
- bfloat16: the same tokens alone and chunked among others;
- the QSA indexer's sparse selection (2 blocks of 4 and the tail: the prompts attend sparsely
  past 11 tokens; attending densely instead, the logits part from transformers' by 0.016);
- two tensor-parallel ranks (gloo): transformers' tokens;
- refusals in one line: four ranks, FP8, a missing tensor.
"""

from __future__ import annotations

import json

import pytest
import torch
from arch_cases import check, generate
from hf_oracle import hf_greedy_plain, save_word_tokenizer
from hybrid_cases import CASES, check_missing_refused, check_refused
from hybrid_checks import check_chunked_batched_preempted, zero_the_restore
from pagoda.runtime import LLM

transformers = pytest.importorskip("transformers")

NAME = "qwen4-exp"


def test_greedy_matches_transformers_chunked_batched_and_preempted(built):
    check_chunked_batched_preempted((NAME, *built(NAME)))


def test_a_warm_prefix_restores_the_ple_conv_and_the_delta_state(built, monkeypatch):
    """A 70-token prompt saves the snapshot at 64 (DeltaNet chunks of 64): inside its one
    whole-prompt step (budget 256) or at a 16-token chunk's end (budget 16). A prompt sharing
    66 tokens then restores it (the PLE conv's last inputs with the DeltaNet's states) and
    reads its n-grams' earlier tokens from the history: transformers' tokens and logits; with
    the PLE conv's inputs left out of the restore, or the restore replaced by zeros, it does
    not read so."""
    _, model, loaded, _ = built(NAME, reference=False)
    first = [(11 * i + 3) % 290 + 5 for i in range(70)]
    second = [*first[:66], 21, 22]
    want = hf_greedy_plain(model, second, 3)
    for budget in (256, 16):
        llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, block_size=16,
                  max_num_batched_tokens=budget, max_num_seqs=2)  # fmt: skip
        generate(llm, [first], 1)
        hits = llm.engine.kv.prefix_hits
        check(generate(llm, [second], 3)[0], want, f"warm after {budget}-token steps")
        assert llm.engine.kv.prefix_hits - hits == 64
    from pagoda.runtime.worker.mamba_state import MambaState

    restore = MambaState.restore

    def without_ple(self, slots, entries):  # the DeltaNet states restored, the PLE conv's not
        restore(self, slots, entries)
        for conv, _ in self.states.values():
            conv[:, self.m.conv_dim :].index_fill_(0, slots, 0)

    monkeypatch.setattr(MambaState, "restore", without_ple)
    with pytest.raises(AssertionError):
        check(generate(llm, [second], 3)[0], want, "the PLE conv's inputs not restored")
    restored = zero_the_restore(monkeypatch)
    with pytest.raises(AssertionError):
        check(generate(llm, [second], 3)[0], want, "restore skipped")
    assert restored == [1]


def _conditional(path, text_model):
    """Qwen4ExpForConditionalGeneration with a tiny vision tower and the case's text weights,
    saved as published (config.json's text_config, `model.language_model.` tensors)."""
    from hf_oracle import TINY

    text = dict(TINY, pad_token_id=0) | CASES[NAME][1]
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64,
                  patch_size=4, num_position_embeddings=16)  # fmt: skip
    cfg = transformers.Qwen4ExpConfig(text_config=text, vision_config=vision)
    model = transformers.Qwen4ExpForConditionalGeneration(cfg).eval()
    state = {k.replace("model.", "model.language_model.", 1): v
             for k, v in text_model.state_dict().items()}  # fmt: skip
    missing, _ = model.load_state_dict(state, strict=False)
    assert all(k.startswith("model.visual.") for k in missing)
    model.save_pretrained(path)
    save_word_tokenizer(path, text["vocab_size"])
    return model


def test_the_multimodal_checkpoint_reads_as_its_text_model(built, tmp_path):
    """The conditional checkpoint (its text weights the case's) serves as the case's text
    model: transformers' tokens of the case, chunked and batched."""
    from pagoda.runtime.model.loader import load_model
    from safetensors import safe_open

    _, text_model, _, reference = built(NAME)
    _conditional(tmp_path, text_model)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen4ExpForConditionalGeneration"]
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    assert any(n.startswith("model.language_model.layers.0.ple.") for n in names)
    assert any(n.startswith("model.visual.") for n in names)
    loaded = load_model(str(tmp_path))
    assert loaded.config.architecture == "qwen4_exp"
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, block_size=16,
              max_num_batched_tokens=16, max_num_seqs=3)  # fmt: skip
    from arch_cases import prompts

    for i, (got, want) in enumerate(zip(generate(llm, prompts()), reference)):
        check(got, want, f"conditional: prompt {i}")


def test_bf16_tokens_do_not_depend_on_chunks_or_batch(built):
    """bfloat16: each prompt alone in one step, and chunked among the others, the same tokens."""
    from arch_cases import prompts
    from pagoda.runtime.model.linear import bf16_rows_invariant

    if not bf16_rows_invariant():
        pytest.skip("bf16 GEMMs on AMX round a row by the row count (docs/runtime.md)")
    _, _, loaded, _ = built(NAME, reference=False)
    common = dict(loaded=loaded, dtype="bfloat16", kv_cache_memory=16 << 20)
    plain = LLM(**common, enable_prefix_caching=False, enable_chunked_prefill=False)
    alone = [generate(plain, [p])[0][0] for p in prompts()]
    busy = LLM(**common, max_num_batched_tokens=16, max_num_seqs=3)
    assert [t for t, _ in generate(busy, prompts())] == alone


@pytest.mark.slow  # a second process (gloo)
def test_two_ranks_match_transformers(built):
    """Two ranks (gloo), the small pool (preempted) then a warm cache: each rank its DeltaNet
    key heads and attention heads (one KV head), the experts by width; the hyper-connections,
    the PLE (its n-gram history sent with each step, its conv's inputs in every rank's state
    slots) and the QSA indexer whole on each; transformers' tokens and logits, preempted, then
    on a warm prefix (each rank's DeltaNet heads' states and the whole PLE conv's inputs
    restored from its snapshots)."""
    from arch_cases import SMALL_POOL, prompts

    path, model, loaded, reference = built(NAME)
    first = [(11 * i + 3) % 290 + 5 for i in range(70)]  # (as the warm prefix test's)
    second = [*first[:66], 21, 22]
    with LLM(str(path), loaded=loaded, tensor_parallel_size=2, **SMALL_POOL) as two:
        got = generate(two, prompts())
        core = two.engine
        assert core.scheduler.num_preemptions > 0 and core.runner.backend.num_kv_heads == 1
        generate(two, [first], 1)
        hits = core.kv.prefix_hits
        warm = generate(two, [second], 3)[0]
        assert core.kv.prefix_hits - hits == 64  # (each rank's snapshot at 64, restored)
        core.check_integrity()
    for i, g in enumerate(got):
        check(g, reference[i], f"{NAME}: prompt {i}, two ranks")
    check(warm, hf_greedy_plain(model, second, 3), "two ranks, warm")


def test_refusals(built):
    """Four ranks (more than the DeltaNet key heads) and FP8 refused in one line; the context not capped by the QSA
    indexer (its sparse selection is built: 512 positions, 200 accepted); a missing
    hyper-connection, PLE or indexer tensor, naming it."""
    from pagoda.runtime.engine.start_checks import check_max_model_len

    _, _, loaded, _ = built(NAME, reference=False)
    mc = loaded.config
    check_refused(NAME, mc)
    assert check_max_model_len(200, mc) == 200
    assert mc.family.qwen4.indexer_dense_limit == 11  # 2 blocks of 4 kept, a tail of 3
    # the indexer's tables count in the KV budget: one attention layer's raw key (16 float32) a
    # token and a block key (16 float32) a block of 4
    from pagoda.runtime.server.memory import kv_bytes_per_token

    kv = kv_bytes_per_token(mc, torch.float32, "auto")
    assert kv == 2 * mc.num_kv_heads * mc.head_dim * 4 + 16 * 4 + 16 * 4 // 4
    check_missing_refused(loaded, ["model.layers.0.ple.key_proj.weight",
                                   "model.layers.1.mlp_hyper_connection.input_mix_weight_up.weight",
                                   "model.hyper_connection_mixer.hc_norm.weight",
                                   "model.layers.1.self_attn.indexer.index_qk_proj.weight"])  # fmt: skip
    assert torch.equal(mc.family.qwen4.multipliers(300, 0), built(NAME, reference=False)[1]
                       .model.layers[0].ple.ple_embedding.layer_multipliers)  # fmt: skip


def test_the_weights_count_as_transformers_counts_them(built):
    """`ModelConfig.num_params` (the memory estimate's): the hyper-connections, the n-gram
    tables and the indexers counted, the norms Qwen4-Exp has not left out (within the q/k
    norms' few weights of transformers' count)."""
    _, model, loaded, _ = built(NAME, reference=False)
    want = sum(p.numel() for p in model.parameters())
    assert abs(loaded.config.num_params - want) <= 64, (loaded.config.num_params, want)


def test_the_cache_rows_read_back_in_every_layout(monkeypatch):
    """What Qwen4-Exp's sparse path stores and gathers (`AttentionBackend.write_kv` /
    `read_kv`) reads back at random slots: the CPU kernel's packed layout (float32 and
    bfloat16), the torch path's head-major one and the [NB, BS, Hkv, D] one of the other
    backends (Triton's, `AttentionBackend`'s own)."""
    from pagoda.runtime.attention import get_attention_backend
    from pagoda.runtime.attention.base import AttentionBackend

    cpu = torch.device("cpu")
    slots = torch.randperm(64)[:20]
    for switch, dtype in (("kernel", torch.float32), ("kernel", torch.bfloat16),
                          ("torch", torch.float32)):  # fmt: skip
        monkeypatch.setenv("PAGODA_CPU_ATTENTION", switch)
        be = get_attention_backend("torch", cpu, 4, 2, 32, 32**-0.5)
        k_cache, v_cache = be.allocate_kv_cache(4, 16, dtype, cpu)
        if switch == "kernel" and be.kernel is None:
            continue  # (the kernel did not build here)
        k, v = torch.randn(2, 20, 2, 32).to(dtype)
        be.write_kv(k, v, k_cache, v_cache, slots)
        got = be.read_kv(k_cache, v_cache, slots)
        assert torch.equal(got[0], k) and torch.equal(got[1], v), (switch, dtype)
    k_cache, v_cache = torch.zeros(2, 4, 16, 2, 32).unbind(0)
    k, v = torch.randn(2, 20, 2, 32)
    AttentionBackend.write_kv(None, k, v, k_cache, v_cache, slots)
    got = AttentionBackend.read_kv(None, k_cache, v_cache, slots)
    assert torch.equal(got[0], k) and torch.equal(got[1], v)
    assert torch.equal(k_cache.view(64, 2, 32)[slots], k)


def test_a_step_pools_only_the_blocks_its_tokens_end(built, monkeypatch):
    """The indexer pools each block once, when a step's token ends it (`PoolTable.close`: a
    chunk the blocks it ends, a decode its token's block), and the selection reads the block
    table only (its raw key rows hidden while it selects): a 53-token prompt in 16-token
    chunks, then decodes, never pools the context's every block; the tokens and logits still
    transformers'."""
    from pagoda.runtime.model.qwen4_qsa import QsaIndexer

    _, model, loaded, _ = built(NAME, reference=False)
    pooled, selected, block_keys, select = [], [], QsaIndexer._block_keys, QsaIndexer.select

    def counted(self, slots, first):
        pooled.append(tuple(slots.shape))
        return block_keys(self, slots, first)

    def blind(self, q, meta):  # the raw keys out of reach: only the block table is read
        rows, self.keys.rows = self.keys.rows, None
        selected.append(meta.num_tokens)
        try:
            return select(self, q, meta)
        finally:
            self.keys.rows = rows

    monkeypatch.setattr(QsaIndexer, "_block_keys", counted)
    monkeypatch.setattr(QsaIndexer, "select", blind)
    prompt = [(7 * i + 5) % 290 + 5 for i in range(53)]
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, block_size=16,
              max_num_batched_tokens=16, max_num_seqs=2)  # fmt: skip
    check(generate(llm, [prompt], 6)[0], hf_greedy_plain(model, prompt, 6), "pooled once")
    assert pooled[:4] == [(4, 4), (4, 4), (4, 4), (1, 4)]  # the blocks the prompt's chunks end
    assert pooled[4:] == [(1, 4)] * 5  # each decode: its own token's block (ended or not)
    assert selected == [16, 16, 16, 5, 1, 1, 1, 1, 1]  # every step sparse (past 11 tokens)
