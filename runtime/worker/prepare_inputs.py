"""A step's inputs: `SchedulerOutput` → `StepInputs`, the flat token batch as host arrays.

Assembled on the host with NumPy (one slice of token ids per sequence, everything else
vectorised); `ModelRunner` moves them to the device. The hooks each add their part here: drafts
to verify (`spec/verify.py`), LoRA slots, a hybrid's state slots, the model's per-sequence state
and token history, longrope's prompt lengths, the prompt positions scored for prompt logprobs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from pagoda.runtime.spec import verify
from pagoda.runtime.worker import mm_encoder, mrope_rows, prompt_logprobs
from pagoda.runtime.worker.step_inputs import StepInputs, token_history

if TYPE_CHECKING:
    import torch
    from pagoda.runtime.core.sched_output import SchedulerOutput
    from pagoda.runtime.request import Request
    from pagoda.runtime.worker.model_runner import ModelRunner


def prepare_inputs(runner: ModelRunner, out: SchedulerOutput) -> StepInputs:
    """The step's flat token batch as host arrays (ragged: one run of tokens per request).
    One-token rows (first: decodes, or a one-token prefill chunk) take one element; only
    longer chunks slice. A row samples when it reaches the end of the known tokens."""
    sched, bs, nd = out.scheduled, runner.block_size, out.num_decodes
    n = len(sched)
    reqs = [s.request for s in sched]
    starts = np.fromiter((r.num_computed_tokens for r in reqs), dtype=np.int64, count=n)
    known = np.fromiter((len(r.token_ids) for r in reqs), dtype=np.int64, count=n)
    one, pending = _decode_ids(runner.inflight, reqs[:nd], starts[:nd], known[:nd])
    if nd == n:
        qlens = np.ones(n, dtype=np.int64)
        cu = np.arange(n + 1, dtype=np.int64)
        ids = one
        positions, seq_idx = starts, np.arange(n)
    else:
        qlens = np.fromiter((s.num_new_tokens for s in sched), dtype=np.int64, count=n)
        cu = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(qlens, out=cu[1:])
        ids = np.empty(int(cu[-1]), dtype=np.int64)
        ids[:nd] = one
        for r, a, b, st in zip(reqs[nd:], cu[nd:-1], cu[nd + 1 :], starts[nd:]):
            chunk = r.token_ids[st : st + (b - a)]
            if len(chunk) < b - a:  # a decode with drafts after its last token
                chunk = chunk + r.spec_token_ids[: b - a - len(chunk)]
            ids[a:b] = chunk
        seq_idx = np.repeat(np.arange(n), qlens)
        positions = np.arange(len(ids)) - cu[:-1][seq_idx] + starts[seq_idx]
    table = runner.block_tables.gather(sched)
    slots = table[seq_idx, positions // bs].astype(np.int64) * bs + positions % bs
    seq_lens = starts + qlens
    sampling = np.flatnonzero(seq_lens >= known).tolist()
    inp = StepInputs(ids, positions, slots, table, qlens, seq_lens, cu, sampling, nd, pending)
    if runner.speculative and nd < n:  # decodes with drafts: rows past the known tokens
        extra = seq_lens - known
        if pending is not None:  # (async scheduling: a token in flight is known)
            extra[pending[0]] -= 1
        if (extra > 0).any():
            inp.sample_rows, inp.spec = verify.spec_rows(ids, cu, extra, sampling)
    _add_state(runner, out, inp, reqs, starts, qlens)
    if runner.prompt_logprob_requests:  # some request asked: are its prompt positions here?
        row_of = {s.request.request_id: i for i, s in enumerate(sched)}
        inp.prompt = prompt_logprobs.prompt_rows(
            runner.prompt_logprob_requests, row_of, starts, qlens, cu
        )
        inp.extra_rows = inp.prompt.flat if inp.prompt is not None else None
    return inp


def _add_state(
    runner: ModelRunner,
    out: SchedulerOutput,
    inp: StepInputs,
    reqs: list[Request],
    starts: np.ndarray,
    qlens: np.ndarray,
) -> None:
    """The parts of `inp` only some models or engines have: LoRA slots, a hybrid's state slots,
    a vision model's image rows, the model's per-sequence state, its token history, longrope's
    prompt lengths."""
    if runner.lora is not None:  # each token's adapter slot (`lora/slots.py`)
        inp.lora = runner.lora.prepare(reqs, qlens)
        if runner.channel is not None:  # rank 0 of a group: the slots the others fill too
            inp.lora_loads = runner.lora.take_loads()
    if runner.mamba is not None:  # the Mamba layers' state slots
        inp.mamba = runner.mamba.prepare(runner.block_tables.rows, starts, qlens,
                                         inp.num_decodes, out.snapshots)  # fmt: skip
    model = runner.model
    if model.config.vision is not None:  # the image placeholders the step's tokens hold
        inp.images = mm_encoder.prepare(runner.encoder_cache, reqs, starts, qlens, inp.cu)
        if getattr(model, "mrope_sel", None) is not None:  # Qwen2-VL's M-RoPE (model/qwen2_vl.py)
            inp.positions, inp.mrope = mrope_rows.prepare(
                reqs, starts, qlens, inp.cu, inp.positions
            )
    if runner.seq_state is not None:  # the model's per-sequence state (its slots)
        inp.seq_state = runner.seq_state.prepare(reqs, starts, qlens)
    if model.token_history:  # the tokens before each sequence's step (n-grams)
        inp.history = token_history([r.token_ids for r in reqs], starts, model.token_history)
    if model.long_rope:  # which rotary table a longrope prompt's chunks read
        n = len(reqs)
        inp.prompt_lens = np.fromiter((r.num_prompt_tokens for r in reqs), np.int64, count=n)


def _decode_ids(
    inflight: tuple[torch.Tensor, dict[str, int]] | None,
    reqs: list[Request],
    starts: np.ndarray,
    known: np.ndarray,
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
    """One-token rows' ids; with async scheduling (`inflight`: the last launched step's tokens
    and each request's row in them), a row whose token is still on the device (computed ==
    known) gets 0 here and is named in the returned (rows, sources)."""
    n = len(reqs)
    if inflight is None or not (starts == known).any():
        ids = (r.token_ids[r.num_computed_tokens] for r in reqs)
        return np.fromiter(ids, dtype=np.int64, count=n), None
    rows = np.flatnonzero(starts == known)
    ids = np.fromiter(
        (
            t[c] if c < len(t) else 0
            for t, c in ((r.token_ids, r.num_computed_tokens) for r in reqs)
        ),
        dtype=np.int64,
        count=n,
    )
    where = inflight[1]
    src = np.fromiter((where[reqs[i].request_id] for i in rows), dtype=np.int64, count=len(rows))
    return ids, (rows, src)
