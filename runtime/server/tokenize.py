"""vLLM's tokenizer endpoints: `POST /tokenize`, `POST /detokenize`, `GET /tokenizer_info`.

They let a client use the served model's own tokenizer: lm-evaluation-harness's
`local-completions` (0.4.13) probes `/tokenizer_info` and `/tokenize` and, when both answer, uses
them (`tokenizer_backend=remote`, its default `auto`) to count context tokens for loglikelihood
requests; without them it needs a Hugging Face tokenizer on the client. Text prompts only (vLLM's
`messages` form and `return_token_strs` are refused by the strict request models).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from pagoda.runtime.engine.admission import EngineUnavailableError
from pagoda.runtime.engine.info import EngineInfo
from pagoda.runtime.server.http import read_body
from pagoda.runtime.server.protocol import APIError, _Strict, parse_request
from pagoda.runtime.server.serving import Serving, unavailable
from pydantic import Field


class TokenizeRequest(_Strict):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int] = Field(max_length=1 << 20)


def tokenize(info: EngineInfo, req: TokenizeRequest) -> dict[str, Any]:
    tokens = info.tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens)
    return {"count": len(tokens), "max_model_len": info.max_model_len, "tokens": tokens,
            "token_strs": None}  # fmt: skip


def detokenize(info: EngineInfo, req: DetokenizeRequest) -> dict[str, Any]:
    bad = next((t for t in req.tokens if not 0 <= t < info.vocab_size), None)
    if bad is not None:
        raise APIError(400, f"token id {bad} is out of vocabulary (0..{info.vocab_size - 1})",
                       param="tokens")  # fmt: skip
    return {"prompt": info.tokenizer.decode(req.tokens, skip_special_tokens=False)}


def tokenizer_info(info: EngineInfo) -> dict[str, Any]:
    tok = info.tokenizer
    eos = tok.token_to_str(tok.eos_token_ids[0]) if tok.eos_token_ids else None
    bos = tok.token_to_str(tok.bos_token_id) if tok.bos_token_id is not None else None
    return {"eos_token": eos, "bos_token": bos, "pad_token": None,
            "chat_template": tok.chat_template, "model_max_length": info.max_model_len}  # fmt: skip


def add_tokenizer_routes(
    app: FastAPI,
    serving: Serving,
    authorize: Callable[[Request], None],
    resolve_model: Callable[[str | None], str],
    max_request_bytes: int,
) -> None:
    def loaded() -> EngineInfo:
        try:
            return serving.engine.loaded_info()
        except EngineUnavailableError as e:  # 503, as the other routes answer
            raise unavailable(e) from e

    async def answer(raw: Request, model: type[_Strict], work: Callable) -> dict[str, Any]:
        authorize(raw)
        req = parse_request(await read_body(raw, max_request_bytes), model)
        resolve_model(req.model)
        info = loaded()
        loop = asyncio.get_running_loop()  # a long text: off the event loop
        return await loop.run_in_executor(serving.prep_pool, work, info, req)

    @app.post("/tokenize")
    async def tokenize_route(raw: Request) -> dict[str, Any]:
        return await answer(raw, TokenizeRequest, tokenize)

    @app.post("/detokenize")
    async def detokenize_route(raw: Request) -> dict[str, Any]:
        return await answer(raw, DetokenizeRequest, detokenize)

    @app.get("/tokenizer_info")
    async def tokenizer_info_route(raw: Request) -> dict[str, Any]:
        authorize(raw)
        return tokenizer_info(loaded())
