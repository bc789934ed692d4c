"""`POST /v1/embeddings` (OpenAI's, with vLLM's `truncate_prompt_tokens`) on a pooling server.

`input`: a string, a list of strings, a list of token ids or a list of such lists; each is one
engine request of the pooling runner (`engine/pooling.py`), added all-or-nothing, the vectors
answered in input order. `encoding_format` float (a list of numbers) or base64 (the float32
little-endian bytes, as OpenAI's). `dimensions`: Matryoshka models only (config.json
`is_matryoshka` / `matryoshka_dimensions`), else a 400. A generating server answers this path
with the 400 `unsupported_api` of the other unserved APIs (`api.py`); a pooling server answers
/v1/completions and /v1/chat/completions with a 400 naming its runner (as vLLM).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
from collections.abc import Callable
from typing import Any, Literal

from pagoda.runtime.engine.admission import EngineUnavailableError
from pagoda.runtime.engine.info import EngineInfo
from pagoda.runtime.engine.outputs import StepOutput
from pagoda.runtime.engine.pooling import POOL_PARAMS, truncated, vector
from pagoda.runtime.engine.request_stream import RequestStream
from pagoda.runtime.sampling.params import ParamError
from pagoda.runtime.server.protocol import APIError, _Strict
from pagoda.runtime.server.request_body import parse_request
from pagoda.runtime.server.serving import Serving, to_json, unavailable
from pydantic import Field, StrictInt, StrictStr


class EmbeddingRequest(_Strict):
    model: str | None = None
    input: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = Field(default=None, ge=1)
    user: str | None = None
    truncate_prompt_tokens: StrictInt | None = Field(default=None, ge=-1)


def refuse_generation(api: str) -> APIError:
    """A pooling server's answer to the generation APIs."""
    return APIError(400, f"The model does not support the {api} API: this server runs the "
                    "pooling runner (an embedding model: /v1/embeddings)",
                    code="unsupported_api")  # fmt: skip


def refuse_pooling(api: str) -> APIError:
    """A generating server's answer to the pooling APIs (and to the other unserved ones)."""
    return APIError(400, f"The model does not support the {api} API: this server runs "
                    "generative models (/v1/completions, /v1/chat/completions)",
                    code="unsupported_api")  # fmt: skip


def tokenized(info: EngineInfo, items: list, param: str, truncate: int | None) -> list[list[int]]:
    """Each input's token ids (strings tokenized), cut to `truncate` (`truncate_prompt_tokens`);
    a 400 naming `param` (`param[i]` in a list of several) for an empty input or one longer
    than the model takes."""
    if not items:
        raise APIError(400, f"'{param}' must not be empty", param=param, code="empty_array")
    out = []
    for i, item in enumerate(items):
        ids = info.tokenizer.encode_whole(item) if isinstance(item, str) else list(item)
        try:
            ids = truncated(ids, truncate, info.max_model_len)
        except ValueError as e:
            raise APIError(400, str(e), param="truncate_prompt_tokens", code="invalid_value") from e
        where = param if len(items) == 1 else f"{param}[{i}]"
        if not ids:
            raise APIError(400, f"'{where}' must not be empty", param=where, code="empty_array")
        if len(ids) > info.max_model_len:  # (a pooled prompt may fill the context)
            raise APIError(400, f"'{where}' is {len(ids)} tokens; this model's maximum context "
                           f"length is {info.max_model_len} tokens (truncate_prompt_tokens "
                           "cuts an input)", param=where, code="context_length_exceeded")  # fmt: skip
        out.append(ids)
    return out


def input_prompts(req: EmbeddingRequest, info: EngineInfo) -> list[list[int]]:
    """Each input's token ids (`tokenized`)."""
    inp = req.input
    if isinstance(inp, str) or (inp and isinstance(inp[0], int)):
        inp = [inp]
    return tokenized(info, inp, "input", req.truncate_prompt_tokens)


