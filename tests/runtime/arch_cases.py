"""Tiny checkpoints of every architecture, and how they are run against transformers: shared
by tests/runtime/model/test_architectures.py, the Triton-backend run in test_triton_engine.py and
the family modules (test_dense_archs.py, test_moe_families.py, ...). A family module is a table:
its CASES, a writer bound as `built = built_fixture(write)` and `case = case_fixture(CASES)`, and
the shared tests bound by name (`greedy_test()`, `gpu_test(...)`) beside its own checks; the
checkpoint-writing steps themselves are tests/runtime/hf_oracle.py's."""

from __future__ import annotations

import pytest
import torch
from hf_oracle import hf_greedy_plain, hf_greedy_plain_batch, make_tiny_model
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model.loader import load_model

NEW = 6
SLIDING, FULL = "sliding_attention", "full_attention"
# llama3's rotary scaled over an original context of 64 (the prompts pass it)
LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}  # fmt: skip
# Ministral 3's rotary: yarn over an original context of 16, so that q's scale changes within
# the prompts (1 + beta * log(1 + floor(p / 16)))
MINISTRAL3_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 32.0, "beta_fast": 32.0,
                   "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                   "original_max_position_embeddings": 16, "llama_4_scaling_beta": 0.5}  # fmt: skip
# name: (transformers config class prefix, config overrides, extra engine arguments)
CASES = {
    "qwen3-d64": ("Qwen3", dict(head_dim=64), {}),
    "qwen3-d128-tied": ("Qwen3", dict(head_dim=128, tie_word_embeddings=True), {}),
    "qwen3-window-layers": (  # a window on the layers from max_window_layers on
        "Qwen3",
        dict(head_dim=64, use_sliding_window=True, sliding_window=10, max_window_layers=1),
        {},
    ),
    "llama-biases": ("Llama", dict(attention_bias=True, mlp_bias=True), {}),
    "mistral-window": ("Mistral", dict(sliding_window=11, num_hidden_layers=3), {}),
    "gemma3-window": (
        "Gemma3Text",
        dict(head_dim=64, sliding_window=9, num_hidden_layers=3, layer_types=[SLIDING, FULL, SLIDING],
             query_pre_attn_scalar=48, rope_parameters={
                 FULL: {"rope_type": "linear", "factor": 2.0, "rope_theta": 100000.0},
                 SLIDING: {"rope_type": "default", "rope_theta": 10000.0}}),
        {},
    ),
    "gemma3-softcaps-d128": (
        "Gemma3Text",
        dict(head_dim=128, sliding_window=16, num_hidden_layers=4, sliding_window_pattern=2,
             attn_logit_softcapping=4.0, final_logit_softcapping=6.0),
        {},
    ),
    "mixtral-top1": ("Mixtral", dict(num_local_experts=8, num_experts_per_tok=1), {}),
    "mixtral-top2-window": (
        "Mixtral", dict(num_local_experts=6, num_experts_per_tok=2, sliding_window=13), {}
    ),
    "qwen3moe-top8-d128": (
        "Qwen3Moe",
        dict(head_dim=128, num_experts=16, num_experts_per_tok=8, moe_intermediate_size=32,
             norm_topk_prob=True, num_hidden_layers=3, mlp_only_layers=[1]),
        {},
    ),
    "qwen3moe-top2-step2": (
        "Qwen3Moe",
        dict(head_dim=64, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=48,
             norm_topk_prob=False, num_hidden_layers=2, decoder_sparse_step=2),
        {},
    ),
    "qwen2moe-shared-dense1": (  # routed + shared experts, layer 1 dense, qkv biases
        "Qwen2Moe",
        dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32,
             shared_expert_intermediate_size=48, num_hidden_layers=2, mlp_only_layers=[1]),
        {},
    ),
    "olmo2": ("Olmo2", dict(num_hidden_layers=2), {}),  # norms after, whole-row q/k norms
    "granite-scalars": (
        "Granite",
        dict(embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.05,
             logits_scaling=2.5, attention_bias=True, mlp_bias=True),
        {},
    ),
    "granitemoe-top2": (  # stacked experts, softmax over the top-k logits, Granite's scalars
        "GraniteMoe",
        dict(num_local_experts=6, num_experts_per_tok=2, intermediate_size=32,
             embedding_multiplier=2.0, residual_multiplier=0.7, attention_multiplier=0.1,
             logits_scaling=1.5),
        {},
    ),
    "olmoe-top3": (  # OLMoE: whole-row q/k norms, experts every layer, not renormalised
        "Olmoe", dict(num_experts=6, num_experts_per_tok=3, intermediate_size=32), {},
    ),
}  # fmt: skip
PREEMPTING = {"mixtral-top2-window", "gemma3-window"}  # these also run in a pool too small


