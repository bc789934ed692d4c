"""ModelRunner: SchedulerOutput → input tensors → forward → sampled tokens.

The runner holds a step's state (model, KV caches, block tables, the hooks' state) and runs its
stages, each in its own module: the step's host arrays (`worker/prepare_inputs.py`), the forward
and sampling queued on the device (here), the results read back (`worker/readback.py`); the
models are built by `worker/model_build.py`, a pooling step runs in `worker/pooler.py`, a draft
model's steps in `worker/draft_step.py`. The only device→host transfer is the sampled tokens
(and their logprobs when asked), read back together at the end.

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
from pagoda.runtime.attention import AttentionMetadata
from pagoda.runtime.attention.base import IMAGE_SPANS
from pagoda.runtime.config import EngineConfig
from pagoda.runtime.core.sched_output import SchedulerOutput
from pagoda.runtime.cpu import qgemm
from pagoda.runtime.cpu.host_memory import keep_freed_memory
from pagoda.runtime.distributed.group import TPGroup
from pagoda.runtime.lora.slots import LoRASlots
from pagoda.runtime.model.llama import (
    HIDDEN_STATES,
    IMAGE_EMBEDS,
    SEQUENCE_STATE,
    TOKEN_HISTORY,
)
from pagoda.runtime.model.loader import LoadedModel
from pagoda.runtime.model.mamba2 import MAMBA_STEP
from pagoda.runtime.model.qwen2_vl import MROPE_POSITIONS
from pagoda.runtime.request import Request
from pagoda.runtime.sampling.sampler import (
    HeadSampling,
    SamplerOutput,
    SamplingBatch,
    WholeSampler,
    head_sampling,
    sample,
)
from pagoda.runtime.spec import rejection, verify
from pagoda.runtime.spec.draft_model import (
    DraftModel,
    draft_block_bytes,
    sampled_bytes,
    scratch_blocks,
)
from pagoda.runtime.structured.bitmask import GrammarBitmask, grammar_rows
from pagoda.runtime.worker import (
    cache_budget,
    draft_step,
    mm_encoder,
    model_build,
    prompt_logprobs,
)
from pagoda.runtime.worker.block_table import BlockTables
from pagoda.runtime.worker.cache_budget import CacheSize
from pagoda.runtime.worker.cuda_graph import CudaGraphRunner
from pagoda.runtime.worker.encoder_cache import EncoderCache
from pagoda.runtime.worker.mamba_state import MambaState
from pagoda.runtime.worker.outputs import LaunchedStep, ModelRunnerOutput
from pagoda.runtime.worker.pooler import Pooler, execute_pooling, pool_rows
from pagoda.runtime.worker.prepare_inputs import prepare_inputs
from pagoda.runtime.worker.readback import copy_to_host, read_step
from pagoda.runtime.worker.step_channel import StepChannel
from pagoda.runtime.worker.step_clock import StepClock
from pagoda.runtime.worker.step_inputs import StepInputs

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
        self.backend = model_build.attention_backend(self, mc)
        torch.manual_seed(config.seed)
        self.model = model_build.build_model(self, loaded, max_model_len, self.backend)
        # speculative decoding's draft model (`spec/draft_model.py`): built before the KV
        # budget is measured (its weights are in use then, its blocks counted in it)
        self._draft_net = (
            None if draft is None else model_build.build_draft(self, draft, max_model_len)
        )
        self.draft: DraftModel | None = None
        model_build.log_quantized_layers(self.model)
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
        self.pooling_type, self.pooler = Pooler.for_runner(
            config, mc.hidden_size, tp, self.device, getattr(self.model, "classifier_head", None)
        )
        # a hybrid's Mamba layers: their state slots (a column per block-table row), before the
        # KV budget is measured
        self.mamba = MambaState.for_model(mc, config.scheduler.max_num_seqs, self.dtype,
                                          self.device, self.block_tables,
                                          1 if tp is None else tp.size)  # fmt: skip
        # a vision model's encoded images, shared by content across requests (vLLM's encoder
        # cache: the rows of a step's tokens, or of the largest image, `encoder_cache.py`)
        self.encoder_cache = None if mc.vision is None else EncoderCache.for_model(config, mc)
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
        self.channel = StepChannel.of(self) if tp is not None and tp.rank == 0 else None
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
        self._backends = self.model.attention_backends
        self.cuda_graphs: CudaGraphRunner | None = None
        self.clock: StepClock | None = None  # set by EngineCore.enable_step_clock
        self._last_sampling: tuple[tuple[int, ...], SamplingBatch, list[Request]] | None = None
        # Async scheduling: the last launched step's tokens and the row of each request in
        # them, for the next step's rows whose token is still on the device.
        self.async_scheduling = config.uses_async_scheduling()
        # speculative decoding: decodes may carry drafts (with async scheduling, rows whose
        # token is in flight run one past their known tokens: `prepare_inputs` tells them apart)
        self.speculative = config.speculative_config is not None
        self.inflight: tuple[torch.Tensor, dict[str, int]] | None = None
        # Structured outputs: bitmasks of constrained rows, applied to the logits before sampling
        self.grammar = GrammarBitmask(loaded.tokenizer, mc.vocab_size, self.device)
        self._grammar_rows: list[int] = []  # constrained rows of the cached sampling batch
        # Requests that asked for prompt logprobs, until their prompt is scored (by id; the
        # engine adds them, `prompt_logprobs.prompt_rows` drops them): empty, steps skip it all
        self.prompt_logprob_requests: dict[str, Request] = {}

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
            if self.device.type == "cuda":  # sampled drafts' q and verification, beside it
                vocab = self._draft_net.vocab_size
                scratch += sampled_bytes(k, config.scheduler.max_num_seqs, vocab)
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
        step's only device→host sync; `worker/readback.py`)."""
        return read_step(self, step)

    def execute_model(self, out: SchedulerOutput) -> LaunchedStep:
        """Inputs → forward → sampling, all queued on the device without waiting for it."""
        clock = self.clock
        inp = prepare_inputs(self, out)
        if self.pooler is not None:
            return execute_pooling(self, out, inp)
        reqs = [out.scheduled[i].request for i in inp.sampling]
        spec = inp.spec
        if spec is not None:  # a drafted request samples each of its rows (`spec/verify.py`)
            drafted = reqs
            reqs = np.repeat(_objects(reqs), spec.counts + 1).tolist()
        batch = self._sampling_batch(reqs, self.model.vocab_size) if reqs else None
        ratio = held = None  # a draft model's sampled drafts: verified by their q (`rejection`)
        if spec is not None:  # before the rows draw their uniforms (the LM head's too)
            held = None if self.draft is None else self.draft.held
            ratio = rejection.ratio_rows(drafted, spec.counts, spec.drafts, held)
            spec.generators = verify.save_generators(drafted, spec.counts)
        rows = self._grammar_rows if batch is not None else []
        plain = batch is not None and not rows and inp.prompt is None and ratio is None
        plain = plain and self._head_samples(batch)
        head = head_sampling(batch) if plain else None
        if clock is not None:
            clock.mark("prepare")
        logits = self.forward(inp, head)
        if self.draft is not None and len(inp.sampling) < len(out.scheduled):
            draft_step.prefill(self, out, inp)  # prompt chunks: the draft's rows too
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
            step = LaunchedStep(reqs, None, deferred=(logits, batch, rows, ratio, held))
            step.prompt = prompt
        else:
            step = LaunchedStep(reqs, self._sample(logits, batch, reqs, rows, ratio, held))
            step.prompt = prompt
        if spec is not None:
            step.spec = (drafted, spec)
        if self.draft is not None:  # the sampling requests' block-table rows, one each
            step.table_rows = self.block_tables.rows[inp.sampling]
        if step.deferred is None:
            self._launched(step)
        if clock is not None:
            clock.mark("sample")
        return step

    def sample_deferred(self, step: LaunchedStep) -> None:
        """Sample a step launched with constrained rows under async scheduling, once the
        previous step's tokens are folded in: the bitmasks were filled while the forward ran."""
        logits, batch, rows, ratio, held = step.deferred
        step.deferred = None
        step.sampler_output = self._sample(logits, batch, step.requests, rows, ratio, held)
        self._launched(step)

    def _sample(self, logits, batch, reqs, rows, ratio, held) -> SamplerOutput:
        """The step's tokens: grammar masks and the hook applied, sampled; a draft model's
        sampled drafts' rows then by the ratio rule with `held`, the q they were drafted by
        (`spec/rejection.py`, on the device)."""
        if rows:
            self.grammar.apply(logits, reqs, rows)
        if self.logits_hook is not None:
            self.logits_hook(reqs, logits)
        so = sample(logits, batch, self._whole_sampler)
        if ratio is not None:
            rejection.resample(so.token_ids, logits, batch, ratio, held, self.to_device)
        return so

    def _launched(self, step: LaunchedStep) -> None:
        """Async scheduling: remember the step's token tensor for the next step's gathers."""
        if self.async_scheduling:
            self.inflight = (
                step.sampler_output.token_ids,
                {r.request_id: i for i, r in enumerate(step.requests)},
            )
            if self.device.type == "cuda":
                copy_to_host(step)

    def _head_samples(self, batch: SamplingBatch) -> bool:
        """Whether the LM head can hand back the step's tokens itself: no row filters (top-k,
        top-p, min-p), nothing reads the logits (penalties, logprobs, the hook), and a
        kernel that samples from its outputs (`Linear.fuses_sampling`)."""
        plain = batch.plain and self.logits_hook is None and not batch.filtered
        return plain and self.head_sampling and self._whole_sampler is not None

    def _device_ids(self, inp: StepInputs) -> torch.Tensor:
        """The step's token ids on the device, in-flight tokens gathered there (no sync)."""
        ids = self.to_device(inp.ids)
        if inp.pending is not None:
            rows, src = (self.to_device(a) for a in inp.pending)
            # a row without a token (-1: non-finite logits) is dropped at its readback; its
            # input here only has to be a valid id
            ids.index_copy_(0, rows, self.inflight[0].index_select(0, src).clamp_(min=0))
        return ids

    def forward(self, inp: StepInputs, head: HeadSampling | None) -> torch.Tensor:
        """Logits of the sampling rows (with `head`: their tokens, from the LM head). In a
        tensor-parallel group, rank 0 first sends the step to the other ranks."""
        ids = self._device_ids(inp)
        if inp.images is not None:  # image placeholders: the images' features (encoded now)
            inp.image_embeds = mm_encoder.device_step(self.model, inp.images, self.to_device)
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
            and inp.image_embeds is None
            and inp.mrope is None
            and graph.can_run(nd, n, max_blocks)
            and not (self.model.long_rope and (inp.prompt_lens > inp.seq_lens).any())
            and (self.graph_seq_limit is None or seq_lens.max() <= self.graph_seq_limit)
        ):  # graphs read longrope's table by seq_lens: not for a one-token chunk mid-prompt
            logits = graph.run(self, ids, inp.positions, inp.slots, inp.table, seq_lens)
            return logits.index_select(0, self.to_device(_logit_rows(inp, inp.sampling)))
        meta = AttentionMetadata.from_host(
            inp.qlens, inp.seq_lens, nd, inp.slots, self.block_size, self.to_device,
            self.to_device(inp.cu.astype(np.int32)), self.to_device(inp.table),
        )  # fmt: skip
        if inp.prompt_lens is not None:
            meta.prompt_lens = self.to_device(inp.prompt_lens.astype(np.int32))
        if inp.images is not None and self.model.config.vision.bidirectional:
            # (the backends' masks read them; every rank has the image rows: StepChannel)
            meta.aux[IMAGE_SPANS] = mm_encoder.spans(inp.images.rows, inp.positions, inp.cu)
        for backend in self._backends:
            backend.prepare(meta)
        if inp.mamba is not None:
            meta.aux[MAMBA_STEP] = self.mamba.device_step(inp.mamba, self.to_device)
        if inp.history is not None:
            meta.aux[TOKEN_HISTORY] = self.to_device(inp.history)
        if inp.image_embeds is not None:  # image placeholders' rows and the images' features
            meta.aux[IMAGE_EMBEDS] = inp.image_embeds
        if inp.mrope is not None:  # Qwen2-VL's [3, T] positions (model/qwen2_vl.py)
            meta.aux[MROPE_POSITIONS] = self.to_device(inp.mrope)
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
