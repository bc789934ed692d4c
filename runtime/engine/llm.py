"""Offline API: `LLM(model=...).generate(prompts, params)` and `.chat(conversations, params)`."""

from __future__ import annotations

import itertools
import json
import operator
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Required, TypedDict

from pagoda.runtime.config import DEFAULT_MODEL, EngineConfig
from pagoda.runtime.engine import scoring
from pagoda.runtime.engine.core import EngineCore
from pagoda.runtime.engine.outputs import CompletionOutput, RequestOutput, prompt_logprob_dicts
from pagoda.runtime.engine.pooling import EmbeddingRequestOutput, PoolingParams, embed
from pagoda.runtime.engine.scoring import ClassificationRequestOutput, ScoringRequestOutput
from pagoda.runtime.lora_config import LoRARequest
from pagoda.runtime.model.hf_overrides import overlay
from pagoda.runtime.model.loader import LoadedModel, resolve_model_path
from pagoda.runtime.model.tokenizer import TEMPLATE_NAMES
from pagoda.runtime.multimodal import chat_images, chat_videos, processor_kwargs
from pagoda.runtime.multimodal import inputs as mm_inputs
from pagoda.runtime.sampling.params import SamplingParams

if TYPE_CHECKING:
    from pagoda.runtime.engine.hf_tokenizer import HFTokenizer


class TextPrompt(TypedDict):
    """vLLM's `TextPrompt`: ``TextPrompt(prompt="...")`` is the dict ``{"prompt": "..."}``."""

    prompt: str


class TokensPrompt(TypedDict, total=False):
    """vLLM's `TokensPrompt`: ``{"prompt_token_ids": [...]}``, `prompt` optional."""

    prompt_token_ids: Required[Sequence[int]]
    prompt: str


PromptType = str | Sequence[int] | dict[str, Any]
# vLLM's TextPrompt / TokensPrompt keys this runtime serves besides `MM_KEYS` (which
# `generate` reads for a vision model: the images and their processor's settings,
# `multimodal/processor_kwargs.py`); any other is refused rather than ignored
PROMPT_KEYS = frozenset({"prompt", "prompt_token_ids"})
MM_KEYS = frozenset({"multi_modal_data", "mm_processor_kwargs"})