class EmbeddingsRoute:
    """The endpoint's steps (`api.add_pooling_routes` awaits them, watching the client):
    `prepare` (the request parsed and its prompts checked), `submit`, `collect`, `body`.
    `server/score.py`'s routes are the same steps over their own requests."""

    api = "Embeddings"  # the API's name in the refusals
    input_param = "input"  # the field a refusal of the inputs as a whole names
    id_prefix = "embd"  # the engine requests' ids

    def __init__(self, serving: Serving, resolve_model: Callable[[str | None], str]) -> None:
        self.serving = serving
        self.resolve_model = resolve_model
        self._ids = itertools.count()

    async def prepare(self, body: bytes) -> tuple[EngineInfo, Any, list[list[int]]]:
        """Parse, tokenize and check off the event loop; APIError for anything refused."""
        engine = self.serving.engine
        try:
            info = engine.loaded_info()
        except EngineUnavailableError as e:
            raise unavailable(e) from e
        if info.runner != "pooling":
            raise refuse_pooling(self.api)

        def work() -> tuple[Any, list[list[int]]]:
            req, prompts = self.parse(body, info)
            try:  # ids in the vocabulary, the number of inputs
                engine.check_prompts(info, prompts, POOL_PARAMS)
            except ParamError as e:
                raise APIError(400, str(e), param=self.input_param, code="invalid_value") from e
            return req, prompts

        loop = asyncio.get_running_loop()
        req, prompts = await loop.run_in_executor(self.serving.prep_pool, work)
        return info, req, prompts

    def parse(self, body: bytes, info: EngineInfo) -> tuple[EmbeddingRequest, list[list[int]]]:
        """The request and its inputs' token ids (on the preparing thread)."""
        req = parse_request(body, EmbeddingRequest)
        self.resolve_model(req.model)
        if info.pooler.cross_encoder:
            raise APIError(400, "The model does not support the Embeddings API: it is a "
                           "sequence classifier (/classify; one label: /v1/score, /v1/rerank)",
                           code="unsupported_api")  # fmt: skip
        if req.dimensions is not None:
            problem = info.pooler.check_dimensions(req.dimensions, info.hidden_size)
            if problem is not None:
                raise APIError(400, problem, param="dimensions", code="invalid_value")
        return req, input_prompts(req, info)

    def submit(self, prompts: list[list[int]]) -> list[RequestStream]:
        """Add the inputs' engine requests (all or none)."""
        try:
            streams = self.serving.engine.add_requests(
                prompts, POOL_PARAMS, f"{self.id_prefix}-{next(self._ids)}", checked=True
            )
        except ParamError as e:
            raise APIError(400, str(e), param=self.input_param, code="invalid_value") from e
        except EngineUnavailableError as e:
            raise unavailable(e) from e
        for s in streams:
            s.wake_at_end = True
        return streams

    async def collect(self, streams: list[RequestStream]) -> list[StepOutput]:
        """Each input's final output (its vector), in input order."""
        outs = []
        for s in streams:
            last = None
            try:
                async for out in s:
                    last = out
            except EngineUnavailableError as e:
                raise unavailable(e) from e
            except ValueError as e:  # the core refused the input when adding it
                raise APIError(400, str(e), param=self.input_param, code="invalid_value") from e
            if last is None or last.embedding is None:
                reason = None if last is None else last.finish_reason
                raise APIError(503, f"the request ended without its vector ({reason})",
                               code="unavailable")  # fmt: skip
            outs.append(last)
        return outs

    def body(self, req: EmbeddingRequest, info: EngineInfo, outs: list[StepOutput]) -> bytes:
        data = []
        for i, out in enumerate(outs):
            v = vector(out.embedding, req.dimensions, bool(info.pooler.normalize))
            if req.encoding_format == "base64":
                emb = base64.b64encode(v.astype("<f4").tobytes()).decode()
            else:
                emb = v.tolist()
            data.append({"object": "embedding", "index": i, "embedding": emb})
        name = self.resolve_model(req.model)
        return to_json({"object": "list", "data": data, "model": name, "usage": usage(outs)})


def usage(outs: list[StepOutput]) -> dict[str, int]:
    """The prompt tokens the inputs' engine requests pooled (no completion tokens)."""
    n = sum(o.num_prompt_tokens for o in outs)
    return {"prompt_tokens": n, "total_tokens": n}
