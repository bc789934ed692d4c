"""The draft model of speculative decoding's "draft_model" method (docs/runtime.md,
"Speculative decoding"): a smaller model with the target's vocabulary, run by the model runner
on the target's device after each step, greedily, k positions ahead of the sequences that take
drafts (vLLM v1's `DraftModelProposer`).

Its KV cache is its own tensors addressed by the target's block tables: block b of the draft
cache holds the draft's keys and values of the positions that block b of the target cache
holds, so the scheduler's one allocator serves both (`draft_block_bytes` is counted in the KV
budget per block). What the draft has seen of a sequence (its KV rows written from the
sequence's real tokens inside the sequence's own blocks) is kept per request. A prompt chunk
before the last is caught up as the target computes it (`catch_up`, queued beside the target's
forward). Each drafting run first catches a sequence up on the rest (the prompt's last chunk and first token, else the tokens the
target accepted last step and its own next one), all sequences in one ragged forward, then runs
k - 1 one-token forwards, each over all the sequences at once, feeding back its own argmax on
the device; the k drafts of every sequence are read back together at the end.

Positions past a sequence's blocks (its last token's, when it starts a block the scheduler has
not handed out yet, and the draft positions) go to scratch blocks past the shared ones, a few
per batch row (`scratch_blocks`, taken from the KV budget before the shared blocks): nothing the draft writes there is counted as seen, and neither is a draft
position inside the sequence's blocks, so a rejected draft's rows are simply written again by a
later catch-up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import chain
from typing import TYPE_CHECKING

import numpy as np
import torch
from pagoda.runtime.attention import AttentionMetadata
from pagoda.runtime.sampling.sampler import SamplingBatch
from pagoda.runtime.spec.rejection import DRAFT, DraftProbs, draft_pick, uniforms

if TYPE_CHECKING:
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.core.sched_output import SchedulerOutput
    from pagoda.runtime.model.llama import LlamaModel
    from pagoda.runtime.model.loader import LoadedModel
    from pagoda.runtime.model_config import ModelConfig
    from pagoda.runtime.request import Request
    from pagoda.runtime.worker.outputs import LaunchedStep, ModelRunnerOutput


def check_draft(config: EngineConfig, target: ModelConfig, draft: ModelConfig) -> None:
    """ValueError, one line, for a draft checkpoint this runner cannot pair with the target,
    read from its config before any weights load: another vocabulary, a context shorter than
    the sequences served, FP8 weights, a latent or indexed cache (the target's refusals,
    recurrent state and the like, are `engine.start_checks.check_speculative`'s; the tokenizers
    are compared once both are loaded: `check_loaded`)."""
    name = config.speculative_config.draft_model
    if draft.vocab_size != target.vocab_size:
        raise ValueError(
            f"speculative_config: the draft model {name} has a vocabulary of {draft.vocab_size} "
            f"tokens, the target {target.vocab_size}: a draft model must share the target's "
            "vocabulary and tokenizer"
        )
    if config.quantization is not None:
        raise ValueError(
            f"speculative decoding with a draft model is not supported with --quantization "
            f"{config.quantization} (the draft would run unquantized beside FP8 weights; "
            "untested): drop --quantization or the draft model"
        )
    served = config.scheduler.max_model_len or target.context_length
    if draft.context_length < served:
        raise ValueError(
            f"speculative_config: the draft model {name} has a context of "
            f"{draft.context_length} tokens, less than max_model_len {served}: lower "
            "--max-model-len"
        )
    f = draft.family
    if f.mla is not None or f.block_index is not None or f.kolibri11 is not None:
        raise ValueError(
            f"speculative_config: the draft model {name} ({draft.architecture}) keeps a latent "
            "or indexed KV cache; a draft model must use plain attention (Llama, Qwen, "
            "Mistral, Gemma, ... families)"
        )


def check_loaded(name: str, target: LoadedModel, draft: LoadedModel) -> None:
    """ValueError, one line, for a loaded draft checkpoint in FP8, or whose tokenizer maps
    tokens to other ids than the target's (equal vocabulary sizes are not enough: a draft token
    is verified by its id)."""
    if draft.fp8_scheme is not None:
        raise ValueError(f"speculative_config: the draft model {name} is an FP8 checkpoint; "
                         "FP8 draft models are not supported (use a 16-bit one)")  # fmt: skip
    if target.tokenizer.backend.get_vocab() != draft.tokenizer.backend.get_vocab():
        raise ValueError(
            f"speculative_config: the draft model {name} has another tokenizer than the target "
            "(token ids differ): a draft model must share the target's tokenizer"
        )


def check_built(name: str, model: LlamaModel) -> None:
    """ValueError, one line, for a built draft whose forward needs per-step inputs the draft
    runner does not make (n-gram token history, longrope tables, per-sequence state)."""
    if model.token_history or model.long_rope or model.sequence_state(1) is not None:
        raise ValueError(
            f"speculative_config: the draft model {name} ({model.config.architecture}) reads "
            "per-sequence inputs (token history, longrope, windows) the draft runner does not "
            "keep; use a plain-attention draft model"
        )


def draft_block_bytes(model: LlamaModel, dtype: torch.dtype, block_size: int) -> int:
    """The draft's bytes of one KV block (added to the target's in the KV budget)."""
    return sum(b.block_bytes(dtype, block_size) for b in model.kv_backends)


def scratch_blocks(k: int, block_size: int) -> int:
    """A batch row's scratch blocks: k positions past a sequence's blocks, from any offset."""
    return -(-k // block_size) + 1


def sampled_bytes(k: int, max_rows: int, vocab_size: int) -> int:
    """Device bytes that sampled drafts take beside the KV cache at most: q of k positions a
    sequence held between steps (float32 [max_rows, k, V], `spec/rejection.DraftProbs`) and the
    verification's float32 [max_rows * k, V] temporaries (p, q's rows, the residual and its
    float64 running sum: about five of them)."""
    return max_rows * k * vocab_size * 4 * 6


def prefill_batch(
    out: SchedulerOutput, sampling: list[int], seq_lens: np.ndarray, rows: np.ndarray
) -> tuple[list[Request], np.ndarray, np.ndarray]:
    """The step's prompt chunks the draft catches up on as the target computes them: its
    scheduled requests that take drafts and do not sample (a chunk before a prompt's last);
    with the positions computed once the step is done and their block-table rows."""
    mid = np.ones(len(out.scheduled), dtype=bool)
    mid[sampling] = False
    idx = [i for i in np.flatnonzero(mid).tolist() if out.scheduled[i].request.takes_drafts]
    return [out.scheduled[i].request for i in idx], seq_lens[idx], rows[idx]


def draft_batch(
    step: LaunchedStep, result: ModelRunnerOutput
) -> tuple[list[Request], list[list[int]], np.ndarray]:
    """Who drafts after a step read back: its sampling requests that take drafts, got a token
    and may generate more than one after it; with the tokens each gained (`result` has them
    consecutively, 1 + accepted drafts each) and their rows of the runner's block tables."""
    sampled = step.requests if step.spec is None else step.spec[0]
    gained = np.ones(len(sampled), dtype=np.int64)
    if step.spec is not None and result.spec is not None:
        gained[step.spec[1].counts > 0] += np.asarray(result.spec.accepted, dtype=np.int64)
    tokens = np.asarray(result.token_ids, dtype=np.int64)
    ends = np.cumsum(gained)
    bad = np.minimum.reduceat(tokens, ends - gained) < 0 if len(tokens) else gained > 0
    room = np.fromiter((r.max_new_tokens - r.num_output_tokens for r in sampled), np.int64,
                       len(sampled)) - gained  # fmt: skip
    # (async scheduling: one preempted while the step was in flight has no blocks now)
    takes = np.fromiter((r.takes_drafts and r.is_running for r in sampled), bool,
                        len(sampled))  # fmt: skip
    keep = np.flatnonzero(takes & ~bad & (room > 1))
    if not len(keep):
        return [], [], keep
    tails = tokens.tolist()
    starts, stops = (ends - gained).tolist(), ends.tolist()
    return ([sampled[i] for i in keep.tolist()],
            [tails[starts[i] : stops[i]] for i in keep.tolist()], step.table_rows[keep])  # fmt: skip


class DraftModel:
    """The draft model beside the target: its weights, its KV cache (`num_blocks` shared with
    the target's, then `max_rows` rows of scratch blocks) and what it has seen of each
    sequence."""

    def __init__(
        self,
        model: LlamaModel,
        k: int,
        num_blocks: int,
        block_size: int,
        max_rows: int,
        dtype: torch.dtype,
        device: torch.device,
        max_positions: int,
    ) -> None:
        self.model, self.k, self.block_size, self.device = model, k, block_size, device
        self.scratch = scratch_blocks(k, block_size)
        self.scratch_base = num_blocks
        total = num_blocks + max_rows * self.scratch
        caches = [b.allocate_kv_cache(total, block_size, dtype, device) for b in model.kv_backends]
        self.kv_caches = model.layer_caches(caches)
        self.backends = model.attention_backends
        self.max_position = max_positions - 1
        # per request: (its num_preemptions then, the positions whose draft rows are real)
        self._seen: dict[Request, tuple[int, int]] = {}
        # the last run's q of its sampling requests, until the next step verifies their drafts
        self.held: DraftProbs | None = None

    def propose(
        self,
        reqs: Sequence[Request],
        tails: Sequence[Sequence[int]],
        table: np.ndarray,
        num_blocks: np.ndarray,
        to_device: Callable[[np.ndarray], torch.Tensor],
    ) -> np.ndarray:
        """int64 [B, k] drafts of `reqs`, each a sequence of its `token_ids` and then its
        `tails` entry (the tokens this step gave it, not folded in yet): greedy for a greedy
        request, drawn from the draft's processed distribution q for one that samples (q kept
        in `held` for the verification, `spec/rejection.py`). `table`: their block tables as
        the step used them ([B, W] int32), `num_blocks` [B] the blocks in each. One
        device→host read, at the end."""
        b, k, bs = len(reqs), self.k, self.block_size
        lens = np.fromiter((len(r.token_ids) + len(t) for r, t in zip(reqs, tails)), np.int64, b)
        seen = self._seen_of(reqs, lens)
        # each sequence's unseen tokens only (not its whole list: a step stays O(new tokens))
        unseen = [r.token_ids[a:] + t for r, t, a in zip(reqs, tails, seen.tolist())]
        width = max(int(-(-(lens.max() + k - 1) // bs)), table.shape[1])
        tbl = np.zeros((b, width), dtype=np.int32)
        tbl[:, : table.shape[1]] = table
        extra = np.arange(width)[None, :] - num_blocks[:, None]
        scratch = (extra >= 0) & (extra < self.scratch)
        spare = self.scratch_base + np.arange(b)[:, None] * self.scratch + extra
        tbl[scratch] = spare[scratch]
        pick = self._sampler(reqs, lens, to_device)
        # the catch-up: every sequence's unseen tokens, its last one giving the first draft
        tok = pick(0, self._ragged(unseen, seen, lens, tbl, to_device))
        drafts = [tok]
        one, ones, cu = np.arange(b), np.ones(b, np.int64), np.arange(b + 1)
        # what every one-token forward shares, on the device once: the table, the query
        # starts, the rows projected (each sequence's one row)
        fixed = (to_device(tbl), to_device(cu.astype(np.int32)), to_device(one))
        for j in range(1, k):  # one position further each, all sequences at once
            pos = np.minimum(lens - 1 + j, self.max_position)
            tok = pick(j, self._forward(tok, pos, tbl, one, ones, cu, to_device, fixed))
            drafts.append(tok)
        out = torch.stack(drafts, dim=1).cpu().numpy()  # the run's one read back
        self._mark_seen(reqs, lens, num_blocks)
        return out

    def _sampler(self, reqs: Sequence[Request], lens: np.ndarray, to_device):
        """`pick(j, logits)`: draft position j's tokens [B] from the draft's logits; the
        sampling rows' q of every position kept in `held` (their drafts' uniforms drawn now:
        `rejection.uniforms`, a seeded request's keyed by its seed and token index)."""
        sampled = np.flatnonzero([not r.params.greedy for r in reqs])
        self.held = None
        if not len(sampled):
            return lambda j, logits: logits.argmax(dim=-1)
        k, device, vocab = self.k, self.device, self.model.vocab_size
        sreqs = [reqs[i] for i in sampled.tolist()]
        f = SamplingBatch.build(sreqs, vocab, device)  # (their temperature and filters)
        index = (lens[sampled][:, None] + np.arange(k)).ravel()
        u = uniforms([r for r in sreqs for _ in range(k)], index, DRAFT, device, to_device)
        u = u.view(-1, k)
        rows = to_device(sampled.astype(np.int64))
        probs = torch.empty((len(sreqs), k, vocab), dtype=torch.float32, device=device)
        self.held = DraftProbs(probs, {r: (n, i) for i, (r, n) in
                                       enumerate(zip(sreqs, lens[sampled].tolist()))})  # fmt: skip

        def pick(j: int, logits: torch.Tensor) -> torch.Tensor:
            tokens, q = draft_pick(logits, f, u[:, j], rows)
            probs[:, j] = q
            return tokens

        return pick

    def catch_up(
        self,
        reqs: Sequence[Request],
        ends: np.ndarray,
        table: np.ndarray,
        num_blocks: np.ndarray,
        to_device: Callable[[np.ndarray], torch.Tensor],
    ) -> None:
        """The draft's rows of the prompt chunks the target computes this step (requests that
        do not sample yet), up to `ends` [B], in one forward queued on the device (nothing read
        back): a prompt is caught up chunk by chunk, within the step's token budget, as the
        target computes it. `table` / `num_blocks` as in `propose`."""
        seen = self._seen_of(reqs, ends)
        unseen = [r.token_ids[a:e] for r, a, e in zip(reqs, seen.tolist(), ends.tolist())]
        self._ragged(unseen, seen, ends, table, to_device)
        self._mark_seen(reqs, ends, num_blocks)

    def _mark_seen(self, reqs: Sequence[Request], ends: np.ndarray, num_blocks: np.ndarray):
        """Each sequence's draft rows real up to `ends`, as far as its own blocks hold them
        (rows in scratch blocks are drafts' only, computed again later)."""
        real = np.minimum(ends, num_blocks * self.block_size)
        for r, n in zip(reqs, real.tolist()):
            self._seen[r] = (r.num_preemptions, n)

    def _ragged(
        self,
        unseen: list[list[int]],
        seen: np.ndarray,
        lens: np.ndarray,
        tbl: np.ndarray,
        to_device: Callable[[np.ndarray], torch.Tensor],
    ) -> torch.Tensor:
        """One forward over each sequence's `unseen` tokens (positions `seen` .. `lens` - 1):
        the logits after each one's last, [B, V] on the device."""
        b = len(unseen)
        qlens = lens - seen
        cu = np.zeros(b + 1, dtype=np.int64)
        np.cumsum(qlens, out=cu[1:])
        ids = np.fromiter(chain.from_iterable(unseen), np.int64, int(cu[-1]))
        seq_idx = np.repeat(np.arange(b), qlens)
        positions = np.arange(len(ids)) - cu[:-1][seq_idx] + seen[seq_idx]
        return self._forward(to_device(ids), positions, tbl, seq_idx, qlens, cu, to_device)

    def _seen_of(self, reqs: Sequence[Request], lens: np.ndarray) -> np.ndarray:
        """Each sequence's positions whose draft rows are real (0: new, or preempted since);
        at most all but its last token, which the catch-up must run to draft."""
        seen_map = self._seen
        if len(seen_map) > 2 * len(reqs) + 64:  # finished requests' entries
            for r in [r for r in seen_map if r.is_finished]:
                del seen_map[r]
        got = (seen_map.get(r, (-1, 0)) for r in reqs)
        seen = np.fromiter(
            (n if e == r.num_preemptions else 0 for r, (e, n) in zip(reqs, got)), np.int64,
            len(reqs),
        )  # fmt: skip
        return np.minimum(seen, lens - 1)

    def _forward(
        self,
        ids: torch.Tensor,
        positions: np.ndarray,
        tbl: np.ndarray,
        seq_idx: np.ndarray,
        qlens: np.ndarray,
        cu: np.ndarray,
        to_device: Callable[[np.ndarray], torch.Tensor],
        fixed: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """One draft forward, each sequence's last row projected: its logits [B, V] on the
        device. `fixed`: `tbl`, `cu` (int32) and the projected rows already on the device (the
        one-token forwards of a step share them)."""
        bs = self.block_size
        slots = tbl[seq_idx, positions // bs].astype(np.int64) * bs + positions % bs
        seq_lens = positions[cu[1:] - 1] + 1
        if fixed is None:
            fixed = (to_device(tbl), to_device(cu.astype(np.int32)), to_device(cu[1:] - 1))
        decodes = len(qlens) if int(qlens.max()) == 1 else 0
        meta = AttentionMetadata.from_host(qlens, seq_lens, decodes, slots, bs, to_device,
                                           fixed[1], fixed[0])  # fmt: skip
        for backend in self.backends:
            backend.prepare(meta)
        return self.model.forward(ids, to_device(positions), self.kv_caches, meta, fixed[2])
