"""`pagoda serve --reasoning-parser deepseek_r1` through the `openai` SDK, with the embedded model
steered by few-shot turns into writing `<think> … </think>` before its answer (SmolLM2 copies the
form; its tokenizer splits `</think>` into several tokens, so the end marker always spans stream
chunks). The oracle is the same prompt on /v1/completions (which a reasoning parser leaves
alone): the chat reply's reasoning and content are its text split by vLLM's rules."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from pydantic import BaseModel
from server_testlib import ServerProcess

MODEL = "smollm2-135m"
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SHOTS = [("What is 2+2?", "<think>two plus two</think>4"),
         ("What is 3+3?", "<think>three plus three</think>6"),
         ("What is 5+5?", "<think>five plus five</think>10")]  # fmt: skip
MESSAGES = [m for q, a in SHOTS for m in ({"role": "user", "content": q},
                                          {"role": "assistant", "content": a})]  # fmt: skip
ASK = [*MESSAGES, {"role": "user", "content": "What is 4+4?"}]


class Answer(BaseModel):
    value: int


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    srv = ServerProcess("--reasoning-parser", "deepseek_r1", "--kv-cache-memory", "64MiB",
                        "--max-model-len", "512", "--no-engine-process", "--log-level", "warning")  # fmt: skip
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0)


def tokenize(client: openai.OpenAI, **body) -> list[int]:
    r = httpx.post(f"{str(client.base_url).removesuffix('/v1/')}/tokenize",
                   json={"model": MODEL, **body}, timeout=30)  # fmt: skip
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def raw(client: openai.OpenAI, messages: list[dict], max_tokens: int, **extra) -> str:
    """What the model writes for these messages, unparsed (the chat prompt on /v1/completions)."""
    ids = tokenize(client, messages=messages, **extra)
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=max_tokens, temperature=0)
    return r.choices[0].text


def test_the_thinking_is_split_off_whole_and_streamed(client):
    text = raw(client, ASK, 30)
    assert text.startswith("<think>") and "</think>" in text  # the steering held
    thought, answer = text[len("<think>") :].split("</think>", 1)
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=30, temperature=0)
    m = r.choices[0].message
    assert (m.reasoning_content, m.reasoning, m.content) == (thought, thought, answer)
    details = r.usage.completion_tokens_details
    assert 0 < details.reasoning_tokens < r.usage.completion_tokens  # the total stays the total
    assert details.reasoning_tokens == len(
        tokenize(client, prompt=thought, add_special_tokens=False)
    )
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=30, temperature=0, stream=True,
        stream_options={"include_usage": True}))  # fmt: skip
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == thought
    assert "".join(getattr(d, "reasoning", None) or "" for d in deltas) == thought
    assert "".join(d.content or "" for d in deltas) == answer
    ends = [j for j, d in enumerate(deltas) if d.content]  # no reasoning after the answer began
    assert not any(getattr(d, "reasoning_content", None) for d in deltas[ends[0] :])
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == details.reasoning_tokens
    # the reply goes back as the SDK hands it over (reasoning and reasoning_content both)
    again = [*ASK, m, {"role": "user", "content": "And 6+6?"}]
    r = client.chat.completions.create(model=MODEL, messages=again, max_tokens=30, temperature=0)
    assert r.choices[0].message.reasoning_content


def test_a_response_writes_the_thinking_as_a_reasoning_item(client):
    """`/v1/responses`: the thinking is a `reasoning` item before the message, whole and
    streamed (`response.reasoning_text.delta`); sent back as an input item before the assistant
    message, it is that message's `reasoning_content` (the prompt is chat's)."""
    c = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=30, temperature=0)
    m = c.choices[0].message
    r = client.responses.create(model=MODEL, input=ASK, max_output_tokens=30, temperature=0)
    thought, answer = r.output
    assert (thought.type, thought.content[0].text, answer.type) == (
        "reasoning", m.reasoning_content, "message")  # fmt: skip
    assert r.output_text == m.content
    assert r.usage.output_tokens_details.reasoning_tokens == \
        c.usage.completion_tokens_details.reasoning_tokens  # fmt: skip
    with client.responses.stream(model=MODEL, input=ASK, max_output_tokens=30,
                                 temperature=0) as stream:  # fmt: skip
        events = list(stream)
        final = stream.get_final_response()
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == \
        m.reasoning_content  # fmt: skip
    assert [o.type for o in final.output] == ["reasoning", "message"]
    assert final.output_text == r.output_text
    again = [*ASK, thought.model_dump(exclude_none=True), answer.model_dump(exclude_none=True),
             {"role": "user", "content": "And 6+6?"}]  # fmt: skip
    back = client.responses.create(model=MODEL, input=again, max_output_tokens=4, temperature=0)
    chat = [*ASK, {"role": "assistant", "content": m.content, "reasoning_content": thought.content[0].text},
            {"role": "user", "content": "And 6+6?"}]  # fmt: skip
    want = client.chat.completions.create(model=MODEL, messages=chat, max_tokens=4, temperature=0)
    assert back.usage.input_tokens == want.usage.prompt_tokens


def test_a_message_writes_the_thinking_as_a_thinking_block(server, client):
    """`/v1/messages` with `thinking`: a thinking block before the text, whole and streamed
    (`thinking_delta`); sent back, it is the assistant message's `reasoning_content`. This
    template has no `enable_thinking` switch: `disabled` is a 400."""
    import anthropic

    claude = anthropic.Anthropic(base_url=server.base, api_key="unused", max_retries=0)
    m = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=30,
                                       temperature=0).choices[0].message  # fmt: skip
    kw = dict(model=MODEL, max_tokens=30, messages=ASK, thinking={"type": "adaptive"},
              extra_body={"temperature": 0})  # fmt: skip
    r = claude.messages.create(**kw)
    assert [(b.type, getattr(b, "thinking", None) or b.text) for b in r.content] == [
        ("thinking", m.reasoning_content), ("text", m.content)]  # fmt: skip
    with claude.messages.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_message()
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert "".join(d.thinking for d in deltas if d.type == "thinking_delta") == m.reasoning_content
    assert [b.to_dict() for b in final.content] == [b.to_dict() for b in r.content]
    again = [
        *ASK,
        {"role": "assistant", "content": r.content},
        {"role": "user", "content": "And 6+6?"},
    ]
    counted = claude.messages.count_tokens(model=MODEL, messages=again)
    chat = [*ASK, {"role": "assistant", "content": m.content, "reasoning_content": m.reasoning_content},
            {"role": "user", "content": "And 6+6?"}]  # fmt: skip
    want = client.chat.completions.create(model=MODEL, messages=chat, max_tokens=1, temperature=0)
    assert counted.input_tokens == want.usage.prompt_tokens
    with pytest.raises(anthropic.BadRequestError, match="enable_thinking"):
        claude.messages.create(**{**kw, "thinking": {"type": "disabled"}})


def test_cut_off_while_thinking_all_of_it_is_reasoning(client):
    text = raw(client, ASK, 4)
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, temperature=0)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "length" and m.content is None
    assert m.reasoning_content == text.removeprefix("<think>")
    assert r.usage.completion_tokens_details.reasoning_tokens == 4 - 3  # <think> is 3 tokens


def test_a_prompt_that_opened_the_thinking(client):
    """The reply continues an assistant message that opened `<think>` (what DeepSeek-R1's
    newer templates write): the output starts inside the thinking, without a start tag."""
    opened = [*ASK, {"role": "assistant", "content": "<think>"}]
    extra = {"continue_final_message": True, "add_generation_prompt": False}
    text = raw(client, opened, 30, **extra)
    assert not text.startswith("<think>") and "</think>" in text
    thought, answer = text.split("</think>", 1)
    r = client.chat.completions.create(model=MODEL, messages=opened, max_tokens=30,
                                       temperature=0, extra_body=extra)  # fmt: skip
    assert (r.choices[0].message.reasoning_content, r.choices[0].message.content) == (
        thought, answer)  # fmt: skip
    closed = [*ASK, {"role": "assistant", "content": "<think>sum</think>"}]
    r = client.chat.completions.create(model=MODEL, messages=closed, max_tokens=8,
                                       temperature=0, extra_body=extra)  # fmt: skip
    m = r.choices[0].message
    assert m.reasoning_content is None and m.content == raw(client, closed, 8, **extra)
    assert r.usage.completion_tokens_details.reasoning_tokens == 0  # no ids kept to count


def test_the_answer_format_holds_after_the_thinking(client):
    """`response_format` constrains the answer only: the thinking is written as before, the
    content parses (the SDK's `parse`)."""
    r = client.chat.completions.parse(model=MODEL, messages=ASK, max_tokens=40, temperature=0,
                                      response_format=Answer)  # fmt: skip
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "stop"
    assert m.reasoning_content == raw(client, ASK, 30)[len("<think>") :].split("</think>")[0]
    assert isinstance(m.parsed, Answer) and m.content == m.parsed.model_dump_json().replace(
        ":", ": "
    )  # compact JSON has ": " here
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=40, temperature=0,
                                       extra_body={"structured_outputs": {"choice": ["8", "16"]}})  # fmt: skip
    assert r.choices[0].message.content in ("8", "16") and r.choices[0].message.reasoning_content
    # the metric counts what the client asked for, not the structural tag the answer's grammar is
    metrics = httpx.get(f"{str(client.base_url).removesuffix('/v1/')}/metrics", timeout=30).text
    kinds = {ln.split('type="')[1].split('"')[0] for ln in metrics.splitlines()
             if ln.startswith("pagoda:structured_output_requests_total{")}  # fmt: skip
    assert {"json", "choice"} <= kinds and "structural_tag" not in kinds, kinds


