"""A second server, with an API key and a tiny waiting queue: /ready before warm-up, 401s,
503 + Retry-After on overload, and SIGTERM draining an in-flight stream, then exit 0."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest
from server_testlib import ServerProcess

pytestmark = pytest.mark.e2e
KEY = "test-secret"
MODEL = "smollm2-135m"


@pytest.fixture(scope="module")
def keyed() -> ServerProcess:
    srv = ServerProcess(
        "--kv-cache-memory", "32MiB", "--max-model-len", "256", "--max-queue-len", "2",
        "--drain-timeout", "60", "--served-model-name", "pagoda-test", MODEL,
        "--log-level", "warning",
        env={"PAGODA_API_KEY": KEY},
    )  # fmt: skip
    srv.seen = srv.wait_ready()
    yield srv
    srv.stop()


@pytest.mark.slow
def test_ready_is_503_until_warmed_up(keyed):
    assert keyed.seen[-1] == 200
    assert 503 in keyed.seen, f"/ready never answered 503 while loading: {keyed.seen}"
    first_answer = next(code for code in keyed.seen if code != 0)
    assert first_answer == 503


def test_api_key(keyed):
    body = {"model": "pagoda-test", "prompt": "Hi", "max_tokens": 2}
    with httpx.Client(base_url=keyed.base, timeout=60) as c:
        # RFC 6750's challenge: the scheme, and invalid_token for a wrong bearer token
        for headers, challenge in (({}, "Bearer"),
                                   ({"Authorization": "Bearer wrong"}, 'Bearer error="invalid_token"'),
                                   ({"Authorization": KEY}, "Bearer")):  # fmt: skip
            r = c.post("/v1/completions", json=body, headers=headers)
            assert r.status_code == 401
            assert r.json()["error"]["code"] == "invalid_api_key"
            assert r.headers["www-authenticate"] == challenge
        assert c.get("/v1/models").status_code == 401
        assert c.get("/tokenizer_info").status_code == 401
        assert c.post("/tokenize", json={"prompt": "Hi"}).status_code == 401
        for open_path in ("/health", "/ready", "/metrics"):
            assert c.get(open_path).status_code == 200
        assert c.get("/debug/engine").status_code == 404  # debug endpoints are off by default
    sdk = openai.OpenAI(base_url=f"{keyed.base}/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in sdk.models.list().data] == ["pagoda-test", MODEL]
    r = sdk.completions.create(model=MODEL, prompt="Hi", max_tokens=2)  # the second name works
    assert r.model == MODEL and r.usage.completion_tokens >= 1
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{keyed.base}/v1", api_key="nope", max_retries=0).models.list()


def test_anthropic_clients_send_the_key_as_x_api_key(keyed):
    """The `anthropic` SDK's `x-api-key` header carries the key on the Messages API's paths
    (and nowhere else); a wrong one is Anthropic's 401 body."""
    import anthropic

    ask = {"model": "pagoda-test", "messages": [{"role": "user", "content": "Hi"}]}
    claude = anthropic.Anthropic(base_url=keyed.base, api_key=KEY, max_retries=0)
    assert claude.messages.count_tokens(**ask).input_tokens > 0
    assert claude.messages.create(max_tokens=1, **ask).usage.output_tokens == 1
    wrong = anthropic.Anthropic(base_url=keyed.base, api_key="nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        wrong.messages.count_tokens(**ask)
    assert e.value.body == {"type": "error", "error": {"type": "authentication_error",
                                                       "message": "invalid or missing API key"}}  # fmt: skip
    r = httpx.post(f"{keyed.base}/v1/completions", headers={"x-api-key": KEY}, timeout=60,
                   json={"model": MODEL, "prompt": "Hi", "max_tokens": 1})  # fmt: skip
    assert r.status_code == 401


async def test_queue_full_is_503_with_retry_after(keyed):
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": MODEL, "prompt": "Tell me about rivers " * 8, "max_tokens": 2}
    async with httpx.AsyncClient(base_url=keyed.base, timeout=120, headers=headers) as c:
        rs = await asyncio.gather(*(c.post("/v1/completions", json=body) for _ in range(10)))
    codes = [r.status_code for r in rs]
    assert set(codes) <= {200, 503} and codes.count(200) >= 2 and 503 in codes, codes
    busy = [r for r in rs if r.status_code == 503]
    assert all(int(r.headers["Retry-After"]) == 1 for r in busy)
    assert all(r.json()["error"]["code"] == "queue_full" for r in busy)
    assert all(r.json()["error"]["type"] == "server_error" for r in busy)  # OpenAI's overloaded
    # OpenAI's retry-after-ms (its SDKs prefer it), spread so that the clients refused in one
    # burst come back apart: with Retry-After alone the openai SDK's retries came in lockstep
    waits = [int(r.headers["retry-after-ms"]) for r in busy]
    assert all(500 <= ms <= 1500 for ms in waits), waits
    assert len(busy) < 3 or len(set(waits)) > 1, waits


@pytest.mark.slow
def test_sigterm_drains_in_flight_stream_then_exits_0(keyed):
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 40, "ignore_eos": True,
            "stream": True}  # fmt: skip
    with httpx.Client(base_url=keyed.base, timeout=120, headers=headers) as c:
        events = []
        with c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            lines = (line for line in r.iter_lines() if line)
            events.append(next(lines))
            keyed.terminate()
            deadline = time.monotonic() + 10
            while c.get("/ready").status_code != 503:
                assert time.monotonic() < deadline, "/ready did not turn 503 on SIGTERM"
                time.sleep(0.05)
            late = c.post("/v1/completions", json={**body, "stream": False})
            assert late.status_code == 503, late.text
            events.extend(lines)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    # every token's text arrived (a reader that paused gets the tokens it missed coalesced)
    assert len("".join(c["choices"][0]["text"] for c in chunks)) >= 40
    assert keyed.proc.wait(30) == 0, keyed.output()
