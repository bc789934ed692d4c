"""vLLM's tokenizer endpoints: `POST /tokenize`, `POST /detokenize`, `GET /tokenizer_info`.

They let a client use the served model's own tokenizer: lm-evaluation-harness's
`local-completions` (0.4.13) probes `/tokenizer_info` and `/tokenize` and, when both answer, uses
them (`tokenizer_backend=remote`, its default `auto`) to count context tokens for loglikelihood
requests; without them it needs a Hugging Face tokenizer on the client. `/tokenize` takes a text
`prompt` or, as vLLM's `TokenizeChatRequest`, chat `messages` (with `add_generation_prompt`,
`continue_final_message`, `chat_template_kwargs`, `tools`, `tool_choice`, `mm_processor_kwargs`):
their ids are those `/v1/chat/completions` feeds the engine (its `usage.prompt_tokens` is their
`count`), rendered by the chat endpoint's own code: a vision model's images expanded to their
runs, the images read where the runs depend on them. `return_token_strs` adds each id's vocabulary string (vLLM's
`convert_ids_to_tokens`). As in vLLM, a prompt longer than `max_model_len` is counted, not
refused.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import FastAPI, Request
from pagoda.runtime.engine.admission import EngineUnavailableError
from pagoda.runtime.engine.info import EngineInfo
from pagoda.runtime.server import tools
from pagoda.runtime.server.chat import ChatEndpoint
from pagoda.runtime.server.http import read_body
from pagoda.runtime.server.protocol import (
    APIError,
    ChatCompletionRequest,
    _Strict,
)
from pagoda.runtime.server.request_body import parse_request
from pagoda.runtime.server.serving import Serving, unavailable
from pydantic import Discriminator, Field, RootModel, Tag


class TokenizeRequest(_Strict):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(_Strict):
    """vLLM's: the fields a chat request renders with; the rest of it is checked as
    `/v1/chat/completions` checks it (`ChatCompletionRequest`)."""

    model: str | None = None
    messages: list[Any]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False  # vLLM's default for messages: the template writes them
    return_token_strs: bool | None = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None  # `none` changes the prompt (no tool prompt where Pagoda writes one)
    # the image processor's settings over --mm-processor-kwargs: each image's run (chat's)
    mm_processor_kwargs: dict[str, Any] | None = None


def _tokenize_form(data: Any) -> str:
    return "Chat" if isinstance(data, dict) and "messages" in data else "Text"


# The body of `/tokenize`: vLLM's two forms, told apart by `messages` as the body is validated
# (its JSON parsed once). The tags are capitalised: an error's `param` leaves them out.
TokenizeBody = RootModel[
    Annotated[
        Annotated[TokenizeRequest, Tag("Text")] | Annotated[TokenizeChatRequest, Tag("Chat")],
        Discriminator(_tokenize_form),
    ]
]


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int] = Field(max_length=1 << 20)


def tokenize(info: EngineInfo, req: TokenizeRequest) -> dict[str, Any]:
    tokens = info.tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens)
    return _tokens(info, tokens, req.return_token_strs)


def tokenize_chat(chat: ChatEndpoint, info: EngineInfo, req: TokenizeChatRequest) -> dict[str, Any]:
    fields = req.model_dump(exclude_unset=True, exclude={"add_special_tokens", "return_token_strs"})
    creq = parse_request(json.dumps(fields).encode(), ChatCompletionRequest)  # same 400s
    template = info.tokenizer.template_for(bool(creq.tools))
    setup = tools.prepare(creq, template, chat.tool_parser, info.tokenizer)
    tokens = chat.prompt(creq, info, setup)[2]
    tok = info.tokenizer
    if req.add_special_tokens and tok.add_bos_token and tok.bos_token_id is not None and \
            tokens[:1] != [tok.bos_token_id]:  # fmt: skip
        tokens = [tok.bos_token_id, *tokens]  # as `encode(..., add_special_tokens=True)` adds
    return _tokens(info, tokens, req.return_token_strs)


def _tokens(info: EngineInfo, tokens: list[int], strs: bool | None) -> dict[str, Any]:
    token_strs = [info.tokenizer.token_to_str(t) for t in tokens] if strs else None
    return {"count": len(tokens), "max_model_len": info.max_model_len, "tokens": tokens,
            "token_strs": token_strs}  # fmt: skip


def detokenize(info: EngineInfo, req: DetokenizeRequest) -> dict[str, Any]:
    bad = next((t for t in req.tokens if not 0 <= t < info.vocab_size), None)
    if bad is not None:
        raise APIError(400, f"token id {bad} is out of vocabulary (0..{info.vocab_size - 1})",
                       param="tokens", code="invalid_value")  # fmt: skip
    return {"prompt": info.tokenizer.decode(req.tokens, skip_special_tokens=False)}


def tokenizer_info(info: EngineInfo) -> dict[str, Any]:
    tok = info.tokenizer
    return {"eos_token": tok.eos_token or None, "bos_token": tok.bos_token or None, "pad_token": None,
            "chat_template": tok.chat_template, "model_max_length": info.max_model_len}  # fmt: skip


def add_tokenizer_routes(
    app: FastAPI,
    serving: Serving,
    chat: ChatEndpoint,
    authorize: Callable[[Request], None],
    resolve_model: Callable[[str | None], str],
    max_request_bytes: int,
) -> None:
    def loaded() -> EngineInfo:
        try:
            return serving.engine.loaded_info()
        except EngineUnavailableError as e:  # 503, as the other routes answer
            raise unavailable(e) from e

    def parse(body: bytes, model: type[_Strict] | None) -> _Strict:
        if model is None:  # /tokenize: either form
            return parse_request(body, TokenizeBody).root
        return parse_request(body, model)

    async def answer(raw: Request, model: type[_Strict] | None, work: Callable) -> dict[str, Any]:
        authorize(raw)
        body = await read_body(raw, max_request_bytes)
        loop = asyncio.get_running_loop()  # a long text: off the event loop
        req = await loop.run_in_executor(serving.prep_pool, parse, body, model)
        resolve_model(req.model)
        info = loaded()
        if isinstance(req, TokenizeChatRequest):
            work = functools.partial(tokenize_chat, chat)
        return await loop.run_in_executor(serving.prep_pool, work, info, req)

    @app.post("/tokenize")
    async def tokenize_route(raw: Request) -> dict[str, Any]:
        return await answer(raw, None, tokenize)

    @app.post("/detokenize")
    async def detokenize_route(raw: Request) -> dict[str, Any]:
        return await answer(raw, DetokenizeRequest, detokenize)

    @app.get("/tokenizer_info")
    async def tokenizer_info_route(raw: Request) -> dict[str, Any]:
        authorize(raw)
        return tokenizer_info(loaded())
