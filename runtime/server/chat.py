"""`/v1/chat/completions`: messages → the model's chat template → assistant messages."""

from __future__ import annotations

from typing import Any

from pagoda.runtime.engine.info import EngineInfo
from pagoda.runtime.request import TokenLogprob
from pagoda.runtime.server.endpoint import Endpoint, Job
from pagoda.runtime.server.logprobs import TokenStrings
from pagoda.runtime.server.protocol import APIError, ChatCompletionRequest


class ChatEndpoint(Endpoint):
    request_model = ChatCompletionRequest
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"
    id_prefix = "chatcmpl"
    renames = {"prompt": "messages", "logprobs": "top_logprobs"}

    def prepare(self, req: ChatCompletionRequest, info: EngineInfo, strings: TokenStrings) -> Job:
        model = self.resolve_model(req.model)
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "top_logprobs requires logprobs=true", param="top_logprobs")
        max_tokens, renames = req.max_tokens, self.renames
        if req.max_completion_tokens is not None:  # OpenAI's newer name; errors must use it
            max_tokens = req.max_completion_tokens
            renames = {**renames, "max_tokens": "max_completion_tokens"}
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        params = self.sampling_params(
            req, renames, info.sampling_defaults, max_tokens=max_tokens, logprobs=logprobs
        )
        messages = [m.as_template_dict() for m in req.messages]
        self.check_length("".join(str(m.get("content", "")) for m in messages), info)
        try:
            text = info.tokenizer.apply_chat_template(messages)
        except ValueError as e:
            raise APIError(400, str(e), param="messages", code="invalid_messages") from e
        except Exception as e:  # a template may raise anything on odd input
            raise APIError(400, f"chat template failed: {e}", param="messages") from e
        self.check_length(text, info)
        prompts = [info.tokenizer.encode(text, add_special_tokens=False)]
        return self.job(req, model, prompts, [text], params, strings, renames)

    def opening(self, job: Job) -> list[dict[str, Any]]:
        delta = {"role": "assistant", "content": ""}
        return [{"index": i, "delta": delta, "logprobs": None} for i in range(job.num_choices)]

    def _logprobs(self, job: Job, lps: list[TokenLogprob]) -> dict[str, Any] | None:
        return {"content": job.strings.chat(lps)} if job.params.logprobs is not None else None

    def choice(self, job: Job, i: int, text: str, lps: list[TokenLogprob]) -> dict[str, Any]:
        message = {"role": "assistant", "content": text}
        return {"index": i, "message": message, "logprobs": self._logprobs(job, lps)}

    def delta(self, job: Job, i: int, text: str, lps: list[TokenLogprob], offset: int,
              first: bool) -> dict[str, Any]:  # fmt: skip
        delta = {"content": text} if text else {}
        return {"index": i, "delta": delta, "logprobs": self._logprobs(job, lps)}
