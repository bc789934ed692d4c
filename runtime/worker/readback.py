"""A launched step's results on the host: `LaunchedStep` → `ModelRunnerOutput`.

The sampled tokens (with their logprobs when asked) are the step's one device→host transfer. On
CUDA they are copied into pinned memory behind an event as the step is launched, so waiting for
step N does not wait for step N+1 queued after it. The result is then assembled: drafts verified
(`spec/verify.py`), a draft model's next drafts (`worker/draft_step.py`), prompt logprobs, or a
pooling step's vectors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from pagoda.runtime.request import Request, TokenLogprob
from pagoda.runtime.sampling.sampler import SamplerOutput
from pagoda.runtime.spec import verify
from pagoda.runtime.worker import draft_step, prompt_logprobs
from pagoda.runtime.worker.outputs import LaunchedStep, ModelRunnerOutput

if TYPE_CHECKING:
    from pagoda.runtime.worker.model_runner import ModelRunner
    from pagoda.runtime.worker.step_clock import StepClock


def read_step(runner: ModelRunner, step: LaunchedStep) -> ModelRunnerOutput:
    """Wait for a step queued by `ModelRunner.execute_model` and read its sampled tokens back
    (the step's only device→host sync)."""
    if step.pooled is not None:  # the pooling runner's vectors
        return _pooled(step, runner.clock)
    if step.sampler_output is None and step.prompt is None:
        return ModelRunnerOutput([], [], [])
    if step.ready is not None:
        step.ready.synchronize()  # this step only, not the ones queued after it
    if step.sampler_output is not None:
        result = runner_output(step.requests, step.host or step.sampler_output)
        if step.spec is not None:
            result = verify.verified(result, *step.spec)
        if runner.draft is not None:
            result.drafts = draft_step.drafts(runner, step, result)
    else:  # only prompt positions this step (a chunk before the last)
        result = ModelRunnerOutput([], [], [])
    if step.prompt is not None:
        rows, scores = step.prompt
        result.prompt_logprobs = prompt_logprobs.entries(rows, step.prompt_host or scores.tensors())
    if runner.clock is not None:
        runner.clock.mark("readback")
    return result


def runner_output(reqs: list[Request], so: SamplerOutput) -> ModelRunnerOutput:
    """The sampled tokens of `reqs` (one row each) and their logprobs where asked."""
    token_ids = so.token_ids.tolist()  # the step's one device→host sync
    if so.logprobs is None:
        return ModelRunnerOutput(reqs, token_ids, [None] * len(reqs))
    chosen = so.logprobs.tolist()
    top_ids = so.top_ids.tolist() if so.top_ids is not None else [[] for _ in reqs]
    top_lps = so.top_logprobs.tolist() if so.top_logprobs is not None else [[] for _ in reqs]
    ranks = so.ranks.tolist() if so.ranks is not None else [None] * len(reqs)
    lps: list[TokenLogprob | None] = []
    for r, t, c, ti, tl, rank in zip(reqs, token_ids, chosen, top_ids, top_lps, ranks):
        k = r.params.logprobs
        lps.append(None if k is None else TokenLogprob(t, c, list(zip(ti[:k], tl[:k])), rank))
    return ModelRunnerOutput(reqs, token_ids, lps)


def _pooled(step: LaunchedStep, clock: StepClock | None) -> ModelRunnerOutput:
    """A pooling step's vectors on the host (float32 [requests, D]), with their requests."""
    if step.ready is not None:
        step.ready.synchronize()
    host = step.pooled_host if step.pooled_host is not None else step.pooled.cpu()
    result = ModelRunnerOutput([], [], [], pooled=(step.requests, host.numpy()))
    if clock is not None:
        clock.mark("readback")
    return result


def copy_to_host(step: LaunchedStep) -> None:
    """Queue the sampled tensors' (and prompt scores') copy into pinned memory and mark it
    with an event."""
    so = step.sampler_output
    step.host = SamplerOutput(*pinned_copies((so.token_ids, so.logprobs, so.top_ids,
                                              so.top_logprobs, so.ranks)))  # fmt: skip
    if step.prompt is not None:
        step.prompt_host = pinned_copies(step.prompt[1].tensors())
    step.ready = torch.cuda.Event()
    step.ready.record()


def pinned_copies(tensors) -> tuple[torch.Tensor | None, ...]:
    """Pinned host copies of device tensors (None stays None), queued without a sync."""
    out = []
    for t in tensors:
        dst = None if t is None else torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        if dst is not None:
            dst.copy_(t, non_blocking=True)
        out.append(dst)
    return tuple(out)
