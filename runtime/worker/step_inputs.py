"""One step's flat batch as host arrays: what `ModelRunner` builds from a `SchedulerOutput` and
what rank 0 of a tensor-parallel group broadcasts to the others (`worker/step_channel.py`).

Plain data in its own module, so the runner and the channel share it without importing each
other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class StepInputs:
    ids: np.ndarray  # int64 [T] token ids
    positions: np.ndarray  # int64 [T]
    slots: np.ndarray  # int64 [T] cache slot of each new token
    table: np.ndarray  # int32 [B, max_blocks] block tables
    qlens: np.ndarray  # int64 [B] new tokens per request
    seq_lens: np.ndarray  # int64 [B] context length including the new tokens
    cu: np.ndarray  # int64 [B + 1] prefix sums of qlens
    sampling: list[int]  # requests that sample a token this step
    num_decodes: int = 0  # the first rows with one new token each
    # Async scheduling: (rows of `ids`, rows of the in-flight step's tokens) to fill on device.
    pending: tuple[np.ndarray, np.ndarray] | None = None
    # Prompt logprobs: rows of `ids` whose logits are wanted after the sampling rows' (int64)
    extra_rows: np.ndarray | None = None
    # rank 0 only: who owns those rows (`sampling.prompt_logprobs.PromptRows`)
    prompt: Any = None
    prompt_lens: np.ndarray | None = None  # int64 [B] each request's prompt (`model/longrope.py`)
    mamba: Any = None  # a hybrid's state slots (`worker.mamba_state.HostSlots`)
    history: np.ndarray | None = None  # int64 [B, n]: `token_history`'s, for `llama.TOKEN_HISTORY`
    # the model's per-sequence state (`LlamaModel.sequence_state`'s step; on the other ranks
    # of a tensor-parallel group its ``rows()`` as received)
    seq_state: Any = None
    # speculative decoding: the rows whose logits are sampled (a drafted request's every
    # position; None: each sampling request's last) and the drafts (`spec.verify.SpecRows`)
    sample_rows: np.ndarray | None = None
    spec: Any = None
    lora: np.ndarray | None = None  # int64 [T]: each token's LoRA slot (None: no adapter)
    # tensor parallelism: the adapters rank 0 put in device slots for this step, (slot,
    # `LoRARequest`) each, which the other ranks load too (`lora/slots.LoRASlots.fill`)
    lora_loads: list[tuple[int, Any]] | None = None
    # a vision model's image placeholder rows and the images to encode
    # (`worker/mm_encoder.ImagePlan`; rank 0 only: the tower runs there)
    images: Any = None
    # their (rows int64 [R], features [R, hidden]) on the device, for `llama.IMAGE_EMBEDS`:
    # encoded by rank 0, broadcast to the other ranks of a group (`worker/step_channel.py`)
    image_embeds: Any = None
    # Qwen2-VL's M-RoPE: int64 [3, T] positions of a step with prompt image rows
    # (`worker/mrope_rows.py`; `positions` then holds the rotary's, slots the cache's)
    mrope: np.ndarray | None = None


def token_history(token_lists, starts: np.ndarray, n: int) -> np.ndarray:
    """int64 [B, n]: the n tokens of each sequence's history before `starts` (its step's first
    position; -1 before the sequence: a prefix-cache hit or a chunk reads what its tokens are)."""
    lens = np.minimum(starts, n)
    flat = np.fromiter((t for ts, s in zip(token_lists, starts.tolist()) for t in ts[max(0, s - n) : s]),
                       dtype=np.int64, count=int(lens.sum()))  # fmt: skip
    out = np.full((len(starts), n), -1, dtype=np.int64)
    out[np.arange(n)[None, :] >= (n - lens)[:, None]] = flat
    return out
