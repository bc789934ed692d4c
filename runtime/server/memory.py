"""What an engine configuration will allocate, and what this machine has free for it.

`pagoda serve` checks this before the port binds (`launch.preflight`), so an impossible size (a
100 TiB KV cache, a billion rows of block tables, a step of 10¹¹ tokens) is one line and exit 2
instead of a `MemoryError` or an OOM kill after the model has loaded.

The estimate counts what the engine preallocates from its config: the KV cache, the block
tables (`worker/block_table.py`: two rows per sequence slot), the RoPE table, the CUDA-graph
inputs, plus the weights as the loader will hold them (`weights.py`: from the checkpoint's
metadata, in the engine's dtype, dequantized or kept in blocks as the loader does, one rank's
share per GPU; not the file's size) and the activations of the largest step it can schedule.
A speculative draft model (`spec/draft_model.py`) counts the same way (`draft_model`): its
weights beside the target's (all of them, once: rank 0 holds it whole), its KV rows in every block and its scratch blocks taken from the
KV budget first, as the runner sizes them.
It is a floor, not a forecast (allocator slack, the tokenizer and Python objects are left out),
so it never refuses a configuration that would fit; what it refuses could not run.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from pagoda.runtime import options
from pagoda.runtime.config import EngineConfig, ModelConfig
from pagoda.runtime.model import mamba_shard
from pagoda.runtime.model.loader import resolve_model_path
from pagoda.runtime.model.mamba2 import step_scan_bytes
from pagoda.runtime.server import weights
from pagoda.runtime.server.weights import gib  # used here, and by callers as `memory.gib`
from pagoda.runtime.spec.draft_model import sampled_bytes, scratch_blocks

GPU_HEADROOM = options.GPU_HEADROOM  # the runner keeps this much free on CUDA
CUDA_GRAPH_MAX_BATCH = 512  # the largest captured decode batch (worker/cuda_graph.py)
_UNLIMITED = 1 << 60  # cgroup limits above this mean "no limit"


@dataclass(frozen=True)
class Footprint:
    """Bytes an engine will hold; `device` parts live on the GPU when it runs on CUDA."""

    weights: int
    kv_cache: int
    kv_blocks: int
    block_tables: int  # host
    rope: int
    cuda_graphs: int
    activations: int  # the largest step: hidden states, MLP, logits of every sampling row
    weights_how: str = ""  # how `weights` was counted (`weights.Weights.how`), for messages
    state: int = 0  # a hybrid's Mamba state slots (`worker/mamba_state.py`): one per sequence
    draft: int = 0  # a speculative draft model's weights (`draft_model`)
    # the sizes a KV budget is cut into: a block's bytes (the draft's rows in it too) and the
    # draft's scratch blocks taken first (`spec/draft_model.py`)
    kv_block_bytes: int = 0
    kv_scratch: int = 0

    @property
    def device_bytes(self) -> int:
        return (self.weights + self.kv_cache + self.rope + self.cuda_graphs + self.activations
                + self.state + self.draft)  # fmt: skip

    def parts(self) -> dict[str, int]:
        return {
            "KV cache": self.kv_cache,
            "block tables": self.block_tables,
            "weights": self.weights,
            "largest step": self.activations,
            "RoPE table": self.rope,
            "CUDA graphs": self.cuda_graphs,
            "Mamba state": self.state,
            "draft model": self.draft,
        }


# What to lower for the part that dominates.
_BLAME = {
    "KV cache": "--kv-cache-memory",
    "block tables": "--max-num-seqs or --max-model-len",
    "weights": "the model (a smaller or quantized checkpoint)",
    "largest step": "--max-num-batched-tokens or --max-num-seqs",
    "RoPE table": "--max-model-len",
    "CUDA graphs": "--max-model-len",
    "Mamba state": "--max-num-seqs",
    "draft model": "the draft model (a smaller checkpoint)",
}


@dataclass(frozen=True)
class Draft:
    """Speculative decoding's draft model as the start-up checks count it: its config, its
    weights as the loader will hold them (`weights.estimate`, read from its checkpoint's
    metadata as the target's are) and the name it was given."""

    config: ModelConfig
    weights: weights.Weights
    name: str

    def kv_bytes(self, cfg: EngineConfig) -> tuple[int, int]:
        """Its KV bytes of one block (added to the target's, as `draft_block_bytes` is) and
        those of its scratch blocks (`scratch_blocks` for each of --max-num-seqs sequences),
        which the runner takes from the KV budget before the shared blocks; on CUDA with
        those the bytes of sampled drafts' q and their verification (`sampled_bytes`)."""
        cache, k = cfg.cache, cfg.speculative_config.num_speculative_tokens
        bs = cache.block_size
        per_block = (
            kv_bytes_per_token(self.config, cfg.torch_dtype(), cache.kv_cache_dtype, bs) * bs
        )
        rows = cfg.scheduler.max_num_seqs
        scratch = rows * scratch_blocks(k, bs) * per_block
        if cfg.torch_device().type == "cuda":  # sampled drafts' q and verification, as the
            scratch += sampled_bytes(k, rows, self.config.vocab_size)  # runner takes them
        return per_block, scratch


def draft_model(
    cfg: EngineConfig,
    tp: int | None = None,
    device: torch.device | None = None,
    config: ModelConfig | None = None,
) -> Draft | None:
    """The draft model of `cfg` (``speculative_config`` method "draft_model"), its weights
    counted for one rank of `tp` on `device` (defaults: `cfg`'s); None without one. `config`:
    its config as the start-up read it once (`engine.start_checks.check_speculative`); read
    here when not given, its errors named as the draft's (`read_draft_config`)."""
    spec = cfg.speculative_config
    if spec is None or spec.draft_model is None:
        return None
    from pagoda.runtime.engine.start_checks import read_draft_config

    mc = config if config is not None else read_draft_config(spec.draft_model)
    held = weights.estimate(mc, cfg, resolve_model_path(spec.draft_model), tp, device)
    return Draft(mc, held, spec.draft_model)


def kv_bytes_per_token(
    mc: ModelConfig, dtype: torch.dtype, kv_cache_dtype: str, block_size: int = 128
) -> int:
    """KV-cache bytes of one token over every layer (attention/base.py `bytes_per_token`; one
    latent row per layer for multi-head latent attention, `ModelConfig.kv_tensors`; DeepSeek-V4's
    rows with their blocks' compressed entries and Ca tails, `dsv4_engine.bytes_per_token`)."""
    if mc.family.dsv4 is not None:
        from pagoda.runtime.model.dsv4_engine import bytes_per_token

        return bytes_per_token(mc.family.dsv4, dtype, block_size)
    total = 0
    for heads, dim in mc.kv_layer_shapes:  # (a hybrid's Mamba layers keep no KV cache)
        rows = mc.kv_tensors * heads
        if kv_cache_dtype == "int8":
            total += rows * (dim + 4)
        elif kv_cache_dtype == "fp8":
            total += rows * dim
        else:
            total += rows * dim * dtype.itemsize
    from pagoda.runtime.model import side_tables

    return total + side_tables.bytes_per_token(mc, dtype, block_size)  # (sparse layers' tables)


def host_available() -> tuple[int, str]:
    """Bytes this process may still allocate on the host, and where the figure comes from:
    MemAvailable, or the container's cgroup limit minus its usage when that is lower."""
    avail, source = _meminfo_available(), "MemAvailable"
    limit = _cgroup_headroom()
    if limit is not None and limit < avail:
        avail, source = limit, "the container's memory limit"
    return avail, source


def device_available(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes of a CUDA device."""
    free, total = torch.cuda.mem_get_info(device)
    return int(free), int(total)


def estimate(
    mc: ModelConfig,
    cfg: EngineConfig,
    model_path: Path,
    device: torch.device,
    draft: ModelConfig | None = None,
) -> Footprint:
    """The engine's footprint for this config; `kv_blocks` 0 when the KV budget on CUDA is left
    to free memory (worked out by `check`). `draft`: the draft model's config, as read once
    (`draft_model`)."""
    dtype = cfg.torch_dtype()
    sched, cache = cfg.scheduler, cfg.cache
    max_len = sched.max_model_len or mc.context_length
    # one rank's weights as loaded (not the file's size): on CUDA each GPU holds one rank's
    # share (checked on one); a CPU holds those of every rank on this node
    held = weights.estimate(mc, cfg, model_path, device=device)
    # a draft model whole, on rank 0 only (`worker/model_build.build_draft`)
    draft = draft_model(cfg, 1, device=device, config=draft)
    w, dw = held.bytes, 0 if draft is None else draft.weights.bytes
    if device.type == "cpu":
        w *= cfg.parallel.ranks_per_node
    per_token = kv_bytes_per_token(mc, dtype, cache.kv_cache_dtype, cache.block_size)
    # a draft's rows in every block, its scratch blocks first (`spec/draft_model.py`)
    draft_block, scratch = (0, 0) if draft is None else draft.kv_bytes(cfg)
    per_block = per_token * cache.block_size + draft_block
    if cache.num_blocks_override is not None:
        kv = cache.num_blocks_override * per_block + scratch
    elif cache.kv_cache_memory is not None:
        kv = cache.kv_cache_memory
    elif device.type == "cpu":
        kv = options.DEFAULT_CPU_KV_CACHE_MEMORY
    else:
        kv = 0  # the runner takes what is free after the weights
    if device.type == "cpu" and cache.num_blocks_override is None:
        kv *= cfg.parallel.ranks_per_node  # a budget per rank, every rank on this host
    width = math.ceil(max_len / cache.block_size)
    if per_token == 0:  # no attention layer (Mamba2 or Mamba-1 alone): blocks hold nothing;
        # with prefix caching, its state snapshots take up to their share of the budget
        # (`ModelRunner`)
        caching = (
            cache.enable_prefix_caching
            and mc.family.mamba is not None
            and mc.family.mamba.snapshots
        )
        kv = int(kv * options.SNAPSHOT_SHARE) if caching else 0
        blocks = sched.max_num_seqs * (width + 1)
    else:
        blocks = max(kv - scratch, 0) // per_block
    rows = 2 * sched.max_num_seqs
    tables = rows * ((width + 1) * 4 + 60)  # int32 table, int64 length, list slots per row
    rotary = mc.head_dim if mc.family.mla is None else mc.family.mla.qk_rope_head_dim
    if mc.family.gemma4 is not None:  # its full-attention layers' table beside the sliding's
        rotary += max(mc.family.gemma4.head_dims)
    if mc.family.laguna is not None:  # its sliding layers' table beside the full ones'
        rotary += mc.head_dim
    rope = max_len * rotary * 4  # float32 rows of the positions served (model_runner)
    graphs = 0
    if device.type == "cuda" and cfg.enable_cuda_graphs:
        graphs = min(sched.max_num_seqs, CUDA_GRAPH_MAX_BATCH) * (width * 4 + 64)
    # one rank's Mamba state slots (its heads: `model/mamba_shard.py`), every rank's on a CPU
    m = mamba_shard.local(mc.family.mamba, cfg.parallel.tensor_parallel_size)
    state = 0 if m is None else m.state_bytes(dtype, sched.max_num_seqs)
    if mc.family.dsv4 is not None:  # DeepSeek-V4's open-window slots (model/dsv4_engine.py)
        from pagoda.runtime.model.dsv4_engine import slots_bytes

        state = slots_bytes(mc.family.dsv4, dtype, sched.max_num_seqs)
    if device.type == "cpu":
        state *= cfg.parallel.ranks_per_node
    return Footprint(w, kv, blocks, tables, rope, graphs,
                     step_bytes(mc, cfg, dtype, blocks or None), held.how, state, dw,
                     per_block, scratch)  # fmt: skip


def step_bytes(
    mc: ModelConfig, cfg: EngineConfig, dtype: torch.dtype, kv_blocks: int | None
) -> int:
    """Activations of the largest step the scheduler can form: its tokens are bounded by the
    token budget, by max_num_seqs × max_model_len and by the KV cache; its sampling rows by
    max_num_seqs and by the blocks (each running sequence holds one)."""
    sched, bs = cfg.scheduler, cfg.cache.block_size
    max_len = sched.max_model_len or mc.context_length
    tokens = min(sched.max_num_batched_tokens, sched.max_num_seqs * max_len)
    rows = min(sched.max_num_seqs, tokens)
    if kv_blocks is not None:
        tokens, rows = min(tokens, kv_blocks * bs), min(rows, kv_blocks)
    qkv = (mc.num_heads + 2 * mc.num_kv_heads) * mc.head_dim
    per_token = (4 * mc.hidden_size + qkv + 3 * mc.intermediate_size) * dtype.itemsize
    scan = 0
    tp = cfg.parallel.tensor_parallel_size
    if (m := mamba_shard.local(mc.family.mamba, tp)) is not None:  # the chunked scan's float32
        # temporaries and the conv's input and output (`ssd.ssd_scan_bytes`), a rank's: the
        # runner's and the fit check's figure (`mamba2.step_scan_bytes`)
        per_token += 2 * m.conv_dim * 4
        scan = step_scan_bytes(mc, sched, tp)
    return tokens * per_token + scan + rows * mc.vocab_size * 8  # float32 logits, probabilities


def check(mc: ModelConfig, cfg: EngineConfig, model_path: Path, asked_len: int | None = None,
          draft: ModelConfig | None = None) -> Footprint:  # fmt: skip
    """The footprint, or ValueError (one line: what does not fit, what to lower). `asked_len`:
    an explicit --max-model-len, which a KV cache of known size must hold one sequence of (a
    context left to the model's default is shortened to the cache instead). `draft`: the draft
    model's config as the start-up read it (`draft_model`)."""
    device = cfg.torch_device()
    fp = estimate(mc, cfg, model_path, device, draft)
    bs, per_block, scratch = cfg.cache.block_size, fp.kv_block_bytes, fp.kv_scratch
    host, source = host_available()
    derived = False
    if device.type == "cpu":
        _fits(fp, fp.device_bytes + fp.block_tables, host, f"on this machine ({source})")
    else:
        free, total = device_available(device)
        if fp.kv_cache == 0:  # default budget: what the runner will take after the weights
            budget = int(total * cfg.cache.gpu_memory_utilization) - (total - free)
            scan = step_scan_bytes(mc, cfg.scheduler, cfg.parallel.tensor_parallel_size)
            budget -= fp.weights + fp.draft + fp.state + GPU_HEADROOM + scan
            fp = estimate_with_kv(fp, mc, cfg, max(budget, 0))
            derived = True
        where = f"free on {device} ({gib(total)} in all)"
        _fits(fp, fp.device_bytes, free, where, exclude=("block tables",))
        _fits(fp, fp.block_tables, host, f"on the host ({source})", only=("block tables",))
    if fp.kv_blocks < 2 and derived:
        drafted = f"; the draft model's {gib(fp.draft)}" if fp.draft else ""
        raise ValueError(
            f"{device} has {gib(fp.kv_cache)} left for the KV cache after the weights "
            f"({gib(fp.weights)} {fp.weights_how}{drafted}) and headroom, fewer than 2 blocks of "
            f"{bs} tokens ({gib(per_block)} each); use a larger GPU or a smaller model"
        )
    if fp.kv_blocks < 2:
        raise ValueError(
            f"the KV cache ({gib(fp.kv_cache)}) holds fewer than 2 blocks of {bs} tokens "
            f"({gib(per_block)} each for this model); raise --kv-cache-memory"
        )
    if asked_len is not None and not derived and cfg.cache.num_blocks_override is None:
        check_context_fits(mc, cfg, asked_len, per_block, scratch)
    return fp


def check_context_fits(mc: ModelConfig, cfg: EngineConfig, asked_len: int, per_block: int,
                       scratch: int = 0) -> None:  # fmt: skip
    """An explicit context longer than a KV cache of known size holds is refused, as vLLM
    refuses it (one rank's cache: its share of the KV heads, at least one, in its budget; a
    draft model's rows in `per_block`, its `scratch` blocks out of the budget first)."""
    bs, tp = cfg.cache.block_size, cfg.parallel.tensor_parallel_size
    if per_block == 0:  # no attention layer: no KV cache to hold the context
        return
    budget = cfg.cache.kv_cache_memory or options.DEFAULT_CPU_KV_CACHE_MEMORY
    rank_block = per_block * max(1, mc.num_kv_heads // tp) // mc.num_kv_heads
    blocks = max(budget - scratch, 0) // rank_block
    if asked_len > blocks * bs:
        raise ValueError(
            f"--max-model-len {asked_len} does not fit in the KV cache: {gib(budget)} holds "
            f"{blocks * bs} tokens ({blocks} blocks of {bs}, {gib(rank_block)} each); raise "
            "--kv-cache-memory or lower --max-model-len"
        )


def estimate_with_kv(fp: Footprint, mc: ModelConfig, cfg: EngineConfig, kv: int) -> Footprint:
    """`fp` with a KV budget of `kv` bytes: blocks of `fp.kv_block_bytes` after `fp.kv_scratch`
    (a draft model's scratch blocks)."""
    per_block, scratch = fp.kv_block_bytes, fp.kv_scratch  # (per_block 0: no attention layer)
    blocks = max(kv - scratch, 0) // per_block if per_block else fp.kv_blocks
    kv = kv if per_block else 0
    act = step_bytes(mc, cfg, cfg.torch_dtype(), blocks)
    return dataclasses.replace(fp, kv_cache=kv, kv_blocks=blocks, activations=act)


def _fits(fp: Footprint, need: int, have: int, where: str, *, exclude: tuple[str, ...] = (),
          only: tuple[str, ...] = ()) -> None:  # fmt: skip
    if need <= have:
        return
    parts = {k: v for k, v in fp.parts().items() if v and k not in exclude and
             (not only or k in only)}  # fmt: skip
    worst = max(parts, key=parts.__getitem__)
    how = {"weights": f" {fp.weights_how}" if fp.weights_how else ""}
    listed = ", ".join(f"{k} {gib(v)}{how.get(k, '')}"
                       for k, v in sorted(parts.items(), key=lambda kv: -kv[1]))  # fmt: skip
    if worst == "KV cache" and len(parts) > 1 and parts[worst] > have:
        head = f"--kv-cache-memory {gib(parts[worst])} is more than the {gib(have)} {where}"
    else:
        head = f"this configuration needs at least {gib(need)} but {gib(have)} is {where}"
    raise ValueError(f"{head} ({listed}); lower {_BLAME[worst]}")


def _meminfo_available() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:  # not Linux: physical memory, as an upper bound
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return _UNLIMITED


def _cgroup_headroom(
    proc: Path = Path("/proc/self/cgroup"), sys_root: Path = Path("/sys/fs/cgroup")
) -> int | None:
    """limit - usage (+ reclaimable page cache) of this process's memory cgroup, v2 or v1."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return None
    v2 = next((ln.split(":", 2)[2] for ln in lines if ln.startswith("0::")), None)
    v1 = next((ln.split(":", 2)[2] for ln in lines
               if "memory" in ln.split(":", 2)[1].split(",")), None)  # fmt: skip
    candidates = []
    if v2 is not None:
        root = sys_root
        candidates += [(root / v2.lstrip("/"), "memory.max", "memory.current", "inactive_file"),
                       (root, "memory.max", "memory.current", "inactive_file")]  # fmt: skip
    if v1 is not None:
        root = sys_root / "memory"
        candidates += [
            (root / v1.lstrip("/"), "memory.limit_in_bytes", "memory.usage_in_bytes",
             "total_inactive_file"),
            (root, "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
        ]  # fmt: skip
    for folder, limit_file, usage_file, cache_key in candidates:
        try:
            raw = (folder / limit_file).read_text().strip()
            usage = int((folder / usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if raw == "max" or int(raw) >= _UNLIMITED:
            return None
        return max(int(raw) - usage + _stat(folder / "memory.stat", cache_key), 0)
    return None


def _stat(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0
