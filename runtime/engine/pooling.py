"""The pooling runner in the engine: what it refuses at start, how a pooled request ends, and
the offline API (`LLM(..., runner="pooling").embed(prompts)` in vLLM's shapes: `PoolingParams`,
`EmbeddingRequestOutput` whose `.outputs.embedding` is a list of floats).

A pooling request is a prompt prefilled (no sampling) whose vector comes back in the step its
prompt ends; it then finishes at once (finish reason "stop"), so its KV blocks are freed
before the next schedule, and its output carries the vector (`StepOutput.embedding`: float32
little-endian bytes, as OpenAI's base64 encoding is).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from pagoda.runtime.request import Request, RequestStatus
from pagoda.runtime.sampling.params import SamplingParams

if TYPE_CHECKING:  # (runtime/config.py imports torch: the API process reads this module)
    from pagoda.runtime.config import EngineConfig, ModelConfig

_REFUSED = "the pooling runner does not support {} ({}): serve it with --runner generate"


def check_pooling(config: EngineConfig, model: ModelConfig) -> None:
    """ValueError, one line, for a pooling engine the runtime cannot build: a family that keeps
    a recurrent or per-sequence state (Mamba hybrids, RWKV, xLSTM, DeepSeek-V4's windows: their
    state slots are not prefill-only), or one whose model computes its own forward (the seam
    that hands back final hidden states is `LlamaModel.forward`'s), or a sequence classifier
    over several ranks."""
    if config.runner != "pooling":
        return
    from pagoda.runtime.engine import recurrent
    from pagoda.runtime.model.llama import LlamaModel
    from pagoda.runtime.model.registry import model_class

    arch = model.architecture
    if model.family.num_labels and config.parallel.tensor_parallel_size > 1:
        raise ValueError("tensor parallelism is not supported for a sequence classifier (its "
                         "head reads whole rows on one rank): drop --tensor-parallel-size")  # fmt: skip
    if recurrent.keeps_state(model) or model.family.dsv4 is not None:
        raise ValueError(_REFUSED.format(arch, "a model that keeps per-sequence state beyond "
                                         "its KV cache"))  # fmt: skip
    cls = model_class(model)
    owner = next(c for c in cls.__mro__ if "forward" in vars(c))
    if owner is not LlamaModel:
        raise ValueError(_REFUSED.format(arch, "its forward does not hand back final hidden "
                                         "states"))  # fmt: skip


def finish_pooled(scheduler, requests: Sequence[Request]) -> None:
    """End the requests whose vectors came back this step and free their blocks."""
    for req in requests:
        if not req.is_finished:  # (aborted meanwhile: freed already)
            req.status = RequestStatus.FINISHED_STOPPED
            scheduler.finish(req)


def vector_bytes(vectors: np.ndarray) -> list[bytes]:
    """Each row of float32 [N, D] as little-endian bytes (what `StepOutput.embedding` holds)."""
    v = np.ascontiguousarray(vectors, dtype="<f4")
    return [row.tobytes() for row in v]


# what a pooled request runs with: no token is ever sampled (the runner pools, `pooler.py`)
POOL_PARAMS = SamplingParams(max_tokens=1)


@dataclass(frozen=True)
class PoolingParams:
    """vLLM's `PoolingParams` fields served: `dimensions` (Matryoshka models: the vector's
    first that many components, normalized again when the pooler normalizes) and
    `truncate_prompt_tokens` (keep the prompt's last k tokens; -1: the last max_model_len: a
    pooled prompt may fill the context, `info.longest_prompt`)."""

    dimensions: int | None = None
    truncate_prompt_tokens: int | None = None


@dataclass
class EmbeddingOutput:
    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class EmbeddingRequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput
    finished: bool = True


def truncated(ids: list[int], k: int | None, max_model_len: int) -> list[int]:
    """A prompt cut to its last `k` tokens (vLLM's `truncate_prompt_tokens`; -1: as many as the
    model takes, max_model_len: nothing is generated); ValueError for k < -1 or 0."""
    if k is None:
        return ids
    if isinstance(k, bool) or not isinstance(k, int) or k == 0 or k < -1:
        raise ValueError(f"truncate_prompt_tokens must be -1 or a positive integer, got {k!r}")
    k = max_model_len if k == -1 else k
    return ids[-k:] if len(ids) > k else ids


def embed(llm: Any, prompts: list, params: PoolingParams | None, bar: Any) -> list:
    """`LLM.embed`'s work: every prompt pooled together, results in input order (a
    cross-encoder's prompts are its encoded pairs, `scoring.score`: each "vector" its score)."""
    engine = llm.engine
    if engine.config.runner != "pooling":
        raise ValueError("embed needs the pooling runner: LLM(..., runner='pooling')")
    params = params or PoolingParams()
    pc = engine.config.pooler_config
    dims = params.dimensions
    if dims is not None:
        problem = pc.check_dimensions(dims, engine.model_config.hidden_size)
        if problem is not None:
            raise ValueError(problem)
    encoded = []
    for p in prompts:
        if isinstance(p, dict) and set(p) == {"prompt"} and isinstance(p["prompt"], str):
            p = p["prompt"]  # (vLLM's TextPrompt)
        if isinstance(p, str):  # as transformers' `tokenizer(text)` reads it
            ids = engine.tokenizer.encode_whole(p)
        else:
            ids = llm._to_ids(p)[1]
        ids = truncated(ids, params.truncate_prompt_tokens, engine.max_model_len)
        engine.validate(ids, POOL_PARAMS)
        encoded.append(ids)
    results: dict[str, EmbeddingRequestOutput | list[int]] = {}
    try:
        for ids in encoded:
            rid = f"embed-{next(llm._ids)}"
            results[rid] = ids
            engine.add_request(rid, ids, POOL_PARAMS, checked=True)
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.embedding is None:  # (an error: no vector)
                    raise RuntimeError(f"request {out.request_id} ended without a vector "
                                       f"({out.finish_reason})")  # fmt: skip
                v = vector(out.embedding, dims, bool(pc.normalize))
                ids = results[out.request_id]
                results[out.request_id] = EmbeddingRequestOutput(
                    out.request_id, ids, EmbeddingOutput(v.tolist())
                )
                if bar is not None:
                    bar.update(1)
    finally:
        for rid, res in results.items():
            if not isinstance(res, EmbeddingRequestOutput):
                engine.abort_request(rid)
    return list(results.values())


def vector(data: bytes, dimensions: int | None, normalize: bool) -> np.ndarray:
    """A pooled vector (float32, little-endian bytes as the engine hands it back) cut to a
    request's Matryoshka `dimensions` (then normalized again when the pooler normalizes: the
    same as pooling to those dimensions, a unit vector's scale not mattering)."""
    v = np.frombuffer(data, dtype="<f4")
    if dimensions is None or dimensions >= len(v):
        return v
    v = v[:dimensions]
    if normalize:
        v = v / max(float(np.linalg.norm(v)), 1e-12)
    return v.astype(np.float32)
