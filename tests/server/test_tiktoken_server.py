"""`pagoda serve` on a tiny DeepSeek-V3 written by transformers whose tokenizer.json is swapped
for Kimi K2's tiktoken files (`model/tiktoken_files.py`), through the `openai` SDK."""

from __future__ import annotations

import pytest
from hf_oracle import drop_tokenizer, hf_greedy_plain, make_tiny_model
from server_testlib import TINY_SERVE, greedy_chat, openai_client
from tiktoken_testlib import tiktoken_encode, train_ranks, write_tiktoken_dir


@pytest.mark.slow
@pytest.mark.e2e
def test_pagoda_serve_answers_a_chat_with_a_tiktoken_deepseek_v3(tmp_path):
    """A tiny DeepSeek-V3 written by transformers, its tokenizer.json swapped for Kimi's files:
    the chat completion's prompt is tiktoken's ids of the rendered template, its answer
    transformers' greedy tokens decoded (whole and streamed), and a structured choice holds.
    The model's vocabulary ends two ids short of the code's 258 special slots, as K2's does."""
    ranks = train_ranks()
    n = len(ranks)
    model = make_tiny_model(
        tmp_path, "DeepseekV3", vocab_size=n + 256, bos_token_id=n, eos_token_id=n + 2,
        pad_token_id=n + 255, kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16,
        num_key_value_heads=4, q_lora_rank=24, v_head_dim=32, n_routed_experts=4,
        num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1,
        moe_intermediate_size=32, first_k_dense_replace=1,
    )  # fmt: skip
    drop_tokenizer(tmp_path)
    specials = write_tiktoken_dir(tmp_path, ranks)
    messages = [{"role": "user", "content": "Hello 你好 😀 x=12345"}]
    rendered = ("<|im_user|>user<|im_middle|>Hello 你好 😀 x=12345<|im_end|>"
                "<|im_assistant|>assistant<|im_middle|>")  # Kimi K2's layout  # fmt: skip
    prompt = tiktoken_encode(ranks, specials, rendered)
    want, _ = hf_greedy_plain(model, prompt, 8)
    with openai_client("--model", str(tmp_path), *TINY_SERVE) as client:
        got, streamed, kw = greedy_chat(client, messages, 8)
        choice = client.chat.completions.create(
            **{**kw, "max_tokens": 20, "extra_body": {"structured_outputs": {
                "choice": ["你好 Kimi", "😀 x=12345"]}}})  # fmt: skip
    assert got.usage.prompt_tokens == len(prompt)
    by_id = {i: t for t, i in ranks.items()} | {i: t.encode() for t, i in specials.items()}
    text = b"".join(by_id[i] for i in want).decode("utf-8", errors="replace")
    assert got.choices[0].message.content == text == streamed
    assert choice.choices[0].message.content in ("你好 Kimi", "😀 x=12345")