class LLM:
    """Batch generation in-process. Engine keyword arguments are those of `EngineConfig.create`
    (e.g. ``max_num_seqs``, ``max_num_batched_tokens``, ``block_size``, ``enable_prefix_caching``,
    ``enable_chunked_prefill``, ``dtype``, ``kv_cache_memory``, ``max_model_len``,
    ``tensor_parallel_size``: ranks started as processes, so a script that uses it needs the
    ``if __name__ == "__main__":`` guard, as with any spawned process)."""

    def __init__(
        self, model: str = DEFAULT_MODEL, *, loaded: LoadedModel | None = None, **engine_args: Any
    ) -> None:
        """`loaded` reuses weights already in memory (tests, benchmarks) instead of reading `model`.
        vLLM's `enforce_eager=True` is ``enable_cuda_graphs=False``; its `trust_remote_code` is
        accepted and changes nothing (no checkpoint's own code is ever run here)."""
        engine_args.pop("trust_remote_code", None)
        if "enforce_eager" in engine_args:
            if "enable_cuda_graphs" in engine_args:
                raise ValueError("give enforce_eager or enable_cuda_graphs, not both")
            engine_args["enable_cuda_graphs"] = not engine_args.pop("enforce_eager")
        if "hf_overrides" in engine_args:  # config.json's keys replaced (an overlay directory)
            model = str(overlay(resolve_model_path(model), engine_args.pop("hf_overrides")))
        self.engine = EngineCore(EngineConfig.create(model, **engine_args), loaded)
        self.config = self.engine.config  # with the context length resolved
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()
        self._closed = False

    def close(self) -> None:
        """Stop the engine's other tensor-parallel ranks, if any (`with LLM(...) as llm:`);
        idempotent. `generate` and `chat` raise RuntimeError afterwards."""
        self._closed = True
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get_tokenizer(self) -> HFTokenizer:
        """The tokenizer with the Hugging Face calls vLLM's `get_tokenizer()` users make
        (`encode`, `decode`, `apply_chat_template(..., tokenize=False)`, ...)."""
        from pagoda.runtime.engine.hf_tokenizer import HFTokenizer

        return HFTokenizer(self.tokenizer)

    def get_default_sampling_params(self) -> SamplingParams:
        """What `generate` uses without params: the model's generation_config.json sampling
        fields over `SamplingParams`' defaults (as vLLM's LLM)."""
        return SamplingParams(**self.engine.sampling_defaults)

    def _to_ids(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, dict):
            unknown = sorted(map(str, set(prompt) - PROMPT_KEYS))
            if unknown:
                raise ValueError(f"prompt key(s) {', '.join(unknown)} not supported; a prompt "
                                 "dict has 'prompt' (text) or 'prompt_token_ids'")  # fmt: skip
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), _token_ids(prompt["prompt_token_ids"])
            if not isinstance(prompt.get("prompt"), str):
                raise ValueError("a prompt dict needs 'prompt' (text) or 'prompt_token_ids'")
            return self._to_ids(prompt["prompt"])
        return None, _token_ids(prompt)

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool | Callable[..., Any] = True,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Run all prompts together (continuous batching); results come back in input order.

        `lora_request` (as vLLM's, with ``LLM(..., enable_lora=True)``): the adapter every
        prompt runs with, or one (or None: the base model) per prompt.

        `use_tqdm` (as vLLM's): True (the default) for a progress bar on stderr, shown only
        where stderr is a terminal (no carriage-return lines in logs); False for none; or a
        callable that makes the bar (``tqdm``'s arguments: ``total``, ``desc``, ``unit``).
        Invalid input raises ValueError before anything runs, naming the offending field.
        """
        if self._closed:
            raise RuntimeError("this LLM is closed; create a new one")
        if self.config.runner == "pooling":
            raise ValueError("this model runs the pooling runner (an embedding model): use "
                             "embed() or score(), or LLM(..., runner='generate')")  # fmt: skip
        prompts = _prompt_list(prompts)
        params = sampling_params or self.get_default_sampling_params()
        plist = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"sampling_params must be one SamplingParams or one per prompt: "
                             f"{len(plist)} for {len(prompts)} prompts")  # fmt: skip
        encoded = [self._to_ids(_text_side(p)) for p in prompts]
        for k, prompt in enumerate(prompts):  # images: placeholders expanded, pixels made
            if isinstance(prompt, dict) and MM_KEYS & set(prompt):
                text, ids = encoded[k]
                vision = processor_kwargs.apply(  # (a prompt's own processor settings)
                    self.engine.model_config.vision,
                    prompt.get("mm_processor_kwargs"),
                    "mm_processor_kwargs",
                )
                if "multi_modal_data" not in prompt:
                    continue
                ids, mm = mm_inputs.from_data(ids, prompt["multi_modal_data"], vision)
                encoded[k], plist[k] = (text, ids), plist[k].clone(multi_modal=mm)
        # all checked before any runs; the copies as validated now run (params are mutable)
        plist = [self.engine.validate(ids, p) for (_, ids), p in zip(encoded, plist)]
        for p, lr in zip(plist, _per_prompt(lora_request, len(prompts))):
            if lr is not None:
                if not isinstance(lr, LoRARequest):
                    raise ValueError(f"lora_request must be a LoRARequest, got {lr!r}")
                self.engine.add_lora(lr)  # read and checked before anything runs
                p.lora_request = lr
        bar = _progress(use_tqdm, len(prompts))
        results: dict[str, RequestOutput] = {}
        try:
            for (text, ids), p in zip(encoded, plist):
                rid = f"offline-{next(self._ids)}"
                results[rid] = RequestOutput(
                    rid, text, ids, [CompletionOutput(i) for i in range(p.n)]
                )
                self.engine.add_request(rid, ids, p, checked=True)  # `validate`d above
            while self.engine.has_unfinished_requests():
                for delta in self.engine.step():
                    res = results[delta.request_id]
                    was_done = res.finished
                    res.add(delta)
                    if delta.prompt_logprobs is not None and res.prompt_logprobs is None:
                        res.prompt_logprobs = prompt_logprob_dicts(
                            delta.prompt_logprobs, self._token_text
                        )
                    if bar is not None and res.finished and not was_done:
                        bar.update(1)
        finally:  # interrupted (Ctrl-C, a failing progress bar): leave no request behind
            for rid, res in results.items():
                if not res.finished:
                    self.engine.abort_request(rid)
            if bar is not None:
                bar.close()
        for res in results.values():
            res.shape_logprobs(self._token_text)
        return list(results.values())

    def embed(
        self,
        prompts: PromptType | Sequence[PromptType],
        pooling_params: PoolingParams | None = None,
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool | Callable[..., Any] = True,
    ) -> list[EmbeddingRequestOutput]:
        """vLLM's `LLM.embed` (an engine built with ``runner="pooling"``, or one the checkpoint
        makes an embedding model): one vector per prompt, in input order
        (`engine/pooling.py`). ValueError before anything runs for bad input."""
        if self._closed:
            raise RuntimeError("this LLM is closed; create a new one")
        pc = self.engine.config.pooler_config
        if pc is not None and pc.cross_encoder:
            raise ValueError("this model is a sequence classifier (no vector): use classify, or "
                             "score for a cross-encoder of one label")  # fmt: skip
        params = _pooling_params(pooling_params, truncate_prompt_tokens)
        prompts = _prompt_list(prompts)
        bar = _progress(use_tqdm, len(prompts))
        try:
            return embed(self, prompts, params, bar)
        finally:
            if bar is not None:
                bar.close()

    def score(
        self,
        data_1: PromptType | Sequence[PromptType],
        data_2: PromptType | Sequence[PromptType],
        /,
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool | Callable[..., Any] = True,
        pooling_params: PoolingParams | None = None,
    ) -> list[ScoringRequestOutput]:
        """vLLM's `LLM.score` with an embedding model (a bi-encoder): each pair's score is the
        cosine similarity of its two prompts' vectors (`engine/scoring.py`); `data_1` one
        prompt (1:N) or as many as `data_2` (N:N), each side a prompt or a list of prompts as
        `embed` takes them. ValueError before anything runs for bad input."""
        if self._closed:
            raise RuntimeError("this LLM is closed; create a new one")
        params = _pooling_params(pooling_params, truncate_prompt_tokens)
        data_1, data_2 = _prompt_list(data_1), _prompt_list(data_2)
        bar = _progress(use_tqdm, len(data_1) + len(data_2))  # (each input embedded once)
        try:
            return scoring.score(self, data_1, data_2, params, bar)
        finally:
            if bar is not None:
                bar.close()

    def classify(
        self,
        prompts: PromptType | Sequence[PromptType],
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool | Callable[..., Any] = True,
        pooling_params: PoolingParams | None = None,
    ) -> list[ClassificationRequestOutput]:
        """vLLM's `LLM.classify` with a sequence classifier (`*ForSequenceClassification`):
        each prompt's labels' probabilities, `.outputs.probs` (`engine/scoring.py`)."""
        if self._closed:
            raise RuntimeError("this LLM is closed; create a new one")
        params = _pooling_params(pooling_params, truncate_prompt_tokens)
        prompts = _prompt_list(prompts)
        bar = _progress(use_tqdm, len(prompts))
        try:
            return scoring.classify(self, prompts, params, bar)
        finally:
            if bar is not None:
                bar.close()

    def _token_text(self, token_id: int) -> str:
        """A token's own text (special tokens too), as vLLM's `Logprob.decoded_token`."""
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def chat(
        self,
        messages: Sequence[dict[str, Any]] | Sequence[Sequence[dict[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool | Callable[..., Any] = True,
        add_generation_prompt: bool | None = None,
        continue_final_message: bool = False,
        tools: Sequence[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Render each conversation with the model's chat template, then generate (vLLM's
        `LLM.chat`): the prompt is what /v1/chat/completions renders for the same messages.

        Text content parts are joined one per line; a vision model's templates get content as
        parts instead, `image_url` parts (data: or http(s) URLs, read here) as
        `{"type": "image"}`, as the server renders them; a `developer` message is a system
        message for a template without that role. `add_generation_prompt` defaults to true, false with
        `continue_final_message`; `tools` (OpenAI tool objects) go to the template, which must
        render them (the reply's tool calls are not parsed: `text` is the model's raw output);
        `chat_template_kwargs` must name variables the template reads.
        """
        if messages and isinstance(messages[0], dict):
            messages = [messages]  # type: ignore[list-item]
        if tools and "tools" not in self.tokenizer.variables_for(True):
            raise ValueError("tools: this model's chat template does not render tools, so the "
                             "model would never see them")  # fmt: skip
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt cannot both be "
                             "true: the reply continues the last message")  # fmt: skip
        vision = self.engine.model_config.vision is not None
        prompts = []
        for conv in messages:
            text = self.tokenizer.apply_chat_template(
                template_messages(conv, self.tokenizer.template_for(bool(tools)), parts=vision),
                add_generation_prompt=add_generation_prompt is not False,
                continue_final_message=continue_final_message,
                tools=tools,
                variables=self._template_kwargs(chat_template_kwargs, bool(tools)),
            )
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            prompt: dict[str, Any] = {"prompt": text, "prompt_token_ids": ids}
            urls = [p["image_url"]["url"] for m in conv for p in _image_parts(m)]
            videos = [p["video_url"]["url"] for m in conv for p in _image_parts(m, "video")]
            data: dict[str, list] = {}
            if urls:  # a vision model's: read now (data: or http(s) URLs), placed by generate
                data["image"] = [chat_images.load(u) for u in urls]
            if videos:  # decoded and sampled as the server's (--media-io-kwargs)
                io_ = self.engine.config.media_io_kwargs
                data["video"] = [chat_videos.load(u, io_) for u in videos]
            if data:
                prompt["multi_modal_data"] = data
            prompts.append(prompt)
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def _template_kwargs(
        self, kwargs: dict[str, Any] | None, tools: bool = False
    ) -> dict[str, Any] | None:
        """`chat_template_kwargs`, each a variable the chat template reads (as the server's)."""
        for key in kwargs or {}:
            if key in TEMPLATE_NAMES:
                raise ValueError(f"chat_template_kwargs: '{key}' is set by chat() itself (use its "
                                 "arguments: messages, tools, add_generation_prompt)")  # fmt: skip
            if key not in self.tokenizer.variables_for(tools):
                raise ValueError(f"chat_template_kwargs: this model's chat template does not read "
                                 f"'{key}', so it would change nothing")  # fmt: skip
        return kwargs


def _text_side(prompt: PromptType) -> PromptType:
    """A prompt without its `multi_modal_data` and `mm_processor_kwargs` (read by `generate`
    itself)."""
    if isinstance(prompt, dict) and MM_KEYS & set(prompt):
        return {k: v for k, v in prompt.items() if k not in MM_KEYS}
    return prompt


def _per_prompt(lora_request: Any, n: int) -> list[Any]:
    """`generate`'s `lora_request`: one for every prompt, or a list of one per prompt."""
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return [lora_request] * n
    out = list(lora_request)
    if len(out) != n:
        raise ValueError(f"lora_request must be one LoRARequest or one per prompt: {len(out)} "
                         f"for {n} prompts")  # fmt: skip
    return out


def _token_ids(ids: Any) -> list[int]:
    """Token ids as Python ints (numpy's integers too); ValueError for anything else."""
    try:
        return [operator.index(t) for t in ids]
    except TypeError as e:
        raise ValueError(f"prompt_token_ids must be a list of integers ({e})") from None


def _prompt_list(prompts: Any) -> list:
    """One prompt (a string, a prompt dict, a list of token ids) as a list of one; a list as
    it is."""
    if isinstance(prompts, (str, dict)) or (
        isinstance(prompts, Sequence) and prompts and isinstance(prompts[0], int)
    ):
        return [prompts]
    return list(prompts)


def _pooling_params(params: PoolingParams | None, truncate: int | None) -> PoolingParams | None:
    """`params` with the call's `truncate_prompt_tokens`, when it gives one."""
    if truncate is None:
        return params
    return PoolingParams(None if params is None else params.dimensions, truncate)


def _progress(use_tqdm: bool | Callable[..., Any], total: int) -> Any:
    """The progress bar `use_tqdm` asks for (None for none)."""
    if not use_tqdm:
        return None
    if callable(use_tqdm):
        return use_tqdm(total=total, desc="Processed prompts", unit="req")
    from tqdm import tqdm

    # disable=None: tqdm's "off unless the stream is a terminal"
    return tqdm(total=total, desc="Processed prompts", unit="req", file=sys.stderr, disable=None)


def template_messages(
    conversation: Sequence[dict[str, Any]], template: str | None, parts: bool = False
) -> list:
    """The messages as the chat template reads them (as the server's `as_template_dict`): text
    parts joined one per line, or with `parts` (a vision model's) content as text and image
    parts (`{"type": "image"}`); `developer` as `system` where the template lacks the role."""
    out = []
    for i, m in enumerate(conversation):
        if not isinstance(m, dict) or "role" not in m:
            raise ValueError(f"messages[{i}] must be a dict with a 'role'")
        m = dict(m)
        content = m.get("content")
        if parts:
            m["content"] = _as_parts(content, i)
        elif isinstance(content, list):
            if any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
                raise ValueError(f"messages[{i}].content: only text parts are supported (image "
                                 "parts: a model that reads images)")  # fmt: skip
            m["content"] = "\n".join(str(p.get("text", "")) for p in content)
        elif content is None:
            m["content"] = ""
        if isinstance(m.get("tool_calls"), list):  # arguments as objects: templates use tojson
            m["tool_calls"] = [_arguments_as_object(c) for c in m["tool_calls"]]
        if m["role"] == "developer" and template is not None and "developer" not in template:
            m["role"] = "system"
        out.append(m)
    return out


def _image_parts(message: Any, kind: str = "image") -> list[dict[str, Any]]:
    """A message's `image_url` (`kind` "video": `video_url`) parts (each with its URL;
    ValueError for one without)."""
    key = f"{kind}_url"
    content = message.get("content") if isinstance(message, dict) else None
    found = [p for p in content if isinstance(p, dict) and p.get("type") == key] if \
        isinstance(content, list) else []  # fmt: skip
    for p in found:
        if not isinstance(p.get(key), dict) or not isinstance(p[key].get("url"), str):
            raise ValueError(f"an {key} part needs {{'{key}': {{'url': ...}}}}")
    return found


def _as_parts(content: Any, i: int) -> list[dict[str, Any]]:
    """A message's content as a vision model's template reads it: text and image parts."""
    if not isinstance(content, list):
        return [{"type": "text", "text": "" if content is None else str(content)}]
    out = []
    for p in content:
        kind = p.get("type") if isinstance(p, dict) else None
        if kind not in ("text", "image_url", "video_url"):
            raise ValueError(f"messages[{i}].content: parts of type {kind!r} are not supported "
                             "(text, image_url, video_url)")  # fmt: skip
        out.append({"type": "text", "text": str(p.get("text", ""))} if kind == "text" else
                   {"type": kind.removesuffix("_url")})  # fmt: skip
    return out


def _arguments_as_object(call: Any) -> Any:
    """A tool call whose JSON `arguments` string is parsed (as vLLM and the server hand it to
    templates); text that is not JSON stays text."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not (isinstance(fn, dict) and isinstance(fn.get("arguments"), str)):
        return call
    try:
        return {**call, "function": {**fn, "arguments": json.loads(fn["arguments"])}}
    except (ValueError, RecursionError):
        return call
