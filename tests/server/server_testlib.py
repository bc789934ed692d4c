"""Start and stop a real `pagoda serve` process on a free loopback port (used by fixtures), and
send it JSON bodies as they are (no SDK between the test and the server)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
MAX_MODEL_LEN = 512
MODEL = "smollm2-135m"  # the served model of the session's server (tests/server/conftest.py)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`python -m pagoda.runtime.cli serve ...` on 127.0.0.1; log in a temp file."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="pagoda-serve-", suffix=".log")  # noqa: SIM115 - closed in stop()
        cmd = [sys.executable, "-m", "pagoda.runtime.cli", "serve", "--port", str(self.port)]
        self.proc = subprocess.Popen(
            [*cmd, *args],
            cwd=ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()

    def wait_ready(self, timeout: float = 180.0) -> list[int]:
        """Poll /ready until 200; returns every status seen (connection errors as 0)."""
        seen: list[int] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}:\n{self.output()}")
            try:
                code = httpx.get(f"{self.base}/ready", timeout=5).status_code
            except httpx.HTTPError:
                code = 0
            seen.append(code)
            if code == 200:
                return seen
            time.sleep(0.2)
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.output()}")

    def post_json(self, path: str, body: Any, **headers: str) -> httpx.Response:
        """POST `body` to `path`: JSON-encoded, or bytes as they are."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"content-type": "application/json", **headers}
        return httpx.post(f"{self.base}{path}", content=data, headers=headers, timeout=60)

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


def bad_field_error(server: ServerProcess, path: str, field: str, value: Any) -> dict[str, Any]:
    """The error body of a one-token request to `path` (`/v1/completions` or
    `/v1/chat/completions`) with `field` set to `value`, which must be a 400."""
    body = {"model": MODEL, "max_tokens": 1, field: value}
    if path == "/v1/completions":
        body["prompt"] = "x"
    else:
        body["messages"] = [{"role": "user", "content": "Name a colour."}]
    r = server.post_json(path, body)
    assert r.status_code == 400, r.text
    return r.json()["error"]


@contextmanager
def openai_client(*args: str) -> Iterator[Any]:
    """An `openai` client of `pagoda serve *args` once it is ready; the server stopped after."""
    import openai

    srv = ServerProcess(*args)
    try:
        srv.wait_ready()
        yield openai.OpenAI(base_url=srv.base + "/v1", api_key="x", max_retries=0)
    finally:
        srv.stop()


# `pagoda serve` of a tiny float32 checkpoint: a 16 MiB KV cache, 256-token contexts
TINY_SERVE = ("--dtype", "float32", "--kv-cache-memory", "16MiB", "--max-model-len", "256",
              "--log-level", "warning")  # fmt: skip


def greedy_chat(client: Any, messages: list[dict], max_tokens: int, **fields: Any):
    """A greedy chat completion of `max_tokens` (EOS ignored, special tokens kept in the text),
    asked whole and then streamed: (the completion, the streamed text, the request's fields)."""
    kw = dict(model=client.models.list().data[0].id, messages=messages, max_tokens=max_tokens,
              temperature=0, extra_body={"ignore_eos": True, "skip_special_tokens": False},
              **fields)  # fmt: skip
    got = client.chat.completions.create(**kw)
    stream = client.chat.completions.create(**kw, stream=True)
    return got, "".join(c.choices[0].delta.content or "" for c in stream if c.choices), kw


def check_image_chat(client: Any, parts: list[dict], ids: list[int], want: list[int],
                     token_id: Any) -> None:  # fmt: skip
    """A vision server's answers: a greedy chat with image `parts` reads the prompt `ids` and
    answers the tokens `want` (their logprob tokens read back by `token_id`); a text-only
    chat after it (4 prompt tokens) too; `/tokenize` of the image messages answers `ids` (the
    image read: its run depends on its size)."""
    name, n = client.models.list().data[0].id, len(want)
    got = client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": parts}], max_tokens=n,
        temperature=0, logprobs=True, extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert got.usage.prompt_tokens == len(ids)
    assert [token_id(t.token) for t in got.choices[0].logprobs.content] == want
    text = client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "w7 w8"}], max_tokens=n,
        temperature=0, extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert text.usage.prompt_tokens == 4
    shown = httpx.post(str(client.base_url).removesuffix("v1/") + "tokenize",
                       json={"messages": [{"role": "user", "content": parts}]}, timeout=30)  # fmt: skip
    assert shown.status_code == 200, shown.text
    assert shown.json()["tokens"] == ids


def chat_prompt_ids(client: Any, **body: Any) -> list[int]:
    """The prompt ids /tokenize renders for a chat `body` (its messages, chat_template_kwargs,
    tools ...): the /v1/completions oracle's prompt."""
    base = str(client.base_url).removesuffix("/v1/")
    r = httpx.post(f"{base}/tokenize", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def save_tokenizer(path: Path, backend: Any, chat_template: str) -> None:
    """A `tokenizers` backend and a chat template (EOS <|im_end|>, no BOS) written beside a
    checkpoint as tokenizer.json and tokenizer_config.json."""
    backend.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": chat_template, "eos_token": "<|im_end|>", "bos_token": None}))  # fmt: skip
