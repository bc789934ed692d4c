"""Completions and chat completions: request → engine requests → OpenAI responses or SSE chunks.

Everything that can be rejected is rejected before the first engine request is added, so a bad
request never leaves work behind; a batch of prompts is added all-or-nothing.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from pagoda.runtime.engine.async_engine import (
    AsyncEngine,
    EngineUnavailableError,
    QueueFullError,
    RequestStream,
)
from pagoda.runtime.engine.outputs import StepOutput
from pagoda.runtime.model.tokenizer import Tokenizer
from pagoda.runtime.sampling import SamplingParams
from pagoda.runtime.server.logprobs import TokenStrings
from pagoda.runtime.server.protocol import APIError, ChatCompletionRequest, CompletionRequest

_SAMPLING_FIELDS = set(SamplingParams.__dataclass_fields__)


@dataclass
class Job:
    """A validated request, ready to run: one engine request per prompt."""

    kind: str  # "completion" | "chat"
    id: str
    model: str
    prompts: list[list[int]]
    prompt_texts: list[str | None]
    params: SamplingParams
    stream: bool
    include_usage: bool
    echo: bool = False
    created: int = 0
    streams: list[RequestStream] | None = None

    @property
    def num_choices(self) -> int:
        return len(self.prompts) * self.params.n


def sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


class OpenAIServing:
    def __init__(self, engine: AsyncEngine, served_model_names: Sequence[str]) -> None:
        self.engine = engine
        self.names = tuple(served_model_names)
        self._strings: TokenStrings | None = None

    # -- validation ----------------------------------------------------------------------------
    def _tokenizer(self) -> Tokenizer:
        if self.engine.core is None:
            raise APIError(503, "model is still loading", code="model_loading")
        return self.engine.core.tokenizer

    @property
    def strings(self) -> TokenStrings:
        if self._strings is None:
            self._strings = TokenStrings(self._tokenizer())
        return self._strings

    def resolve_model(self, name: str | None) -> str:
        if name is None:
            return self.names[0]
        if name not in self.names:
            raise APIError(
                404,
                f"The model '{name}' does not exist; this server serves {', '.join(self.names)}",
                param="model",
                code="model_not_found",
            )
        return name

    def sampling_params(
        self, req: CompletionRequest | ChatCompletionRequest, renames: dict[str, str], **kw: Any
    ) -> SamplingParams:
        """Build SamplingParams; its ValueError (which names the field) becomes a 400."""
        fields = {
            "n": req.n,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "top_k": req.top_k,
            "min_p": req.min_p,
            "seed": req.seed,
            "presence_penalty": req.presence_penalty,
            "frequency_penalty": req.frequency_penalty,
            "repetition_penalty": req.repetition_penalty,
            "stop": tuple([req.stop] if isinstance(req.stop, str) else (req.stop or ())),
            "stop_token_ids": tuple(req.stop_token_ids or ()),
            "ignore_eos": req.ignore_eos,
            "skip_special_tokens": req.skip_special_tokens,
            "include_stop_str_in_output": req.include_stop_str_in_output,
            **kw,
        }
        try:
            return SamplingParams(**{k: v for k, v in fields.items() if v is not None or k in kw})
        except ValueError as e:
            word, _, rest = str(e).partition(" ")
            param = renames.get(word, word) if word in _SAMPLING_FIELDS else None
            message = f"{param} {rest}" if param else str(e)
            raise APIError(400, message, param=param, code="invalid_value") from e

    def _check_prompts(self, prompts: list[list[int]], params: SamplingParams, param: str) -> None:
        assert self.engine.core is not None
        for ids in prompts:
            try:
                self.engine.core.validate(ids, params)
            except ValueError as e:
                message = str(e) if str(e).startswith(param) else f"{param}: {e}"
                raise APIError(400, message, param=param, code="invalid_prompt") from e

    def prepare_completion(self, req: CompletionRequest) -> Job:
        model = self.resolve_model(req.model)
        tok = self._tokenizer()
        p = req.prompt
        if isinstance(p, str):
            texts: list[str | None] = [p]
            prompts = [tok.encode(p)]
        elif p and isinstance(p[0], str):
            texts, prompts = list(p), [tok.encode(s) for s in p]  # type: ignore[arg-type]
        elif p and isinstance(p[0], list):
            texts, prompts = [None] * len(p), [list(x) for x in p]  # type: ignore[arg-type]
        else:
            texts, prompts = [None], [list(p)]  # type: ignore[arg-type]
        if not prompts:
            raise APIError(400, "prompt must not be empty", param="prompt", code="invalid_prompt")
        if req.best_of is not None and req.best_of != req.n:
            raise APIError(400, "best_of other than n is not supported", param="best_of")
        if req.echo and req.logprobs is not None:
            raise APIError(400, "echo with logprobs is not supported", param="echo")
        max_tokens = 16 if req.max_tokens is None else req.max_tokens  # OpenAI's default
        params = self.sampling_params(req, {}, max_tokens=max_tokens, logprobs=req.logprobs)
        self._check_prompts(prompts, params, "prompt")
        return self._job("completion", "cmpl", model, prompts, texts, params, req, echo=req.echo)

    def prepare_chat(self, req: ChatCompletionRequest) -> Job:
        model = self.resolve_model(req.model)
        tok = self._tokenizer()
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "top_logprobs requires logprobs=true", param="top_logprobs")
        max_tokens, mt_param = req.max_tokens, "max_tokens"
        if req.max_completion_tokens is not None:
            max_tokens, mt_param = req.max_completion_tokens, "max_completion_tokens"
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        renames = {"max_tokens": mt_param, "logprobs": "top_logprobs"}
        params = self.sampling_params(req, renames, max_tokens=max_tokens, logprobs=logprobs)
        try:
            text = tok.apply_chat_template([m.as_template_dict() for m in req.messages])
        except ValueError as e:
            raise APIError(400, str(e), param="messages", code="invalid_messages") from e
        except Exception as e:  # a template may raise anything on odd input
            raise APIError(400, f"chat template failed: {e}", param="messages") from e
        prompts = [tok.encode(text, add_special_tokens=False)]
        self._check_prompts(prompts, params, "messages")
        return self._job("chat", "chatcmpl", model, prompts, [text], params, req)

    def _job(
        self,
        kind: str,
        prefix: str,
        model: str,
        prompts: list[list[int]],
        texts: list[str | None],
        params: SamplingParams,
        req: CompletionRequest | ChatCompletionRequest,
        echo: bool = False,
    ) -> Job:
        include_usage = bool(req.stream and req.stream_options and req.stream_options.include_usage)
        return Job(
            kind, f"{prefix}-{uuid.uuid4().hex}", model, prompts, texts, params, req.stream,
            include_usage, echo, int(time.time()),
        )  # fmt: skip

    # -- running ---------------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        """Add the job's engine requests (all or none); engine refusals become 503s."""
        streams: list[RequestStream] = []
        try:
            for i, ids in enumerate(job.prompts):
                streams.append(self.engine.add_request(ids, job.params, f"{job.id}-{i}"))
        except (EngineUnavailableError, ValueError) as e:
            for s in streams:
                self.engine.abort(s.request_id)
            if isinstance(e, QueueFullError):
                raise APIError(503, str(e), code="queue_full",
                               headers={"Retry-After": str(e.retry_after or 1)}) from e  # fmt: skip
            if isinstance(e, EngineUnavailableError):
                headers = {"Retry-After": str(e.retry_after)} if e.retry_after else None
                raise APIError(503, str(e), code="unavailable", headers=headers) from e
            raise APIError(400, str(e), param="prompt", code="invalid_prompt") from e
        job.streams = streams

    def abort(self, job: Job) -> None:
        for s in job.streams or ():
            self.engine.abort(s.request_id)

    async def _outputs(self, job: Job) -> AsyncIterator[tuple[int, StepOutput]]:
        """(choice index, delta) from every prompt's stream, as they come."""
        streams, n = job.streams or [], job.params.n
        if len(streams) == 1:
            async for out in streams[0]:
                yield out.index, out
            return
        queue: asyncio.Queue[Any] = asyncio.Queue()

        async def pump(i: int, s: RequestStream) -> None:
            try:
                async for out in s:
                    queue.put_nowait((i * n + out.index, out))
            except Exception as e:
                queue.put_nowait((i, e))
            queue.put_nowait((i, None))

        tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
        try:
            left = len(tasks)
            while left:
                idx, item = await queue.get()
                if item is None:
                    left -= 1
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield idx, item
        finally:
            for t in tasks:
                t.cancel()

    def _usage(self, job: Job, tokens: list[int], cached: int) -> dict[str, Any]:
        prompt = sum(len(p) for p in job.prompts)
        out = sum(tokens)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": out,
            "total_tokens": prompt + out,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    def _head(self, job: Job, obj: str) -> dict[str, Any]:
        return {"id": job.id, "object": obj, "created": job.created, "model": job.model}

    async def full_response(self, job: Job) -> dict[str, Any]:
        k, chat = job.num_choices, job.kind == "chat"
        texts = [""] * k
        lps: list[list] = [[] for _ in range(k)]
        tokens, finish, stop = [0] * k, [None] * k, [None] * k
        cached = 0
        async for idx, o in self._outputs(job):
            texts[idx] += o.new_text
            lps[idx].extend(o.new_logprobs)
            tokens[idx] = o.num_output_tokens
            if o.finished:
                finish[idx], stop[idx] = o.finish_reason, o.stop_reason
                cached = max(cached, o.num_cached_tokens)
        want_lp = job.params.logprobs is not None
        choices = []
        for i in range(k):
            c: dict[str, Any] = {"index": i}
            if chat:
                c["message"] = {"role": "assistant", "content": texts[i]}
                c["logprobs"] = {"content": self.strings.chat(lps[i])} if want_lp else None
            else:
                prefix = self._echo_text(job, i) if job.echo else ""
                c["text"] = prefix + texts[i]
                c["logprobs"] = self.strings.completion(lps[i], 0) if want_lp else None
            c["finish_reason"], c["stop_reason"] = finish[i], stop[i]
            choices.append(c)
        body = self._head(job, "chat.completion" if chat else "text_completion")
        body["choices"] = choices
        body["usage"] = self._usage(job, tokens, cached)
        return body

    def _echo_text(self, job: Job, choice: int) -> str:
        i = choice // job.params.n
        text = job.prompt_texts[i]
        return text if text is not None else self._tokenizer().decode(job.prompts[i])

    async def stream_response(self, job: Job) -> AsyncIterator[str]:
        """SSE chunks; the last is `data: [DONE]`. Errors after the start become an error event."""
        k, chat = job.num_choices, job.kind == "chat"
        head = self._head(job, "chat.completion.chunk" if chat else "text_completion")
        want_lp = job.params.logprobs is not None
        tokens, offsets, started = [0] * k, [0] * k, [False] * k
        cached = 0

        def chunk(choice: dict[str, Any]) -> str:
            data = {**head, "choices": [choice]}
            if job.include_usage:
                data["usage"] = None
            return sse(data)

        try:
            if chat:
                for i in range(k):
                    delta = {"role": "assistant", "content": ""}
                    yield chunk(
                        {"index": i, "delta": delta, "logprobs": None, "finish_reason": None}
                    )
            async for idx, o in self._outputs(job):
                tokens[idx] = o.num_output_tokens
                text = o.new_text
                if job.echo and not started[idx]:
                    text = self._echo_text(job, idx) + text
                started[idx] = True
                if not (text or o.finished or (want_lp and o.new_logprobs)):
                    continue
                c: dict[str, Any] = {"index": idx}
                if chat:
                    c["delta"] = {"content": text} if text else {}
                    c["logprobs"] = (
                        {"content": self.strings.chat(o.new_logprobs)} if want_lp else None
                    )
                else:
                    c["text"] = text
                    c["logprobs"] = (
                        self.strings.completion(o.new_logprobs, offsets[idx]) if want_lp else None
                    )
                    offsets[idx] += len(text)
                c["finish_reason"] = o.finish_reason if o.finished else None
                if o.finished:
                    c["stop_reason"] = o.stop_reason
                    cached = max(cached, o.num_cached_tokens)
                yield chunk(c)
            if job.include_usage:
                yield sse({**head, "choices": [], "usage": self._usage(job, tokens, cached)})
        except EngineUnavailableError as e:
            yield sse(APIError(503, str(e), code="unavailable").body())
        yield "data: [DONE]\n\n"
