"""Rank 0 → the other ranks: each step's prepared inputs (vLLM's executor broadcasting the
scheduler's output, one level lower: the arrays the forward reads, not the requests).

Rank 0 alone schedules, samples and owns the requests; the other ranks hold no request state,
only their part of the weights and KV cache, and run the forward rank 0 tells them to. A step
crosses in three broadcasts:

1. a fixed header (int64 [8], control group): what follows and its sizes, or "stop";
2. the host arrays (int64, control group): positions, slots, block tables, query and sequence
   lengths, their prefix sums, the prompts' lengths (longrope's table: `model/longrope.py`),
   the sampling rows, the rows scored for prompt logprobs, a step with drafts' rows projected
   (`StepInputs.sample_rows`: every row of a drafted request, `spec/verify.py`), the tokens
   before each sequence's step a model reads (`StepInputs.history`: Qwen4-Exp's n-grams; its
   [B, n] size from the model's `token_history`, the same on every rank);
   and a hybrid's state slots (`worker/mamba_state.HostSlots`: each sequence's, those to zero,
   and its prefix cache's snapshot copies: restores, saves at chunk ends and inside chunks);
   the model's per-sequence state slots (`LlamaModel.sequence_state`'s step as its ``rows()``,
   DeepSeek-V4's open windows: `model/dsv4_engine.HostStep`); each token's LoRA slot;
   and, in a step that put an adapter in a device slot, its (slot, adapter) as JSON bytes
   (one more broadcast, only then: `lora/slots.LoRASlots.fill`);
3. the token ids (device group): from rank 0's device, so a token sampled by the step still in
   flight (async scheduling) is broadcast without the host reading it; in a step that reaches
   a vision model's image placeholders, their rows (with the host arrays) and the features
   rank 0's tower encoded for them (device group: the other ranks hold no tower; rows of the
   model's `image_feature_width`: Qwen3-VL's hold its DeepStack features too); in a step
   holding Qwen2-VL's prompt image rows, their [3, T] M-RoPE positions (with the host arrays:
   `worker/mrope_rows.py`, `StepInputs.mrope`).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import torch
from pagoda.runtime.distributed.group import TPGroup
from pagoda.runtime.lora_config import LoRARequest
from pagoda.runtime.worker.mamba_state import HostSlots
from pagoda.runtime.worker.mm_encoder import ImagePlan
from pagoda.runtime.worker.step_inputs import StepInputs

STOP, STEP = 0, 1
HEADER = 17
SNAPSHOT_ROWS = (2, 2, 3)  # rows of `HostSlots.restore`, `save_end`, `save_mid`


class StepChannel:
    def __init__(
        self, tp: TPGroup, hidden: int = 0, dtype: torch.dtype = torch.float32, history: int = 0
    ) -> None:
        """`hidden`, `dtype`: the width and dtype of a vision model's image features;
        `history`: the tokens before each sequence's step the model reads (`token_history`)."""
        self.tp = tp
        self.hidden, self.dtype, self.history = hidden, dtype, history
        self._header = torch.zeros(HEADER, dtype=torch.int64)

    @classmethod
    def of(cls, runner) -> StepChannel:
        """The channel of a `ModelRunner`'s group, for its model's image features (Qwen3-VL's
        rows hold its DeepStack features beside the merged ones: `image_feature_width`)."""
        return cls(runner.tp, runner.model.image_feature_width, runner.dtype,
                   runner.model.token_history)  # fmt: skip

    def send(self, inp: StepInputs, ids: torch.Tensor) -> None:
        """Rank 0: broadcast the step (`ids` on the device) to the other ranks."""
        t, (b, width), s = ids.shape[0], inp.table.shape, len(inp.sampling)
        extra = inp.extra_rows if inp.extra_rows is not None else np.empty(0, dtype=np.int64)
        drafted = inp.sample_rows if inp.sample_rows is not None else np.empty(0, dtype=np.int64)
        h = self._header
        mamba = inp.mamba  # a hybrid's state slots: [B] slots, then those to zero
        state = () if mamba is None else (mamba.slots, mamba.fresh)
        fresh = 0 if mamba is None else len(mamba.fresh) + 1
        snaps = [] if mamba is None else [mamba.restore, mamba.save_end, mamba.save_mid]
        snaps = [np.empty((n, 0), dtype=np.int64) if a is None else a
                 for n, a in zip(SNAPSHOT_ROWS, snaps)]  # fmt: skip
        counts = [a.shape[1] for a in snaps] if snaps else [0, 0, 0]
        seq = () if inp.seq_state is None else (inp.seq_state.rows(),)  # (the model's slots)
        lora = () if inp.lora is None else (inp.lora,)
        loads = _encode_loads(inp.lora_loads)
        images = inp.image_embeds  # (rows, features) on the device, or None
        rows = () if images is None else (inp.images.rows,)  # (on the host: no sync)
        mrope = () if inp.mrope is None else (inp.mrope.reshape(-1),)  # Qwen2-VL's [3, T]
        h.copy_(torch.tensor([STEP, t, b, width, s, inp.num_decodes, len(extra), fresh, *counts,
                              sum(len(a) for a in seq), len(lora), len(loads),
                              len(drafted), sum(len(r) for r in rows), len(mrope)]))  # fmt: skip
        self.tp.broadcast_host(h)
        if loads:
            self.tp.broadcast_host(torch.frombuffer(bytearray(loads), dtype=torch.uint8))
        prompt_lens = inp.prompt_lens if inp.prompt_lens is not None else inp.seq_lens
        parts = (inp.positions, inp.slots, inp.table.reshape(-1), inp.qlens, inp.seq_lens, inp.cu,
                 prompt_lens, *state, *(a.reshape(-1) for a in snaps), *seq, *lora)  # fmt: skip
        history = () if not self.history else (inp.history.reshape(-1),)
        payload = np.concatenate([*(np.asarray(p, dtype=np.int64) for p in parts),
                                  np.asarray(inp.sampling, dtype=np.int64), extra,
                                  np.asarray(drafted, dtype=np.int64), *rows,
                                  *mrope, *history])  # fmt: skip
        self.tp.broadcast_host(torch.from_numpy(payload))
        self.tp.broadcast(ids)
        if images is not None:
            self.tp.broadcast(images[1].contiguous())

    def stop(self) -> None:
        """Rank 0: tell the other ranks to leave their loop."""
        self._header.zero_()
        self.tp.broadcast_host(self._header)

    def receive(self) -> tuple[StepInputs, torch.Tensor] | None:
        """Another rank: the next step's inputs and its token ids on this rank's device, or
        None when rank 0 stops. Waits as long as rank 0 stays idle."""
        h = self.tp.broadcast_host(self._header).tolist()
        if h[0] == STOP:
            return None
        t, b, width, s, nd, e, fresh = h[1:8]
        counts, seq, lora, nloads = h[8:11], h[11], t * h[12], h[13]
        nd_rows, nimage, mrope = h[14], h[15], 3 * t * h[16]
        loads = None
        if nloads:
            raw = self.tp.broadcast_host(torch.empty(nloads, dtype=torch.uint8))
            loads = _decode_loads(raw.numpy().tobytes())
        state = b + fresh - 1 if fresh else 0
        snap = [n * c for n, c in zip(SNAPSHOT_ROWS, counts)]
        size = 2 * t + b * width + 4 * b + 1 + state + sum(snap) + seq + lora + s + e + nd_rows
        size += nimage + mrope + b * self.history
        a = self.tp.broadcast_host(torch.empty(size, dtype=torch.int64)).numpy()
        cuts = np.cumsum([t, t, b * width, b, b, b + 1, b, state, *snap, seq, lora, s, e, nd_rows,
                          nimage, mrope])  # fmt: skip
        (positions, slots, table, qlens, seq_lens, cu, prompt_lens, state, restore, save_end,
         save_mid, seq_rows, lora_slots, sampling, extra, drafted, image_rows,
         mrope_rows, history) = np.split(a, cuts)  # fmt: skip
        device = self.tp.device
        ids = torch.empty(t, dtype=torch.int64, device=device)
        self.tp.broadcast(ids)
        images = None
        if nimage:
            features = torch.empty(nimage, self.hidden, dtype=self.dtype, device=device)
            self.tp.broadcast(features)
            images = (torch.from_numpy(image_rows).to(device), features)
        inp = StepInputs(
            ids=np.empty(0, dtype=np.int64),  # on the device: `ids`
            positions=positions, slots=slots, table=table.reshape(b, width).astype(np.int32),
            qlens=qlens, seq_lens=seq_lens, cu=cu, sampling=sampling.tolist(), num_decodes=nd,
            extra_rows=extra if e else None, prompt_lens=prompt_lens,
            seq_state=seq_rows if seq else None, lora=lora_slots if lora else None,
            lora_loads=loads, sample_rows=drafted if nd_rows else None, image_embeds=images,
            images=ImagePlan([], image_rows, []) if nimage else None,  # (rows: the masks')
            mrope=mrope_rows.reshape(3, t) if mrope else None,
            history=history.reshape(b, self.history) if self.history else None,
        )  # fmt: skip
        if fresh:
            inp.mamba = HostSlots(state[:b], state[b:], qlens.tolist(), nd)
            for name, rows, c, arr in zip(("restore", "save_end", "save_mid"), SNAPSHOT_ROWS,
                                          counts, (restore, save_end, save_mid)):  # fmt: skip
                if c:
                    setattr(inp.mamba, name, arr.reshape(rows, c))
        return inp, ids


def _encode_loads(loads) -> bytes:
    """A step's LoRA loads, (slot, `LoRARequest`) each, as JSON (b"" for none): every field of
    the request by name (`dataclasses.fields`), so a field added to it crosses too."""
    if not loads:
        return b""
    names = [f.name for f in dataclasses.fields(LoRARequest)]
    return json.dumps([[slot, {n: getattr(r, n) for n in names}] for slot, r in loads]).encode()


def _decode_loads(data: bytes) -> list[tuple[int, LoRARequest]]:
    return [(slot, LoRARequest(**fields)) for slot, fields in json.loads(data)]