def prompts() -> list[list[int]]:
    """Three prompts, two longer than every window, two sharing a 48-token prefix."""
    shared = [(7 * i + 3) % 290 + 5 for i in range(48)]
    return [[*shared, 11, 12, 13, 14, 15], [(5 * i + 1) % 290 + 5 for i in range(23)], shared]


def build(name: str, path):
    """(loaded checkpoint, prompts, transformers' greedy tokens and logits per prompt, extra
    engine arguments) for case `name`, its checkpoint written to `path`."""
    arch, overrides, engine_args = CASES[name]
    model = make_tiny_model(path, arch, **overrides)
    reference = hf_greedy_plain_batch(model, prompts(), NEW)
    return load_model(str(path)), prompts(), reference, engine_args


def generate(llm: LLM, prompts: list[list[int]], n: int = NEW):
    """(greedy tokens, per-step float32 logits) of each prompt's `n` steps, all in one batch."""
    seen: dict[str, list[torch.Tensor]] = {}
    llm.engine.runner.logits_hook = lambda reqs, lg: [
        seen.setdefault(r.request_id, []).append(row.cpu()) for r, row in zip(reqs, lg.float())
    ]
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    return [(o.outputs[0].token_ids, seen[o.request_id]) for o in outs]


def check(got, want, what: str) -> None:
    """Tokens equal, logits within 1e-3 at every step."""
    (tokens, logits), (ref_tokens, ref_logits) = got, want
    assert tokens == ref_tokens, what
    worst = max(float((a - b).abs().max()) for a, b in zip(logits, ref_logits))
    assert worst < 1e-3, f"{what}: logits differ by {worst}"


def tokens_without_host_syncs(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    """Greedy tokens of `prompts` in one batch on a CUDA engine, every step's launch
    (`ModelRunner.execute_model`: prefill chunks, mixed steps eager, decodes in CUDA graphs)
    run under torch's sync debug mode "error": an ``.item()``, a data-dependent shape or a
    pageable copy in a family's forward raises. The token readback after the launch is the
    step's one sync. `llm` must schedule synchronously (``async_scheduling=False``) and have
    no logits hook (`generate`'s reads rows to the host)."""
    runner = llm.engine.runner
    launch = runner.execute_model

    def checked(out):
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            return launch(out)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    runner.execute_model = checked
    try:
        params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    finally:
        del runner.execute_model
    return [o.outputs[0].token_ids for o in outs]


def check_on_cuda_with_graphs(loaded, reference, what: str) -> LLM:
    """A family's gpu test (benchmarks/gpu_check.sh's `families` step): float32 with the
    defaults on CUDA (the Triton ops and attention, the fused-MoE kernel, CUDA graphs):
    transformers' tokens and logits, cold and on a warm cache; eager decodes give the graphs'
    tokens; no step's launch syncs with the host (`tokens_without_host_syncs`). Returns the
    engine with graphs."""
    import os

    import pytest

    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("needs CUDA with compiled Triton kernels (TRITON_INTERPRET=0)")
    common = dict(loaded=loaded, dtype="float32", kv_cache_memory=256 << 20,
                  max_num_batched_tokens=16, max_num_seqs=4)  # fmt: skip
    llm = LLM(**common)
    assert llm.engine.runner.cuda_graphs is not None and llm.engine.runner.backend.name == "triton"
    cold = generate(llm, prompts())
    warm = generate(llm, prompts()[::-1])[::-1]
    for i, want in enumerate(reference):
        check(cold[i], want, f"{what}: prompt {i}, graphs, cold")
        check(warm[i], want, f"{what}: prompt {i}, graphs, warm")
    tokens = [t for t, _ in cold]
    assert [t for t, _ in generate(LLM(**common, enable_cuda_graphs=False), prompts())] == tokens
    assert tokens_without_host_syncs(LLM(**common, async_scheduling=False), prompts()) == tokens
    return llm


def built_fixture(write):
    """A module-scoped fixture `built`: name -> (checkpoint directory, transformers model,
    loaded checkpoint, transformers' greedy tokens and logits per prompt), each case written
    once by `write(name, path)` (which returns the transformers model). A test module binds it
    as `built = built_fixture(write)`."""

    @pytest.fixture(scope="module")
    def built(tmp_path_factory):
        done: dict[str, tuple] = {}

        def get(name: str):
            if name not in done:
                path = tmp_path_factory.mktemp(name)
                model = write(name, path)
                reference = hf_greedy_plain_batch(model, prompts(), NEW)
                done[name] = (path, model, load_model(str(path)), reference)
            return done[name]

        return get

    return built


def case_fixture(names):
    """A module-scoped fixture `case` over `names`: (name, *built(name)). A test module binds it
    as `case = case_fixture(CASES)`."""

    @pytest.fixture(scope="module", params=list(names))
    def case(request, built):
        return request.param, *built(request.param)

    return case


def check_chunked_cached_batched(loaded, reference, what: str) -> LLM:
    """float32, 16-token steps, the three prompts in one batch, then again in reverse order on
    the warm prefix cache: transformers' tokens and logits each time. Returns the engine."""
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, block_size=16,
              max_num_batched_tokens=16, max_num_seqs=4)  # fmt: skip
    cold = generate(llm, prompts())
    warm = generate(llm, prompts()[::-1])[::-1]
    for i, want in enumerate(reference):
        check(cold[i], want, f"{what}: prompt {i}, cold")
        check(warm[i], want, f"{what}: prompt {i}, warm")
    assert llm.engine.kv.prefix_hits > 0
    check_side_table_bytes(llm)
    return llm


