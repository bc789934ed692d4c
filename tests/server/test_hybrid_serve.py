"""`pagoda serve` on a tiny Granite 4.0 checkpoint (`GraniteMoeHybridForCausalLM`: Mamba2 and
attention layers, experts beside the shared MLP) written by transformers, answering through the
`openai` SDK as transformers does: completions (whole and streamed) and a chat turn give
transformers' greedy tokens, three requests at once (one engine step holds their prefill chunks
and decodes, each sequence in its own state slot) as one at a time. The second identical
request is served from the prefix cache (KV blocks and a Mamba state snapshot at the 32-token
boundary), says so in `usage.prompt_tokens_details.cached_tokens`, and answers the same."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from hf_oracle import hf_greedy_plain, make_tiny_model
from server_testlib import openai_client
from tokenizers import Tokenizer

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
NEW = 8


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple]:
    path = tmp_path_factory.mktemp("granite4")
    model = make_tiny_model(path, "GraniteMoeHybrid", num_hidden_layers=3,
                            layer_types=["mamba", "attention", "mamba"], mamba_n_heads=4,
                            mamba_d_state=16, mamba_chunk_size=8, num_local_experts=4,
                            num_experts_per_tok=2, intermediate_size=32,
                            shared_intermediate_size=48, embedding_multiplier=2.0,
                            residual_multiplier=0.7, attention_multiplier=0.1,
                            logits_scaling=1.5)  # fmt: skip
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    with openai_client("--model", str(path), "--dtype", "float32", "--kv-cache-memory", "16MiB",
                       "--max-model-len", "256", "--max-num-batched-tokens", "16", "--max-num-seqs", "4",
                       "--no-engine-process", "--log-level", "warning") as client:  # fmt: skip
        yield client, model, tok


def _complete(client, prompt: list[int], cached: list | None = None, **kw) -> str:
    """The completion's words; its cached prompt tokens appended to `cached`."""
    r = client.completions.create(model=client.models.list().data[0].id, prompt=prompt,
                                  max_tokens=NEW, temperature=0, extra_body={"ignore_eos": True},
                                  **kw)  # fmt: skip
    if kw.get("stream"):
        return _words("".join(c.choices[0].text for c in r))
    if cached is not None:
        cached.append(r.usage.prompt_tokens_details.cached_tokens)
    return _words(r.choices[0].text)


def _words(text: str) -> list[str]:
    """The word-level tokenizer's tokens of `text` ("w5 w17": a space between, one before
    the first where a prompt precedes it)."""
    return text.split()


def test_completions_and_chat_answer_as_transformers(served):
    client, model, tok = served
    prompts = [[(7 * i + 3) % 290 + 5 for i in range(40)], [11, 12, 13], [42]]
    want = [_words(tok.decode(hf_greedy_plain(model, p, NEW)[0])) for p in prompts]
    with ThreadPoolExecutor(3) as pool:  # at once: one batch
        together = list(pool.map(lambda p: _complete(client, p), prompts))
    assert together == want
    cached: list[int] = []
    assert [_complete(client, p, cached) for p in prompts] == want  # again, one at a time
    assert cached == [32, 0, 0]  # the 40-token prompt to its last 16-token boundary
    assert _complete(client, prompts[0], stream=True) == want[0]
    # the chat template: "w3 <content> w4 " -> [3, 5, 6, 7, 4]
    r = client.chat.completions.create(model=client.models.list().data[0].id,
                                       messages=[{"role": "user", "content": "w5 w6 w7"}],
                                       max_tokens=NEW, temperature=0,
                                       extra_body={"ignore_eos": True})  # fmt: skip
    want_chat = hf_greedy_plain(model, [3, 5, 6, 7, 4], NEW)[0]
    assert _words(r.choices[0].message.content) == _words(tok.decode(want_chat))
