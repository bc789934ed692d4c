"""Background responses, cancel, input items and resumable streams through the `openai` SDK
against the session's `pagoda serve` (the embedded SmolLM2): a background response answers
`queued` at once, runs on whether or not it is polled, and ends as the same request run in the
foreground would; its stream resumes from any sequence number; cancel aborts it in the engine;
input items are OpenAI's pages; each refusal is a 400 in OpenAI's body."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from test_concurrency_metrics import idle_engine, scrape

pytestmark = pytest.mark.e2e
MODEL = "smollm2-135m"
ASK = "What is the capital of France?"
GREEDY = dict(model=MODEL, temperature=0, max_output_tokens=12)
LONG = dict(model=MODEL, input="Write a long story about a dragon.", max_output_tokens=400)


def wait_ended(client, response_id, timeout=60):
    deadline = time.monotonic() + timeout
    while (r := client.responses.retrieve(response_id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline, r
        time.sleep(0.05)
    return r


async def test_a_background_response_runs_unpolled_and_ends_as_a_foreground_one(client, server):
    fg = client.responses.create(input=ASK, **GREEDY)
    bg = client.responses.create(input=ASK, background=True, **GREEDY)
    assert (bg.status, bg.background, bg.output, bg.usage) == ("queued", True, [], None)
    async with httpx.AsyncClient(base_url=server.base, timeout=60) as c:
        await idle_engine(c)  # nobody polls: it still runs to its end and is stored
    done = client.responses.retrieve(bg.id)
    assert (done.status, done.background, done.id) == ("completed", True, bg.id)
    assert done.output_text == fg.output_text and "Paris" in done.output_text
    assert done.usage.output_tokens == fg.usage.output_tokens
    assert done.usage.input_tokens == fg.usage.input_tokens
    cut = client.responses.create(input=ASK, background=True, **{**GREEDY, "max_output_tokens": 2})
    assert wait_ended(client, cut.id).status == "incomplete"
    follow = client.responses.create(previous_response_id=bg.id, input="And of Germany?",
                                     **{**GREEDY, "max_output_tokens": 1})  # fmt: skip
    assert follow.usage.input_tokens > fg.usage.input_tokens  # its conversation was stored


def test_a_background_stream_resumes_from_any_sequence_number(client):
    whole = client.responses.create(input=ASK, **GREEDY)
    first = []
    with client.responses.create(input=ASK, background=True, stream=True, **GREEDY) as stream:
        for event in stream:  # the client leaves after 4 events; the response runs on
            first.append(event)
            if len(first) == 4:
                break
    assert [e.type for e in first[:2]] == ["response.created", "response.in_progress"]
    assert (first[0].response.status, first[0].response.background) == ("queued", True)
    rid = first[0].response.id
    rest = list(client.responses.retrieve(rid, stream=True, starting_after=3))
    events = first + rest
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == whole.output_text
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    replay = list(client.responses.retrieve(rid, stream=True))  # all of it, from 0
    assert [e.model_dump() for e in replay] == [e.model_dump() for e in events]
    assert list(client.responses.retrieve(rid, stream=True, starting_after=len(events))) == []
    assert client.responses.retrieve(rid).output_text == whole.output_text


async def test_cancel_aborts_a_background_response_in_the_engine(client, server):
    before = scrape(server.base)
    long = client.responses.create(background=True, **LONG)
    with pytest.raises(openai.BadRequestError) as e:  # its conversation is not there yet
        client.responses.create(previous_response_id=long.id, input="Go on.", **GREEDY)
    assert e.value.param == "previous_response_id"
    cancelled = client.responses.cancel(long.id)
    assert (cancelled.id, cancelled.status) == (long.id, "cancelled")
    assert cancelled.usage.output_tokens < 400
    async with httpx.AsyncClient(base_url=server.base, timeout=60) as c:
        state = await idle_engine(c, timeout=10)
    assert state["stats"]["num_free_blocks"] == state["stats"]["num_blocks"]
    aborted = "pagoda:request_success_total{finished_reason=abort}"
    assert scrape(server.base)[aborted] - before.get(aborted, 0) == 1
    assert client.responses.retrieve(long.id) == cancelled
    assert client.responses.cancel(long.id) == cancelled  # again: as it is
    done = client.responses.create(input=ASK, background=True, **GREEDY)
    ended = wait_ended(client, done.id)
    assert client.responses.cancel(done.id) == ended  # an ended one: as it is
    # a streamed one: its stream ends after its last delta (OpenAI's events lack a cancel)
    with client.responses.create(background=True, stream=True, **LONG) as stream:
        rid = next(iter(stream)).response.id
        assert client.responses.cancel(rid).status == "cancelled"
        kinds = [e.type for e in stream]
    assert "response.completed" not in kinds and kinds[-1] == "response.output_item.done"
    foreground = client.responses.create(input=ASK, **{**GREEDY, "max_output_tokens": 2})
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.cancel(foreground.id)
    assert e.value.body["message"] == "Cannot cancel a synchronous response."
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_missing")


def test_input_items_are_listed_in_openais_pages(client):
    turns = [{"role": "user", "content": ASK},
             {"type": "message", "role": "assistant", "id": "msg_given",
              "content": [{"type": "output_text", "text": "Paris."}]},
             {"role": "user", "content": [{"type": "input_text", "text": "And Germany?"}]}]  # fmt: skip
    r = client.responses.create(input=turns, instructions="Be brief.",
                                **{**GREEDY, "max_output_tokens": 2})  # fmt: skip
    page = client.responses.input_items.list(r.id)  # newest first, OpenAI's default
    assert [i.role for i in page.data] == ["user", "assistant", "user"]
    assert page.data[1].id == "msg_given"  # the id it was sent with
    assert (page.first_id, page.last_id, page.has_more) == (page.data[0].id, page.data[2].id,
                                                            False)  # fmt: skip
    asc = client.responses.input_items.list(r.id, order="asc", limit=2)
    assert asc.has_more and [i.id for i in asc.data] == [page.data[2].id, "msg_given"]
    assert asc.data[0].content[0].text == ASK and asc.data[1].content[0].text == "Paris."
    every = list(client.responses.input_items.list(r.id, order="asc", limit=1))  # by `after`
    assert [i.id for i in every] == [i.id for i in reversed(page.data)]
    last = client.responses.input_items.list(r.id, order="asc", after=page.data[0].id)
    assert (last.data, last.has_more, last.first_id) == ([], False, None)


@pytest.fixture(scope="module")
def stored(client):
    """A stored response answered when it was made (not in the background)."""
    return client.responses.create(input=ASK, **{**GREEDY, "max_output_tokens": 1})


@pytest.mark.parametrize("call, param", [
    (lambda c, r: c.responses.create(input=ASK, background=True, store=False, **GREEDY), "store"),
    (lambda c, r: c.responses.retrieve(r.id, stream=True), "stream"),  # answered already
    (lambda c, r: c.responses.retrieve(r.id, starting_after=2), "starting_after"),
    (lambda c, r: c.responses.retrieve(r.id, include=["reasoning.encrypted_content"]),
     "include"),
    (lambda c, r: c.responses.retrieve(r.id, stream=True, include_obfuscation=True),
     "include_obfuscation"),
    (lambda c, r: c.responses.retrieve(r.id, stream=True, starting_after=-1), "starting_after"),
    (lambda c, r: c.responses.retrieve(r.id, extra_query={"x": 1}), "x"),
    (lambda c, r: c.responses.input_items.list(r.id, limit=101), "limit"),
    (lambda c, r: c.responses.input_items.list(r.id, limit=0), "limit"),
    (lambda c, r: c.responses.input_items.list(r.id, order="up"), "order"),
    (lambda c, r: c.responses.input_items.list(r.id, after="msg_nope"), "after"),
    (lambda c, r: c.responses.input_items.list(r.id, include=["message.output_text.logprobs"]),
     "include"),
    (lambda c, r: c.responses.cancel(r.id, extra_query={"now": 1}), "now"),
    (lambda c, r: c.responses.delete(r.id, extra_query={"x": 1}), "x"),
])  # fmt: skip
def test_what_the_stored_routes_cannot_honour_is_a_400_naming_it(client, stored, call, param):
    with pytest.raises(openai.BadRequestError) as e:
        call(client, stored)
    assert e.value.status_code == 400 and e.value.param == param, e.value.body
    assert e.value.body["type"] == "invalid_request_error" and e.value.message


def test_a_background_response_made_without_stream_has_no_events_to_stream(client):
    r = client.responses.create(input=ASK, background=True, **{**GREEDY, "max_output_tokens": 2})
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.retrieve(r.id, stream=True)
    assert e.value.param == "stream" and "without stream" in e.value.message
    wait_ended(client, r.id)
