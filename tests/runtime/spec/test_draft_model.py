"""Speculative decoding with a draft model (`spec/draft_model.py`) end to end on tiny
transformers-written Llamas: greedy output token for token the engine's without it, with the
target itself as its draft (every draft accepted) and with a one-layer draft (its first layer
and embeddings the target's: some drafts rejected), through chunked prefill, prefix-cache hits
and preemption; sampled drafts verified by their probabilities (the law itself:
test_rejection.py); bad drafts refused in one line."""

from __future__ import annotations

import json
import random

import pytest
import torch
from engine_testlib import summary
from hf_oracle import make_tiny_llama
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.config import EngineConfig
from pagoda.runtime.engine.start_checks import check_speculative
from pagoda.runtime.model.loader import read_model_config

# small enough to chunk prompts (budget 48), share prefixes and preempt (16 blocks of 8)
ENGINE = dict(dtype="float32", block_size=8, num_blocks_override=16, max_num_seqs=6,
              max_num_batched_tokens=48, max_model_len=160, long_prefill_token_threshold=24)  # fmt: skip
K = 3


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """The target (2 layers) and a draft of its first layer (the same seed: the same embeddings
    and first layer)."""
    target, short = tmp_path_factory.mktemp("target"), tmp_path_factory.mktemp("draft")
    make_tiny_llama(target)
    make_tiny_llama(short, num_hidden_layers=1)
    return target, short


@pytest.fixture(scope="module")
def engines(paths):
    target, short = paths
    same = {"method": "draft_model", "model": str(target), "num_speculative_tokens": K}
    return (LLM(str(target), **ENGINE),
            LLM(str(target), **ENGINE, speculative_config=same),
            LLM(str(target), **ENGINE, speculative_config={"model": str(short),
                                                           "num_speculative_tokens": K}))  # fmt: skip


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    """Unequal prompts, two sharing a prefix of three blocks (a prefix-cache hit)."""
    rng = random.Random(seed)
    out = [[rng.randrange(5, 300) for _ in range(rng.randrange(2, 40))] for _ in range(n)]
    out[1] = out[0][:24] + out[1]
    return out


def _run(llm: LLM, prompts, params):
    return summary(llm.generate([{"prompt_token_ids": p} for p in prompts], params))


def test_greedy_output_is_the_engines_without_drafts(engines):
    plain, same, short = engines
    prompts = _prompts(6)
    params = [SamplingParams(temperature=0, max_tokens=20 + 5 * i, ignore_eos=True)
              for i in range(len(prompts))]  # fmt: skip
    want = _run(plain, prompts, params)
    for llm in (same, short):
        llm.engine.reset_counters()
        assert _run(llm, prompts, params) == want
        core = llm.engine
        assert core.scheduler.num_preemptions > 0 and core.kv.prefix_hits > 0
        core.check_integrity()
        assert core.kv.num_free_blocks == core.kv.num_blocks
    # the target as its own draft still gets its own attention backends and KV tensors: nothing
    # a drafting run prepares or writes is the target's (nor its captured CUDA graphs')
    runner = same.engine.runner
    target = {id(runner.backend), *map(id, runner.model.kv_backends)}
    assert target.isdisjoint(map(id, runner.draft.backends))
    ptrs = {t.data_ptr() for kv in runner.kv_caches for t in kv}
    assert ptrs.isdisjoint(t.data_ptr() for kv in runner.draft.kv_caches for t in kv)
    full, part = same.engine.spec_stats, short.engine.spec_stats
    # the target as its own draft: every draft is the target's own greedy token
    assert full.num_draft_tokens > 50 and full.num_accepted_tokens == full.num_draft_tokens
    # a one-layer draft: some accepted, some not
    assert 0 < part.num_accepted_tokens < part.num_draft_tokens
    assert part.acceptance_rate < full.acceptance_rate


