"""Iteration-level scheduler with chunked prefill, prefix reuse and preemption by recompute.

Each step: running decodes first, then running partial prefills, then waiting requests, all
under `max_num_batched_tokens` and `max_num_seqs`. When blocks run out, the most recently
arrived running request is preempted (its blocks freed, recomputed later from the queue front).

Sequences of multi-sequence requests (`Request.bulk`: prompts x n, engine/admission.py) yield to
single-sequence requests for blocks too, as they do for batch slots: a bulk sequence is
preempted before any single one, and a waiting single request is admitted before waiting bulk
sequences (preempted ones included), so a request of n=8 x 1,500 tokens that fills the KV cache
does not hold a 3-token request back until its sequences finish (56 s before, on the test
server). That yielding is capped: a bulk sequence that arrived more than `BULK_MAX_WAIT_S`
ago is treated as a single one again (admitted and preempted in arrival order like any other),
so a steady stream of single requests cannot starve a bulk request forever.
With chunked prefill, the prompt chunks of requests asking prompt logprobs add up to at most
`PROMPT_LOGPROB_ROWS` tokens a step: each of them is a row of logits (vocabulary-wide) the step
holds beside the sampling rows'.

A long prompt does not stall the others (vLLM's `long_prefill_token_threshold`): while any other
request is running or waiting, a prefill chunk is at most `long_prefill_token_threshold` tokens,
so the step stays short and the rest of the budget goes to decodes and new prompts. Alone, a
prompt takes the whole budget (nothing waits on it). 0 turns the cap off.

A hybrid model's prefix caching (`core/state_snapshots.py`): a prefill chunk cut short of its
prompt's end (by the budget or the cap) ends on a multiple of the SSD chunk where one lies in
it, so the next chunk starts on one; each step plans the state copies (`SnapshotPlan`): a
hit's snapshot restored into its slot, the boundaries its prefill chunks reach saved.

A model whose image tokens attend to each other both ways (Gemma 3) never has an image split
across prefill chunks (`multimodal.inputs.whole_images`, vLLM's rule): a chunk that would end
inside an image ends before it; one starting at (or, after a prefix-cache hit, inside) an image
takes the rest of it past the long-prefill cap, or waits for a step whose budget holds it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from pagoda.runtime.config import SchedulerConfig
from pagoda.runtime.core.kv_cache_manager import KVCacheManager
from pagoda.runtime.core.sched_output import ScheduledRequest, SchedulerOutput, SnapshotPlan
from pagoda.runtime.lora.engine import LoRAGate
from pagoda.runtime.multimodal.inputs import whole_images
from pagoda.runtime.request import RUNNING, Request, RequestStatus

PROMPT_LOGPROB_ROWS = 1024  # a step's logits rows for prompt logprobs (chunked prefill)
# How long after its arrival a bulk sequence still yields to single-sequence requests (for batch
# slots and KV blocks); older, it is scheduled in arrival order like any request (no starvation)
BULK_MAX_WAIT_S = 60.0


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        kv: KVCacheManager,
        clock: Callable[[], float] = time.monotonic,
        lora: LoRAGate | None = None,
    ) -> None:
        """`lora`: the limit on distinct LoRA adapters among running requests (`lora/engine.py`)."""
        self.config = config
        self.lora = lora
        self.kv = kv
        self.clock = clock  # `Request.arrival_time`'s clock
        self.bulk_max_wait_s = BULK_MAX_WAIT_S
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0
        self._scored_room = PROMPT_LOGPROB_ROWS  # this step's (`_scored_chunk`)
        # a hybrid's prefix caching: this step's prefill rows, and its hits' snapshot entries
        self.snapshots = kv.snapshots
        self._prefills: list[Request] = []
        self._restores: dict[str, int] = {}

    # -- queue management -------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        if req.request_id in self.requests:
            raise ValueError(f"duplicate request id {req.request_id!r}")
        self.requests[req.request_id] = req
        self.waiting.append(req)

    def abort(self, request_id: str) -> Request | None:
        """Drop a request wherever it is and free its blocks at once."""
        req = self.requests.get(request_id)
        if req is None or req.is_finished:
            return None
        req.status = RequestStatus.FINISHED_ABORTED
        self.finish(req)
        return req

    def finish(self, req: Request) -> None:
        """Forget a finished request and release its blocks."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.kv.free(req)
        self.requests.pop(req.request_id, None)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- the step ----------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        # the largest prefill chunk this step: capped while the request is not alone
        cap = self.config.long_prefill_token_threshold or 0
        if cap <= 0 or len(self.running) + len(self.waiting) <= 1:
            cap = budget  # off, or the request is alone: nothing waits on it
        plan: dict[str, ScheduledRequest] = {}
        preempted: list[Request] = []
        partial: list[Request] = []
        drafted = False  # a decode with drafts (speculative decoding) runs 1 + d tokens
        # the decode loop's fast path
        allocate, room, ids_of = self.kv.allocate_slots, self.kv.room, self.kv.req_block_ids
        # Decodes first, placed in the pass that finds them (a steady decode batch: one visit
        # per request); partial prefills after. A snapshot: preemption edits `running`.
        for req in list(self.running):
            # tokens in flight (async scheduling) count as known
            computed = req.num_computed_tokens
            if req.num_pending and req.takes_drafts:
                continue  # its drafts come from its tokens: scheduled once they are read back
            if len(req.token_ids) + req.num_pending - computed != 1:
                partial.append(req)
                continue
            if budget <= 0 or req.status != RUNNING:
                continue
            if req.num_pending and req.ends_with_pending:
                continue  # its last token is in flight: it finishes when that is read back
            rid = req.request_id
            if req.spec_token_ids:  # drafts: 1 + d tokens, within the budget and the blocks
                d = min(len(req.spec_token_ids), budget - 1)
                if d > 0 and allocate(req, 1 + d):
                    del req.spec_token_ids[d:]
                    plan[rid] = ScheduledRequest(req, 1 + d, ids_of[rid])
                    budget -= 1 + d
                    drafted = True
                    continue
                req.spec_token_ids = []  # decodes one token as usual
            # `allocate(req, 1)`, whose fast path (room in the last block) is this lookup
            if computed >= room.get(rid, 0) and not allocate(req, 1):
                fits, back = self._make_room(req, 1, plan, preempted)
                budget += back
                if not fits:
                    continue
            plan[rid] = ScheduledRequest(req, 1, ids_of[rid])
            budget -= 1
        budget = self._schedule_prefills(partial, plan, preempted, budget, cap)
        num_running = len(plan)
        if not preempted:
            self._admit_waiting(plan, budget, cap)
        scheduled = list(plan.values())
        if partial or drafted or len(plan) > num_running:  # decodes first (stable)
            scheduled.sort(key=lambda s: s.num_new_tokens != 1)
            num_decodes = sum(1 for s in scheduled if s.num_new_tokens == 1)
            num_tokens = sum(s.num_new_tokens for s in scheduled)
        else:
            num_decodes = num_tokens = len(scheduled)
        plan = self._snapshot_plan(scheduled) if self._prefills else None
        return SchedulerOutput(scheduled, num_decodes, num_tokens, preempted, plan)

    def _aligned(self, start: int, n: int, left: int) -> int:
        """A prefill chunk of `n` of the `left` tokens a request has to compute from `start`:
        cut short, it ends on a multiple of the SSD chunk where one lies in it, so the next
        chunk starts on one and the scan's chunk boundaries, where its snapshots are read, fall
        on the snapshot boundaries (`core/state_snapshots.py`)."""
        if self.snapshots is None or n >= left:
            return n
        end = start + n
        end -= end % self.snapshots.chunk
        return end - start if end > start else n

    def _snapshot_plan(self, scheduled: list[ScheduledRequest]) -> SnapshotPlan | None:
        """The step's snapshot copies: the hits' restores, the boundaries its prefill rows reach
        (`StateSnapshots.plan_saves`), for the rows the step kept (one preempted after it was
        planned is gone)."""
        prefills, restores = self._prefills, self._restores
        self._prefills, self._restores = [], {}
        row = {s.request.request_id: i for i, s in enumerate(scheduled)}
        plan = SnapshotPlan()
        for rid, entry in restores.items():
            if rid in row:
                plan.restores.append((row[rid], entry))
        caches = self.kv.caches
        for req in prefills:
            i = row.get(req.request_id)
            if i is None or not caches(req):
                continue
            start = req.num_computed_tokens
            end = start + scheduled[i].num_new_tokens
            saves = self.snapshots.plan_saves(req.block_hashes, start, end, req.num_prompt_tokens)
            plan.saves += [(i, b, entry) for b, entry in saves]
        return plan if plan.restores or plan.saves else None

    def _schedule_prefills(
        self,
        partial: list[Request],
        plan: dict[str, ScheduledRequest],
        preempted: list[Request],
        budget: int,
        cap: int,
    ) -> int:
        """Plan the running requests with more than one token to compute (prefill chunks), in
        order, after the decodes: each gets what is left of `budget`, at most `cap` tokens (with
        chunked prefill; without, its whole remainder or nothing). Returns the budget left."""
        allocate, block_ids = self.kv.allocate_slots, self.kv.block_ids
        chunked = self.config.enable_chunked_prefill
        snapshots = self.snapshots
        self._scored_room = PROMPT_LOGPROB_ROWS
        for req in partial:
            if budget <= 0 or req.status != RUNNING:
                continue
            if req.num_pending and req.ends_with_pending:
                continue
            n = len(req.token_ids) + req.num_pending - req.num_computed_tokens
            if n <= 0:
                continue
            if n > cap:
                n = cap
            if n > budget:
                if not chunked:
                    continue
                n = budget
            if chunked and req.wants_prompt_logprobs:
                n = self._scored_chunk(n)
                if n <= 0:
                    continue
            if snapshots is not None:
                left = len(req.token_ids) + req.num_pending - req.num_computed_tokens
                n = self._aligned(req.num_computed_tokens, n, left)
            n = whole_images(req.params.multi_modal, req.num_computed_tokens, n, budget)
            if n <= 0:
                continue
            if not allocate(req, n):
                fits, back = self._make_room(req, n, plan, preempted)
                budget += back
                if not fits:
                    continue
            plan[req.request_id] = ScheduledRequest(req, n, block_ids(req.request_id))
            budget -= n
            if snapshots is not None:
                self._prefills.append(req)
        return budget

    def _scored_chunk(self, n: int) -> int:
        """A chunk of a request asking prompt logprobs: `n` tokens cut to the step's room for
        scored rows, which it then takes (a chunk that then finds no blocks gives nothing
        back: the step only scores less)."""
        n = min(n, self._scored_room)
        self._scored_room -= n
        return n

    def _make_room(
        self, req: Request, n: int, plan: dict[str, ScheduledRequest], out: list[Request]
    ) -> tuple[bool, int]:
        """`req`'s `n` slots did not fit: preempt the most recently arrived running request
        (even `req` itself), bulk sequences first (those not aged past `bulk_max_wait_s`),
        until they do; (whether they fit, the budget given back)."""
        back = 0
        young = self.clock() - self.bulk_max_wait_s  # bulk sequences that arrived after it
        while True:
            victim = max(
                self.running, key=lambda r: (r.bulk and r.arrival_time > young, r.arrival_time)
            )
            back += self._preempt(victim, plan, out)
            if victim is req:
                return False, back
            if self.kv.allocate_slots(req, n):
                return True, back

    def _preempt(
        self, victim: Request, plan: dict[str, ScheduledRequest], out: list[Request]
    ) -> int:
        """Free a running request for recompute; returns the budget it gives back."""
        done = plan.pop(victim.request_id, None)
        self.running.remove(victim)
        self.kv.free(victim, uncache_this_step=done is not None)
        victim.status = RequestStatus.PREEMPTED
        victim.num_computed_tokens = 0
        victim.spec_token_ids = []
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(victim)
        out.append(victim)
        return done.num_new_tokens if done is not None else 0

    def _admit_waiting(self, plan: dict[str, ScheduledRequest], budget: int, cap: int) -> None:
        # single-sequence requests (and bulk ones aged past `bulk_max_wait_s`) first, in order
        # (only a queue that starts with a young bulk sequence has any behind one: scanned once
        # a step)
        first = None
        if self.waiting and self.waiting[0].bulk:
            young = self.clock() - self.bulk_max_wait_s
            if self.waiting[0].arrival_time > young:
                first = deque(r for r in self.waiting if not r.bulk or r.arrival_time <= young)
        held: list[Request] = []  # waiting for a LoRA slot: back at the front afterwards
        if self.lora is not None:
            self.lora.start_step(self.running)
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = first[0] if first else self.waiting[0]
            if req.num_pending:
                break  # preempted while a step of it was in flight: wait for its token
            if self.lora is not None and not self.lora.admits(req):
                held.append(req)  # its adapter would be one too many: the next may go
                self.waiting.remove(req)
                if first:
                    first.popleft()
                continue
            computed, num_cached = self.kv.get_computed_blocks(req)
            n = min(req.num_tokens - num_cached, cap)
            if n > budget:
                if not self.config.enable_chunked_prefill:
                    break
                n = budget
            if self.config.enable_chunked_prefill and req.wants_prompt_logprobs:
                n = self._scored_chunk(n)
                if n <= 0:
                    break
            n = self._aligned(num_cached, n, req.num_tokens - num_cached)
            n = whole_images(req.params.multi_modal, num_cached, n, budget)
            if n <= 0 or not self.kv.allocate_slots(req, n, computed):
                break
            if req is self.waiting[0]:
                self.waiting.popleft()
            else:
                self.waiting.remove(req)
            if first:
                first.popleft()
            self.kv.record_prefix_lookup(req, num_cached)
            req.num_computed_tokens = num_cached
            if req.num_preemptions == 0:
                req.num_cached_tokens = num_cached
            req.status = RequestStatus.RUNNING
            if req.first_scheduled_time is None:
                req.first_scheduled_time = time.monotonic()
            self.running.append(req)
            plan[req.request_id] = ScheduledRequest(req, n, self.kv.block_ids(req.request_id))
            budget -= n
            if self.snapshots is not None:
                self._prefills.append(req)
                if num_cached:  # the Mamba layers' state at the hit, restored into its slot
                    self._restores[req.request_id] = self.kv.snapshot_entry(req, num_cached)
        self.waiting.extendleft(reversed(held))

    def update_after_step(self, out: SchedulerOutput) -> None:
        """Advance progress of every scheduled request (tokens are appended by the engine)."""
        for s in out.scheduled:
            s.request.num_computed_tokens += s.num_new_tokens
        self.kv.end_step()