def check_side_table_bytes(llm: LLM) -> None:
    """Where the model keeps tables beside its KV cache (`model/side_tables.py`: sparse
    layers' keys), the pool's KV rows and tables hold what the runner sizes a block as
    (`bytes_per_block`; each table one spare row more), and the start-up estimate
    (`server/memory.kv_bytes_per_token`) and `server/fit.py` count as much."""
    from pagoda.runtime.model import side_tables
    from pagoda.runtime.server.fit import Plan
    from pagoda.runtime.server.memory import kv_bytes_per_token

    runner = llm.engine.runner
    mc, bs = runner.model_config, runner.block_size
    specs = side_tables.specs(mc)
    if not specs:
        return
    kv = {t.data_ptr(): t for pair in runner.kv_caches for t in pair}  # (shared caches once)
    tables = side_tables.tables(runner.model)
    assert tables and all(t.rows is not None for t in tables)
    held = sum(t.numel() * t.element_size() for t in kv.values())
    held += sum(t.nbytes - t.spare_bytes for t in tables)
    assert held == runner.num_blocks * runner.bytes_per_block
    assert kv_bytes_per_token(mc, runner.dtype, "auto", bs) * bs == runner.bytes_per_block
    plan = Plan(runner.dtype, fp8_weights=False, fp8_kv=False, block_size=bs)
    assert plan.kv_bytes_per_token(mc) * bs == runner.bytes_per_block


def check_on_triton(model, loaded, lengths, what: str) -> LLM:
    """The first prompts cut to `lengths` (past a window, say), chunked and batched on the Triton
    backend not batch-invariant (prompt rows in the prefill kernel or SDPA, decodes in the
    decode kernel), float32: transformers' tokens and logits on the cut prompts. Returns the
    engine."""
    short = [p[:n] for p, n in zip(prompts(), lengths)]
    reference = [hf_greedy_plain(model, p, NEW) for p in short]
    llm = LLM(loaded=loaded, attention_backend="triton", dtype="float32", kv_cache_memory=8 << 20,
              max_num_batched_tokens=16, max_num_seqs=4, batch_invariant=False)  # fmt: skip
    for i, (got, want) in enumerate(zip(generate(llm, short), reference)):
        check(got, want, f"{what} on Triton: prompt {i}")
    return llm


SMALL_POOL = dict(num_blocks_override=7, block_size=16, max_model_len=96, dtype="float32",
                  max_num_batched_tokens=16, max_num_seqs=3)  # fmt: skip


def check_preempted(loaded, reference, what: str) -> None:
    """A KV pool of 7 blocks: requests are preempted, tokens and logits still transformers';
    the pool whole after."""
    small = LLM(loaded=loaded, **SMALL_POOL)
    got = generate(small, prompts())
    assert small.engine.scheduler.num_preemptions > 0
    for i, want in enumerate(reference):
        check(got[i], want, f"{what}: prompt {i}, preempted")
    small.engine.check_integrity()


