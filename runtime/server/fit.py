"""Does the model fit? Weights plus the KV cache of one full-length sequence, against the memory
one device (one rank) has, before anything loads.

`pagoda serve` asks this first in `launch.preflight`. A model that cannot serve even one
``max_model_len`` sequence exits 2 with one line, written to the pod's termination message with
the reason ``ModelDoesNotFit`` (`runtime/termination.py`; the operator turns it into a condition
on the InferenceService), giving the numbers and what would fit: FP8 weights (and KV cache) on a
GPU that has FP8, more GPUs (tensor parallelism), a shorter context, on a CPU serving 16-bit
``--dtype float32`` where the quantized GEMM then keeps the checkpoint's blocks.

What it counts, per rank of ``tensor_parallel_size``:

* the weights as the loader will hold them, one rank's share (`weights.py`: from the
  checkpoint's tensor table, not its file size: dequantized GGUF blocks and cast tensors in the
  model's dtype, the blocks `qgemm` reads in place on a CPU in float32, FP8 projections at one
  byte plus a float32 scale per output row where they run in FP8, a tied LM head's packed copy
  on a CPU). A config.json without weight files counts from the model's shape
  (`Plan.weight_bytes`: the decoder's projections at one byte plus a float32 scale per output
  channel where they run in FP8, the rest in the model's dtype; each rank's share: q, o, the
  MLP, experts and vocabulary split over the ranks, K and V by this rank's KV heads (replicated
  when there are fewer than ranks), the FP8 scales of row-parallel o and down whole on every
  rank (`model.parallel_linear`), norms on every rank), as do the other plans `would_fit`
  suggests.
* a speculative draft model's weights (``speculative_config`` with ``model``: its checkpoint
  counted as the target's, `memory.draft_model`, all of it: rank 0 holds it whole) and its KV
  rows of each position beside the target's; with one, FP8 weights are not offered (refused
  beside a draft model).
* the KV cache of one sequence of ``max_model_len`` tokens (whole blocks), with each rank's KV
  heads (split over the ranks; one each when there are fewer heads than ranks); where the
  cache's size is fixed up front and smaller (``--kv-cache-memory``, the CPU's default 2 GiB),
  that size: the engine then shortens ``max_model_len`` to what the cache holds.
* against: on CUDA, what the runner gives the model and its cache (``gpu_memory_utilization`` of
  the device, less what other processes hold, less `memory.GPU_HEADROOM`); on a CPU, the memory
  this process may still allocate (`memory.host_available`: MemAvailable or the cgroup limit).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
from pagoda.runtime import family_options, options
from pagoda.runtime.config import EngineConfig, ModelConfig, fp8_runs_on
from pagoda.runtime.model import mamba_shard
from pagoda.runtime.server import memory
from pagoda.runtime.server import weights as weights_of
from pagoda.runtime.server.memory import gib
from pagoda.runtime.termination import ReasonedError

REASON = "ModelDoesNotFit"
TP_SIZES = (2, 4, 8, 16, 32, 64)  # the group sizes suggested (GPUs of the same size)


@dataclass(frozen=True)
class Plan:
    """What one rank holds: the served dtype, FP8 projections or not, FP8 KV or not, ranks;
    ``int8_kv``: the CPU's int8 KV cache (each row's bytes and a float32 scale)."""

    dtype: torch.dtype
    fp8_weights: bool
    fp8_kv: bool
    tp: int = 1
    max_model_len: int = 0
    block_size: int = 16
    max_num_seqs: int = 1  # a hybrid's Mamba state slots: one per sequence
    int8_kv: bool = False
    # speculative decoding's draft model: its weights and KV rows counted beside the target's,
    # held as the target's are (`spec/draft_model.py`)
    draft: ModelConfig | None = None

    def weight_bytes(self, mc: ModelConfig) -> int:
        """The weights of one rank (module docstring), a draft model's too (all of it on rank
        0, which holds it whole: `worker/model_build.build_draft`)."""
        draft = 0 if self.draft is None else self._whole().weight_bytes(self.draft)
        return draft + weights_of.from_shapes(mc, self.dtype, self.fp8_weights, self.tp)

    def _alone(self) -> Plan:
        """This plan without its draft model (the draft's own bytes are counted with it)."""
        return dataclasses.replace(self, draft=None)

    def _whole(self) -> Plan:
        """The draft model's plan: alone, on one rank (rank 0 holds all of it)."""
        return dataclasses.replace(self, draft=None, tp=1)

    def kv_heads(self, mc: ModelConfig) -> int:
        """KV heads on one rank: split over the ranks, replicated when there are fewer."""
        return max(1, mc.num_kv_heads // self.tp)

    def kv_bytes_per_token(self, mc: ModelConfig) -> int:
        """One rank's KV bytes of a position, a draft model's rows of it too."""
        if self.draft is not None:
            draft = self._whole().kv_bytes_per_token(self.draft)
            return self._alone().kv_bytes_per_token(mc) + draft
        if mc.family.dsv4 is not None:  # rows, entries, Ca tails (model/dsv4_engine.py)
            from pagoda.runtime.model.dsv4_engine import bytes_per_token

            return bytes_per_token(mc.family.dsv4, self.dtype, self.block_size)
        item = 1 if self.fp8_kv or self.int8_kv else self.dtype.itemsize
        from pagoda.runtime.model import side_tables

        tables = side_tables.bytes_per_token(mc, self.dtype, self.block_size)  # (sparse layers')
        return tables + sum(  # int8: a float32 scale per row; KV
            mc.kv_tensors * max(1, heads // self.tp) * (dim * item + 4 * self.int8_kv)
            for heads, dim in mc.kv_layer_shapes  # heads split over the ranks
        )

    def kv_bytes(self, mc: ModelConfig, tokens: int | None = None) -> int:
        """One sequence of ``tokens`` (default ``max_model_len``), in whole blocks."""
        tokens = self.max_model_len if tokens is None else tokens
        blocks = -(-tokens // self.block_size)
        return blocks * self.block_size * self.kv_bytes_per_token(mc)

    def state_bytes(self, mc: ModelConfig) -> int:
        """A hybrid's Mamba state slots, one per sequence (`worker/mamba_state.py`)."""
        if mc.family.dsv4 is not None:  # DeepSeek-V4's open-window slots (dsv4_engine.py)
            from pagoda.runtime.model.dsv4_engine import slots_bytes

            return slots_bytes(mc.family.dsv4, self.dtype, self.max_num_seqs)
        m = mamba_shard.local(mc.family.mamba, self.tp)  # this rank's heads
        return 0 if m is None else m.state_bytes(self.dtype, self.max_num_seqs)

    def need(self, mc: ModelConfig) -> int:
        return self.weight_bytes(mc) + self.kv_bytes(mc) + self.state_bytes(mc)


def plan_of(cfg: EngineConfig, model_path: Path, tp: int = 1) -> Plan:
    """The plan `cfg` serves `model_path` with (its FP8 settings as the loader applies them)."""
    device = cfg.torch_device()
    scheme = None
    if model_path.is_dir():
        from pagoda.runtime.model.hf_loader import read_quantization

        scheme = read_quantization(model_path)
    if scheme is not None and scheme.block is not None:  # block-wise: dequantized at load
        scheme = None
    fp8 = (cfg.quantization == "fp8" or scheme is not None) and fp8_runs_on(device)
    kv = cfg.cache.kv_cache_dtype
    return Plan(cfg.torch_dtype(), fp8, kv == "fp8", tp, cfg.scheduler.max_model_len or 0,
                cfg.cache.block_size, cfg.scheduler.max_num_seqs, kv == "int8")  # fmt: skip


def usable(cfg: EngineConfig, device: torch.device) -> tuple[int, str]:
    """Bytes one rank has for weights and KV cache, and how that figure came about."""
    if device.type != "cuda":
        have, source = memory.host_available()
        return have, f"on this machine ({source})"
    free, total = memory.device_available(device)
    util = cfg.cache.gpu_memory_utilization
    have = int(total * util) - (total - free) - memory.GPU_HEADROOM
    return have, (
        f"usable on {device} ({gib(total)} in all × gpu-memory-utilization {util:g}, less "
        f"{gib(total - free)} in use and {gib(memory.GPU_HEADROOM)} headroom)"
    )


def check(
    mc: ModelConfig,
    cfg: EngineConfig,
    model_path: Path,
    tensor_parallel_size: int = 1,
    draft_config: ModelConfig | None = None,
) -> Plan:
    """The plan when weights + one ``max_model_len`` sequence fit one rank; else a
    `ReasonedError` (reason ``ModelDoesNotFit``) with the numbers and what would fit.
    `draft_config`: the draft model's config as the start-up read it (`memory.draft_model`)."""
    device = cfg.torch_device()
    plan = plan_of(cfg, model_path, tensor_parallel_size)
    if not plan.max_model_len:
        plan = Plan(**{**plan.__dict__, "max_model_len": mc.context_length})
    held = weights_of.estimate(mc, cfg, model_path, tensor_parallel_size)  # as loaded
    weights, how = held.bytes, held.how
    draft = memory.draft_model(cfg, 1, config=draft_config)  # whole, beside the target's
    if draft is not None:
        plan = dataclasses.replace(plan, draft=draft.config)
        weights += draft.weights.bytes
        how += f", and {draft.weights} for the draft model {draft.name}"
    if state := plan.state_bytes(mc):  # counted with the weights: both fixed at start
        weights += state
        how += f", and {gib(state)} of Mamba state for {plan.max_num_seqs} sequences"
    have, where = usable(cfg, device)
    tokens = cfg.scheduler.max_num_batched_tokens
    scan = memory.step_scan_bytes(mc, cfg.scheduler, tensor_parallel_size)  # a rank's
    if device.type == "cuda" and scan:  # kept free
        have -= scan
        where = f"{where[:-1]}, and {gib(scan)} for the Mamba scan of a {tokens}-token step)"
    kv = plan.kv_bytes(mc)
    budget = kv_budget(cfg, plan.kv_bytes_per_token(mc), device)
    budgeted = budget is not None and budget < kv
    if weights + (budget if budgeted else kv) <= have:
        return plan
    fp8_here = device.type == "cuda" and fp8_runs_on(device)
    # FP8 weights offered unless a GGUF or a family not tested with them (`family_options`)
    quantizable = model_path.suffix != ".gguf" and family_options.tested(mc.architecture, "fp8")
    quantizable = quantizable and draft is None  # (refused beside a draft: `check_draft`)
    text = message(mc, plan, weights, budget if budgeted else kv, have, where, fp8_here, budgeted,
                   how, float32_fix(mc, cfg, model_path, plan, have),
                   quantizable=quantizable)  # fmt: skip
    raise ReasonedError(text, reason=REASON)


def float32_fix(mc: ModelConfig, cfg: EngineConfig, model_path: Path, plan: Plan,
                have: int) -> list[str]:  # fmt: skip
    """On a CPU serving 16-bit weights: ``--dtype float32`` where the quantized GEMM then reads
    the stored blocks in place (a GGUF's Q4 blocks are about a third of its bf16 weights) and
    weights + the float32 KV cache fit."""
    if cfg.torch_device().type != "cpu" or plan.dtype == torch.float32:
        return []
    f32 = dataclasses.replace(cfg, dtype="float32")
    held = weights_of.estimate(mc, f32, model_path, plan.tp)
    if not held.in_place:
        return []
    wide = Plan(**{**plan.__dict__, "dtype": torch.float32})
    budget = kv_budget(f32, wide.kv_bytes_per_token(mc), cfg.torch_device())
    need = held.bytes + min(wide.kv_bytes(mc), budget if budget is not None else 1 << 62)
    if (draft := memory.draft_model(f32, 1, config=plan.draft)) is not None:  # float32 too
        need += draft.weights.bytes
    if need > have:
        return []
    return [f"--dtype float32 ({gib(need)}: the stored blocks read in place)"]


def kv_budget(cfg: EngineConfig, per_token: int, device: torch.device) -> int | None:
    """A KV-cache size fixed up front (--kv-cache-memory, a test's block count, the CPU's
    default), or None where the runner takes what is free (CUDA). A cache smaller than one
    full sequence makes the engine shorten max_model_len to it (with a warning), so the smaller
    of the two is what must fit."""
    cache = cfg.cache
    if cache.num_blocks_override is not None:
        return cache.num_blocks_override * cache.block_size * per_token
    if cache.kv_cache_memory is not None:
        return cache.kv_cache_memory
    return options.DEFAULT_CPU_KV_CACHE_MEMORY if device.type == "cpu" else None


def message(
    mc: ModelConfig, plan: Plan, weights: int, kv: int, have: int, where: str, fp8_here: bool,
    budgeted: bool = False, how: str = "", first: list[str] | None = None,
    quantizable: bool = True,
) -> str:  # fmt: skip
    """One line: what is needed, what there is, and what would fit (module docstring);
    ``budgeted``: ``kv`` is the fixed KV-cache size, smaller than one full sequence; ``how``:
    how the weights were counted (`weights.Weights.how`); ``first``: fixes worked out by the
    caller, listed before the others; ``quantizable``: ``--quantization fp8`` may be offered
    (not for a GGUF: `quantization.fp8.check_checkpoint_form`)."""
    kind = "FP8" if plan.fp8_weights else str(plan.dtype).removeprefix("torch.")
    how = how or f"({kind})"
    kv_kind = (
        "fp8" if plan.fp8_kv else "int8" if plan.int8_kv else str(plan.dtype).removeprefix("torch.")
    )
    params = mc.num_params / 1e9
    ranks = f" per GPU over {plan.tp} ranks" if plan.tp > 1 else ""
    what = "--kv-cache-memory" if budgeted else f"one {plan.max_model_len}-token sequence"
    head = (
        f"the model ({params:.1f}B parameters) needs {gib(weights + kv)}{ranks}: weights "
        f"{gib(weights)} {how} + KV cache {gib(kv)} for {what} ({kv_kind} KV), but "
        f"{gib(max(have, 0))} is {where}"
    )
    fixes = (first or []) + would_fit(mc, plan, weights, have, fp8_here, "usable on" in where,
                                      budgeted, quantizable)  # fmt: skip
    tail = "; would fit: " + ", ".join(fixes) if fixes else "; nothing smaller fits this device"
    return head + tail


def _splits(mc: ModelConfig, tp: int) -> bool:
    """Whether `mc` can be split over `tp` ranks (`distributed.layout.check`: heads and widths
    that divide, a hybrid's Mamba2 heads and groups too; DeepSeek's latent attention not at
    all), so that no refused size is offered."""
    from pagoda.runtime.distributed.layout import check

    try:
        check(mc, tp)
    except ValueError:
        return False
    return True


def would_fit(
    mc: ModelConfig, plan: Plan, weights: int, have: int, fp8_here: bool, cuda: bool,
    budgeted: bool = False, quantizable: bool = True,
) -> list[str]:  # fmt: skip
    """Changes that make weights + one sequence fit, each with what it would need (``weights``:
    this plan's, as counted; ``budgeted``: the KV cache's size is set, so a smaller one is the
    shorter context; ``quantizable``: FP8 weights may be offered, else (a GGUF, a family not
    tested with them) the FP8 KV cache alone; an FP8 KV cache only where the family is tested
    with one, `family_options`)."""
    out = []
    fp8_alone = False
    kv = family_options.tested(mc.architecture, "kv_cache")  # an FP8 KV cache may be offered
    changes = ([{"fp8_weights": True}, *([{"fp8_weights": True, "fp8_kv": True}] if kv else [])]
               if quantizable else [{"fp8_kv": True}] if kv and not plan.fp8_kv else [])  # fmt: skip
    if fp8_here and not (plan.fp8_weights and plan.fp8_kv):
        for fp8 in (Plan(**{**plan.__dict__, **change}) for change in changes):
            if fp8.need(mc) <= have:
                flags = " ".join(f for f, on in (("--quantization fp8", quantizable),
                                                 ("--kv-cache-dtype fp8", fp8.fp8_kv)) if on)  # fmt: skip
                out.append(f"{flags} ({gib(fp8.need(mc))})")
                fp8_alone = True
                break
    if cuda:  # (a draft model stays whole on rank 0: `Plan._whole`)
        wider_tp = None  # the fewest GPUs that hold the model as it is
        for tp in (t for t in TP_SIZES if t > plan.tp and _splits(mc, t)):
            wider = Plan(**{**plan.__dict__, "tp": tp})
            if wider.need(mc) <= have:
                out.append(f"--tensor-parallel-size {tp} ({gib(wider.need(mc))} per GPU)")
                wider_tp = tp
                break
        if fp8_here and quantizable and not plan.fp8_weights and not fp8_alone:  # FP8, fewer GPUs
            for tp in (t for t in TP_SIZES
                       if plan.tp < t < (wider_tp or 1 << 30) and _splits(mc, t)):  # fmt: skip
                both = Plan(**{**plan.__dict__, "tp": tp, "fp8_weights": True})
                if both.need(mc) <= have:
                    out.append(f"--quantization fp8 --tensor-parallel-size {tp} "
                               f"({gib(both.need(mc))} per GPU)")  # fmt: skip
                    break
    room = have - weights
    if room > 0 and plan.kv_bytes_per_token(mc):  # (none without attention layers)
        tokens = room // plan.kv_bytes_per_token(mc) // plan.block_size * plan.block_size
        if tokens >= plan.block_size and budgeted:
            size = plan.kv_bytes(mc, tokens)
            out.append(
                f"--kv-cache-memory {size >> 20}MiB ({tokens} tokens; {gib(weights + size)})"
            )
        elif tokens >= plan.block_size:
            out.append(f"--max-model-len {tokens} ({gib(weights + plan.kv_bytes(mc, tokens))})")
    return out
