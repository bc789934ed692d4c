"""A large non-streaming response is built and encoded off the event loop, one choice at a
time, so one client's 256 choices of logprobs do not stop every stream and /health while its
JSON is made (10 s of the event loop for 400 tokens each with 20 alternatives, measured here).
No model: the engine's outputs are made up, the tokenizer is the embedded model's."""

from __future__ import annotations

import asyncio
import gc
import json
import random
import time

import pytest
import structured_testlib
from pagoda.runtime.engine.outputs import StepOutput
from pagoda.runtime.request import TokenLogprob
from pagoda.runtime.sampling.params import SamplingParams
from pagoda.runtime.server.completions import CompletionEndpoint
from pagoda.runtime.server.endpoint import Job
from pagoda.runtime.server.logprobs import TokenStrings
from pagoda.runtime.server.protocol import APIError
from pagoda.runtime.server.serving import Serving, response_json

TOP = 20


@pytest.fixture(scope="module")
def strings() -> TokenStrings:
    return TokenStrings(structured_testlib.smol_tokenizer())


class Outputs:
    """A request stream that hands over made-up outputs: `tokens` steps of one choice each."""

    def __init__(self, rid: str, n: int, tokens: int, rng: random.Random) -> None:
        self.request_id = rid
        self.items = []
        for step in range(tokens):
            for i in range(n):
                t = rng.randrange(49152)
                top = [(rng.randrange(49152), -2.0) for _ in range(TOP)]
                self.items.append(StepOutput(
                    rid, i, [t], "x", [TokenLogprob(t, -1.0, top)], finished=step == tokens - 1,
                    finish_reason="length", num_output_tokens=step + 1))  # fmt: skip

    def __aiter__(self):
        return self._gen()

    async def _gen(self):
        for k, item in enumerate(self.items):
            if k % 256 == 0:
                await asyncio.sleep(0)
            yield item


def job_of(strings: TokenStrings, prompts: int, n: int, tokens: int) -> Job:
    params = SamplingParams(n=n, max_tokens=tokens, logprobs=TOP)
    job = Job(CompletionEndpoint(("m",), 256), "cmpl-1", "m", [[1, 2]] * prompts,
              [None] * prompts, params, False, False, strings, {})  # fmt: skip
    rng = random.Random(0)
    job.streams = [Outputs(f"r{j}", n, tokens, rng) for j in range(prompts)]  # type: ignore[misc]
    return job


async def test_a_large_response_leaves_the_event_loop_free(strings):
    serving = Serving(None)  # type: ignore[arg-type]  # full_response reads no engine
    gc.collect()
    gc.freeze()  # as the server does once ready (`draining.freeze_startup_objects`)
    try:
        job = job_of(strings, prompts=16, n=16, tokens=48)  # 256 choices × 48 × 21 entries
        gaps: list[float] = []
        done = asyncio.Event()

        async def tick() -> None:
            last = time.perf_counter()
            while not done.is_set():
                await asyncio.sleep(0.005)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        ticker = asyncio.ensure_future(tick())
        await asyncio.sleep(0.05)
        start = time.perf_counter()
        body = await serving.full_response(job)
        took = time.perf_counter() - start
        done.set()
        await ticker
    finally:
        gc.unfreeze()
        serving.close()
    data = json.loads(body)
    assert len(data["choices"]) == 256 and data["usage"]["completion_tokens"] == 256 * 48
    first = data["choices"][0]["logprobs"]
    assert len(first["tokens"]) == 48 and len(first["top_logprobs"][0]) >= TOP
    assert took > 0.3, f"built too fast ({took:.2f} s) to show anything"
    assert max(gaps) < 0.25 * took, (max(gaps), took)


def test_response_json_is_the_whole_response_as_json():
    head = {"id": "x", "object": "text_completion", "created": 1, "model": 'a"choices":[]'}
    choices = [{"index": 0, "text": "\ud800 lone"}, {"index": 1, "text": "é\n"}]
    usage = {"prompt_tokens": 1}
    assert json.loads(response_json(head, choices, usage)) == {
        **head, "choices": choices, "usage": usage}  # fmt: skip


class Refused:
    """A request stream the engine failed: iterating it raises `error`."""

    def __init__(self, error: Exception) -> None:
        self.request_id, self.error = "r0", error

    def __aiter__(self):
        return self

    async def __anext__(self):
        raise self.error


class BrokenEndpoint(CompletionEndpoint):
    """An endpoint whose response building has a bug (a parser raising ValueError on output)."""

    def choice(self, *args, **kwargs):
        raise ValueError("Invalid \\escape")

    def delta(self, *args, **kwargs):
        raise ValueError("Invalid \\escape")


async def _stream_events(serving: Serving, job: Job) -> list[dict]:
    events = [e async for e in serving.stream_response(job)]
    return [json.loads(e[len(b"data: ") :]) for e in events[:-1]]


async def test_only_the_engines_refusals_are_400s(strings):
    """A ValueError from the engine's stream (the core refused the request's input) is a 400;
    one raised while the server builds the response is its own bug: a 500 (whole: the error
    guard's; streamed: an internal_error event), not a 400 `invalid_request` blaming the
    request (a tool parser's json.loads error was answered so)."""
    serving = Serving(None)  # type: ignore[arg-type]
    try:
        job = job_of(strings, prompts=1, n=1, tokens=2)
        job.streams = [Refused(ValueError("prompt refused"))]  # type: ignore[list-item]
        with pytest.raises(APIError) as e:
            await serving.full_response(job)
        assert (e.value.status, e.value.code) == (400, "invalid_request")
        job.streams = [Refused(ValueError("prompt refused"))]  # type: ignore[list-item]
        assert (await _stream_events(serving, job))[-1]["error"]["code"] == "invalid_request"
        job = job_of(strings, prompts=1, n=1, tokens=2)
        job.endpoint = BrokenEndpoint(("m",), 256)
        with pytest.raises(ValueError, match="escape"):  # not an APIError: the guard's 500
            await serving.full_response(job)
        job = job_of(strings, prompts=1, n=1, tokens=2)
        job.endpoint = BrokenEndpoint(("m",), 256)
        err = (await _stream_events(serving, job))[-1]["error"]
        assert (err["code"], err["message"]) == ("internal_error", "internal error (ValueError)")
    finally:
        serving.close()
