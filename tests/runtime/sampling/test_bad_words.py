"""bad_words: vLLM's tokenization (with and without a leading space) and its match on the
output's last tokens, then the bans in the batched sampler (other rows untouched)."""

from __future__ import annotations

import pytest
import structured_testlib
import torch
from pagoda.runtime.request import Request
from pagoda.runtime.sampling.bad_words import bad_words_token_ids, banned_now
from pagoda.runtime.sampling.params import ParamError, SamplingParams
from pagoda.runtime.sampling.sampler import SamplingBatch, sample

V = 64


def test_tokenized_as_vllm_does():
    tok = structured_testlib.smol_tokenizer()
    enc = lambda s: tuple(tok.encode(s, add_special_tokens=False))  # noqa: E731
    got = bad_words_token_ids(["hello", "  world"], tok, 49152)
    assert got == (enc("hello"), enc(" hello"), enc("world"), enc(" world"))
    with pytest.raises(ValueError, match="bad_words"):
        bad_words_token_ids(["hello"], tok, 10)


def test_banned_when_the_output_ends_with_the_words_start():
    words = ((5,), (7, 8, 9))
    assert banned_now(words, []) == {5}
    assert banned_now(words, [1, 7]) == {5}
    assert banned_now(words, [1, 7, 8]) == {5, 9}
    assert banned_now(words, [7, 8, 1]) == {5}


def _row(params: SamplingParams, words, output) -> Request:
    r = Request("r", [1, 2, 3], params, bad_words=words)
    r.token_ids += output
    return r


@pytest.mark.parametrize("extra", [{"temperature": 0}, {"temperature": 5.0, "seed": 1},
                                   {"temperature": 5.0, "top_k": 3, "seed": 2}])  # fmt: skip
def test_sampler_never_completes_a_word(extra):
    torch.manual_seed(0)
    logits = torch.randn(3, V)
    best = logits.argmax(-1)
    p = SamplingParams(**extra, logit_bias={int(best[0]): 100})  # the bias loses to the ban
    reqs = [_row(p, ((int(best[0]),),), []), _row(SamplingParams(temperature=0), (), []),
            _row(p.clone(logit_bias=None), ((4, int(best[2])),), [4])]  # fmt: skip
    for r in reqs:
        r.generator = torch.Generator().manual_seed(3)
    b = SamplingBatch.build(reqs, V, torch.device("cpu"))
    assert b.changes  # a two-token word: rebuilt every step
    for _ in range(10):
        out = sample(logits.clone(), b)
        assert int(out.token_ids[0]) != int(best[0])
        assert int(out.token_ids[1]) == int(best[1])
        assert int(out.token_ids[2]) != int(best[2])
    reqs[2].token_ids.append(5)  # no longer after the word's start: its best is free again
    b = b.refreshed(reqs, V, torch.device("cpu"))
    if extra["temperature"] == 0:
        assert int(sample(logits.clone(), b).token_ids[2]) == int(best[2])


def test_a_row_with_no_ban_yet_stays_live():
    r = _row(SamplingParams(temperature=0), ((4, 6),), [])
    b = SamplingBatch.build([r], V, torch.device("cpu"))
    assert b.changes and b.logit_bias.tokens.numel() == 0
    r.token_ids.append(4)
    b = b.refreshed([r], V, torch.device("cpu"))
    logits = torch.zeros(1, V)
    logits[0, 6] = 10
    assert int(sample(logits, b).token_ids[0]) != 6


def test_params_check():
    assert SamplingParams(bad_words=("a b",)).bad_words == ["a b"]
    for bad in ("word", [""], ["  "], [3], ["x"] * 301):
        with pytest.raises(ParamError) as e:
            SamplingParams(bad_words=bad)
        assert e.value.field == "bad_words"


def test_a_grammar_row_left_with_nothing_keeps_the_grammars_tokens():
    """The grammar's mask is in the logits first: bans that leave none of its tokens are not
    applied to that row (no draw from a row of -inf); other bans in the batch still hold."""
    from pagoda.runtime.structured.params import StructuredOutputsParams

    so = StructuredOutputsParams(choice=["x"])
    logits = torch.full((2, V), float("-inf"))
    logits[0, 10] = 0.0  # the grammar allows 10 alone
    logits[1, [10, 11]] = torch.tensor([1.0, 0.0])
    reqs = [_row(SamplingParams(temperature=0, structured_outputs=so), ((10,),), []),
            _row(SamplingParams(temperature=0, structured_outputs=so), ((10,),), [])]  # fmt: skip
    out = sample(logits.clone(), SamplingBatch.build(reqs, V, torch.device("cpu")))
    assert out.token_ids.tolist() == [10, 11]
