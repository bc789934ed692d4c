"""GrammarBitmask: the model runner's one hook for constrained rows (fill + apply, per step).

Per step with constrained rows (`grammar_rows`, recomputed only when the batch changes):

1. Each constrained request's matcher catches up with its output tokens: the usual single new
   token per request goes through xgrammar's batched `accept_token` in one call; rebuilt or
   lagging requests feed theirs one by one.
2. Their bitmasks (1 bit per vocabulary entry: allowed) are filled on the host in one batched
   xgrammar call into a preallocated buffer (pinned on CUDA). Near the end of its budget a
   request is steered to a complete output (`matcher.Closer`): first, where only a few tokens
   are allowed and the grammar lets the open array or object close (or end), that is the only
   token allowed; at the very end, the way out's tokens one by one.
   A row that allows nothing at all (a grammar with a dead end) allows EOS alone.
3. The masks are applied to the logits in place (-inf where not allowed) before the sampler
   runs, so penalties, temperature, top-k/top-p/min-p, seeds, logprobs (over the allowed tokens,
   as vLLM reports them) and `n` work unchanged on the masked rows. CPU: `mask_kernel` (C, a
   word of 32 tokens at a time; xgrammar's kernel without a compiler). CUDA: the masks are
   copied without a sync and unpacked by `apply_bitmask_torch` (a few PyTorch ops, no JIT).
   A row whose allowed tokens all have -inf logits from the model (ids a pruned LM head never
   scores) while others are finite gets logit 0 on them (`allowed_tokens.keep_allowed`): it
   still draws an allowed token (greedy the first, sampled a uniform one), not `NO_TOKEN`.

Requests without a constraint are never looked at in steps whose batch did not change, and a
batch without constrained rows costs one list scan when it changes (`grammar_rows`).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from pagoda.runtime.sampling.allowed_tokens import keep_allowed, lost_rows
from pagoda.runtime.structured import mask_kernel

log = logging.getLogger(__name__)
STRUCTURAL = 4  # soft steering closes where fewer than vocabulary size / this tokens are allowed
_SHIFTS: dict[torch.device, torch.Tensor] = {}


def grammar_rows(reqs: list[Any]) -> list[int]:
    """Rows of `reqs` whose output is constrained."""
    return [i for i, r in enumerate(reqs) if r.params.structured_outputs is not None]


def apply_bitmask_torch(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """logits[rows[i], t] = -inf where bit t of bitmask[i] is 0 (bit t % 32 of int32 word t // 32,
    xgrammar's layout); logits [N, V], bitmask [R, ceil(V / 32)] int32, rows [R] int64, all on
    one device."""
    v = logits.shape[1]
    allowed = _unpack(bitmask, v)
    was = logits.index_select(0, rows)
    masked = was.masked_fill(~allowed, float("-inf"))
    # the allowed tokens all -inf in the model's row (a pruned LM head's ids): all alike
    lost = lost_rows(was, masked.amax(-1, keepdim=True))
    logits.index_copy_(0, rows, keep_allowed(masked, allowed, lost))


def _row_max(logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """[R] the maxima of `logits`' `rows` (CPU: each row read in place, no copy)."""
    return torch.stack([logits[i].amax() for i in rows])


def _unpack(bitmask: torch.Tensor, v: int) -> torch.Tensor:
    """[R, V] bool (allowed) from xgrammar's [R, ceil(V / 32)] int32 bitmask."""
    shifts = _SHIFTS.get(bitmask.device)
    if shifts is None:
        shifts = _SHIFTS[bitmask.device] = torch.arange(
            32, device=bitmask.device, dtype=torch.int32
        )
    return ((bitmask.unsqueeze(-1) >> shifts) & 1).flatten(1)[:, :v].bool()


def soft_close(row: torch.Tensor, closes: list[int], vocab_size: int) -> int | None:
    """Soft steering: the first of `closes` (EOS, `]`, `}`) a bitmask row allows, where it
    allows few tokens (between values, not inside a string); else None."""
    if _count(row) >= vocab_size // STRUCTURAL:
        return None
    return next((t for t in closes if _allows(row, t)), None)


def _only(row: torch.Tensor, token: int) -> None:
    """A bitmask row allowing `token` alone."""
    row.zero_()
    row[token // 32] = 1 << (token % 32) if token % 32 != 31 else -(1 << 31)


def _allows(row: torch.Tensor, token: int) -> bool:
    return bool((int(row[token // 32]) >> (token % 32)) & 1)


def _count(row: torch.Tensor) -> int:
    """Tokens a bitmask row allows."""
    return int(np.unpackbits(row.numpy().view(np.uint8)).sum())


class GrammarBitmask:
    """Fills and applies the bitmasks of a step's constrained rows (one per model runner)."""

    def __init__(self, tokenizer: Any, vocab_size: int, device: torch.device) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.device = device
        self.words = (vocab_size + 31) // 32
        # CPU: apply as CUDA does (`apply_bitmask_torch`), for tests of that path
        self.torch_apply = False
        self._host: torch.Tensor | None = None  # [rows, words] int32, grown on demand
        self._ready = False

    def _setup(self) -> None:
        import xgrammar as xgr
        from pagoda.runtime.structured.compiler import compiler_for

        self.xgr = xgr
        self.compiler = compiler_for(self.tokenizer, self.vocab_size)
        self.closer = self.compiler.closer
        self.batch = xgr.BatchGrammarMatcher(max_threads=1)
        self._ready = True

    def _buffer(self, n: int) -> torch.Tensor:
        if self._host is None or self._host.shape[0] < n:
            rows = max(n, 2 * (self._host.shape[0] if self._host is not None else 8))
            pin = self.device.type == "cuda"
            self._host = torch.empty((rows, self.words), dtype=torch.int32, pin_memory=pin)
        return self._host

    def state_of(self, req: Any):
        """The request's GrammarState, made (and its grammar compiled, offline) on first use."""
        state = req.grammar
        if state is None:
            from pagoda.runtime.structured.matcher import GrammarState

            spec = req.params.structured_outputs
            state = req.grammar = GrammarState(self.compiler.compile(spec))
            state.printable = spec.compact_json
        return state

    @torch.inference_mode()
    def apply(self, logits: torch.Tensor, reqs: list[Any], rows: list[int]) -> None:
        """Mask the constrained `rows` of `logits` [len(reqs), V] in place (see the module
        docstring). Rows of requests that already finished are left alone (their token is
        dropped)."""
        if not self._ready:
            self._setup()
        live = [i for i in rows if not reqs[i].is_finished]
        if not live:
            return
        states = [self.state_of(reqs[i]) for i in live]
        outputs = [reqs[i].output_token_ids for i in live]
        self._catch_up(states, outputs)
        host = self._buffer(len(live))
        at = range(len(live))  # row j of the masks is the logits row live[j]
        free, free_at, soft, printable = [], [], [], []
        for state, j, i in zip(states, at, live):
            req = reqs[i]
            left = req.max_new_tokens - req.num_output_tokens
            token, steer = (
                (self.closer.stop, False) if state.broken else state.steer(self.closer, left)
            )
            if token is None:
                free.append(state.matcher)
                free_at.append(j)
                if steer:
                    soft.append(j)
                if state.printable:
                    printable.append(j)
            else:
                _only(host[j], token)
        if free:
            self.batch.batch_fill_next_token_bitmask(free, host, free_at)
        if printable:  # compact JSON never holds a byte below 0x20 (see `compiler.printable`)
            host[printable] &= self.compiler.printable
        if free_at:  # output is text: no invalid UTF-8 (see `compiler.utf8`)
            valid, after = self.compiler.utf8
            host[free_at] &= valid
            for j, i in zip(free_at, (live[k] for k in free_at)):
                out = reqs[i].token_ids
                ban = after.get(out[-1]) if reqs[i].num_output_tokens else None
                if ban is not None:
                    host[j] &= ban
        for j in soft:  # near the end, between values: close rather than open something new
            close = soft_close(host[j], self.closer.closes, self.vocab_size)
            if close is not None:
                _only(host[j], close)
        if free_at and self.closer.stop is not None:  # a dead end (nothing allowed): stop,
            # rather than sample from all -inf (NaN logprobs, an arbitrary token)
            dead = (host[free_at] == 0).all(dim=1).nonzero().flatten().tolist()
            for k in dead:
                j = free_at[k]
                log.warning("grammar allows no token after %d output tokens; ending the request",
                            reqs[live[j]].num_output_tokens)  # fmt: skip
                _only(host[j], self.closer.stop)
        self._mask_logits(logits, host[: len(live)], live)

    def _mask_logits(self, logits: torch.Tensor, mask: torch.Tensor, live: list[int]) -> None:
        """Set to -inf what the host bitmask `mask` (row j for logits row `live[j]`) bans: on
        CUDA (or with `torch_apply`) in torch, else with the native kernel, else xgrammar's."""
        rows_t = torch.tensor(live, dtype=torch.long)
        if self.device.type == "cuda" or self.torch_apply:  # pinned: copied without a sync
            if self.device.type == "cuda":
                rows_t = rows_t.pin_memory().to(self.device, non_blocking=True)
                mask = mask.to(self.device, non_blocking=True)
            apply_bitmask_torch(logits, mask, rows_t)
            return
        before = _row_max(logits, live)
        self._mask_logits_cpu(logits, mask, live, rows_t)
        # the allowed tokens all -inf in the model's row (a pruned LM head's ids): all alike,
        # as `apply_bitmask_torch` does (on the CPU, where a test is free: only such rows)
        lost = torch.isfinite(before) & (_row_max(logits, live) == float("-inf"))
        if lost.any():
            at = lost.nonzero().flatten()
            kept = logits.index_select(0, rows_t[at])
            allowed = _unpack(mask[at], logits.shape[1])
            logits.index_copy_(0, rows_t[at], keep_allowed(kept, allowed, lost[at, None]))

    def _mask_logits_cpu(self, logits, mask, live: list[int], rows_t: torch.Tensor) -> None:
        if mask_kernel.available() and logits.is_contiguous():
            mask_kernel.apply_mask(logits, mask, rows_t)
        else:  # no C compiler: xgrammar's kernel, masks at the rows' positions
            full = torch.full((logits.shape[0], self.words), -1, dtype=torch.int32)
            full[rows_t] = mask
            self.xgr.apply_token_bitmask_inplace(logits, full, indices=live)

    def _catch_up(self, states: list, outputs: list[list[int]]) -> None:
        """Every matcher consumes its request's new tokens: single tokens in one batched call."""
        one, tokens, singles = [], [], []
        for state, out in zip(states, outputs):
            n = state.pending(out)
            if n == 1 and not state.broken:
                one.append(state)
                tokens.append(out[-1])
            elif n < 0:
                log.info("grammar state rebuilt from %d output tokens", len(out))
                state.rebuild(out)
            elif n > 1:
                singles.append((state, out))
        if one:
            accepted = self.batch.batch_accept_token([s.matcher for s in one], tokens)
            for state, t, ok in zip(one, tokens, accepted):
                state.accept_one(t, ok)
                if not ok:
                    log.error("grammar refused a sampled token %d; ending the request", t)
        for state, out in singles:
            state.accept(out)
