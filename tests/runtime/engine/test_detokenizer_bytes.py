"""Detokenization at the edges of UTF-8, checked against `tokenizers`' own decode: an output cut
mid-character, a prompt that ends mid-character (or in U+FFFD), and a SentencePiece byte-fallback
tokenizer (Llama 2, Mistral, Gemma) meeting an invalid byte. Token ids are forced through the
engine's OutputProcessor the way EngineCore._update feeds it."""

from __future__ import annotations

import pytest
from hf_oracle import make_tiny_model
from pagoda.runtime import LLM
from pagoda.runtime.engine.output_processor import OutputProcessor
from pagoda.runtime.model.tokenizer import Tokenizer
from pagoda.runtime.request import Request, RequestStatus
from pagoda.runtime.sampling.params import SamplingParams
from pagoda.runtime.worker.outputs import ModelRunnerOutput
from spm_testlib import byte_fallback_tokenizer


@pytest.fixture(scope="module")
def spm() -> Tokenizer:
    return byte_fallback_tokenizer()


def byte_ids(tok: Tokenizer, data: bytes) -> list[int]:
    return [tok.backend.token_to_id(f"<0x{b:02X}>") for b in data]


def drive(tok: Tokenizer, prompt: list[int], out: list[int], **params) -> tuple[list[str], str]:
    """Stream `out` through an OutputProcessor as the engine does: deltas and the final text."""
    params.setdefault("max_tokens", len(out))
    op = OutputProcessor(tok)
    req = Request("r", prompt, SamplingParams(**params), eos_token_ids=tok.eos_token_ids)
    req.status = RequestStatus.RUNNING
    op.add("r", [req])
    deltas = []
    for t in out:
        req.token_ids.append(t)  # EngineCore._update
        if t in req.stop_ids or req.num_output_tokens >= req.max_new_tokens:
            req.check_stop_token()
        if req.params.stop:
            op.check_stop_string(req, t)
        (o,) = op.process(ModelRunnerOutput([req], [t], [None]), None)
        deltas.append(o.new_text)
        if o.finished:
            break
    assert o.finished
    return deltas, "".join(deltas)


def after(tok: Tokenizer, prompt: list[int], out: list[int]) -> str:
    """The oracle: the output's text as decoding prompt and output together reads it."""
    return tok.decode(prompt + out)[len(tok.decode(prompt)) :]


@pytest.mark.parametrize("stop", [(), ("zzz",)], ids=["no-stop", "stop-strings"])
def test_output_cut_mid_character_reads_as_decode_does(smol, spm, stop):
    """max_tokens (or a stop token) ending the output inside a character: its bytes are handed
    out as decoding the output reads them (U+FFFD), not silently dropped."""
    for tok, tail in ((smol.tokenizer, None), (spm, byte_ids(spm, "🙂".encode()[:2]))):
        prompt = tok.encode("Hello")
        body = tok.encode(" naïve 日本")
        cut = tail or tok.encode(" 🙂🎉")[:-1]
        out = body + cut
        _, text = drive(tok, prompt, out, stop=stop)
        assert text == after(tok, prompt, out) and text.endswith("\ufffd"), text
        # ended by a stop token (not shown): the bytes before it are read the same way
        _, text = drive(tok, prompt, [*out, 2], stop=stop, max_tokens=50, stop_token_ids=[2])
        assert text == after(tok, prompt, out)


def test_byte_fallback_run_ending_the_output_is_read_once(spm):
    """An output ending in byte tokens: whole characters among them are handed out once, and
    only the bytes after the last whole one are read at the end (as U+FFFD, one per byte as
    byte fallback reads them; decoding the whole output would turn the run's complete
    characters into U+FFFD too, which a stream that has handed them out cannot)."""
    prompt, x = spm.encode("Hello"), spm.encode(" x", add_special_tokens=False)
    for data, want in (("日本🙂".encode(), "日本🙂"), ("日本🙂".encode()[:-2], "日本\ufffd\ufffd")):
        for stop in ((), ("zzz",)):
            text = drive(spm, prompt, x + byte_ids(spm, data), stop=stop)[1]
            assert text == after(spm, prompt, x) + want


