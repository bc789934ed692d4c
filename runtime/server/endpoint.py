"""What completions and chat completions share: the `Job` a request becomes, and `Endpoint`, the
base of the two classes that know one API's request fields and response shapes.

An endpoint's `prepare` is pure and synchronous (parse, sampling params, templating,
tokenization): the server runs it on a worker thread so that the event loop never does
per-request heavy work. Validation against the engine (context length, token ids, queue bound)
happens once, in `AsyncEngine.add_requests`.
"""

from __future__ import annotations

import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from pagoda.runtime.engine.info import EngineInfo
from pagoda.runtime.engine.request_stream import RequestStream
from pagoda.runtime.request import TokenLogprob
from pagoda.runtime.sampling.params import ParamError, SamplingParams
from pagoda.runtime.server.logprobs import TokenStrings
from pagoda.runtime.server.lora_adapters import ServedAdapters
from pagoda.runtime.server.protocol import APIError, shorten
from pagoda.runtime.server.reasoning import ReasoningStream
from pagoda.runtime.server.tool_parsers import ToolStream
from pagoda.runtime.server.tools import ToolSetup
from pydantic import BaseModel

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from pagoda.runtime.server.serving import Serving

# A token's text is at most this many times longer (in bytes) than the token's own vocabulary
# string; text longer than max_model_len * max_token_bytes * this cannot fit and is refused
# without being tokenized (normalizers can shrink text a little; 4 is a wide margin).
_SURELY_TOO_LONG_MARGIN = 4


@dataclass
class Job:
    """A parsed request, ready to run: one engine request per prompt."""

    endpoint: Endpoint
    id: str
    model: str
    prompts: list[list[int]]
    prompt_texts: list[str | None]
    params: SamplingParams
    stream: bool
    include_usage: bool
    strings: TokenStrings
    renames: dict[str, str]  # engine field name → the request's (for ParamError → 400)
    echo: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    # Parsed and tokenized: the metrics' clock starts here, as vLLM's (a grammar compile counts).
    arrival_time: float = field(default_factory=time.monotonic)
    streams: list[RequestStream] | None = None
    tools: ToolSetup | None = None  # chat with tools: how calls are parsed
    tool_streams: dict[int, ToolStream] = field(default_factory=dict)  # per choice, streaming
    called: set[int] = field(default_factory=set)  # choices whose output held tool calls
    opened: set[int] = field(default_factory=set)  # chat with tools: choices whose role was sent
    # chat with --reasoning-parser: whether replies start thinking (None: no parser)
    reasoning: bool | None = None
    reasoning_streams: dict[int, ReasoningStream] = field(default_factory=dict)  # per choice
    reasoning_end_id: int | None = None  # `</think>`'s token, where it is one
    role: str = "assistant"  # chat: the reply's role
    echo_text: str = ""  # chat: what each reply starts with (`echo`)
    continuous_usage: bool = False  # stream: every chunk's usage is its choice's so far
    # Prompt logprobs: each prompt's entries as its first output brought them (by prompt
    # index), the `prompt_logprobs` k the response shows (None: the field is left out)
    prompt_logprobs: dict[int, list[TokenLogprob]] = field(default_factory=dict)
    prompt_logprobs_k: int | None = None
    echo_logprobs: bool = False  # completions: echo with logprobs (the prompt's come first)
    echo_only: bool = False  # completions: echo with max_tokens 0 (the one token is dropped)
    api_state: Any = None  # an endpoint's own per-request state (the Responses API's)

    @property
    def num_choices(self) -> int:
        return len(self.prompts) * self.params.n

    def param_error(self, e: ParamError) -> APIError:
        """A ParamError from the engine, named as this API spells the field."""
        return param_error(e, self.renames)


