"""Speculative decoding (n-gram drafts) end to end on a tiny transformers-written Llama: greedy
output token for token the engine's without it (unequal prompts, chunked prefill, prefix-cache
hits, preemption, stop strings, length limits), seeded sampling the same tokens too (the
verifier rewinds each generator to the draws it kept), drafts accepted and rejected, requests
the verifier does not handle decoded one token a step, and the metrics counted."""

from __future__ import annotations

import random

import pytest
from engine_testlib import summary
from hf_oracle import make_tiny_llama
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.structured.params import StructuredOutputsParams
from sync_watch import SyncWatch

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
        "prompt_lookup_min": 2}  # fmt: skip
# small enough to chunk prompts (budget 48), share prefixes and preempt (16 blocks of 8)
ENGINE = dict(dtype="float32", block_size=8, num_blocks_override=16, max_num_seqs=6,
              max_num_batched_tokens=48, max_model_len=160, long_prefill_token_threshold=24)  # fmt: skip


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    make_tiny_llama(path)
    return (LLM(str(path), **ENGINE), LLM(str(path), **ENGINE, speculative_config=SPEC),
            LLM(str(path), **ENGINE, speculative_config=SPEC, async_scheduling=True))  # fmt: skip


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    """Unequal prompts that repeat a phrase (so drafts are found in them), two sharing a
    prefix of three blocks (a prefix-cache hit)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        phrase = [rng.randrange(5, 300) for _ in range(rng.randrange(3, 9))]
        out.append([rng.randrange(5, 300) for _ in range(rng.randrange(2, 30))] + phrase * 3)
    out[1] = out[0][:24] + out[1]
    return out


def _run(llm: LLM, prompts, params):
    return summary(llm.generate([{"prompt_token_ids": p} for p in prompts], params))


def test_greedy_output_is_the_engines_without_drafts(engines):
    plain, spec, _ = engines
    prompts = _prompts(6)
    params = [SamplingParams(temperature=0, max_tokens=24 + 5 * i, ignore_eos=True)
              for i in range(len(prompts))]  # fmt: skip
    # a stop string met mid-way (the word of a token it writes late): the tokens after it in the
    # same drafted step are dropped
    probe = plain.generate({"prompt_token_ids": prompts[2]}, params[2])[0].outputs[0].token_ids
    params[2] = SamplingParams(temperature=0, max_tokens=40, stop=[f"w{probe[-6]}"])
    spec.engine.reset_counters()
    want = _run(plain, prompts, params)
    assert want[2][0][2] == "stop"
    assert _run(spec, prompts, params) == want
    # and again: the prompts' blocks are cached now (hits)
    assert _run(spec, prompts, params) == want
    core = spec.engine
    stats = core.spec_stats
    assert stats.num_accepted_tokens > 0  # drafts accepted ...
    assert stats.num_draft_tokens > stats.num_accepted_tokens  # ... and rejected
    assert core.scheduler.num_preemptions > 0
    assert core.kv.prefix_hits > 0
    core.check_integrity()
    assert core.kv.num_free_blocks == core.kv.num_blocks


def test_seeded_sampling_gives_the_same_tokens(engines):
    """A sampled draft is kept iff the target's own draw equals it (rejection sampling with a
    one-hot draft), with the draws a plain step makes: a seeded request's output is unchanged."""
    plain, spec, _ = engines
    prompts = _prompts(4, seed=1)
    params = [
        SamplingParams(temperature=0.7, max_tokens=30, seed=11, ignore_eos=True),
        SamplingParams(temperature=1.0, top_k=5, max_tokens=30, seed=12, ignore_eos=True),
        SamplingParams(temperature=0.9, top_p=0.8, max_tokens=30, n=2, seed=13, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=30, seed=14, ignore_eos=True),
    ]
    spec.engine.reset_counters()
    assert _run(spec, prompts, params) == _run(plain, prompts, params)
    assert spec.engine.spec_stats.num_accepted_tokens > 0


def test_requests_the_verifier_does_not_handle_get_no_drafts(engines):
    plain, spec, _ = engines
    prompts = _prompts(3, seed=2)
    params = [
        SamplingParams(temperature=0, max_tokens=20, logprobs=2, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=20, repetition_penalty=1.3, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=20, min_tokens=5, logit_bias={9: 2.0}),
    ]
    spec.engine.reset_counters()
    assert _run(spec, prompts, params) == _run(plain, prompts, params)
    assert spec.engine.spec_stats.num_drafts == 0


