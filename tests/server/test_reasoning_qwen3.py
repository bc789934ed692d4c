"""`pagoda serve --reasoning-parser qwen3` end to end with the `openai` SDK on a Qwen3 checkpoint:
a tiny random-weight Qwen3ForCausalLM written by transformers, the embedded model's tokenizer with
`<think>` and `</think>` added as single tokens (as Qwen3's vocabulary has them), and a chat
template of Qwen3's shape that reads `enable_thinking` (with it false, the generation prompt
closes an empty thinking block). The random model is held to a few tokens, the markers among
them (`allowed_token_ids`, seeded sampling), so it writes `</think>` at random places; the oracle
is /v1/completions of the same prompt ids, which a reasoning parser leaves alone."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import structured_testlib
from hf_oracle import make_tiny_model
from server_testlib import chat_prompt_ids, openai_client, save_tokenizer

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# Qwen3's chat template, reduced to what a reply's prompt depends on: ChatML turns, an assistant
# turn's reasoning_content written back as a thinking block, and the generation prompt, which
# with enable_thinking false writes an empty thinking block (Qwen3's `enable_thinking is defined
# and enable_thinking is false` branch)
TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.reasoning_content %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + message.reasoning_content.strip('\\n')"
    " + '\\n</think>\\n\\n' + message.content.lstrip('\\n') + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)
ASK = [{"role": "user", "content": "What is 4+4?"}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[openai.OpenAI, dict[str, int]]]:
    from tokenizers import AddedToken

    path = tmp_path_factory.mktemp("qwen3-think")
    backend = structured_testlib.smol_tokenizer().backend
    backend.add_tokens([AddedToken(t, normalized=False, special=False)
                        for t in ("<think>", "</think>")])  # fmt: skip
    vocab = backend.get_vocab_size()
    # SmolLM2's ids: <|endoftext|> 0, <|im_start|> 1, <|im_end|> 2 (make_tiny_model's pad, bos, eos)
    make_tiny_model(path, "Qwen3", vocab_size=vocab, hidden_size=32, intermediate_size=64,
                    num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                    head_dim=16, tie_word_embeddings=True)  # fmt: skip
    save_tokenizer(path, backend, TEMPLATE)
    ids = {t: backend.token_to_id(t) for t in ("<think>", "</think>", "<|im_end|>")}
    ids.update({w: backend.token_to_id(w) for w in ("Ġeight", "Ġsum", "Ġis", "Ċ")})
    assert None not in ids.values() and ids["<|im_end|>"] == 2, ids
    with openai_client("--model", str(path), "--reasoning-parser", "qwen3",
                       "--kv-cache-memory", "16MiB", "--max-model-len", "256",
                       "--no-engine-process", "--log-level", "warning") as client:  # fmt: skip
        yield client, ids


def prompt_ids(client: openai.OpenAI, **extra) -> list[int]:
    return chat_prompt_ids(client, **{"messages": ASK, **extra})


def both(
    client: openai.OpenAI, ids: dict[str, int], seed: int, bias: dict | None = None, **extra
) -> tuple[str, Any]:
    """(the /v1/completions text of the chat prompt, the chat reply's message), both sampled
    with `seed` among the markers and a few words (EOS left out: each runs to max_tokens)."""
    model = client.models.list().data[0].id
    kw = dict(model=model, max_tokens=12, temperature=1.0, seed=seed)
    allowed = {"allowed_token_ids": [i for t, i in ids.items() if t != "<|im_end|>"]}
    if bias:
        allowed["logit_bias"] = {str(ids[t]): b for t, b in bias.items()}
    text = client.completions.create(prompt=prompt_ids(client, **extra), **kw, extra_body=allowed)
    chat = client.chat.completions.create(messages=ASK, **kw, extra_body={**allowed, **extra})
    return text.choices[0].text, chat.choices[0].message


def test_the_template_reads_enable_thinking(served):
    client, ids = served
    on, off = prompt_ids(client), prompt_ids(client, **NO_THINKING)
    assert off[: len(on)] == on and ids["</think>"] in off[len(on) :]  # an empty block closed


def test_with_thinking_on_the_reply_splits_at_the_end_marker(served):
    client, ids = served
    closed = 0
    for seed in range(6):
        text, m = both(client, ids, seed)
        assert m.reasoning == m.reasoning_content
        head = text.lstrip()
        head = head.removeprefix("<think>") if head.startswith("<think>") else text
        if "</think>" in head:
            closed += 1
            thought, answer = head.split("</think>", 1)  # later markers are content (vLLM)
            assert (m.reasoning_content or "", m.content or "") == (thought, answer), text
        else:  # cut off while thinking: all of it is reasoning
            assert (m.reasoning_content, m.content) == (head, None), text
    assert closed >= 2  # the seeds exercise the split, not only the cut-off thinking


def test_with_thinking_off_all_of_it_is_content(served):
    client, ids = served
    texts = []
    for seed in range(3):
        text, m = both(client, ids, seed, {"</think>": 4.0}, **NO_THINKING)
        assert (m.content, m.reasoning_content) == (text, None)
        texts.append(text)
    assert any("</think>" in t for t in texts)  # the markers it writes stay content


def test_anthropic_thinking_switches_enable_thinking(served):
    """`/v1/messages`' `thinking` is the template's `enable_thinking`: the prompt counted is
    chat's with it on or off, and a message without thinking is chat's reply with it off (all
    text)."""
    client, _ = served
    base, model = str(client.base_url).removesuffix("/v1/"), client.models.list().data[0].id
    body = {"model": model, "messages": ASK}

    def count(thinking: dict) -> int:
        r = httpx.post(f"{base}/v1/messages/count_tokens", json={**body, "thinking": thinking})
        assert r.status_code == 200, r.text
        return r.json()["input_tokens"]

    on, off = prompt_ids(client), prompt_ids(client, **NO_THINKING)
    assert (count({"type": "adaptive"}), count({"type": "disabled"})) == (len(on), len(off))
    r = httpx.post(f"{base}/v1/messages", json={**body, "max_tokens": 8, "temperature": 0,
                                                "thinking": {"type": "disabled"}}, timeout=60)  # fmt: skip
    chat = client.chat.completions.create(model=model, messages=ASK, max_tokens=8, temperature=0,
                                          extra_body=NO_THINKING).choices[0].message  # fmt: skip
    assert r.status_code == 200, r.text
    assert [b["type"] for b in r.json()["content"]] in (["text"], [])
    assert "".join(b["text"] for b in r.json()["content"]) == (chat.content or "")
