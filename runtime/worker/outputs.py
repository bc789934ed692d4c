"""What the model runner hands the engine: a step queued on the device, then its sampled tokens.

Plain data in its own module, so the engine's output side reads it without importing the runner.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pagoda.runtime.request import Request, TokenLogprob

if TYPE_CHECKING:
    import torch
    from pagoda.runtime.sampling.sampler import SamplerOutput
    from pagoda.runtime.spec.verify import SpecResult
    from pagoda.runtime.worker.prompt_logprobs import PromptRows, PromptScores


@dataclass
class ModelRunnerOutput:
    requests: list[Request]  # the requests that sampled, in row order
    token_ids: list[int]
    logprobs: list[TokenLogprob | None]
    # prompt logprobs scored this step: (request, its new entries), in any order
    prompt_logprobs: list[tuple[Request, list[TokenLogprob]]] = field(default_factory=list)
    # speculative decoding: a drafted request has one entry per token it gained this step (in
    # order); `positions` then gives each entry's sequence length once its token is appended
    positions: list[int] | None = None
    spec: SpecResult | None = None
    # the draft model's drafts after this step (`spec/draft_model.py`): the requests that take
    # them and their drafts, int64 [len(requests), k], for their next decode
    drafts: tuple[list[Request], Any] | None = None
    # the pooling runner: the requests whose prompt ended this step and their vectors (float32
    # [len(requests), D] on the host), in the same order
    pooled: tuple[list[Request], Any] | None = None


@dataclass
class LaunchedStep:
    """A step queued on the device: who samples, and where the results will be."""

    requests: list[Request]  # the requests that sample, in row order
    sampler_output: SamplerOutput | None  # device tensors
    host: SamplerOutput | None = None  # pinned copies, valid once `ready` has fired (CUDA)
    ready: torch.cuda.Event | None = None
    # Async scheduling with constrained rows: (logits, sampling batch, grammar rows, a draft
    # model's sampled drafts' ratio rows and q or None) waiting for the previous step's tokens
    # before their bitmasks are filled (`ModelRunner.sample_deferred`)
    deferred: tuple[torch.Tensor, Any, list[int], Any, Any] | None = None
    # Prompt logprobs: the rows scored, their scores (device), pinned copies (CUDA, `ready`)
    prompt: tuple[PromptRows, PromptScores] | None = None
    prompt_host: tuple[torch.Tensor | None, ...] | None = None
    # speculative decoding: (the sampling requests, one each, `spec.verify.SpecRows`)
    spec: tuple[list[Request], Any] | None = None
    # a draft model: the sampling requests' rows of the runner's block tables (one each)
    table_rows: Any = None
    # the pooling runner: float32 [len(requests), D] vectors on the device, and their pinned
    # copy (CUDA), valid once `ready` has fired
    pooled: torch.Tensor | None = None
    pooled_host: torch.Tensor | None = None

    @property
    def samplers(self) -> list[Request]:
        """The requests that sample, one each (a drafted request has a row per token)."""
        return self.requests if self.spec is None else self.spec[0]

    @property
    def empty(self) -> bool:
        """Nothing to read back: no row sampled or scored a prompt."""
        return self.sampler_output is None and self.deferred is None and self.prompt is None