def test_prompt_ending_in_replacement_or_mid_character_is_not_repeated(smol, spm):
    """A prompt whose text ends in U+FFFD (pasted mojibake) or whose ids end mid-character:
    the completion is the output's own text, never the prompt's text again."""
    for tok in (smol.tokenizer, spm):
        prompt, out = (
            tok.encode("Hi there \ufffd"),
            tok.encode(" ok fine", add_special_tokens=False),
        )
        text = drive(tok, prompt, out)[1]
        assert text == after(tok, prompt, out) and text.strip() == "ok fine"
    tok = smol.tokenizer
    emoji = tok.encode("🙂🎉", add_special_tokens=False)
    prompt, out = tok.encode("Hello") + emoji[:1], emoji[1:] + tok.encode(" ok")
    assert drive(tok, prompt, out)[1] == tok.decode(out) == "\ufffd\ufffd🎉 ok"


@pytest.mark.parametrize("stop", [(), ("zzz",)], ids=["no-stop", "stop-strings"])
def test_invalid_byte_after_a_whole_byte_fallback_character_does_not_raise(spm, stop):
    """DecodeStream raises "Invalid prefix" when byte-fallback decoding turns a character it
    already handed out into U+FFFD bytes (vLLM #17448); that error used to end the engine.
    The text handed out stays, and the stream goes on after it."""
    prompt = spm.encode("Hello")
    ok = spm.encode(" ok fine", add_special_tokens=False)
    for bad in ("🙂".encode() + b"\x9f", "é".encode() + b"\xa9\xa9"):
        out = byte_ids(spm, bad) + ok
        _, text = drive(spm, prompt, out, stop=stop)
        assert text.startswith(bad[:-1].decode(errors="ignore")) and text.endswith(" ok fine")
        # the prompt's context ending in such a character: the same
        prompt2 = spm.encode("Hello") + byte_ids(spm, "🙂".encode())
        _, text = drive(spm, prompt2, byte_ids(spm, b"\x9f") + ok, stop=stop)
        assert text.endswith(" ok fine") and "Hello" not in text


def test_engine_survives_random_bytes_of_a_byte_fallback_checkpoint(tmp_path, spm):
    """End to end: a transformers-written tiny Llama with the byte-fallback tokenizer.json,
    sampled hot, emits byte tokens at random (invalid sequences among them); every sample
    finishes and its text is what streaming handed out."""
    make_tiny_model(tmp_path, "Llama", vocab_size=spm.vocab_size)
    spm.backend.save(str(tmp_path / "tokenizer.json"))
    llm = LLM(str(tmp_path), max_model_len=256, kv_cache_memory=8 << 20)
    params = SamplingParams(n=4, max_tokens=100, temperature=1.5, seed=0, ignore_eos=True)
    (result,) = llm.generate(["Hello café"], params)
    for o in result.outputs:
        assert o.finish_reason == "length" and len(o.token_ids) == 100 and o.text


@pytest.mark.parametrize("stop", [(), ("zzz",)], ids=["no-stop", "stop-strings"])
def test_a_run_that_never_makes_a_character_is_handed_out_as_it_goes(smol, spm, stop):
    """Invalid bytes or skipped special tokens, forced (logit_bias) for the whole output: the
    stream waited on all of them to the end, and DecodeStream decoded every waiting id again
    at each step (O(n) per token: 2 ms a token at 4,000). They are read (as decoding reads
    them) after a few steps instead, so text keeps coming and the stream stays short."""
    cases = [
        (spm, spm.backend.token_to_id("<0xFF>")),
        (spm, 1),  # <s>, skipped
        (smol.tokenizer, smol.tokenizer.backend.token_to_id("Ģ")),  # byte 0x80 alone
    ]
    for tok, bad in cases:
        out = [bad] * 200
        deltas, text = drive(tok, tok.encode("Hello"), out, stop=stop)
        assert text == tok.decode(out)
        if text:  # invalid bytes: U+FFFD comes while the output goes on, not at its end
            assert "".join(deltas[:100]).count("\ufffd") >= 50
