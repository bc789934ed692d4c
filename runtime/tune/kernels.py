"""Kernel sweep: for each attention launcher and shape bucket, time a small candidate space
(the matmul buckets, one per weight shape, are planned and checked in `tune.matmul`, the FP8
GEMM's in `tune.fp8_matmul`).

Buckets are the shapes the model will hit (its head dim, GQA ratio, block size and dtype; decode
``num_seqs`` × ``max_seq_len``; prefill ``max_query_len``), keyed like ``configs/<Device>.json``.
The prefill rows run in the prefill kernel (``prefill_attention``). With batch invariance (the
default) it has two buckets, as ``paged_attention`` looks them up: the decodes
(``max_query_len`` 1, timed on a decode batch) and every other row (``INVARIANT_PREFILL_LEN``,
timed on the engine's chunk); the second is swept with the first one's ``TILE_SIZE``, which the
launcher imposes on it.
Every candidate is first run on fresh random inputs and compared with the torch reference
(``pagoda.kernels.reference``): a candidate that raises or disagrees is rejected and never saved.
Survivors are timed (``triton.testing.do_bench``, median, inputs rotated through copies larger
than L2 on CUDA) and the fastest is written with ``save_kernel_config``.

Runs on CUDA; under ``TRITON_INTERPRET=1`` the same logic runs on CPU tensors (tests), with a
wall-clock timer because the interpreter is not a performance target.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from pagoda.runtime.tune import fp8_matmul, matmul, moe

DECODE = "decode_attention"
PREFILL = "prefill_attention"
MAX_TIMED_TOKENS = (
    1 << 21
)  # batch × context of one timed decode bucket (8 GB of bf16 KV at 8 heads)
TOL = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 4e-2}

Timer = Callable[[Callable[[], None]], float]  # returns milliseconds


@dataclass(frozen=True)
class AttentionShape:
    """The attention geometry of one model at one dtype and KV block size."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype

    def __post_init__(self) -> None:
        if min(self.num_heads, self.num_kv_heads, self.head_dim, self.block_size) < 1:
            raise ValueError(f"attention shape must be positive: {self}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")


@dataclass(frozen=True)
class Bucket:
    """One config bucket: ``shape`` is its lookup key, ``seqs`` the (query_len, seq_len) batch."""

    kernel: str
    shape: dict[str, int] = field(hash=False)
    seqs: tuple[tuple[int, int], ...]
    invariant: bool = False  # a batch-invariant prefill bucket (`TILE_SIZE` shared, see above)

    @property
    def label(self) -> str:
        return f"{self.kernel} " + " ".join(f"{k}={v}" for k, v in self.shape.items())


