"""`/v1/completions`: prompts (text, token ids, or batches of either) → text choices."""

from __future__ import annotations

from typing import Any

from pagoda.runtime.engine.info import EngineInfo
from pagoda.runtime.request import TokenLogprob
from pagoda.runtime.server.endpoint import Endpoint, Job
from pagoda.runtime.server.logprobs import TokenStrings
from pagoda.runtime.server.protocol import APIError, CompletionRequest
from pagoda.runtime.server.structured_outputs import spec_from_request


class CompletionEndpoint(Endpoint):
    request_model = CompletionRequest
    object_name = chunk_object_name = "text_completion"
    id_prefix = "cmpl"

    def __init__(self, served_model_names: tuple[str, ...], max_batch: int) -> None:
        super().__init__(served_model_names)
        self.max_batch = max_batch

    def prepare(self, req: CompletionRequest, info: EngineInfo, strings: TokenStrings) -> Job:
        model = self.resolve_model(req.model)
        if req.best_of is not None and req.best_of != req.n:
            raise APIError(400, "best_of other than n is not supported", param="best_of")
        if req.echo and req.logprobs is not None:
            raise APIError(400, "echo with logprobs is not supported", param="echo")
        params = self.sampling_params(
            req, self.renames, info.sampling_defaults, max_tokens=req.max_tokens, logprobs=req.logprobs,
            structured_outputs=spec_from_request(req),
        )  # fmt: skip
        texts, prompts = self._prompts(req.prompt, info)
        return self.job(req, model, prompts, texts, params, strings, echo=req.echo)

    def _prompts(
        self, p: str | list[int] | list[str] | list[list[int]], info: EngineInfo
    ) -> tuple[list[str | None], list[list[int]]]:
        """(texts, token ids) per prompt; a batch larger than the queue bound is refused first."""
        if isinstance(p, str):
            p = [p]
        elif not p or not isinstance(p[0], (str, list)):
            return [None], [list(p)]  # one prompt of token ids (the engine refuses it if empty)
        if len(p) > self.max_batch:
            raise APIError(
                400,
                f"prompt: a batch of {len(p)} prompts is more than this server queues at once "
                f"({self.max_batch})",
                param="prompt",
                code="invalid_value",
            )
        if isinstance(p[0], list):
            return [None] * len(p), [list(x) for x in p]  # type: ignore[arg-type]
        for text in p:
            self.check_length(text, info)  # type: ignore[arg-type]
        return list(p), [info.tokenizer.encode(text) for text in p]  # type: ignore[misc]

    def _echo(self, job: Job, i: int) -> str:
        """The prompt as given: its text, or its token ids decoded whole (special tokens too,
        as a text prompt's special-token text is echoed)."""
        j = i // job.params.n
        text = job.prompt_texts[j]
        if text is not None:
            return text
        return job.strings.tokenizer.decode(job.prompts[j], skip_special_tokens=False)

    def choice(self, job: Job, i: int, text: str, lps: list[TokenLogprob]) -> dict[str, Any]:
        prefix = self._echo(job, i) if job.echo else ""
        logprobs = job.strings.completion(lps, 0) if job.params.logprobs is not None else None
        return {"index": i, "text": prefix + text, "logprobs": logprobs}

    def delta(self, job: Job, i: int, text: str, lps: list[TokenLogprob], offset: int,
              first: bool, final: bool) -> dict[str, Any]:  # fmt: skip
        if job.echo and first:
            text = self._echo(job, i) + text
        want = job.params.logprobs is not None
        return {"index": i, "text": text,
                "logprobs": job.strings.completion(lps, offset) if want else None}  # fmt: skip
