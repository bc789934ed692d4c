"""ModelRunner: SchedulerOutput → input tensors → forward → sampled tokens.

Inputs are assembled on the host with NumPy (one slice of token ids per sequence, everything
else vectorised) and moved to the device in one copy per tensor. The only device→host transfer
is the sampled tokens (and their logprobs when asked), read back together at the end.

With async scheduling a step may be prepared before the previous step's tokens are read back:
a decode row whose token is still on the device gets it by a device-side gather from that step's
sampled tokens, and on CUDA the readback copies into pinned memory behind an event, so waiting
for step N does not wait for step N+1 queued after it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch
from pagoda.runtime.attention import AttentionBackend, AttentionMetadata, get_attention_backend
from pagoda.runtime.config import EngineConfig, ModelConfig, fp8_runs_on
from pagoda.runtime.core.sched_output import SchedulerOutput
from pagoda.runtime.cpu import qgemm
from pagoda.runtime.cpu.host_memory import keep_freed_memory
from pagoda.runtime.distributed.group import TPGroup
from pagoda.runtime.lora.slots import LoRASlots
from pagoda.runtime.model import alibi
from pagoda.runtime.model.llama import HIDDEN_STATES, SEQUENCE_STATE, TOKEN_HISTORY, LlamaModel
from pagoda.runtime.model.loader import LoadedModel
from pagoda.runtime.model.mamba2 import MAMBA_STEP
from pagoda.runtime.model.ops import select_ops
from pagoda.runtime.model.registry import build_model
from pagoda.runtime.quantization.fp8 import check_checkpoint_form, engine_scheme
from pagoda.runtime.request import Request, TokenLogprob
from pagoda.runtime.sampling.sampler import (
    HeadSampling,
    SamplerOutput,
    SamplingBatch,
    WholeSampler,
    head_sampling,
    sample,
)
from pagoda.runtime.spec import verify
from pagoda.runtime.spec.draft_model import (
    DraftModel,
    check_built,
    draft_batch,
    draft_block_bytes,
    prefill_batch,
    scratch_blocks,
)
from pagoda.runtime.structured.bitmask import GrammarBitmask, grammar_rows
from pagoda.runtime.worker import cache_budget, prompt_logprobs
from pagoda.runtime.worker.block_table import BlockTables
from pagoda.runtime.worker.cache_budget import CacheSize
from pagoda.runtime.worker.cuda_graph import CudaGraphRunner
from pagoda.runtime.worker.mamba_state import MambaState
from pagoda.runtime.worker.outputs import LaunchedStep, ModelRunnerOutput
from pagoda.runtime.worker.pooler import Pooler, pool_rows
from pagoda.runtime.worker.step_channel import StepChannel
from pagoda.runtime.worker.step_clock import StepClock
from pagoda.runtime.worker.step_inputs import StepInputs, token_history

log = logging.getLogger(__name__)


class ModelRunner:
    """With `tp`, this rank's part of a tensor-parallel model (`pagoda.runtime.distributed`):
    its heads, KV cache and weights; rank 0 sends every step to the others before running it."""

    def __init__(
        self,
        config: EngineConfig,
        loaded: LoadedModel,
        max_model_len: int,
        tp: TPGroup | None = None,
        draft: LoadedModel | None = None,
    ) -> None:
        self.config = config
        self.tp = tp
        self.device = tp.device if tp is not None else config.torch_device()
        self.dtype = config.torch_dtype()
        if self.device.type == "cpu":
            keep_freed_memory()  # reuse the heap for the step's large temporaries
        mc = loaded.config
        self.model_config = mc
        self.block_size = config.cache.block_size
        self.backend = self._attention_backend(mc)
        torch.manual_seed(config.seed)
        self.model = self._build_model(loaded, max_model_len, self.backend)
        # speculative decoding's draft model (`spec/draft_model.py`): built before the KV
        # budget is measured (its weights are in use then, its blocks counted in it)
        self._draft_net = None if draft is None else self._build_draft(draft, max_model_len)
        self.draft: DraftModel | None = None
        _log_quantized_layers(self.model)
        # LoRA adapters: the layers wrapped, the adapters' device slots (`pagoda.runtime.lora`)
        self.lora = None if config.lora is None else LoRASlots(config.lora, mc)
        if self.lora is not None:
            self.lora.wrap(self.model)
        # Where the LM head samples from its outputs (`qgemm`), steps that write logits pick the
        # greedy and unfiltered rows with the same code: a row's token never depends on the path.
        fused = self.model.lm_head.fuses_sampling
        self._whole_sampler: WholeSampler | None = qgemm.load().sample_logits if fused else None
        self.head_sampling = fused  # whether the LM head may sample (benchmarks turn it off)
        # Debug/test hook: called with (requests, logits in the model's dtype) of every step
        # that samples, before sampling; it reads them, or edits them in place (test_llm.py
        # poisons one row with NaN, as a bad checkpoint would)
        self.logits_hook: Callable[[list[Request], torch.Tensor], None] | None = None
        # Rows for every running request, and as many again before finished ones are reclaimed.
        max_blocks = -(-max_model_len // self.block_size) + 1
        self.block_tables = BlockTables(2 * config.scheduler.max_num_seqs, max_blocks)
        # the pooling runner: each step hands back hidden states, pooled per prompt that ends
        self.pooling_type, self.pooler = Pooler.for_runner(config, mc.hidden_size, tp, self.device)
        # a hybrid's Mamba layers: their state slots (a column per block-table row), before the
        # KV budget is measured
        self.mamba = MambaState.for_model(mc, config.scheduler.max_num_seqs, self.dtype,
                                          self.device, self.block_tables,
                                          1 if tp is None else tp.size)  # fmt: skip
        # a model's own per-sequence state (DeepSeek-V4's open windows), before the KV budget
        self.seq_state = self.model.sequence_state(config.scheduler.max_num_seqs)
        sized = self._size_cache(max_model_len)
        self.num_blocks, self.num_snapshots = sized.num_blocks, sized.num_snapshots
        if tp is not None:  # the same pool on every rank: what the fullest device holds
            self.num_blocks = tp.agree_min(self.num_blocks)
            if self.snapshot_interval:  # (every rank computes the same interval)
                self.num_snapshots = tp.agree_min(self.num_snapshots)
        if self.num_snapshots:  # a hybrid's prefix caching: its Mamba state snapshots
            self.mamba.allocate_snapshots(self.num_snapshots)
        self.channel = StepChannel(tp) if tp is not None and tp.rank == 0 else None
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = [
            backend.allocate_kv_cache(self.num_blocks, self.block_size, self.dtype, self.device)
            for backend in self.model.kv_backends
        ]
        if self.mamba is not None:  # the attention layers' caches at their layers' places
            self.kv_caches = self.mamba.layer_caches(self.kv_caches)
        self.kv_caches = self.model.layer_caches(self.kv_caches)  # (Gemma 4's shared layers)
        if self._draft_net is not None:
            k = config.speculative_config.num_speculative_tokens
            self.draft = DraftModel(self._draft_net, k, self.num_blocks, self.block_size,
                                    config.scheduler.max_num_seqs, self.dtype, self.device,
                                    max_model_len)  # fmt: skip
        # each backend of another shape plans a step too (`AttentionBackend.with_geometry`)
        self._backends = list({id(b): b for b in (self.backend, *self.model.kv_backends)}.values())
        self.cuda_graphs: CudaGraphRunner | None = None
        self.clock: StepClock | None = None  # set by EngineCore.enable_step_clock
        self._last_sampling: tuple[tuple[int, ...], SamplingBatch, list[Request]] | None = None
        # Async scheduling: the last launched step's tokens and the row of each request in
        # them, for the next step's rows whose token is still on the device.
        self.async_scheduling = config.uses_async_scheduling()
        # speculative decoding: decodes may carry drafts (never with async scheduling, whose
        # in-flight rows also run past their known tokens)
        self.speculative = config.speculative_config is not None
        self._inflight: tuple[torch.Tensor, dict[str, int]] | None = None
        # Structured outputs: bitmasks of constrained rows, applied to the logits before sampling
        self.grammar = GrammarBitmask(loaded.tokenizer, mc.vocab_size, self.device)
        self._grammar_rows: list[int] = []  # constrained rows of the cached sampling batch
        # Requests that asked for prompt logprobs, until their prompt is scored (by id; the
        # engine adds them, `prompt_logprobs.prompt_rows` drops them): empty, steps skip it all
        self.prompt_logprob_requests: dict[str, Request] = {}

    def _attention_backend(self, mc: ModelConfig) -> AttentionBackend:
        """The attention backend of model `mc` (the target's or the draft's) for this rank's
        heads (tensor parallel: its share of them; layout.py replicates KV heads when there
        are fewer than ranks)."""
        config = self.config
        heads, kv_heads = mc.num_heads, mc.num_kv_heads
        if self.tp is not None:
            heads, kv_heads = self.tp.layout.local_heads(heads, kv_heads)
        # ALiBi's slopes of this rank's heads (BLOOM, MPT; None for other models)
        slopes = alibi.slopes(mc, None if self.tp is None else self.tp.layout.heads(mc.num_heads))
        return get_attention_backend(
            config.attention_backend,
            self.device,
            heads,
            kv_heads,
            mc.head_dim,
            mc.family.attention_scale(mc.head_dim),
            batch_invariant=config.batch_invariant,
            kv_cache_dtype=config.cache.kv_cache_dtype,
            sliding_window=mc.family.sliding_window,
            softcap=mc.family.attn_logit_softcapping,
            sinks=mc.family.attention_sinks,
            latent=None if mc.family.mla is None else mc.family.mla.kv_lora_rank,
            alibi_slopes=None if slopes is None else slopes.to(self.device),
            rel_logits=mc.family.relative_logits,
        )

    def _build_model(
        self, loaded: LoadedModel, max_model_len: int, backend: AttentionBackend
    ) -> LlamaModel:
        """The model on this device, FP8 where the device has the kernels (an FP8 checkpoint is
        dequantized at load where it has not)."""
        mc, config = loaded.config, self.config
        check_checkpoint_form(config.quantization, loaded.path)
        fp8 = engine_scheme(config.quantization, loaded.fp8_scheme, fp8_runs_on(self.device))
        if loaded.fp8_scheme is not None and fp8 is None:
            log.info("FP8 checkpoint: no FP8 kernels on %s, weights dequantized to %s at load",
                     self.device, self.dtype)  # fmt: skip
        return build_model(
            mc,
            loaded.weights,
            quantized=loaded.quantized,
            dtype=self.dtype,
            device=self.device,
            backend=backend,
            ops=select_ops(self.device, backend.name),
            # the rotary tables cover the positions served, not the whole context: Llama 4
            # Scout's 10M positions would be 5.4 GB of float32 rows at head size 128
            max_positions=max_model_len,
            batch_invariant=config.batch_invariant,
            tp=self.tp,
            fp8=fp8,
            check_weights=config.check_weights,
        )

    def _build_draft(self, draft: LoadedModel, max_model_len: int) -> LlamaModel:
        """The draft model's weights on this device, with its own attention backend."""
        net = self._build_model(draft, max_model_len, self._attention_backend(draft.config))
        check_built(draft.name, net, max_model_len)
        log.info("speculative decoding: draft model %s (%s, %d layers) drafts %d tokens a step",
                 draft.name, draft.config.architecture, draft.config.num_layers,
                 self.config.speculative_config.num_speculative_tokens)  # fmt: skip
        return net

    def capture_cuda_graphs(self, max_num_seqs: int, max_model_len: int) -> None:
        """On CUDA with the Triton backend, record decode steps for padded batch sizes."""
        if not (
            self.config.enable_cuda_graphs
            and self.device.type == "cuda"
            and self.backend.name == "triton"
            and self.pooling_type is None  # (pooling never decodes)
        ):
            return
        if self.mamba is not None or self.seq_state is not None:
            log.info("CUDA graphs off: a model with per-sequence state runs its decodes eagerly")
            return
        if self.lora is not None:
            log.info("CUDA graphs off: LoRA adapters run their decodes eagerly")
            return
        mla = self.model_config.family.mla
        if mla is not None and mla.indexer is not None:  # dense or sparse: chosen per step
            log.info("CUDA graphs off: DeepSeek Sparse Attention runs its decodes eagerly")
            return
        limit = self.graph_seq_limit  # (captured within it, replayed only there)
        self.cuda_graphs = CudaGraphRunner(
            self.model, self.kv_caches, self.block_size, max_num_seqs,
            max_model_len if limit is None else min(limit, max_model_len), self.device,
        )  # fmt: skip
        self.cuda_graphs.capture()

    @property
    def bytes_per_block(self) -> int:
        from pagoda.runtime.model import side_tables

        # the sparse layers' tables beside the KV rows (MiniMax-M3's, Qwen4-Exp's, Kolibri 1.1's)
        tables = side_tables.block_bytes(self.model_config, self.dtype, self.block_size)
        draft = self._draft_net
        if draft is not None:  # the draft's rows of the same block (`spec/draft_model.py`)
            tables += draft_block_bytes(draft, self.dtype, self.block_size)
        return tables + sum(
            b.block_bytes(self.dtype, self.block_size) for b in self.model.kv_backends
        )

    @property
    def snapshot_interval(self) -> int:
        """Tokens between a hybrid's state snapshots; 0 without them (`cache_budget`)."""
        prefix_caching = self.config.cache.enable_prefix_caching
        return cache_budget.snapshot_interval(self.mamba, self.block_size, prefix_caching)

    def _size_cache(self, max_model_len: int) -> CacheSize:
        """The blocks and a hybrid's snapshots the memory budget holds (`cache_budget`)."""
        config, interval = self.config, self.snapshot_interval
        shape = cache_budget.CacheShape(
            self.block_size,
            self.bytes_per_block,
            config.scheduler.max_num_seqs,
            interval,
            self.mamba.snapshot_bytes if interval else 0,
        )
        ranks = 1 if self.tp is None else self.tp.size
        scratch = 0  # a draft model's scratch blocks, one row per sequence (`spec/draft_model.py`)
        if self._draft_net is not None:
            k, bs = config.speculative_config.num_speculative_tokens, self.block_size
            row = scratch_blocks(k, bs) * draft_block_bytes(self._draft_net, self.dtype, bs)
            scratch = config.scheduler.max_num_seqs * row
        return shape.size(
            lambda: (
                cache_budget.cache_budget(
                    config.cache, self.device, self.model_config, config.scheduler, ranks
                )
                - scratch
            ),
            max_model_len,
            config.scheduler.max_model_len,
            config.cache.num_blocks_override,
        )

    def to_device(self, arr: np.ndarray) -> torch.Tensor:
        """Host array → device tensor; on CUDA through pinned memory, asynchronously (no sync)."""
        t = torch.from_numpy(arr)
        if self.device.type != "cuda":
            return t
        return t.pin_memory().to(self.device, non_blocking=True)

    def readback(self, step: LaunchedStep) -> ModelRunnerOutput:
        """Wait for a step queued by `execute_model` and read its sampled tokens back (the
        step's only device→host sync)."""
        if step.pooled is not None:  # the pooling runner's vectors
            return self._pooled_readback(step)
        if step.sampler_output is None and step.prompt is None:
            return ModelRunnerOutput([], [], [])
        if step.ready is not None:
            step.ready.synchronize()  # this step only, not the ones queued after it
        if step.sampler_output is not None:
            result = self._readback(step.requests, step.host or step.sampler_output)
            if step.spec is not None:
                result = verify.verified(result, *step.spec)
            if self.draft is not None:
                result.drafts = self._drafts(step, result)
        else:  # only prompt positions this step (a chunk before the last)
            result = ModelRunnerOutput([], [], [])
        if step.prompt is not None:
            rows, scores = step.prompt
            result.prompt_logprobs = prompt_logprobs.entries(
                rows, step.prompt_host or scores.tensors()
            )
        if self.clock is not None:
            self.clock.mark("readback")
        return result

    def execute_model(self, out: SchedulerOutput) -> LaunchedStep:
        """Inputs → forward → sampling, all queued on the device without waiting for it."""
        clock = self.clock
        inp = self._prepare_inputs(out)
        if self.pooler is not None:
            return self._execute_pooling(out, inp)
        reqs = [out.scheduled[i].request for i in inp.sampling]
        spec = inp.spec
        if spec is not None:  # a drafted request samples each of its rows (`spec/verify.py`)
            drafted = reqs
            reqs = np.repeat(_objects(reqs), spec.counts + 1).tolist()
        batch = self._sampling_batch(reqs, self.model.vocab_size) if reqs else None
        if spec is not None:  # before the rows draw their uniforms (the LM head's too)
            spec.generators = verify.save_generators(drafted, spec.counts)
        rows = self._grammar_rows if batch is not None else []
        plain = batch is not None and not rows and inp.prompt is None and self._head_samples(batch)
        head = head_sampling(batch) if plain else None
        if clock is not None:
            clock.mark("prepare")
        logits = self._forward(inp, head)
        if self.draft is not None and len(inp.sampling) < len(out.scheduled):
            self._draft_prefill(out, inp)  # prompt chunks: the draft's rows too
        if clock is not None:
            clock.mark("forward")
        prompt = None
        if inp.prompt is not None:  # the rows after the sampling rows' score prompt tokens
            n, p = len(reqs), inp.prompt
            prompt = (p, prompt_logprobs.score(logits[n:], self.to_device(p.targets), p.k, p.ranks))
            logits = logits[:n]
        if batch is None:
            return LaunchedStep([], None, prompt=prompt)
        if head is not None:  # the LM head gave the tokens: no logits were written
            step = LaunchedStep(reqs, SamplerOutput(logits, None, None, None))
        elif rows and self.async_scheduling:  # masks need the in-flight step's tokens first
            return LaunchedStep(reqs, None, deferred=(logits, batch, rows), prompt=prompt)
        else:
            if rows:
                self.grammar.apply(logits, reqs, rows)
            if self.logits_hook is not None:
                self.logits_hook(reqs, logits)
            step = LaunchedStep(reqs, sample(logits, batch, self._whole_sampler), prompt=prompt)
        if spec is not None:
            step.spec = (drafted, spec)
        if self.draft is not None:  # the sampling requests' block-table rows, one each
            step.table_rows = self.block_tables.rows[inp.sampling]
        self._launched(step)
        if clock is not None:
            clock.mark("sample")
        return step

    def _drafts(self, step: LaunchedStep, result: ModelRunnerOutput):
        """The draft model's drafts for the step's sampling requests that take them, after the
        tokens the step gave them (`ModelRunnerOutput.drafts`); None when none does."""
        reqs, tails, rows = draft_batch(step, result)
        if not reqs:
            return None
        table, nblocks = self._table_rows(rows)
        drafts = self.draft.propose(reqs, tails, table, nblocks, self.to_device)
        if self.clock is not None:
            self.clock.mark("draft")
        return reqs, drafts

    def _draft_prefill(self, out: SchedulerOutput, inp: StepInputs) -> None:
        """The draft's catch-up on the step's prompt chunks that do not sample (queued)."""
        reqs, ends, rows = prefill_batch(out, inp.sampling, inp.seq_lens, self.block_tables.rows)
        if reqs:
            self.draft.catch_up(reqs, ends, *self._table_rows(rows), self.to_device)

    def _table_rows(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Block-table rows of the last gathered step: [B, their most blocks] and [B] counts."""
        tables = self.block_tables
        nblocks = tables.lens[rows]
        return tables.table[rows, : max(int(nblocks.max()), 1)], nblocks

    def _execute_pooling(self, out: SchedulerOutput, inp: StepInputs) -> LaunchedStep:
        """The pooling runner's step: hidden states (no LM head) → the vectors of the prompts
        that end in it (`worker/pooler.py`), queued on the device."""
        hidden = self._forward(inp, None)
        reqs = [out.scheduled[i].request for i in inp.sampling]
        vectors = self.pooler.pool(hidden, inp, self.block_tables.rows, self.to_device)
        step = LaunchedStep(reqs, None, pooled=vectors)
        if vectors is not None and self.device.type == "cuda":
            step.pooled_host = _pinned_copies((vectors,))[0]
            step.ready = torch.cuda.Event()
            step.ready.record()
        if self.clock is not None:
            self.clock.mark("forward")
        return step

    def _pooled_readback(self, step: LaunchedStep) -> ModelRunnerOutput:
        """A pooling step's vectors on the host (float32 [requests, D]), with their requests."""
        if step.ready is not None:
            step.ready.synchronize()
        host = step.pooled_host if step.pooled_host is not None else step.pooled.cpu()
        result = ModelRunnerOutput([], [], [], pooled=(step.requests, host.numpy()))
        if self.clock is not None:
            self.clock.mark("readback")
        return result

    def sample_deferred(self, step: LaunchedStep) -> None:
        """Sample a step launched with constrained rows under async scheduling, once the
        previous step's tokens are folded in: the bitmasks were filled while the forward ran."""
        logits, batch, rows = step.deferred
        step.deferred = None
        self.grammar.apply(logits, step.requests, rows)
        if self.logits_hook is not None:
            self.logits_hook(step.requests, logits)
        step.sampler_output = sample(logits, batch, self._whole_sampler)
        self._launched(step)

    def _launched(self, step: LaunchedStep) -> None:
        """Async scheduling: remember the step's token tensor for the next step's gathers."""
        if self.async_scheduling:
            self._inflight = (
                step.sampler_output.token_ids,
                {r.request_id: i for i, r in enumerate(step.requests)},
            )
            if self.device.type == "cuda":
                self._copy_to_host(step)

    def _head_samples(self, batch: SamplingBatch) -> bool:
        """Whether the LM head can hand back the step's tokens itself: no row filters (top-k,
        top-p, min-p), nothing reads the logits (penalties, logprobs, the hook), and a
        kernel that samples from its outputs (`Linear.fuses_sampling`)."""
        plain = batch.plain and self.logits_hook is None and not batch.filtered
        return plain and self.head_sampling and self._whole_sampler is not None

    @staticmethod
    def _copy_to_host(step: LaunchedStep) -> None:
        """Queue the sampled tensors' (and prompt scores') copy into pinned memory and mark it
        with an event."""
        so = step.sampler_output
        step.host = SamplerOutput(*_pinned_copies((so.token_ids, so.logprobs, so.top_ids,
                                                   so.top_logprobs, so.ranks)))  # fmt: skip
        if step.prompt is not None:
            step.prompt_host = _pinned_copies(step.prompt[1].tensors())
        step.ready = torch.cuda.Event()
        step.ready.record()

    def _prepare_inputs(self, out: SchedulerOutput) -> StepInputs:
        """The step's flat token batch as host arrays (ragged: one run of tokens per request).
        One-token rows (first: decodes, or a one-token prefill chunk) take one element; only
        longer chunks slice. A row samples when it reaches the end of the known tokens."""
        sched, bs, nd = out.scheduled, self.block_size, out.num_decodes
        n = len(sched)
        reqs = [s.request for s in sched]
        starts = np.fromiter((r.num_computed_tokens for r in reqs), dtype=np.int64, count=n)
        known = np.fromiter((len(r.token_ids) for r in reqs), dtype=np.int64, count=n)
        one, pending = self._decode_ids(reqs[:nd], starts[:nd], known[:nd])
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
        table = self.block_tables.gather(sched)
        slots = table[seq_idx, positions // bs].astype(np.int64) * bs + positions % bs
        seq_lens = starts + qlens
        sampling = np.flatnonzero(seq_lens >= known).tolist()
        inp = StepInputs(ids, positions, slots, table, qlens, seq_lens, cu, sampling, nd, pending)
        if self.speculative and nd < n and (seq_lens > known).any():  # decodes with drafts
            inp.sample_rows, inp.spec = verify.spec_rows(ids, cu, seq_lens - known, sampling)
        if self.lora is not None:  # each token's adapter slot (`lora/slots.py`)
            inp.lora = self.lora.prepare(reqs, qlens)
            if self.channel is not None:  # rank 0 of a group: the slots the others fill too
                inp.lora_loads = self.lora.take_loads()
        if self.mamba is not None:  # the Mamba layers' state slots
            inp.mamba = self.mamba.prepare(self.block_tables.rows, starts, qlens, nd,
                                           out.snapshots)  # fmt: skip
        if self.seq_state is not None:  # the model's per-sequence state (its slots)
            inp.seq_state = self.seq_state.prepare(reqs, starts, qlens)
        if self.model.token_history:  # the tokens before each sequence's step (n-grams)
            inp.history = token_history([r.token_ids for r in reqs], starts,
                                        self.model.token_history)  # fmt: skip
        if self.model.long_rope:  # which rotary table a longrope prompt's chunks read
            inp.prompt_lens = np.fromiter((r.num_prompt_tokens for r in reqs), np.int64, count=n)
        if self.prompt_logprob_requests:  # some request asked: are its prompt positions here?
            row_of = {s.request.request_id: i for i, s in enumerate(sched)}
            inp.prompt = prompt_logprobs.prompt_rows(
                self.prompt_logprob_requests, row_of, starts, qlens, cu
            )
            inp.extra_rows = inp.prompt.flat if inp.prompt is not None else None
        return inp

    def _decode_ids(
        self, reqs: list[Request], starts: np.ndarray, known: np.ndarray
    ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
        """One-token rows' ids; with async scheduling, a row whose token is still on the
        device (computed == known) gets 0 here and is named in the returned (rows, sources)."""
        n = len(reqs)
        if self._inflight is None or not (starts == known).any():
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
        where = self._inflight[1]
        src = np.fromiter(
            (where[reqs[i].request_id] for i in rows), dtype=np.int64, count=len(rows)
        )
        return ids, (rows, src)

    def _device_ids(self, inp: StepInputs) -> torch.Tensor:
        """The step's token ids on the device, in-flight tokens gathered there (no sync)."""
        ids = self.to_device(inp.ids)
        if inp.pending is not None:
            rows, src = (self.to_device(a) for a in inp.pending)
            # a row without a token (-1: non-finite logits) is dropped at its readback; its
            # input here only has to be a valid id
            ids.index_copy_(0, rows, self._inflight[0].index_select(0, src).clamp_(min=0))
        return ids

    def _forward(self, inp: StepInputs, head: HeadSampling | None) -> torch.Tensor:
        """Logits of the sampling rows (with `head`: their tokens, from the LM head). In a
        tensor-parallel group, rank 0 first sends the step to the other ranks."""
        ids = self._device_ids(inp)
        if self.channel is not None:
            self.channel.send(inp, ids)
        return self.forward_step(inp, ids, head)

    @property
    def graph_seq_limit(self) -> int | None:
        """The longest sequence a captured decode may hold, where the model's attention takes
        another path past it (Kolibri 1.1's indexed layers past their budget select their keys,
        MiniMax-M3's sparse layers their blocks, chosen on the host: model/kolibri1.py,
        model/minimax_m3.py); None: any."""
        f = self.model_config.family
        if f.kolibri11 is not None:
            return f.kolibri11.budget
        return None if f.block_index is None else f.block_index.dense_reach

    def forward_step(
        self, inp: StepInputs, ids: torch.Tensor, head: HeadSampling | None = None
    ) -> torch.Tensor:
        """The forward of a prepared step (`ids` on the device): a captured CUDA graph when
        one fits, else eager. The other ranks of a group run it with rank 0's inputs."""
        graph = self.cuda_graphs
        if self.lora is not None:
            if inp.lora_loads and self.tp is not None and self.tp.rank > 0:
                self.lora.fill(inp.lora_loads)  # what rank 0 loaded in preparing the step
            self.lora.device_step(inp.lora, self.to_device)
        seq_lens = inp.seq_lens.astype(np.int32)
        n, max_blocks, nd = len(inp.qlens), inp.table.shape[1], inp.num_decodes
        if (
            graph is not None
            and head is None
            and graph.can_run(nd, n, max_blocks)
            and not (self.model.long_rope and (inp.prompt_lens > inp.seq_lens).any())
            and (self.graph_seq_limit is None or seq_lens.max() <= self.graph_seq_limit)
        ):  # graphs read longrope's table by seq_lens: not for a one-token chunk mid-prompt
            logits = graph.run(self, ids, inp.positions, inp.slots, inp.table, seq_lens)
            return logits.index_select(0, self.to_device(_logit_rows(inp, inp.sampling)))
        meta = AttentionMetadata(
            num_seqs=n,
            num_decodes=nd,
            num_tokens=ids.shape[0],
            max_query_len=int(inp.qlens.max()),
            max_seq_len=int(inp.seq_lens.max()),
            query_start_loc=self.to_device(inp.cu.astype(np.int32)),
            seq_lens=self.to_device(seq_lens),
            block_tables=self.to_device(inp.table),
            slot_mapping=self.to_device(inp.slots),
            block_size=self.block_size,
            query_lens_host=inp.qlens.tolist(),
            seq_lens_host=inp.seq_lens.tolist(),
        )
        if inp.prompt_lens is not None:
            meta.prompt_lens = self.to_device(inp.prompt_lens.astype(np.int32))
        for backend in self._backends:
            backend.prepare(meta)
        if inp.mamba is not None:
            meta.aux[MAMBA_STEP] = self.mamba.device_step(inp.mamba, self.to_device)
        if inp.history is not None:
            meta.aux[TOKEN_HISTORY] = self.to_device(inp.history)
        if inp.seq_state is not None:
            meta.aux[SEQUENCE_STATE] = self.seq_state.device_step(inp.seq_state, self.to_device)
        if self.pooling_type is not None:  # hidden states of the rows pooled, no LM head
            rows, head = pool_rows(self.pooling_type, inp), HIDDEN_STATES
        else:
            rows = _logit_rows(inp, _last_rows(inp))
        return self.model.forward(
            ids,
            self.to_device(inp.positions),
            self.kv_caches,
            meta,
            self.to_device(rows),
            head,
        )

    def _sampling_batch(self, reqs: list[Request], vocab_size: int) -> SamplingBatch:
        """The step's sampling parameters, reused while the same requests sample in the same
        order (steady decoding): params are frozen, generators are the requests' own objects.
        Penalties and min_tokens depend on the tokens so far: brought up to date every step."""
        key = tuple(map(id, reqs))
        cached = self._last_sampling
        if cached is not None and cached[0] == key:
            batch = cached[1]
            if not batch.changes:
                return batch
            batch = batch.refreshed(reqs, vocab_size, self.device)
            self._last_sampling = (key, batch, reqs)  # min_tokens masks, once met, stay off
            return batch
        for r in reqs:
            if r.params.seed is not None and r.generator is None:
                r.generator = torch.Generator(device=self.device).manual_seed(r.params.seed)
        batch = SamplingBatch.build(reqs, vocab_size, self.device)
        self._grammar_rows = grammar_rows(reqs)
        self._last_sampling = (key, batch, reqs)  # holding reqs keeps their ids unique
        return batch

    def _readback(self, reqs: list[Request], so: SamplerOutput) -> ModelRunnerOutput:
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


def _last_rows(inp: StepInputs) -> np.ndarray:
    """The rows sampled: each sampling request's last, or with drafts all of a drafted
    request's (`StepInputs.sample_rows`)."""
    if inp.sample_rows is not None:
        return inp.sample_rows
    return inp.cu[1:][inp.sampling] - 1


def _objects(items: list) -> np.ndarray:
    """A 1-D object array of `items` (NumPy would read sequences as rows)."""
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def _logit_rows(inp: StepInputs, sampling_rows) -> np.ndarray:
    """The rows of the token batch the LM head projects: the sampling rows', then the rows
    scored for prompt logprobs."""
    rows = np.asarray(sampling_rows, dtype=np.int64)
    return rows if inp.extra_rows is None else np.concatenate([rows, inp.extra_rows])


def _pinned_copies(tensors) -> tuple[torch.Tensor | None, ...]:
    """Pinned host copies of device tensors (None stays None), queued without a sync."""
    out = []
    for t in tensors:
        dst = None if t is None else torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        if dst is not None:
            dst.copy_(t, non_blocking=True)
        out.append(dst)
    return tuple(out)


def _log_quantized_layers(model: LlamaModel) -> None:
    """Say when linear layers run in FP8, or multiply by stored blocks (float32 CPU models):
    it sets decode speed."""
    from pagoda.runtime.cpu.qgemm import QGemmWeight

    layers = model.linears()
    fp8 = [x for x in layers if hasattr(x, "weight_scale")]  # `fp8_linear.Fp8Linear`
    if fp8:
        log.info("%d of %d linear layers run in FP8 (%.0f MB of E4M3 weights and scales)",
                 len(fp8), len(layers), sum(x.nbytes for x in fp8) / 1e6)  # fmt: skip
    on_blocks = [x.fast for x in layers if isinstance(x.fast, QGemmWeight)]
    if on_blocks:
        mb = sum(w.nbytes for w in on_blocks) / 1e6
        kinds = sorted({k for w in on_blocks for k in w.kinds})
        log.info(
            "%d of %d linear layers multiply by their stored %s weights (%.0f MB a step; "
            "PAGODA_CPU_QGEMM=0 uses float32 copies)",
            len(on_blocks),
            len(layers),
            "/".join(kinds),
            mb,
        )