def plan_buckets(
    shape: AttentionShape,
    *,
    max_num_seqs: int,
    max_model_len: int,
    max_num_batched_tokens: int,
    quick: bool = False,
    batch_invariant: bool = False,
) -> list[Bucket]:
    """Decode (batch × context) and prefill (max_query_len) buckets this engine can reach;
    ``quick``: the smallest of each. ``batch_invariant``: only the prefill kernel's two fixed
    buckets, as every row runs in it then."""
    d = shape.head_dim
    batches = sorted({b for b in (1, 4, 16, 64, 256) if b <= max_num_seqs} | {max_num_seqs})
    contexts = sorted({c for c in (512, 2048, 8192, 32768) if c <= max_model_len} | {max_model_len})
    out = []
    for b, ctx in itertools.product(batches, contexts):
        if b * ctx <= MAX_TIMED_TOKENS:
            shp = {"head_dim": d, "num_seqs": b, "max_seq_len": ctx}
            out.append(Bucket(DECODE, shp, ((1, ctx),) * b))
    top = min(max_num_batched_tokens, max_model_len)
    if batch_invariant:  # every row, decodes too, runs in the prefill kernel
        return invariant_prefill_buckets(shape, max_num_seqs, max_model_len, top)
    for q in sorted({q for q in (16, 64, 512, 2048) if q <= top} | {top}):
        n = max(1, min(8, max_num_batched_tokens // q))
        out.append(
            Bucket(
                PREFILL, {"head_dim": d, "max_query_len": q}, ((q, min(max_model_len, 2 * q)),) * n
            )
        )
    if quick:
        return [next(b for b in out if b.kernel == k) for k in (DECODE, PREFILL)]
    return out


def invariant_prefill_buckets(
    shape: AttentionShape, max_num_seqs: int, max_model_len: int, chunk: int
) -> list[Bucket]:
    """The prefill kernel's batch-invariant buckets: its decode launch (a decode batch at up to
    2k of context) and its prefill launch (up to 4 chunks of ``chunk`` tokens over cache)."""
    from pagoda.kernels.attention import INVARIANT_PREFILL_LEN

    d = shape.head_dim
    ctx = min(2048, max_model_len)
    chunk = max(2, min(chunk, 4096, max_model_len))
    prefill = ((chunk, min(2 * chunk, max_model_len)),) * max(1, min(4, 8192 // chunk))
    return [
        Bucket(PREFILL, {"head_dim": d, "max_query_len": 1}, ((1, ctx),) * min(max_num_seqs, 64),
               invariant=True),
        Bucket(PREFILL, {"head_dim": d, "max_query_len": INVARIANT_PREFILL_LEN}, prefill,
               invariant=True),
    ]  # fmt: skip


def candidate_space(kernel: str, quick: bool = False) -> list[dict[str, Any]]:
    """The configs tried per bucket (small: a whole model should tune in ~10 min on one GPU);
    ``quick``: two of them (smoke tests)."""
    if kernel == matmul.MATMUL:
        return matmul.candidate_space(quick)
    if kernel == moe.FUSED_MOE:
        return moe.candidate_space(quick)
    if kernel == fp8_matmul.FP8_MATMUL:
        return fp8_matmul.FP8_LINEAR.candidate_space(quick)
    if quick:
        return [c for c in candidate_space(kernel) if c["num_stages"] == 2][:2]
    pipes = [(4, 2), (4, 3), (8, 3)]
    if kernel == DECODE:
        rules = [
            {"waves": 2, "min_tokens_per_split": 256, "max_splits": 16},
            {"waves": 4, "min_tokens_per_split": 128, "max_splits": 64},
            {"waves": 1, "min_tokens_per_split": 256, "max_splits": 1},
        ]
        return [
            {"TILE_SIZE": t, "num_warps": w, "num_stages": s, **r}
            for t, (w, s), r in itertools.product((32, 64, 128), pipes, rules)
        ]
    return [
        {"BLOCK_M": m, "TILE_SIZE": t, "num_warps": w, "num_stages": s}
        for m, t, (w, s) in itertools.product((16, 64, 128), (32, 64, 128), pipes)
    ]


@dataclass
class PagedBatch:
    """Launcher arguments of one random paged batch (``num_decodes`` first sequences decode)."""

    args: dict[str, Any]
    num_decodes: int


def make_batch(
    shape: AttentionShape,
    seqs: Iterable[tuple[int, int]],
    device: torch.device,
    gen: torch.Generator,
) -> PagedBatch:
    """Random q and paged K/V (blocks shuffled) for ``seqs`` = [(query_len, seq_len)]."""
    seqs = list(seqs)
    bs, hkv, d = shape.block_size, shape.num_kv_heads, shape.head_dim
    per_seq = [-(-s // bs) for _, s in seqs]
    total = sum(per_seq)
    perm = torch.randperm(total, generator=gen).to(torch.int32)
    table = torch.zeros((len(seqs), max(per_seq)), dtype=torch.int32)
    start = 0
    for i, n in enumerate(per_seq):
        table[i, :n] = perm[start : start + n]
        start += n

    # Values are drawn on the device (a GB-sized cache drawn on the host would take minutes),
    # from a device generator seeded by ``gen`` so runs stay reproducible.
    dev_gen = gen
    if device.type != "cpu":
        seed = int(torch.randint(0, 2**62, (1,), generator=gen))
        dev_gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*dims: int) -> torch.Tensor:
        return torch.randn(dims, generator=dev_gen, device=device).to(shape.dtype)

    q_lens = [q for q, _ in seqs]
    qsl = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(q_lens), 0)
    args = {
        "q": randn(sum(q_lens), shape.num_heads, d),
        "k_cache": randn(total, bs, hkv, d),
        "v_cache": randn(total, bs, hkv, d),
        "block_tables": table.to(device),
        "seq_lens": torch.tensor([s for _, s in seqs], dtype=torch.int32, device=device),
        "query_start_loc": qsl.to(device),
        "max_query_len": max(q_lens),
        "max_seq_len": max(s for _, s in seqs),
        "scale": d**-0.5,
    }
    num_decodes = next((i for i, (q, _) in enumerate(seqs) if q != 1), len(seqs))
    return PagedBatch(args, num_decodes)


def num_splits_for(
    bucket: Bucket, shape: AttentionShape, config: dict, device: torch.device
) -> int:
    from pagoda.kernels.config import num_sms
    from pagoda.kernels.decode_attention import choose_num_splits

    return choose_num_splits(
        num_decodes=bucket.shape["num_seqs"],
        num_kv_heads=shape.num_kv_heads,
        max_seq_len=bucket.shape["max_seq_len"],
        num_sms=num_sms(device),
        config=config,
    )


def launch(kernel: str, batch: PagedBatch, config: dict, splits: int, out: torch.Tensor) -> None:
    """Run one launcher with ``config`` exactly as ``paged_attention`` would for this bucket:
    the prefill kernel takes leading decodes in its one-token launch, the rest in one more."""
    from pagoda.kernels import decode_attention, prefill_attention

    a = batch.args
    common = {k: a[k] for k in ("q", "k_cache", "v_cache", "block_tables", "seq_lens", "scale")}
    if kernel == DECODE:
        decode_attention.launch_decode_attention(
            **common, out=out, num_decodes=batch.num_decodes, num_splits=splits, config=config
        )
        return
    nd, num_seqs, num_tokens = batch.num_decodes, a["seq_lens"].shape[0], a["q"].shape[0]
    common.update(query_start_loc=a["query_start_loc"], out=out, config=config)
    if nd:
        prefill_attention.launch_prefill_attention(
            **common, first_seq=0, last_seq=nd, first_token=0, last_token=nd,
            one_token_per_seq=True,
        )  # fmt: skip
    if nd < num_seqs:
        prefill_attention.launch_prefill_attention(
            **common, first_seq=nd, last_seq=num_seqs, first_token=nd, last_token=num_tokens
        )
