"""Which part of a model one tensor-parallel rank holds (pure arithmetic, no communication).

Megatron-style sharding, as vLLM's: rank r of N holds

- query heads ``[r H/N, (r+1) H/N)`` (H must divide by N);
- KV heads ``[r Hkv/N, (r+1) Hkv/N)`` when N divides Hkv, else (N a multiple of Hkv) the one
  KV head its query heads read, ``r Hkv / N``: the KV heads are then *replicated*, each held by
  N / Hkv ranks, so the grouped-query mapping of every query head is what it was on one device;
- rows ``[r I/N, (r+1) I/N)`` of the MLP's gate and up (and those columns of down), per expert
  for a mixture of experts (I must divide by N);
- a hybrid's Mamba2 heads and B/C groups as `model/mamba_shard.py` says (Qwen3-Next's Gated
  DeltaNet layers by key heads, the KDA, lightning-attention and RG-LRU layers by heads; Mamba-1's
  mixers, LFM2's short convs and RWKV's wkv by channels, Zamba's Mamba-1 mixers and xLSTM's
  mLSTM by heads);
- a family's own shapes as its module says (`tp_families.py`, by architecture: Gemma 4's
  layers' KV heads and MLP widths, Laguna's layers' query heads, DeepSeek-V4's output
  projection groups (`model/dsv4_shard.py`; its one KV row a token replicated), ...);
- rows ``[r V'/N, (r+1) V'/N)`` of the embedding and LM head, V' the vocabulary rounded up to a
  multiple of N (the padding rows are zeros on the embedding side and cut from the logits).

`check` names what does not divide, before anything is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pagoda.runtime import family_options, options
from pagoda.runtime.distributed import tp_families

if TYPE_CHECKING:  # (config reads a rank's Mamba2 shapes from model/mamba_shard.py, which
    # imports this module)
    from pagoda.runtime.config import ModelConfig
    from pagoda.runtime.recurrent_configs import MambaConfig


@dataclass(frozen=True)
class TPLayout:
    rank: int
    size: int

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank {self.rank} is outside a group of {self.size}")

    def even(self, n: int) -> tuple[int, int]:
        """This rank's [start, stop) of `n` rows split evenly (`check` made sure N divides n)."""
        part = n // self.size
        return self.rank * part, (self.rank + 1) * part

    def heads(self, num_heads: int) -> tuple[int, int]:
        """This rank's query heads [start, stop)."""
        return self.even(num_heads)

    def kv_heads(self, num_kv_heads: int) -> tuple[int, int]:
        """This rank's KV heads [start, stop): its share, or the one it replicates."""
        if num_kv_heads >= self.size:
            return self.even(num_kv_heads)
        head = self.rank * num_kv_heads // self.size
        return head, head + 1

    def qkv_rows(self, num_heads: int, num_kv_heads: int, head_dim: int) -> list[tuple[int, int]]:
        """This rank's [start, stop) rows of q, k and v (its query heads', its KV heads'), as
        the stacked q/k/v layer and a LoRA adapter of it are cut."""
        (q0, q1), (k0, k1) = self.heads(num_heads), self.kv_heads(num_kv_heads)
        kv = (k0 * head_dim, k1 * head_dim)
        return [(q0 * head_dim, q1 * head_dim), kv, kv]

    def local_heads(self, num_heads: int, num_kv_heads: int) -> tuple[int, int]:
        """How many query and KV heads this rank computes (its attention backend's); all of
        them where there are fewer than ranks (a model without attention, Mamba's: its stand-in
        heads, which `check` does not split)."""
        if num_heads < self.size:
            return num_heads, num_kv_heads
        (q0, q1), (k0, k1) = self.heads(num_heads), self.kv_heads(num_kv_heads)
        return q1 - q0, k1 - k0

    def vocab(self, vocab_size: int) -> tuple[int, int]:
        """This rank's rows of the padded vocabulary [start, stop) (stop may pass vocab_size)."""
        part = -(-vocab_size // self.size)
        return self.rank * part, (self.rank + 1) * part


def mamba_problem(m: MambaConfig, size: int) -> str | None:
    """Why `size` ranks cannot split a hybrid's Mamba2 mixers (one line), or None: the heads must
    divide, the B/C groups divide or be a multiple of them (`model/mamba_shard.py`); Qwen3-Next's
    Gated DeltaNet layers split by key heads, which must divide, the KDA, lightning and RG-LRU layers by
    heads; Mamba-1's (Mamba's, Falcon-Mamba's, Jamba's) by channels of d_inner, which must
    divide, Zamba's by its heads, LFM2's short convs and RWKV's wkv by channels, xLSTM's mLSTM
    by heads (Zaya's and Inkling's conv states by their attention heads: their families'
    checks). Other mixers are not split:
    refused (their families' rows in `family_options.py` refuse them first, naming the
    architecture)."""
    if m.mixer == "gated_deltanet":  # Qwen3-Next's: by key heads (their value heads follow)
        if m.n_groups % size:
            return (f"--tensor-parallel-size {size} does not divide the Gated DeltaNet key heads "
                    f"(linear_num_key_heads {m.n_groups})")  # fmt: skip
        return None
    if m.mixer == "mamba1" and m.n_heads == 1:  # Jamba's: by channels (`model/mamba1.py`)
        if m.d_inner % size:
            return (f"--tensor-parallel-size {size} does not divide the Mamba mixers' channels "
                    f"(mamba d_inner {m.d_inner})")  # fmt: skip
        return None
    if m.zaya is not None or m.kv_convs:  # Zaya's conv state, Inkling's: by their attention
        return None  # heads (`zaya_config.tp_problem`, `inkling_config.tp_problem`)
    if m.mixer == "short_conv":  # LFM2's gated short convs: by channels (`model/lfm2.py`)
        if m.d_inner % size:
            return (f"--tensor-parallel-size {size} does not divide the short convs' channels "
                    f"(hidden_size {m.d_inner})")  # fmt: skip
        return None
    if m.mixer == "mamba1":  # Zamba's: by heads, each its own x_proj and dt_proj (`zamba.py`)
        if m.n_heads % size:
            return (f"--tensor-parallel-size {size} does not divide the Mamba heads "
                    f"(n_mamba_heads {m.n_heads})")  # fmt: skip
        return None
    if m.mixer == "wkv":  # RWKV's time-mix: by channels (`model/rwkv.py`)
        if m.d_inner % size:
            return (f"--tensor-parallel-size {size} does not divide the wkv channels "
                    f"(attention_hidden_size {m.d_inner})")  # fmt: skip
        return None
    if m.mixer == "mlstm":  # xLSTM's: by heads (`model/xlstm.py`)
        if m.n_heads % size:
            return (f"--tensor-parallel-size {size} does not divide the mLSTM heads "
                    f"(num_heads {m.n_heads})")  # fmt: skip
        return None
    if m.mixer in ("kda", "lightning", "rglru"):  # Kimi Linear's, ..., MiniMax-Text-01's,
        # RecurrentGemma's (its RG-LRU's gate blocks): by heads
        if m.n_heads % size:
            kind = {"kda": "KDA", "lightning": "lightning attention", "rglru": "RG-LRU"}[m.mixer]
            return (f"--tensor-parallel-size {size} does not divide the {kind} heads "
                    f"({m.n_heads})")  # fmt: skip
        return None
    if m.mixer != "mamba2":
        return f"--tensor-parallel-size {size} is not supported for a model with {m.mixer} layers"
    if m.n_heads % size:
        return (f"--tensor-parallel-size {size} does not divide the Mamba2 heads "
                f"(mamba n_heads {m.n_heads})")  # fmt: skip
    if m.n_groups % size and size % m.n_groups:
        return (f"--tensor-parallel-size {size} neither divides the Mamba2 groups "
                f"(n_groups {m.n_groups}) nor is a multiple of them")  # fmt: skip
    return None


def check(config: ModelConfig, size: int) -> None:
    """ValueError, one line, if `config` cannot be split over `size` ranks: its family is not
    tested on ranks (`family_options.py`), or its shapes do not divide: the shared checks (the
    arithmetic is `options.tensor_parallel_problem`'s, which the operator also runs for the
    built-in models; a shared expert's width, a hybrid's mixers), then the family's own
    (`tp_families.TP_PROBLEMS`)."""
    if size == 1:
        return
    family_options.refuse(config.architecture, "tensor_parallel", size=size)
    f = config.family
    dense = f.num_experts == 0 or any(not f.has_experts(i) for i in range(config.num_layers))
    m = f.mamba  # Mamba's, Falcon-Mamba's, Mamba2's: mixers alone, their config's heads and
    # MLP width stand-ins (`model/mamba1_config.py`), not split: the mixers' shapes checked
    alone = m is not None and not any(m.attention(i) for i in range(config.num_layers))
    bare = alone and m.mixer in ("mamba1", "mamba2")
    no_heads = bare or (alone and m.mixer in ("wkv", "mlstm"))  # (RWKV's, xLSTM's stand-ins;
    # their channel-mix / FFN split by width)
    problem = options.tensor_parallel_problem(
        size,
        0 if no_heads else config.num_heads,
        0 if no_heads else config.num_kv_heads,
        mlp_width=config.intermediate_size if dense and not bare else None,
        expert_width=f.moe_intermediate_size if f.num_experts else None,
    )
    shared = f.shared_expert_intermediate_size  # Qwen2-MoE's shared expert, split by width
    if problem is None and shared % size:
        problem = (f"--tensor-parallel-size {size} does not divide the shared expert's width "
                   f"(shared_expert_intermediate_size {shared})")  # fmt: skip
    if problem is None and m is not None and m.num_layers:  # the Mamba2 mixers' heads, groups
        problem = mamba_problem(m, size)
    if problem is None:  # the family's own shapes (its `tp_families.TP_PROBLEMS` entry)
        problem = tp_families.tp_problem(config, size)
    if problem is not None:
        raise ValueError(problem)
