"""`pagoda serve` on a tiny Llama written by transformers whose tokenizer.json is swapped for a
SentencePiece `tokenizer.model` and a Llama-2-style tokenizer_config.json
(`model/spm_files.py`), through the `openai` SDK."""

from __future__ import annotations

import pytest
import sentencepiece as spm
from hf_oracle import drop_tokenizer, hf_greedy_plain, make_tiny_model
from sentencepiece_testlib import slow_tokenizer, train, write_spm_dir
from server_testlib import TINY_SERVE, greedy_chat, openai_client


def piece_bytes(sp: spm.SentencePieceProcessor, i: int) -> list[int]:
    """A token's bytes as SentencePiece's piece reads: "\u2581" a space, <0xNN> its byte."""
    piece = sp.id_to_piece(i)
    return list(
        bytes([int(piece[3:5], 16)]) if sp.is_byte(i) else piece.replace("\u2581", " ").encode()
    )


@pytest.mark.slow
@pytest.mark.e2e
def test_pagoda_serve_answers_a_chat_with_a_tokenizer_model_llama(tmp_path):
    """The chat completion's prompt is transformers' slow tokenizer's ids of the rendered
    template (BOS from the template, no second one), its answer transformers' greedy tokens,
    (each token's logprob bytes SentencePiece's piece), the same text whole and streamed."""
    model_bytes = train("bpe", True)
    sp = spm.SentencePieceProcessor(model_proto=model_bytes)
    # scale 6: greedy picks well apart (the smallest top-two gap 0.04; at 3, 0.015)
    model = make_tiny_model(tmp_path, "Llama", scale=6.0, vocab_size=sp.get_piece_size())
    drop_tokenizer(tmp_path)
    write_spm_dir(tmp_path, model_bytes)
    messages = [{"role": "user", "content": "Hello  東京 🙂 x=12345\n\tnaïve"}]
    rendered = (
        "<s><|im_start|>user\nHello  東京 🙂 x=12345\n\tnaïve<|im_end|>\n<|im_start|>assistant\n"
    )
    prompt = slow_tokenizer(tmp_path).encode(rendered, add_special_tokens=False)
    assert prompt[0] == 1 and prompt[1] != 1
    want, _ = hf_greedy_plain(model, prompt, 10)
    with openai_client("--model", str(tmp_path), *TINY_SERVE) as client:
        got, streamed, _ = greedy_chat(client, messages, 10, logprobs=True)
    assert got.usage.prompt_tokens == len(prompt)
    assert [t.bytes for t in got.choices[0].logprobs.content] == [piece_bytes(sp, i) for i in want]
    assert got.choices[0].message.content == streamed