def check_two_ranks(path, loaded, reference, what: str, kv_heads: int | None = None) -> None:
    """Tensor parallelism over gloo, two ranks, the small pool (chunked, preempted) then a warm
    cache: transformers' tokens and logits. `kv_heads`: the KV heads rank 0 must hold."""
    with LLM(str(path), loaded=loaded, tensor_parallel_size=2, **SMALL_POOL) as two:
        got = generate(two, prompts()) + generate(two, prompts()[::-1])[::-1]
        core = two.engine
        assert core.scheduler.num_preemptions > 0 and core.kv.prefix_hits > 0
        if kv_heads is not None:
            assert core.runner.backend.num_kv_heads == kv_heads  # this rank's
        core.check_integrity()
    for i, g in enumerate(got):
        check(g, reference[i % 3], f"{what}: prompt {i}, two ranks")


def greedy_test():
    """The test a family module binds as
    `test_greedy_matches_transformers_chunked_cached_batched_and_preempted` over its `case`
    fixture: transformers' tokens and logits chunked, batched and on a warm prefix cache
    (`check_chunked_cached_batched`), then in a pool so small that requests are preempted
    (`check_preempted`)."""

    def test(case):
        name, _, _, loaded, reference = case
        check_chunked_cached_batched(loaded, reference, name)
        check_preempted(loaded, reference, name)

    return test


def gpu_test(check_runner=None):
    """The test a family module binds as `test_gpu_matches_transformers_with_graphs` over its
    `case` fixture (benchmarks/gpu_check.sh's `families` steps): `check_on_cuda_with_graphs`,
    then `check_runner(name, runner)` where given (the experts in the fused-MoE kernel, ...)."""

    @pytest.mark.gpu
    def test(case):
        name, _, _, loaded, reference = case
        runner = check_on_cuda_with_graphs(loaded, reference, name).engine.runner
        if check_runner is not None:
            check_runner(name, runner)

    return test


def fused_moe_at(index: int = -1):
    """A `gpu_test` check: layer `index`'s MoE block (its routed experts beside a shared one)
    runs the fused kernel, not each expert."""

    def check_runner(name, runner):
        moe = runner.model.layers[index].mlp
        assert getattr(moe, "routed", moe).fused is not None, name

    return check_runner


def scramble_correction_biases(model, path, first_moe_layer: int = 0) -> torch.Generator:
    """Random router correction biases (`e_score_correction_bias`, V3's noaux_tc router), large
    enough to change the experts picked, on the layers from `first_moe_layer` on that route
    (dense layers skipped); the model saved again to `path`. Returns the generator (seed 2) for
    further draws."""
    g = torch.Generator().manual_seed(2)
    layers = model.model.layers[first_moe_layer:]
    biases = [
        getattr(getattr(x.mlp, "gate", None), "e_score_correction_bias", None) for x in layers
    ]
    assert any(b is not None for b in biases), "no router with a correction bias"
    with torch.no_grad():
        for bias in biases:
            if bias is not None:
                bias.copy_(torch.randn(bias.shape, generator=g))
    model.save_pretrained(path)
    return g


def check_rotary_float32(rotary, hf_module, dtype: torch.dtype, theta: float, scaling) -> None:
    """A float32 rotary (`ops.rotary_float32`'s: ERNIE 4.5's, LFM3's) on q [T, H, D] and k [T,
    Hkv, D] equal bit for bit to transformers' own apply_rotary_pos_emb (`hf_module`'s) with its
    float32 cos and sin, from the cache by positions (the CUDA ops' path) and from float32 rows
    gathered once (the CPU's)."""
    from pagoda.runtime.model.ops import build_cos_sin_cache, gather_cos_sin

    g = torch.Generator().manual_seed(0)
    q = torch.randn(7, 4, 32, generator=g).to(dtype)
    k = torch.randn(7, 2, 32, generator=g).to(dtype)
    positions = torch.tensor([0, 1, 2, 40, 41, 300, 5])
    cache = build_cos_sin_cache(32, theta, scaling, 512)
    cos, sin = cache[positions].chunk(2, dim=-1)  # transformers' cat((freqs, freqs)) tables
    cos, sin = torch.cat([cos, cos], -1)[None], torch.cat([sin, sin], -1)[None]
    want_q, want_k = hf_module.apply_rotary_pos_emb(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin
    )
    for rows in (positions, None):
        gq, gk = q.clone(), k.clone()
        table = cache if rows is not None else gather_cos_sin(positions, cache, torch.float32)
        rotary(positions=rows, q=gq, k=gk, cos_sin_cache=table)
        assert torch.equal(gq, want_q[0].transpose(0, 1)), rows
        assert torch.equal(gk, want_k[0].transpose(0, 1)), rows