def test_sampled_drafts_are_verified_by_their_probabilities(engines):
    """Sampled requests draft from the draft's own distribution q and keep draft x with
    probability min(1, p(x) / q(x)) (`spec/rejection.py`): with the target as its own draft
    q = p, so every draft is kept (keeping a draft iff the target's own draw is it would keep
    about sum p^2 of them); a seeded request's tokens are the same run after run (for the same schedule)."""
    _, same, short = engines
    prompts = _prompts(3, seed=1)
    params = [
        SamplingParams(temperature=0.7, max_tokens=24, seed=11, ignore_eos=True),
        SamplingParams(temperature=0.9, top_k=20, max_tokens=24, seed=12, ignore_eos=True),
        SamplingParams(temperature=0.8, top_p=0.9, max_tokens=24, n=2, seed=13, ignore_eos=True),
    ]
    for llm in (same, short):
        llm.engine.reset_counters()
        _run(llm, prompts, params)
    stats, part = same.engine.spec_stats, short.engine.spec_stats
    assert stats.num_draft_tokens > 40 and stats.acceptance_rate > 0.97
    assert 0 < part.num_accepted_tokens < part.num_draft_tokens
    assert short.engine.runner.draft.held is not None  # (the last run's sampled rows' q)
    # the same schedule (preemption changes which tokens are drafts): the same tokens
    for llm in (same, short):
        assert _run(llm, prompts[:2], params[:2]) == _run(llm, prompts[:2], params[:2])
    # greedy requests beside sampled ones: still the plain engine's tokens
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    mixed = _run(short, prompts, [greedy, params[1], greedy])
    assert [mixed[0], mixed[2]] == _run(engines[0], [prompts[0], prompts[2]], greedy)


def test_async_scheduling_gives_the_same_tokens(paths, engines):
    """With async scheduling (a drafting request scheduled once its step is read back, the
    draft's next run and q held across the step launched meanwhile): greedy tokens the plain
    engine's, beside a request without drafts whose steps overlap; seeded samples the same
    run to run."""
    target, short = paths
    spec = {"model": str(short), "num_speculative_tokens": K}
    llm = LLM(str(target), **ENGINE, speculative_config=spec, async_scheduling=True)
    assert llm.engine.async_scheduling
    prompts = _prompts(6)
    params = [SamplingParams(temperature=0, max_tokens=19 + 5 * i, ignore_eos=True)
              for i in range(len(prompts))]  # fmt: skip
    params[3] = SamplingParams(temperature=0, max_tokens=30, logprobs=1)  # no drafts
    assert _run(llm, prompts, params) == _run(engines[0], prompts, params)
    core = llm.engine
    assert core.scheduler.num_preemptions > 0 and core.kv.prefix_hits > 0
    assert 0 < core.spec_stats.num_accepted_tokens < core.spec_stats.num_draft_tokens
    core.check_integrity()
    assert core.kv.num_free_blocks == core.kv.num_blocks
    sampled = [SamplingParams(temperature=0.8, max_tokens=24, seed=3 + i, ignore_eos=True)
               for i in range(3)]  # fmt: skip
    first = _run(llm, prompts[:3], sampled)
    assert _run(llm, prompts[:3], sampled) == first


@pytest.mark.slow  # (a second rank spawned; nothing timed)
def test_two_ranks_with_a_draft_give_one_rank_s_tokens(paths, engines):
    """Tensor parallelism: the draft model whole on rank 0 (its forwards take no collective),
    the target split over two ranks (gloo), each step's drafted rows sent to rank 1; greedy
    tokens equal one rank's, through chunking, preemption and prefix-cache hits; n-gram drafts
    the same."""
    target, short = paths
    plain = engines[0]
    prompts = _prompts(6)
    params = [SamplingParams(temperature=0, max_tokens=16 + 4 * i, ignore_eos=True)
              for i in range(len(prompts))]  # fmt: skip
    want = _run(plain, prompts, params)
    specs = ({"model": str(short), "num_speculative_tokens": K},
             {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 1})  # fmt: skip
    for spec in specs:
        with LLM(str(target), **ENGINE, tensor_parallel_size=2, speculative_config=spec) as two:
            assert _run(two, prompts, params) == want
            core = two.engine
            assert core.scheduler.num_preemptions > 0 and core.kv.prefix_hits > 0
            assert core.spec_stats.num_accepted_tokens > 0
            core.check_integrity()
            if "model" in spec:  # rank 0's share of the target's heads, all of the draft's
                runner = core.runner
                assert runner.backend.num_heads * 2 == runner.draft.model.backend.num_heads


