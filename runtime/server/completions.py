"""`/v1/completions`: prompts (text, token ids, or batches of either) → text choices.

As vLLM's: `max_tokens` defaults to 16 (OpenAI's legacy default; null too); `echo` with
`logprobs` scores the prompt (its prompt logprobs, the first token null) before the completion's
tokens, and with `max_tokens` 0 returns the prompt alone (the engine computes one token, which
is dropped: what lm-evaluation-harness's loglikelihood requests read); `prompt_logprobs: k`
adds vLLM's per-choice `prompt_logprobs` list.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pagoda.runtime.engine.info import EngineInfo
from pagoda.runtime.request import TokenLogprob
from pagoda.runtime.server.endpoint import Endpoint, Job
from pagoda.runtime.server.logprobs import TokenStrings
from pagoda.runtime.server.protocol import APIError, CompletionRequest
from pagoda.runtime.server.structured_outputs import spec_from_request

DEFAULT_MAX_TOKENS = 16  # OpenAI's legacy completions default, and vLLM's


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
            raise APIError(400, "best_of other than n is not supported", param="best_of",
                           code="unsupported_value")  # fmt: skip
        max_tokens = DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
        echo_only = req.echo and max_tokens == 0
        if max_tokens == 0 and not req.echo:
            raise APIError(400, "max_tokens must be at least 1 (0 is allowed with echo: the "
                           "prompt alone, scored with logprobs)", param="max_tokens",
                           code="invalid_value")  # fmt: skip
        if echo_only and req.min_tokens:
            raise APIError(400, f"min_tokens must be <= max_tokens (0), got {req.min_tokens}",
                           param="min_tokens", code="invalid_value")  # fmt: skip
        plp = req.prompt_logprobs  # echo with logprobs scores the prompt with k = logprobs
        if req.echo and req.logprobs is not None and (plp is None or 0 <= plp < req.logprobs):
            plp = req.logprobs
        params = self.sampling_params(
            req, self.renames, info.sampling_defaults, max_tokens=1 if echo_only else max_tokens,
            logprobs=req.logprobs, prompt_logprobs=plp, structured_outputs=spec_from_request(req),
        )  # fmt: skip
        if echo_only:  # the one token is dropped: nothing may stop on it but EOS
            params = dataclasses.replace(params, stop=(), stop_token_ids=())
        texts, prompts = self._prompts(req.prompt, info)
        job = self.job(req, model, prompts, texts, params, strings, echo=req.echo)
        job.echo_logprobs = req.echo and req.logprobs is not None
        job.echo_only = echo_only
        return job

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

    def _echoed(self, job: Job, i: int) -> tuple | None:
        """The prompt's part of an echoed choice's logprobs (`TokenStrings.completion`)."""
        if not job.echo_logprobs:
            return None
        j = i // job.params.n
        return job.prompts[j], job.prompt_logprobs.get(j), job.params.logprobs

    def choice(self, job: Job, i: int, text: str, lps: list[TokenLogprob]) -> dict[str, Any]:
        if job.echo_only:
            text, lps = "", []
        prefix = self._echo(job, i) if job.echo else ""
        want = job.params.logprobs is not None
        logprobs = job.strings.completion(lps, 0, self._echoed(job, i)) if want else None
        out = {"index": i, "text": prefix + text, "logprobs": logprobs}
        if job.prompt_logprobs_k is not None:  # vLLM's field, per choice
            j = i // job.params.n
            out["prompt_logprobs"] = job.strings.prompt(
                job.prompts[j], job.prompt_logprobs.get(j), job.prompt_logprobs_k
            )
        return out

    def delta(self, job: Job, i: int, text: str, lps: list[TokenLogprob], offset: int,
              first: bool, final: bool) -> dict[str, Any]:  # fmt: skip
        if job.echo_only:
            text, lps = "", []
        echoed = None
        if job.echo and first:
            text = self._echo(job, i) + text
            echoed = self._echoed(job, i)
        want = job.params.logprobs is not None
        return {"index": i, "text": text,
                "logprobs": job.strings.completion(lps, offset, echoed) if want else None}  # fmt: skip

    def echoed_text_length(self, job: Job, i: int) -> int:
        """How far an echoed prompt's tokens move `text_offset` (echo with logprobs)."""
        return job.strings.text_length(job.prompts[i // job.params.n]) if job.echo_logprobs else 0

    def finish_reason(self, job: Job, i: int, reason: str | None) -> str | None:
        """With max_tokens 0 the length limit ends the choice, whatever the dropped token was."""
        return "length" if job.echo_only and reason is not None else reason
