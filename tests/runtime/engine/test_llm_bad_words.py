"""bad_words through the offline LLM and the embedded model: a word the free greedy output
contains is gone from the output (with async scheduling too, whose steps then run
synchronously), and a batch-mate that bans nothing keeps its greedy tokens."""

from __future__ import annotations

import pytest
from pagoda.runtime import LLM, SamplingParams

PROMPTS = ["The capital of France is", "Write a haiku about rivers."]
FREE = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def _llm(smol, **kw) -> LLM:
    common = dict(loaded=smol, dtype="float32", max_model_len=256, kv_cache_memory=32 << 20)
    return LLM(**{**common, **kw})


@pytest.fixture(scope="module")
def engines(smol):
    return _llm(smol), _llm(smol, async_scheduling=True)


def _word_of_several_tokens(tok, text: str) -> str:
    for word in text.split():
        if len(tok.encode(" " + word, add_special_tokens=False)) > 1:
            return word
    raise AssertionError(f"no word of several tokens in {text!r}")


@pytest.mark.parametrize("which", ["sync", "async"])
def test_banned_words_are_gone_and_batch_mates_unchanged(engines, which):
    llm = engines[which == "async"]
    tok = llm.get_tokenizer()
    free = [o.outputs[0] for o in llm.generate(PROMPTS, FREE)]
    one = free[0].text.split()[0]  # the first word, single token or not
    several = _word_of_several_tokens(tok, free[0].text)
    outs = llm.generate(PROMPTS, [FREE.clone(bad_words=[one, several]), FREE])
    banned = outs[0].outputs[0]
    for word in (one, several):
        for ids in (tok.encode(word, add_special_tokens=False),
                    tok.encode(" " + word, add_special_tokens=False)):  # fmt: skip
            t, n = banned.token_ids, len(ids)
            assert all(t[i : i + n] != ids for i in range(len(t) - n + 1)), (word, banned.text)
    assert banned.token_ids != free[0].token_ids
    assert outs[1].outputs[0].token_ids == free[1].token_ids


def test_sync_and_async_agree(engines):
    sync, async_ = engines
    p = FREE.clone(bad_words=["Paris", " the"])
    assert ([o.outputs[0].token_ids for o in sync.generate(PROMPTS, p)]
            == [o.outputs[0].token_ids for o in async_.generate(PROMPTS, p)])  # fmt: skip
    async_.engine.check_integrity()