def test_tool_calls_follow_the_thinking(client):
    tools = [openai.pydantic_function_tool(Answer, name="report")]
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=60, temperature=0,
                                       tools=tools, tool_choice="required",
                                       parallel_tool_calls=False)  # fmt: skip
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    assert m.reasoning_content and "<tool_call>" not in m.reasoning_content
    assert [c.function.name for c in m.tool_calls] == ["report"]
    Answer.model_validate_json(m.tool_calls[0].function.arguments)


def test_completions_are_left_alone(client):
    prompt = "Q: 2+2?\nA: <think>two plus two</think>4\nQ: 3+3?\nA: <think>"
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    assert "</think>" in r.choices[0].text
    assert r.usage.completion_tokens_details is None


def test_echo_comes_first_in_content_while_the_reply_thinks(client):
    """echo of an assistant message that opened `<think>`, the reply cut off inside the
    thinking: content is the echoed text, whole as streamed (vLLM's: the echo prefixes the
    content). The whole response dropped it (content null) while the stream sent it."""
    opened = [*ASK, {"role": "assistant", "content": "<think>four"}]
    extra = {"continue_final_message": True, "add_generation_prompt": False}
    assert "</think>" not in raw(client, opened, 3, **extra)  # the reply is all thinking
    kw = dict(model=MODEL, messages=opened, max_tokens=3, temperature=0,
              extra_body={**extra, "echo": True})  # fmt: skip
    m = client.chat.completions.create(**kw).choices[0].message
    assert m.content == "<think>four" and m.reasoning_content
    chunks = client.chat.completions.create(**kw, stream=True)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == m.content
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == (
        m.reasoning_content)  # fmt: skip
