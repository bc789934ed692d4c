"""What the engine hands back: per-step deltas (streaming), finished results (offline) and the
stats snapshot the server's metrics read.

`StepOutput` and `EngineStats` are msgspec Structs (array-like, untracked by the collector):
cheaper to build than dataclasses on the engine's per-step path, and one step's outputs cross
from the engine process to the API process as one MessagePack message decoded straight back
into them (`core_proc.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
from pagoda.runtime.request import TokenLogprob


class StepOutput(msgspec.Struct, array_like=True, gc=False):
    """New output of one sample (choice `index`) of request `request_id` in one engine step."""

    request_id: str
    index: int
    new_token_ids: list[int]
    new_text: str
    new_logprobs: list[TokenLogprob]
    finished: bool
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error" (no finite logit)
    stop_reason: str | int | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_output_tokens: int = 0
    arrival_time: float = 0.0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    # on a sample's first output, with `prompt_logprobs`: prompt tokens 1.. scored
    prompt_logprobs: list[TokenLogprob] | None = None
    # the pooling runner: the prompt's vector, float32 little-endian bytes (`engine/pooling.py`)
    embedding: bytes | None = None


@dataclass
class Logprob:
    """vLLM's `Logprob`: one token's entry in a position's {token id: Logprob} dict."""

    logprob: float
    rank: int | None = None  # 1 = the most likely token
    decoded_token: str | None = None


def prompt_logprob_dicts(
    entries: list[TokenLogprob], decode: Callable[[int], str]
) -> list[dict[int, Logprob] | None]:
    """Prompt logprobs as vLLM shapes them: None for the first prompt token, then per token a
    dict of the token itself (first) and its top alternatives (rank 1..k)."""
    out: list[dict[int, Logprob] | None] = [None]
    for e in entries:
        d = {e.token_id: Logprob(e.logprob, e.rank, decode(e.token_id))}
        for rank, (t, v) in enumerate(e.top, 1):
            if t not in d:
                d[t] = Logprob(v, rank, decode(t))
        out.append(d)
    return out


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    # with `logprobs`, as vLLM's: per generated token {token id: Logprob} (`logprob_dict`)
    logprobs: list[dict[int, Logprob]] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    # the sum of the sampled tokens' log-probabilities; None unless logprobs were asked for
    cumulative_logprob: float | None = None

    def finished(self) -> bool:
        """Whether this sample is done (vLLM's `CompletionOutput.finished()`)."""
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    num_cached_tokens: int = 0
    # with SamplingParams.prompt_logprobs: vLLM's shape (`prompt_logprob_dicts`)
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None

    def add(self, delta: StepOutput) -> None:
        """Fold one step's delta into this accumulated result."""
        out = self.outputs[delta.index]
        out.text += delta.new_text
        out.token_ids.extend(delta.new_token_ids)
        if delta.new_logprobs:
            out.logprobs = (out.logprobs or []) + delta.new_logprobs
            out.cumulative_logprob = (out.cumulative_logprob or 0.0) + sum(
                lp.logprob for lp in delta.new_logprobs
            )
        if delta.finished:
            out.finish_reason, out.stop_reason = delta.finish_reason, delta.stop_reason
            self.num_cached_tokens = max(self.num_cached_tokens, delta.num_cached_tokens)
        self.finished = all(o.finished() for o in self.outputs)

    def shape_logprobs(self, decode: Callable[[int], str]) -> None:
        """The samples' logprobs, gathered by `add` as `TokenLogprob`s, in vLLM's shape."""
        for out in self.outputs:
            if out.logprobs is not None:
                out.logprobs = [logprob_dict(lp, decode) for lp in out.logprobs]  # type: ignore[arg-type]


def logprob_dict(lp: TokenLogprob, decode: Callable[[int], str]) -> dict[int, Logprob]:
    """One generated token's logprobs in vLLM's shape: the sampled token first, with its rank in
    the vocabulary (above k when it is not among the top k), then the top k ranked 1..k (the
    sampled token, when among them, keeps its first place in the dict with their entry)."""
    d = {lp.token_id: Logprob(lp.logprob, lp.rank, decode(lp.token_id))}
    for rank, (token, value) in enumerate(lp.top, 1):
        d[token] = Logprob(value, rank, decode(token))
    return d


class EngineStats(msgspec.Struct, array_like=True, gc=False):
    """Scheduler and KV-cache counters after a step (gauges and cumulative counters)."""

    num_running: int
    num_waiting: int
    kv_usage: float
    num_blocks: int
    num_free_blocks: int
    prefix_queries: int
    prefix_hits: int
    num_preemptions: int
    # speculative decoding (cumulative; `spec.stats.SpecDecodeStats`): empty per-position
    # counts when it is off
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_pos: list[int] = msgspec.field(default_factory=list)
    # LoRA (with --enable-lora; vLLM's lora_requests_info): the adapters of the running and
    # waiting requests, and --max-loras (0: LoRA off)
    lora_running: list[str] = msgspec.field(default_factory=list)
    lora_waiting: list[str] = msgspec.field(default_factory=list)
    max_lora: int = 0
    # a vision model's encoder cache (`worker/encoder_cache.py`; cumulative): images looked up
    # and found encoded; `mm_encoder_cache` false for a text model (no such counters)
    mm_encoder_cache: bool = False
    mm_encoder_cache_queries: int = 0
    mm_encoder_cache_hits: int = 0
