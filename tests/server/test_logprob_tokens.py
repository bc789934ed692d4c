"""Logprob token strings of a SentencePiece model, with the `openai` SDK against a real server:
a tiny transformers-written Llama with a byte-fallback tokenizer.json (Llama 2 style). The
`tokens` of /v1/completions join into the text (the "▁" of a word-initial token is its space,
though decoding the token alone strips it) and `text_offset` is where each starts; a token with
a Latin-1 character is its text, not the GPT-2 byte table's reading of it."""

from __future__ import annotations

import openai
import pytest
from hf_oracle import make_tiny_model
from server_testlib import ServerProcess
from spm_testlib import BYTE_IDS, byte_fallback_tokenizer


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    path = tmp_path_factory.mktemp("spm-llama")
    tok = byte_fallback_tokenizer()
    make_tiny_model(path, "Llama", vocab_size=tok.vocab_size)
    tok.backend.save(str(path / "tokenizer.json"))
    srv = ServerProcess("--model", str(path), "--kv-cache-memory", "16MiB",
                        "--max-model-len", "256", "--log-level", "warning")  # fmt: skip
    try:
        srv.wait_ready()
        yield openai.OpenAI(base_url=srv.base + "/v1", api_key="x", max_retries=0)
    finally:
        srv.stop()


def test_completion_tokens_join_into_text_and_offsets_follow_it(client):
    # no byte tokens (their text is half a character) nor <unk> <s> </s> (not in the text);
    # sampled hot for word pieces with "▁"
    extra = {"ignore_eos": True, "logit_bias": {str(i): -100 for i in [0, 1, 2, *BYTE_IDS]}}
    kw = dict(model=client.models.list().data[0].id, prompt="Hello café", max_tokens=40,
              temperature=1.5, seed=1, logprobs=1, extra_body=extra)  # fmt: skip
    full = client.completions.create(**kw).choices[0]
    tokens, offsets = full.logprobs.tokens, full.logprobs.text_offset
    assert "".join(tokens) == full.text and " " in full.text
    assert offsets == [len("".join(tokens[:i])) for i in range(len(tokens))]
    assert not any(t.startswith("bytes:") for t in tokens)
    streamed = list(client.completions.create(**kw, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == full.text
    assert [o for c in streamed if c.choices[0].logprobs
            for o in c.choices[0].logprobs.text_offset] == offsets  # fmt: skip