def test_stats_carry_the_counters(engines):
    _, spec, _ = engines
    spec.engine.reset_counters()
    _run(spec, _prompts(2, seed=3), SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    s = spec.engine.stats()
    assert s.spec_num_drafts > 0 and s.spec_num_draft_tokens >= s.spec_num_accepted_tokens
    assert len(s.spec_accepted_per_pos) == 4
    assert sum(s.spec_accepted_per_pos) == s.spec_num_accepted_tokens
    assert s.spec_accepted_per_pos == sorted(s.spec_accepted_per_pos, reverse=True)


def test_seeded_sampling_with_drafts_rejected_gives_the_same_tokens(smol):
    """The embedded model asked to rewrite code at temperature 0.8: it copies much of it (drafts
    accepted) and departs from it where the draws do (drafts rejected, each seeded generator set
    back to the draws of the tokens kept); both samples are the plain engine's token for token
    (a generator left one draw off changes them)."""
    text = "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b\n"
    prompt = (f"<|im_start|>user\nRewrite this code with add renamed to plus:\n{text}<|im_end|>\n"
              "<|im_start|>assistant\n")  # fmt: skip
    common = dict(loaded=smol, dtype="float32", max_model_len=256, kv_cache_memory=32 << 20)
    plain, spec = LLM(**common), LLM(**common, speculative_config=SPEC)
    params = SamplingParams(temperature=0.8, max_tokens=32, n=2, seed=2)
    got = summary(spec.generate(prompt, params, use_tqdm=False))
    assert got == summary(plain.generate(prompt, params, use_tqdm=False))
    stats = spec.engine.spec_stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens


def test_async_scheduling_gives_the_same_tokens(engines):
    """With async scheduling a request that takes drafts is scheduled once its tokens are read
    back (its drafts come from them) while the others' steps overlap: greedy tokens the plain
    engine's (chunked prefill, preemption, prefix hits, a stop string, lengths ending inside a
    drafted step), seeded samples the synchronous drafting engine's."""
    plain, spec, async_ = engines
    core = async_.engine
    assert core.async_scheduling and core.runner.async_scheduling
    prompts = _prompts(6)
    params = [SamplingParams(temperature=0, max_tokens=23 + 5 * i, ignore_eos=True)
              for i in range(len(prompts))]  # fmt: skip
    probe = plain.generate({"prompt_token_ids": prompts[2]}, params[2])[0].outputs[0].token_ids
    params[2] = SamplingParams(temperature=0, max_tokens=40, stop=[f"w{probe[-6]}"])
    params[4] = SamplingParams(temperature=0, max_tokens=30, logprobs=1)  # no drafts: overlaps
    core.reset_counters()
    want = _run(plain, prompts, params)
    assert _run(async_, prompts, params) == want
    assert _run(async_, prompts, params) == want  # prefix hits
    stats = core.spec_stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    assert core.scheduler.num_preemptions > 0 and core.kv.prefix_hits > 0
    core.check_integrity()
    assert core.kv.num_free_blocks == core.kv.num_blocks
    assert all(r.num_pending == 0 for r in core.scheduler.waiting)
    seeded = [SamplingParams(temperature=0.8, max_tokens=30, seed=5 + i, n=1 + i % 2,
                             ignore_eos=True) for i in range(4)]  # fmt: skip
    prompts = _prompts(4, seed=1)
    assert _run(async_, prompts, seeded) == _run(spec, prompts, seeded)


def test_async_drafted_steps_launch_without_a_sync(engines, monkeypatch):
    """A drafted step launched while another is in flight, beside a row whose token is gathered
    on the device, queues no device-to-host sync (recorded on the CPU: `sync_watch.py`)."""
    *_, async_ = engines
    core = async_.engine
    launch, seen, ahead = core.runner.execute_model, [], []

    def watched(out):
        with SyncWatch() as watch:
            step = launch(out)
        seen.extend(watch.seen)
        if step.spec is not None:  # its rows whose token is in flight
            ahead.append(sum(s.request.num_pending > 0 for s in out.scheduled))
        return step

    monkeypatch.setattr(core.runner, "execute_model", watched)
    params = [SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=30, logit_bias={9: 1.0})]  # fmt: skip
    _run(async_, _prompts(2, seed=4), params)
    assert ahead and max(ahead) > 0  # drafted steps beside in-flight rows, launched early
    assert not seen, sorted(set(seen))


def test_async_drafts_beside_a_constrained_request(engines, monkeypatch):
    """A structured-output row samples after the in-flight step is read back (its mask needs
    that token): the drafted rows of its step are verified then, with the plain tokens."""
    plain, _, async_ = engines
    runner, late = async_.engine.runner, []
    inner = runner.sample_deferred

    def deferred(step):
        late.append(step.spec is not None)
        inner(step)

    monkeypatch.setattr(runner, "sample_deferred", deferred)
    prompts = _prompts(3, seed=5)
    choice = StructuredOutputsParams(regex=r"(w[0-9]+){20,40}")
    params = [SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=24, structured_outputs=choice),
              SamplingParams(temperature=0, max_tokens=26, ignore_eos=True)]  # fmt: skip
    async_.engine.reset_counters()
    assert _run(async_, prompts, params) == _run(plain, prompts, params)
    assert async_.engine.spec_stats.num_accepted_tokens > 0
    assert any(late)  # a deferred step with drafted rows
