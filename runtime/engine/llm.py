"""Offline API: `LLM(model=...).generate(prompts, params)` and `.chat(conversations, params)`."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from pagoda.runtime.config import DEFAULT_MODEL, EngineConfig
from pagoda.runtime.engine.core import EngineCore
from pagoda.runtime.engine.outputs import CompletionOutput, RequestOutput
from pagoda.runtime.model.loader import LoadedModel
from pagoda.runtime.sampling.params import SamplingParams

PromptType = str | Sequence[int] | dict[str, Any]


class LLM:
    """Batch generation in-process. Engine keyword arguments are those of `EngineConfig.create`
    (e.g. ``max_num_seqs``, ``max_num_batched_tokens``, ``block_size``, ``enable_prefix_caching``,
    ``enable_chunked_prefill``, ``dtype``, ``kv_cache_memory``, ``max_model_len``)."""

    def __init__(
        self, model: str = DEFAULT_MODEL, *, loaded: LoadedModel | None = None, **engine_args: Any
    ) -> None:
        """`loaded` reuses weights already in memory (tests, benchmarks) instead of reading `model`."""
        self.engine = EngineCore(EngineConfig.create(model, **engine_args), loaded)
        self.config = self.engine.config  # with the context length resolved
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def get_default_sampling_params(self) -> SamplingParams:
        """What `generate` uses without params: the model's generation_config.json sampling
        fields over `SamplingParams`' defaults (as vLLM's LLM)."""
        return SamplingParams(**self.engine.sampling_defaults)

    def _to_ids(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return None, list(prompt["prompt_token_ids"])
            return self._to_ids(prompt["prompt"])
        return None, list(prompt)

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Run all prompts together (continuous batching); results come back in input order.

        Invalid input raises ValueError before anything runs, naming the offending field.
        """
        if isinstance(prompts, (str, dict)) or (
            isinstance(prompts, Sequence) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)  # type: ignore[arg-type]
        params = params or self.get_default_sampling_params()
        plist = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError("params must be one SamplingParams or one per prompt")
        encoded = [self._to_ids(p) for p in prompts]
        for (_, ids), p in zip(encoded, plist):
            self.engine.validate(ids, p)
        results: dict[str, RequestOutput] = {}
        order = []
        for (text, ids), p in zip(encoded, plist):
            rid = f"offline-{next(self._ids)}"
            self.engine.add_request(rid, ids, p)
            results[rid] = RequestOutput(rid, text, ids, [CompletionOutput(i) for i in range(p.n)])
            order.append(rid)
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(order), desc="Generating", unit="req")
        while self.engine.has_unfinished_requests():
            for delta in self.engine.step():
                res = results[delta.request_id]
                was_done = res.finished
                res.add(delta)
                if bar is not None and res.finished and not was_done:
                    bar.update(1)
        if bar is not None:
            bar.close()
        return [results[r] for r in order]

    def chat(
        self,
        conversations: Sequence[dict[str, Any]] | Sequence[Sequence[dict[str, Any]]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Apply the model's chat template to each conversation, then generate."""
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]  # type: ignore[list-item]
        prompts = [self.tokenizer.apply_chat_template(c) for c in conversations]  # type: ignore[arg-type]
        return self.generate(prompts, params, use_tqdm=use_tqdm)
