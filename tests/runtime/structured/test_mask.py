"""Mask correctness: for random grammars (JSON Schemas, regexes, EBNF) and random logits, every
token the batched sampler picks on a constrained row is one an independent xgrammar matcher
accepts at that point, whatever the row's sampling (greedy, temperature, top-k/top-p/min-p,
penalties, logprobs, seeds), and unconstrained rows in the same batch are untouched.

Each test runs on the CPU path (the C mask kernel, then the native C sampler or the LM head's
own sampler) and on the CUDA path run on the CPU (`apply_bitmask_torch`, then the PyTorch
sampler, chunked and over whole rows as CUDA draws). Walks end within their budget: JSON outputs
are complete and validate against their schema.
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import torch
import xgrammar as xgr
from pagoda.runtime.cpu import qgemm
from pagoda.runtime.request import Request
from pagoda.runtime.sampling import native as sampler_native
from pagoda.runtime.sampling import ops as sampler_ops
from pagoda.runtime.sampling import sampler
from pagoda.runtime.sampling.params import SamplingParams
from pagoda.runtime.sampling.sampler import SamplingBatch, sample
from pagoda.runtime.structured import mask_kernel
from pagoda.runtime.structured.bitmask import GrammarBitmask, apply_bitmask_torch, grammar_rows
from pagoda.runtime.structured.params import StructuredOutputsParams
from structured_testlib import random_ebnf, random_regex, random_schema

CPU = torch.device("cpu")
WHOLE: dict[str, sampler.WholeSampler] = {}


@pytest.fixture(params=["native", "head", "torch", "flat", "xgrammar-kernel"])
def path(request, monkeypatch):
    if request.param == "xgrammar-kernel":  # no C compiler for the mask kernel
        monkeypatch.setattr(mask_kernel, "available", lambda: False)
    if request.param in ("torch", "flat"):
        monkeypatch.setattr(sampler_native, "usable", lambda x: False)
    if request.param == "flat":
        monkeypatch.setattr(sampler_ops, "flat_draws", lambda w: True)
    elif request.param in ("native", "head") and not sampler_native.available():
        pytest.skip("no C compiler for the native sampler kernels")
    if request.param == "head":
        if qgemm.load() is None:
            pytest.skip("no quantized GEMM here (AVX2 + FMA and a C++ compiler)")
        monkeypatch.setitem(WHOLE, "head", qgemm.load().sample_logits)
    return request.param


SAMPLINGS = [
    dict(temperature=0.0),
    dict(temperature=0.8, seed=3),
    dict(temperature=1.5, top_k=20),
    dict(temperature=1.0, top_p=0.5),
    dict(temperature=0.7, top_k=50, top_p=0.9, min_p=0.05, logprobs=3),
    dict(temperature=1.0, min_p=0.2),
    dict(temperature=0.9, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.5),
    dict(temperature=0.0, logprobs=0, repetition_penalty=1.2),
]


def _requests(compiler, specs, max_tokens, eos):
    reqs = []
    for i, spec in enumerate(specs):
        compiled = spec.with_compiled(compiler.compile(spec))
        kw = SAMPLINGS[i % len(SAMPLINGS)]
        params = SamplingParams(max_tokens=max_tokens, structured_outputs=compiled, **kw)
        reqs.append(Request(f"r{i}", [1, 2, 3], params, eos_token_ids=eos))
    return reqs


def _walk(gb: GrammarBitmask, reqs, vocab: int, seed: int, free: int = 2) -> None:
    """Sample every request to its end; `free` unconstrained greedy rows ride along."""
    g = torch.Generator().manual_seed(seed)
    refs = {r.request_id: xgr.GrammarMatcher(r.params.structured_outputs.compiled) for r in reqs}
    others = [Request(f"u{i}", [5], SamplingParams(temperature=0, max_tokens=10**6))
              for i in range(free)]  # fmt: skip
    for _ in range(max(r.max_new_tokens for r in reqs) + 1):
        live = [r for r in reqs if not r.is_finished]
        if not live:
            return
        batch_reqs = live[:1] + others + live[1:]
        logits = torch.randn(len(batch_reqs), vocab, generator=g) * 4
        raw = logits.clone()
        rows = grammar_rows(batch_reqs)
        assert rows == [0, *range(1 + free, len(batch_reqs))]
        gb.apply(logits, batch_reqs, rows)
        out = sample(logits, SamplingBatch.build(batch_reqs, vocab, CPU), WHOLE.get("head"))
        tokens = out.token_ids.tolist()
        for i in range(1, 1 + free):  # unconstrained rows: the unmasked argmax
            assert tokens[i] == int(raw[i].argmax())
        for row in rows:
            r, t = batch_reqs[row], tokens[row]
            assert refs[r.request_id].accept_token(t), (
                f"{r.request_id} sampled token {t} the grammar does not allow "
                f"(after {r.num_output_tokens} tokens, {r.params})"
            )
            if out.logprobs is not None and r.params.logprobs is not None:
                assert -1e4 < float(out.logprobs[row]) <= 1e-5
            r.append_token(t)
            r.check_stop_token()
    raise AssertionError("requests did not finish")


def _text(tok, r) -> str:
    ids = r.output_token_ids
    if ids and ids[-1] in r.stop_ids:
        ids = ids[:-1]
    return tok.decode(ids)


def test_random_json_schemas(path, smol_tokenizer, compiler):
    rng = random.Random(11)
    schemas = [random_schema(rng) for _ in range(8)]
    specs = [StructuredOutputsParams(json=s) for s in schemas]
    eos = smol_tokenizer.eos_token_ids
    reqs = _requests(compiler, specs, 72, eos)
    gb = _bitmask(smol_tokenizer, path)
    _walk(gb, reqs, smol_tokenizer.model_vocab_size, seed=1)
    for r, s in zip(reqs, schemas):
        assert r.status.finish_reason == "stop", (s, _text(smol_tokenizer, r))
        jsonschema.validate(json.loads(_text(smol_tokenizer, r)), s)


def test_random_regexes_and_grammars(path, smol_tokenizer, compiler):
    rng = random.Random(5)
    specs = [StructuredOutputsParams(regex=random_regex(rng)) for _ in range(4)]
    specs += [StructuredOutputsParams(grammar=random_ebnf(rng)) for _ in range(3)]
    specs += [StructuredOutputsParams(choice=("left", "right", "straight on"))]
    reqs = _requests(compiler, specs, 40, smol_tokenizer.eos_token_ids)
    _walk(_bitmask(smol_tokenizer, path), reqs, smol_tokenizer.model_vocab_size, seed=2)
    for r, spec in zip(reqs, specs):
        assert r.status.finish_reason in ("stop", "length")
        if spec.choice:
            assert _text(smol_tokenizer, r) in spec.choice


def test_json_strings_never_take_raw_control_bytes(path, smol_tokenizer, compiler):
    """xgrammar (0.2.9) lets a length-bounded string hold a raw tab or NUL, which JSON forbids:
    logits that favour such tokens still give valid JSON (compact: the printable mask; with
    free whitespace: lengths as patterns)."""
    schema = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 8},
              "t": {"type": ["string", "null"], "minLength": 2}}, "required": ["s", "t"]}  # fmt: skip
    control = [i for i, b in enumerate(compiler.decoded_vocab) if b and b[0] < 0x20]
    vocab, eos = smol_tokenizer.model_vocab_size, smol_tokenizer.eos_token_ids
    for free_ws in (False, True):
        spec = StructuredOutputsParams(json=schema, disable_any_whitespace=not free_ws)
        reqs = _requests(compiler, [spec] * 2, 40, eos)
        gb = _bitmask(smol_tokenizer, path)
        for _ in range(41):
            live = [r for r in reqs if not r.is_finished]
            if not live:
                break
            logits = torch.randn(len(live), vocab)
            logits[:, control] += 50.0
            gb.apply(logits, live, list(range(len(live))))
            out = sample(logits, SamplingBatch.build(live, vocab, CPU), WHOLE.get("head"))
            for r, t in zip(live, out.token_ids.tolist()):
                r.append_token(t)
                r.check_stop_token()
        for r in reqs:
            text = _text(smol_tokenizer, r)
            assert r.status.finish_reason == "stop", text
            jsonschema.validate(json.loads(text), schema)


def test_no_invalid_utf8_after_a_lead_byte(smol_tokenizer, compiler):
    """xgrammar (0.2.9) lets a JSON string take a UTF-8-encoded surrogate (ED A0..BF): after a
    token ending in ED only continuation bytes 80..9F may follow."""
    vocab = compiler.decoded_vocab
    single = {b[0]: i for i, b in enumerate(vocab) if len(b) == 1}
    spec = StructuredOutputsParams(json={"type": "string"})
    spec = spec.with_compiled(compiler.compile(spec))
    req = Request("u", [1], SamplingParams(max_tokens=50, structured_outputs=spec))
    for byte in (ord('"'), 0xED):
        req.append_token(single[byte])
    logits = torch.zeros(1, smol_tokenizer.model_vocab_size)
    GrammarBitmask(smol_tokenizer, smol_tokenizer.model_vocab_size, CPU).apply(logits, [req], [0])
    allowed = {vocab[i][0] for i in torch.isfinite(logits[0]).nonzero().flatten().tolist()}
    assert allowed and allowed <= set(range(0x80, 0xA0))


def _bitmask(tok, path: str) -> GrammarBitmask:
    gb = GrammarBitmask(tok, tok.model_vocab_size, CPU)
    gb.torch_apply = path in ("torch", "flat")  # the CUDA path's torch unpacking
    return gb


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_c_kernel_matches_xgrammar_kernel(dtype):
    if not mask_kernel.available():
        pytest.skip("no C compiler")
    g = torch.Generator().manual_seed(1)
    vocab, n = 1000, 6  # a tail word of 8 tokens
    logits = torch.randn(n, vocab, generator=g).to(dtype)
    words = (vocab + 31) // 32
    bitmask = torch.randint(-(2**31), 2**31 - 1, (n, words), generator=g, dtype=torch.int32)
    bitmask[:, 3] = -1  # whole words allowed and masked
    bitmask[:, 4] = 0
    rows = [5, 0, 2]
    want = logits.clone()
    xgr.apply_token_bitmask_inplace(want, bitmask, indices=rows)
    got = logits.clone()
    mask_kernel.apply_mask(got, bitmask[rows], torch.tensor(rows))
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    assert torch.equal(got[~torch.isinf(got)], want[~torch.isinf(want)])


def test_torch_apply_matches_xgrammar_kernel():
    g = torch.Generator().manual_seed(0)
    vocab, n = 1000, 6
    logits = torch.randn(n, vocab, generator=g)
    words = (vocab + 31) // 32
    bitmask = torch.randint(-(2**31), 2**31 - 1, (n, words), generator=g, dtype=torch.int32)
    rows = [0, 2, 5]
    want = logits.clone()
    xgr.apply_token_bitmask_inplace(want, bitmask, indices=rows)
    got = logits.clone()
    apply_bitmask_torch(got, bitmask[rows], torch.tensor(rows))
    assert torch.equal(got, want)
    for dtype in (torch.bfloat16,):
        got = logits.to(dtype)
        apply_bitmask_torch(got, bitmask[rows], torch.tensor(rows))
        assert torch.equal(torch.isinf(got), torch.isinf(want))


@pytest.mark.parametrize("how", ["torch", "c-kernel", "xgrammar-kernel"])
def test_allowed_tokens_the_model_never_scores_are_still_drawn(how, monkeypatch):
    """A grammar that allows only ids whose logits are all -inf (a pruned LM head's, here
    100..) while others are finite: those ids get logit 0, all alike, so the row still draws
    one (greedy: the first); without it the row had no finite logit (NO_TOKEN, an error). A
    row that keeps a finite allowed logit, and one with no finite logit at all, are as before."""
    if how == "xgrammar-kernel":
        monkeypatch.setattr(mask_kernel, "available", lambda: False)
    elif how == "c-kernel" and not mask_kernel.available():
        pytest.skip("no C compiler")
    vocab = 128
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(0))
    logits[:, 100:] = float("-inf")
    logits[2] = float("-inf")
    allowed = [[105, 120], [7, 110], [105]]
    bitmask = torch.zeros(3, vocab // 32, dtype=torch.int32)
    for j, ids in enumerate(allowed):
        for t in ids:
            bitmask[j, t // 32] |= (1 << (t % 32)) if t % 32 != 31 else -(1 << 31)
    gb = GrammarBitmask(None, vocab, CPU)
    gb.torch_apply, gb.xgr = how == "torch", xgr
    want = logits.clone()
    gb._mask_logits(logits, bitmask, [0, 1, 2])
    assert logits[0].isfinite().nonzero().flatten().tolist() == [105, 120]
    assert (logits[0, [105, 120]] == 0).all()
    assert logits[1].isfinite().nonzero().flatten().tolist() == [7]
    assert logits[1, 7] == want[1, 7]
    assert not logits[2].isfinite().any()
    out = sample(
        logits,
        SamplingBatch.build(
            [Request(f"r{i}", [1], SamplingParams(temperature=0)) for i in range(3)], vocab, CPU
        ),
    )
    assert out.token_ids.tolist() == [105, 7, -1]
