"""What the end-to-end tests of a family's own tool-call and reasoning parsers through
`pagoda serve` share (test_glm45_api.py, test_minimax_m2_api.py): the weather question and
tool, a tiny random checkpoint whose vocabulary carries the family's markers, the server on it,
and the checks of a tool call whole, streamed and sent back through the template."""

from __future__ import annotations

import json
from typing import Any

from server_testlib import chat_prompt_ids, openai_client, save_tokenizer

ASK = [{"role": "user", "content": "Weather in Paris for 3 days?"}]
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "enum": ["Paris", "Oslo"]},
    "code": {"type": "string", "enum": ["7", "12"]},  # a string of digits stays a string
    "days": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["city", "code", "days"], "additionalProperties": False}  # fmt: skip
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]


def write_marker_model(path, arch: str, template: str, markers: list[str],
                       specials: tuple[str, ...] = (), **config: Any):  # fmt: skip
    """A tiny random `arch` checkpoint at `path` (`make_tiny_model` with `config`), the
    embedded model's tokenizer with `markers` added as single non-special tokens (as the
    family's vocabulary has them) and `specials` as special ones, and `template`; returns the
    tokenizer's backend."""
    import structured_testlib
    from hf_oracle import make_tiny_model
    from tokenizers import AddedToken

    backend = structured_testlib.smol_tokenizer().backend
    backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in markers])
    backend.add_tokens([AddedToken(t, normalized=False, special=True) for t in specials])
    make_tiny_model(path, arch, vocab_size=backend.get_vocab_size(), **config)
    save_tokenizer(path, backend, template)
    return backend


def serve(path, reasoning_parser: str):
    """`pagoda serve` on `path` with `reasoning_parser` and no --tool-call-parser (`auto` must
    read the family's from its template), a small pool, in one process: an `openai` client
    (a context manager)."""
    return openai_client("--model", str(path), "--reasoning-parser", reasoning_parser,
                         "--kv-cache-memory", "16MiB", "--max-model-len", "512",
                         "--no-engine-process", "--log-level", "warning")  # fmt: skip


def check_call_whole_and_streamed(client, call: dict, name: str, args: dict):
    """The chat request `call` answered with one tool call, `name` with `args`, whole
    (finish_reason tool_calls, no content) and streamed (the same name and arguments text);
    then the call and its result sent back render a longer prompt. Returns the whole choice,
    the streamed one and the messages sent back."""
    whole = client.chat.completions.create(**call).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content is None
    (got,) = whole.message.tool_calls
    assert (got.function.name, json.loads(got.function.arguments)) == (name, args)
    with client.chat.completions.stream(**call) as stream:
        final = stream.get_final_completion().choices[0]
    (streamed,) = final.message.tool_calls
    assert (streamed.function.name, streamed.function.arguments) == (
        got.function.name, got.function.arguments)  # fmt: skip
    again = [*ASK, whole.message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": got.id, "content": "sunny"}]  # fmt: skip
    shown = chat_prompt_ids(client, messages=again, tools=TOOLS)
    assert len(shown) > len(chat_prompt_ids(client, messages=ASK, tools=TOOLS))
    return whole, final, again