def test_the_draft_s_cache_is_in_the_kv_budget(paths):
    """A block's draft rows are added to the target's bytes per block, and the draft's scratch
    blocks (ceil(k / block size) + 1 a sequence) come out of the budget first."""
    target, short = paths
    common = dict(dtype="float32", block_size=8, kv_cache_memory=1 << 20, max_num_seqs=4,
                  max_model_len=128)  # fmt: skip
    spec = {"model": str(short), "num_speculative_tokens": K}
    plain = LLM(str(target), **common).engine.runner
    drafted = LLM(str(target), **common, speculative_config=spec).engine.runner
    per = plain.bytes_per_block
    draft = drafted.bytes_per_block - per
    assert draft == per // 2  # one layer of the target's two, the same heads
    assert plain.num_blocks == (1 << 20) // per
    assert drafted.num_blocks == ((1 << 20) - 4 * 2 * draft) // (per + draft)
    # `pagoda serve`'s start-up estimate (`server/memory.py`) counts the same blocks
    from pagoda.runtime.server import memory

    cfg = EngineConfig.create(str(target), **common, speculative_config=spec)
    fp = memory.estimate(read_model_config(str(target)), cfg, target, cfg.torch_device())
    assert fp.kv_blocks == drafted.num_blocks and fp.draft > 0
    # the start-up reads the draft's config once (`check_speculative`) and passes it on
    draft = check_speculative(cfg, read_model_config(str(target)))
    assert draft == read_model_config(str(short))
    from pagoda.runtime.engine import start_checks

    def unread(path):
        raise AssertionError(f"{path} read again")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(start_checks, "read_draft_config", unread)
        again = memory.estimate(read_model_config(str(target)), cfg, target, cfg.torch_device(),
                                draft)  # fmt: skip
    assert again == fp
    # on CUDA the sampled drafts' q (held between steps) and verification come out of the budget
    from pagoda.runtime.spec.draft_model import sampled_bytes

    gpu = EngineConfig.create(str(target), **common, speculative_config=spec, device="cuda")
    scratch = [memory.draft_model(c, 1, config=draft).kv_bytes(c)[1] for c in (cfg, gpu)]
    assert scratch[1] - scratch[0] == sampled_bytes(K, 4, 300) == 4 * K * 300 * 24
    # rank 0 holds the draft whole: with two ranks its weights and KV rows are all counted
    from pagoda.runtime.server.fit import Plan

    mc, f32 = read_model_config(str(target)), torch.float32
    one, two = (Plan(f32, False, False, tp=t, draft=draft) for t in (1, 2))
    whole = Plan(f32, False, False).weight_bytes(draft)
    assert two.weight_bytes(mc) - Plan(f32, False, False, tp=2).weight_bytes(mc) == whole
    assert one.weight_bytes(mc) - Plan(f32, False, False).weight_bytes(mc) == whole
    kv = Plan(f32, False, False).kv_bytes_per_token(draft)
    assert two.kv_bytes_per_token(mc) - Plan(f32, False, False, tp=2).kv_bytes_per_token(mc) == kv


def _refusal(target, spec: dict, **engine) -> str:
    config = EngineConfig.create(model=str(target), speculative_config=spec, **engine)
    with pytest.raises(ValueError) as e:
        check_speculative(config, read_model_config(str(target)))
    assert "\n" not in str(e.value)
    return str(e.value)


def test_bad_drafts_are_refused_in_one_line(paths, tmp_path):
    target, short = paths
    spec = {"model": str(short), "num_speculative_tokens": 2}
    missing = _refusal(target, spec | {"model": str(tmp_path / "x")})
    assert missing.startswith("speculative_config: the draft model: model") and "neither" in missing
    other = tmp_path / "other"
    make_tiny_llama(other, vocab_size=200, num_hidden_layers=1)
    assert "vocabulary of 200 tokens, the target 300" in _refusal(
        target, spec | {"model": str(other)}
    )
    assert "--quantization fp8" in _refusal(target, spec, quantization="fp8")
    # the same vocabulary size, other token ids: refused once both tokenizers are loaded
    make_tiny_llama(other, num_hidden_layers=1)
    tok = json.loads((other / "tokenizer.json").read_text())
    tok["model"]["vocab"] = {f"w{i}": 299 - i for i in range(300)}
    (other / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ValueError, match="another tokenizer than the target"):
        LLM(str(target), **ENGINE, speculative_config=spec | {"model": str(other)})
    # a context shorter than the sequences served
    make_tiny_llama(other, num_hidden_layers=1, max_position_embeddings=64)
    with pytest.raises(ValueError, match="has a context of 64 tokens, less than max_model_len"):
        LLM(str(target), **ENGINE, speculative_config=spec | {"model": str(other)})


