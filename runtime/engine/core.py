"""EngineCore: one step = schedule → run the model → fold sampled tokens back into requests.

Synchronous and single-threaded by design; `AsyncEngine` runs it on its own thread for the
server, `LLM` drives it directly for offline batches.

On CUDA the host work of building a step's outputs (incremental detokenization, `StepOutput`s)
overlaps the next step's forward: `step()` queues step N on the device, then emits step N-1's
outputs while the GPU runs, then reads step N's tokens back. Everything that decides what runs
next (appending tokens, EOS/length stops, stop strings, freeing finished requests) still
happens before the next schedule, so the tokens are the same; outputs arrive one step later.
On the CPU the forward runs on the host itself, so there is nothing to overlap and outputs are
emitted in their own step.

With async scheduling (`--async-scheduling`, as vLLM v1's) the host also schedules and launches
step N+1 before reading step N back: each request sampling in step N counts its token as known
(`Request.num_pending`), and the runner gathers that token on the device. The host's schedule,
input preparation and bookkeeping then hide behind the device's forward instead of adding to it.
What it costs: a request that stops (EOS, stop string) at step N has already been scheduled in
step N+1, whose row is computed and dropped; the length limit is known ahead and never wasted.
Steps run synchronously while a request with penalties is running (they need the host's token
counts). Tokens are the same as without it (each request's draws come from its own generator in
the same order; greedy output relies on batch invariance, the default).

A request's checks and its `n` samples are built in `engine/request_intake.py`; what a config
asks of its model is refused at the start in `engine/start_checks.py`.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import functools
import gc
import logging
import time
from collections.abc import Callable, Sequence

import torch
from pagoda.runtime.config import EngineConfig, ModelConfig
from pagoda.runtime.core.kv_cache_manager import KVCacheManager
from pagoda.runtime.core.scheduler import Scheduler
from pagoda.runtime.cpu.host_memory import release_freed_memory
from pagoda.runtime.engine import recurrent, request_intake
from pagoda.runtime.engine.deferred import Deferred
from pagoda.runtime.engine.output_processor import OutputProcessor
from pagoda.runtime.engine.outputs import EngineStats, StepOutput
from pagoda.runtime.engine.pooling import check_pooling, finish_pooled
from pagoda.runtime.engine.start_checks import (
    check_block_size,
    check_dtype,
    check_max_model_len,
    check_speculative,
)
from pagoda.runtime.lora import engine as lora
from pagoda.runtime.model.loader import LoadedModel, load_model
from pagoda.runtime.multimodal import processor_kwargs
from pagoda.runtime.pooler_config import with_runner
from pagoda.runtime.request import FIRST_FINISHED, Request, RequestStatus
from pagoda.runtime.sampling.bad_words import needs_history
from pagoda.runtime.sampling.bans import check_bans_leave_tokens
from pagoda.runtime.sampling.params import SamplingParams
from pagoda.runtime.spec.draft_model import check_loaded
from pagoda.runtime.spec.drafter import Drafter
from pagoda.runtime.worker.model_runner import ModelRunner
from pagoda.runtime.worker.outputs import LaunchedStep, ModelRunnerOutput
from pagoda.runtime.worker.step_clock import StepClock

log = logging.getLogger(__name__)


class EngineCore:
    """With `config.parallel.tensor_parallel_size` > 1 this process is rank 0 of a group
    (`pagoda.runtime.distributed`): it starts the other ranks and sends them every step;
    `on_failure` hears, from another thread, that one of them died. `close()` stops them."""

    def __init__(
        self,
        config: EngineConfig,
        loaded: LoadedModel | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        loaded = loaded or load_model(config.model)
        self.model_name = loaded.name
        # (the image processor as --mm-processor-kwargs sets it: the images' preprocessing)
        self.model_config = processor_kwargs.served(loaded.config, config.mm_processor_kwargs)
        self.tokenizer = loaded.tokenizer
        self.sampling_defaults = dict(loaded.sampling_defaults)  # generation_config.json's
        config = with_runner(config, loaded.path, loaded.config.hidden_size)  # --runner auto
        check_pooling(config, loaded.config)
        check_dtype(config, loaded.config)
        check_block_size(config, loaded.config)
        check_speculative(config, loaded.config)
        if config.lora is not None:  # a family whose layers take adapters (`lora/slots.py`)
            from pagoda.runtime.lora_config import check_model

            check_model(loaded.config)
        limit = check_max_model_len(config.scheduler.max_model_len, loaded.config)
        draft = load_draft(config, loaded)
        self.executor = start_group(config, loaded.config, limit, on_failure)
        tp = self.executor.group if self.executor is not None else None
        try:  # a failed start stops the other ranks and leaves the group (a new one can start)
            self.runner = ModelRunner(config, loaded, limit, tp, draft)
            del loaded, draft  # the checkpoints' tensors (unless the caller holds them): garbage
            self._start(config, limit)
        except BaseException:
            if self.executor is not None:
                self.executor.close()
            raise

    def _start(self, config: EngineConfig, limit: int) -> None:
        """The rest of the start once the runner is built: cache, scheduler, CUDA graphs."""
        bs = config.cache.block_size
        capacity = self.runner.num_blocks * bs
        if limit > capacity:
            log.warning(
                "max_model_len %d exceeds the KV cache (%d tokens); capping", limit, capacity
            )
            limit = capacity
        self.max_model_len = limit
        if config.scheduler.max_model_len != limit:  # left to the model, or capped to the cache
            config = config.with_max_model_len(limit)
        config = config.with_device_defaults()
        config, snapshots = recurrent.snapshots(config, self.model_config, self.runner)
        self.config = config
        self.kv = KVCacheManager(
            self.runner.num_blocks, bs, config.cache.enable_prefix_caching, snapshots
        )
        gate = None if config.lora is None else lora.LoRAGate(config.lora.max_loras)
        self.scheduler = Scheduler(config.scheduler, self.kv, lora=gate)
        for module in () if config.lora is None else config.lora.lora_modules:
            self.add_lora(module)  # --lora-modules: each read and checked at start
        self.runner.capture_cuda_graphs(config.scheduler.max_num_seqs, limit)
        self.outputs = OutputProcessor(self.tokenizer)
        self.clock: StepClock | None = None  # per-phase timing, see `enable_step_clock`
        # Emit a step's outputs during the next step's forward (module docstring).
        self.overlap_outputs = self.runner.device.type == "cuda"
        self._pending: ModelRunnerOutput | None = None
        self.async_scheduling = config.uses_async_scheduling()
        self._inflight: LaunchedStep | None = None  # async: launched, not read back yet
        self._penalized: set[str] = set()  # requests whose steps must run synchronously
        # speculative decoding: drafts and their counters (refused families: `check_speculative`)
        spec = config.speculative_config
        self.drafter = Drafter(spec) if spec is not None else None
        self.spec_stats = self.drafter.stats if self.drafter is not None else None
        # Start-up objects (weights, tokenizer, graphs) never die: keep the collector off them,
        # or a full collection every few hundred steps stalls a step by milliseconds.
        gc.collect()
        gc.freeze()
        # Frozen objects are never collected, not even at exit; Triton's nanobind bindings then
        # print ~40 lines of "leaked" types at exit. Unfreeze at exit (registered once).
        atexit.unregister(gc.unfreeze)
        atexit.register(gc.unfreeze)
        if self.runner.device.type == "cpu":
            release_freed_memory()  # the load's float32 temporaries, kept by the heap settings

    def enable_step_clock(self) -> StepClock:
        """Time every step by phase from now on (benchmarks); returns the shared clock."""
        sync = torch.cuda.synchronize if self.runner.device.type == "cuda" else None
        self.clock = self.runner.clock = StepClock(sync)
        return self.clock

    # -- requests ------------------------------------------------------------------------
    def validate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> SamplingParams:
        """Raise ValueError (naming the field) for input the engine cannot serve; returns the
        params validated as they are now (a copy: SamplingParams are mutable, as vLLM's;
        `engine/request_intake.py`)."""
        return request_intake.validate(self, prompt_token_ids, params)

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        *,
        checked: bool = False,
        bulk: bool = False,
    ) -> None:
        """Add a request (ValueError for input the engine cannot serve, nothing added).

        `bulk`: one prompt of a request of several sequences (prompts x n), or any request
        with `n` > 1: its sequences yield blocks to single-sequence requests (scheduler.py).

        `checked`: the caller's own validated copy of the params, never changed after, with a
        prompt that passed `EngineInfo.validate` against this core (`AsyncEngine`'s requests,
        in a thread or an engine process): they are neither copied nor checked again, which
        saved the engine loop a `validated()` copy and a Python scan of the prompt's ids per
        arrival (~30 us + ~0.3 us a token on a 2-core Xeon)."""
        if not checked:
            params = self.validate(prompt_token_ids, params)  # later changes reach no request
        elif params.structured_outputs is not None:  # compiled already: a cache hit
            request_intake.compile_grammar(self, params.structured_outputs)
        if request_id in self.outputs:
            raise ValueError(f"duplicate request id {request_id!r}")
        bad_words = request_intake.bad_words_of(self, params) if params.bad_words else ()
        mc = self.model_config
        check_bans_leave_tokens(params, mc.eos_token_ids, mc.vocab_size, bad_words)
        if params.lora_request is not None:  # read (or found) now: a bad adapter fails here
            self.add_lora(params.lora_request)
        reqs = request_intake.samples(self, request_id, prompt_token_ids, params, bad_words, bulk)
        self.outputs.add(request_id, reqs)
        for req in reqs:
            self.scheduler.add_request(req)
            if req.wants_prompt_logprobs:
                self.runner.prompt_logprob_requests[req.request_id] = req
            if params.needs_penalties or needs_history(bad_words):  # need the host's tokens
                self._penalized.add(req.request_id)

    def add_lora(self, request) -> None:
        """Read a LoRA adapter into host memory (or find it there), checked against the model;
        ValueError for a bad one (or without --enable-lora), the engine unharmed."""
        if self.runner.lora is None:
            raise ValueError("LoRA adapters are not enabled on this engine (--enable-lora)")
        self.runner.lora.adapter(request)

    def read_lora(self, request) -> concurrent.futures.Future | None:
        """Start reading `request`'s adapter off the engine thread (`LoRASlots.start_read`);
        None when there is nothing to wait for (no adapter, in host memory, or no --enable-lora:
        then `add_lora` answers at once). Once the future is done, `add_lora` takes it."""
        if request is None or self.runner.lora is None:
            return None
        return self.runner.lora.start_read(request)

    def load_lora(self, request) -> Deferred | None:
        """`POST /v1/load_lora_adapter`'s call: the adapter read off the engine thread, then
        checked in (`add_lora`) by the loop (`engine/deferred.py`); None: done already."""
        read = self.read_lora(request)
        if read is None:
            self.add_lora(request)
            return None
        return Deferred(read, functools.partial(EngineCore.add_lora, request=request))

    def remove_lora(self, lora_int_id: int) -> bool:
        """Forget an adapter (requests already running with it finish with it)."""
        return self.runner.lora is not None and self.runner.lora.remove(lora_int_id)

    def abort_request(self, request_id: str) -> None:
        """Abort every sample of a request; its blocks are freed at once."""
        for cid in self.outputs.abort(request_id):
            self.scheduler.abort(cid)
            self._penalized.discard(cid)
            self.runner.prompt_logprob_requests.pop(cid, None)

    def has_unfinished_requests(self) -> bool:
        return (
            self.scheduler.has_unfinished()
            or self._pending is not None
            or self._inflight is not None
        )

    # -- the step --------------------------------------------------------------------------
    def step(self) -> list[StepOutput]:
        if self.executor is not None:
            self.executor.check()  # a rank is gone: never wait on it
        if self.async_scheduling:
            return self._step_async()
        clock = self.clock
        if clock is not None:
            clock.start()
        if self.drafter is not None:
            self.drafter.propose(self.scheduler.running)
            if clock is not None:
                clock.mark("propose")
        out = self.scheduler.schedule()
        if out.is_empty:
            return self._emit_pending()
        self.kv.record_peak(out.scheduled)
        if clock is not None:
            clock.mark("schedule")
        launched = self.runner.execute_model(out)  # queued on the device, not waited for
        outputs = self._emit_pending()  # the previous step's, while the device works
        result = self.runner.readback(launched)
        self.scheduler.update_after_step(out)
        self._update(result)
        if self.overlap_outputs:
            self._pending = result
        else:
            outputs += self.outputs.process(result, self.clock)
        return outputs

    def _step_async(self) -> list[StepOutput]:
        """Schedule and launch step N+1, then read step N back while the device runs N+1."""
        clock = self.clock
        if clock is not None:
            clock.start()
        prev, self._inflight, outputs = self._inflight, None, []
        if prev is not None and self._penalized:
            outputs, prev = self._finish(prev), None  # penalties need every token on the host
        if self.drafter is not None:  # drafts for the requests read back (none in flight)
            self.drafter.propose(self.scheduler.running)
        out = self.scheduler.schedule()
        if not out.is_empty:
            self.kv.record_peak(out.scheduled)
            if clock is not None:
                clock.mark("schedule")
            launched = self.runner.execute_model(out)
            self.scheduler.update_after_step(out)
            if launched.deferred is not None:  # constrained rows: their masks need step N
                if prev is not None:
                    outputs += self._finish(prev)
                    prev = None
                self.runner.sample_deferred(launched)
            for req in launched.samplers:
                req.num_pending += 1
            self._inflight = None if launched.empty else launched
        if prev is not None:
            outputs += self._finish(prev)
        return outputs

    def _finish(self, launched: LaunchedStep) -> list[StepOutput]:
        """Read an async step back, fold its tokens in and build its outputs."""
        result = self.runner.readback(launched)
        for req in launched.samplers:
            req.num_pending -= 1
        # stopped or aborted meanwhile: dropped (a drafted step's by `_update`)
        if result.spec is None and any(r.is_finished for r in result.requests):
            keep = [i for i, r in enumerate(result.requests) if not r.is_finished]
            result = ModelRunnerOutput(
                [result.requests[i] for i in keep],
                [result.token_ids[i] for i in keep],
                [result.logprobs[i] for i in keep],
                result.prompt_logprobs,
            )
        self._update(result)
        return self.outputs.process(result, self.clock)

    def _update(self, result: ModelRunnerOutput) -> None:
        """Fold the sampled tokens into their requests and settle which ones finished, before
        anything is scheduled again (stop strings need the text, so those detokenize here).
        A request with drafts gains several tokens, one entry each, folded in order: those
        after one that ends it are dropped, and its computed tokens go back to those accepted."""
        if result.pooled is not None:  # the pooling runner: those prompts end (engine/pooling.py)
            finish_pooled(self.scheduler, result.pooled[0])
        now = time.monotonic()
        check_stop_string = self.outputs.check_stop_string
        for req, entries in result.prompt_logprobs:  # before the first token's output
            req.prompt_logprobs.extend(entries)
        drafted, dropped = result.spec is not None, []
        # once per request per step: attribute reads, no calls on the common path
        for i, (req, tok, lp) in enumerate(zip(result.requests, result.token_ids, result.logprobs)):
            if drafted and req.status >= FIRST_FINISHED:  # an earlier token of its drafts ended it
                dropped.append(i)
                continue
            if tok < 0:  # no token: the row's logits had no finite maximum (NaN, overflow)
                self._fail_request(req)
                continue
            ids = req.token_ids
            ids.append(tok)  # Request.append_token
            if lp is not None:
                req.logprobs.append(lp)
            if req.first_token_time is None:
                req.first_token_time = now
            # check_stop_token decides; most tokens meet neither of its conditions
            if tok in req.stop_ids or len(ids) - req.num_prompt_tokens >= req.max_new_tokens:
                req.check_stop_token()
            if req.params.stop:
                check_stop_string(req, tok)
            if req.status >= FIRST_FINISHED:
                self.scheduler.finish(req)
                self._penalized.discard(req.request_id)
        if self.drafter is not None:  # (a draft model's drafts come after any step)
            self.drafter.settle(result, dropped)
        if self.clock is not None:
            self.clock.mark("update")

    def _fail_request(self, req: Request) -> None:
        """End a request whose step gave no token (finish reason "error"); the others of the
        batch go on. Its blocks are freed now; the output processor reports it."""
        log.error("request %s: the model produced non-finite logits (NaN or Inf); it ends "
                  "with an error", req.request_id)  # fmt: skip
        req.status = RequestStatus.FINISHED_ERROR
        self.scheduler.finish(req)
        self._penalized.discard(req.request_id)

    def _emit_pending(self) -> list[StepOutput]:
        pending, self._pending = self._pending, None
        return self.outputs.process(pending, self.clock) if pending is not None else []

    def reset_counters(self) -> None:
        """Zero the cumulative counters of `stats` (prefix-cache and encoder-cache lookups,
        preemptions)."""
        self.kv.prefix_queries = self.kv.prefix_hits = 0
        self.scheduler.num_preemptions = 0
        if self.spec_stats is not None:
            self.spec_stats.reset()
        if getattr(self.runner, "encoder_cache", None) is not None:
            self.runner.encoder_cache.reset_counters()

    def stats(self) -> EngineStats:
        stats = EngineStats(
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting,
            kv_usage=self.kv.usage(),
            num_blocks=self.kv.num_blocks,
            num_free_blocks=self.kv.num_free_blocks,
            prefix_queries=self.kv.prefix_queries,
            prefix_hits=self.kv.prefix_hits,
            num_preemptions=self.scheduler.num_preemptions,
        )
        if self.config.lora is not None:  # vLLM's lora_requests_info
            stats.lora_running = lora.adapter_names(self.scheduler.running)
            stats.lora_waiting = lora.adapter_names(self.scheduler.waiting)
            stats.max_lora = self.config.lora.max_loras
        spec = self.spec_stats
        if spec is not None:
            stats.spec_num_drafts = spec.num_drafts
            stats.spec_num_draft_tokens = spec.num_draft_tokens
            stats.spec_num_accepted_tokens = spec.num_accepted_tokens
            stats.spec_accepted_per_pos = list(spec.accepted_per_pos)
        cache = getattr(self.runner, "encoder_cache", None)
        if cache is not None:  # a vision model's encoder cache (`worker/encoder_cache.py`)
            stats.mm_encoder_cache = True
            stats.mm_encoder_cache_queries = cache.queries
            stats.mm_encoder_cache_hits = cache.hits
        return stats

    def check_integrity(self) -> None:
        self.kv.check_integrity()

    def close(self) -> None:
        """Stop the other tensor-parallel ranks, if any (idempotent)."""
        if self.executor is not None:
            self.executor.close(self.runner.channel if hasattr(self, "runner") else None)


def load_draft(config: EngineConfig, target: LoadedModel) -> LoadedModel | None:
    """The draft model's checkpoint (speculative decoding's "draft_model" method), checked
    against the target's once loaded (`check_loaded`); None without one."""
    spec = config.speculative_config
    if spec is None or spec.draft_model is None:
        return None
    draft = load_model(spec.draft_model)
    check_loaded(spec.draft_model, target, draft)
    return draft


def start_group(config: EngineConfig, model: ModelConfig, max_model_len: int, on_failure):
    """The executor of a tensor-parallel group (its other ranks started and joined), or None
    for one rank. ValueError when the model cannot be split that way."""
    if config.parallel.tensor_parallel_size == 1:
        return None
    from pagoda.runtime.distributed.layout import check
    from pagoda.runtime.engine.executor import Executor

    check(model, config.parallel.tensor_parallel_size)
    return Executor(config, max_model_len, on_failure)