class Endpoint(ABC):
    """One OpenAI API: its request model, how a request becomes a Job, how outputs look."""

    request_model: ClassVar[type[BaseModel]]
    object_name: ClassVar[str]  # "text_completion" | "chat.completion"
    chunk_object_name: ClassVar[str]
    id_prefix: ClassVar[str]
    renames: ClassVar[dict[str, str]] = {}  # engine field name → this API's name

    adapters: ServedAdapters | None = None  # LoRA adapters `model` may name (set by the app)

    def __init__(self, served_model_names: tuple[str, ...]) -> None:
        self.names = served_model_names

    # -- requests ------------------------------------------------------------------------------
    @abstractmethod
    def prepare(self, req: Any, info: EngineInfo, strings: TokenStrings) -> Job:
        """Request model → Job (APIError 400/404 for what can be refused without the engine)."""

    def resolve_model(self, name: str | None) -> str:
        if name is None:
            return self.names[0]
        if name not in self.names and (self.adapters is None or self.adapters.get(name) is None):
            raise APIError(
                404,
                f"The model '{shorten(name, 100)}' does not exist; this server serves "
                f"{', '.join(self.names)}",
                param="model",
                code="model_not_found",
            )
        return name

    def sampling_params(
        self, req: Any, renames: dict[str, str], defaults: Mapping[str, Any] = {}, **kw: Any
    ) -> SamplingParams:
        """SamplingParams from the fields both APIs share plus `kw`, `defaults` (the model's
        generation config, `EngineInfo.sampling_defaults`) where the request leaves a field out,
        as vLLM does; ParamError → 400."""
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
            "min_tokens": req.min_tokens,
            "ignore_eos": req.ignore_eos,
            "skip_special_tokens": req.skip_special_tokens,
            "include_stop_str_in_output": req.include_stop_str_in_output,
            "logit_bias": req.logit_bias,
            "allowed_token_ids": req.allowed_token_ids,
            "bad_words": req.bad_words,
            # ranks only where a response shows them: vLLM's `prompt_logprobs` field (OpenAI's
            # logprobs, and echo's prompt scores, have none)
            "logprob_ranks": req.prompt_logprobs is not None,
        }
        fields = {**defaults, **{k: v for k, v in fields.items() if v is not None}}
        lora = None if self.adapters is None else self.adapters.get(req.model)
        if lora is not None:  # `model` names an adapter: the request runs with it
            fields["lora_request"] = lora
        try:
            return SamplingParams(**{**fields, **kw})
        except ParamError as e:
            raise param_error(e, renames) from e

    def check_length(self, text: str, info: EngineInfo) -> None:
        """Refuse text that cannot fit in the context before paying for its tokenization."""
        if len(text) > info.max_model_len * info.max_token_bytes * _SURELY_TOO_LONG_MARGIN:
            raise param_error(
                ParamError(
                    "prompt",
                    f"prompt is {len(text)} characters, far more than this model's maximum "
                    f"context length of {info.max_model_len} tokens",
                ),
                self.renames,
            )

    def job(self, req: Any, model: str, prompts: list[list[int]], texts: list[str | None],
            params: SamplingParams, strings: TokenStrings, renames: dict[str, str] | None = None,
            echo: bool = False) -> Job:  # fmt: skip
        include_usage = bool(req.stream and req.stream_options and req.stream_options.include_usage)
        job_id = f"{self.id_prefix}-{uuid.uuid4().hex}"
        job = Job(self, job_id, model, prompts, texts, params, req.stream, include_usage,
                  strings, renames or self.renames, echo)  # fmt: skip
        job.continuous_usage = include_usage and req.stream_options.continuous_usage_stats
        job.prompt_logprobs_k = req.prompt_logprobs
        return job

    # -- responses -----------------------------------------------------------------------------
    def head(self, job: Job, chunk: bool) -> dict[str, Any]:
        obj = self.chunk_object_name if chunk else self.object_name
        return {"id": job.id, "object": obj, "created": job.created, "model": job.model}

    def opening(self, job: Job) -> list[dict[str, Any]]:
        """Stream choices sent before any token (chat: the assistant role)."""
        return []

    def echoed_text_length(self, job: Job, i: int) -> int:
        """How far choice `i`'s first chunk moves `text_offset` before its tokens' (echo)."""
        return 0

    def response_fields(self, job: Job) -> dict[str, Any]:
        """Fields of a full response beside its choices (chat: `prompt_logprobs`)."""
        return {}

    def response_body(self, job: Job, choices: list[dict[str, Any]],
                      usage: dict[str, Any]) -> bytes | None:  # fmt: skip
        """A full response's JSON where this API's shape is not `{head, choices, usage}` (the
        Responses API's: `responses.py`); None: that shape."""
        return None

    def detach(self, serving: Serving, job: Job) -> bytes | AsyncIterator[bytes] | None:
        """A submitted job that runs on without its client (the Responses API's background
        responses): the answer sent at once (JSON, or SSE events to follow); None for a job
        answered as it runs."""
        return None

    def stream(self, serving: Serving, job: Job) -> AsyncIterator[bytes]:
        """The SSE bytes of a streamed response (chat's and completions' chunks)."""
        return serving.stream_response(job)

    @abstractmethod
    def choice(self, job: Job, i: int, text: str, lps: list[TokenLogprob]) -> dict[str, Any]:
        """A full response's choice `i` (without finish_reason/stop_reason)."""

    @abstractmethod
    def delta(self, job: Job, i: int, text: str, lps: list[TokenLogprob], offset: int,
              first: bool, final: bool) -> dict[str, Any] | None:  # fmt: skip
        """A stream chunk's choice `i` (without finish_reason); `offset`: the length of
        the text of the tokens whose logprobs were sent so far (where `text_offset` goes on);
        `final`: the choice's last chunk. None: nothing to send yet."""

    def usage_details(self, job: Job, ids: list[list[int]]) -> dict[str, Any]:
        """Fields added to a response's usage (`ids`: each choice's output token ids, collected
        only where `job.reasoning` is set)."""
        return {}

    def finish_reason(self, job: Job, i: int, reason: str | None) -> str | None:
        """The finish reason a client sees (chat: `tool_calls` when the output held calls)."""
        return "tool_calls" if reason == "stop" and i in job.called else reason


def param_error(e: ParamError, renames: dict[str, str]) -> APIError:
    """ParamError → APIError 400 whose `param` (and message) use the request's field name."""
    param = renames.get(e.field, e.field)
    message = e.message
    if message.startswith(e.field):
        message = param + message[len(e.field) :]
    elif not message.startswith(param):
        message = f"{param}: {message}"
    return APIError(400, message, param=param, code="invalid_value")