@pytest.mark.parametrize(
    "spec, words",
    [
        ({"method": "draft_model", "num_speculative_tokens": 2}, 'needs "model"'),
        ({"model": "d", "num_speculative_tokens": 2, "prompt_lookup_max": 3},
         "prompt_lookup_max: n-gram drafting's key"),
        ({"model": "d", "num_speculative_tokens": 2, "adaptive": True}, "adaptive: n-gram"),
        ({"method": "ngram", "model": "d", "num_speculative_tokens": 2}, "takes no model"),
    ],
)  # fmt: skip
def test_bad_keys_are_refused(spec, words):
    with pytest.raises(ValueError, match=words):
        EngineConfig.create(speculative_config=spec)


def test_a_model_without_a_method_is_a_draft_model():
    spec = EngineConfig.create(speculative_config='{"model": "d", "num_speculative_tokens": 2}')
    s = spec.speculative_config
    assert (s.method, s.draft_model, s.adaptive) == ("draft_model", "d", False)
    assert EngineConfig.create(speculative_config=s.to_json()).speculative_config == s


@pytest.mark.slow  # (800 sequences; nothing timed)
def test_sampled_output_has_the_target_s_law(tmp_path):
    """End to end on a vocabulary of 8: the second token of 800 seeded samples (drafted after
    the first, verified by `spec/rejection.py`) is distributed as the target's marginal
    sum_a p(a) p(b | a), chi-square with fixed seeds (it cannot flake), and not as the law
    the draft proposes, sum_a p(a) q(b | a)."""
    target, draft = tmp_path / "t", tmp_path / "d"
    tiny = dict(vocab_size=8, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                num_key_value_heads=1)  # fmt: skip
    hf_p = make_tiny_llama(target, **tiny)
    hf_q = make_tiny_llama(draft, num_hidden_layers=1, **tiny)
    prompt, t, m = [3, 5, 1, 6], 1.6, 800

    def marginal(second):
        with torch.no_grad():
            first = (hf_p(torch.tensor([prompt])).logits[0, -1] / t).softmax(-1)
            ids = torch.tensor([[*prompt, a] for a in range(8)])
            nxt = (second(ids).logits[:, -1] / t).softmax(-1)
        return (first[:, None] * nxt).sum(0).double()

    want, proposed = marginal(hf_p), marginal(hf_q)
    spec = {"model": str(draft), "num_speculative_tokens": 2}
    llm = LLM(str(target), dtype="float32", max_num_seqs=256, max_model_len=16, block_size=8,
              num_blocks_override=1024, speculative_config=spec)  # fmt: skip
    params = [SamplingParams(temperature=t, max_tokens=3, seed=i, ignore_eos=True)
              for i in range(m)]  # fmt: skip
    outs = llm.generate([{"prompt_token_ids": prompt}] * m, params)
    counts = torch.bincount(torch.tensor([o.outputs[0].token_ids[1] for o in outs]), minlength=8)
    counts = counts.double()
    stats = llm.engine.spec_stats
    assert stats.num_draft_tokens >= m and 0 < stats.num_accepted_tokens < stats.num_draft_tokens

    def chi2(law):  # (statistic, degrees of freedom)
        big = law * m >= 5  # cells expecting fewer than 5 pooled into one
        exp, got = law[big] * m, counts[big]
        if not big.all():
            exp = torch.cat([exp, law[~big].sum(0, keepdim=True) * m])
            got = torch.cat([got, counts[~big].sum(0, keepdim=True)])
        return float(((got - exp) ** 2 / exp).sum()), len(exp) - 1

    stat, df = chi2(want)
    assert stat < CHI2_P001[df]
    assert chi2(proposed)[0] > 3 * CHI2_P001[7]  # (the test tells the two laws apart)


# chi-square quantiles exceeded with probability 0.001, by degrees of freedom
CHI2_P001 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32, 8: 26.12}
