"""What the model runner hands the engine: a step queued on the device, then its sampled tokens.

Plain data in its own module, so the engine's output side reads it without importing the runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pagoda.runtime.request import Request, TokenLogprob

if TYPE_CHECKING:
    import torch
    from pagoda.runtime.sampling.sampler import SamplerOutput


@dataclass
class ModelRunnerOutput:
    requests: list[Request]  # the requests that sampled, in row order
    token_ids: list[int]
    logprobs: list[TokenLogprob | None]


@dataclass
class LaunchedStep:
    """A step queued on the device: who samples, and where the results will be."""

    requests: list[Request]  # the requests that sample, in row order
    sampler_output: SamplerOutput | None  # device tensors
    host: SamplerOutput | None = None  # pinned copies, valid once `ready` has fired (CUDA)
    ready: torch.cuda.Event | None = None
    # Async scheduling with constrained rows: (logits, sampling batch, grammar rows) waiting for
    # the previous step's tokens before their bitmasks are filled (`ModelRunner.sample_deferred`)
    deferred: tuple[torch.Tensor, Any, list[int]] | None = None
