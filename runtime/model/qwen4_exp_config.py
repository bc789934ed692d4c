"""Qwen4-Exp's config (`Qwen4ExpForCausalLM`, and `Qwen4ExpForConditionalGeneration` read
text-only: its `text_config`, its `model.language_model.` tensors), for `model/qwen4_exp.py`;
reached through `qwen3_next_config` (Qwen3.5-MoE's layers: Gated DeltaNet, gated attention,
experts in every layer). What Qwen4-Exp adds, as `Qwen4Exp` (`FamilyConfig.qwen4`):

- hyper-connections: ``hc_count`` residual streams of ``hidden_size`` (``hc_lowrank`` the
  rank of each mixer's input weights);
- Per-Layer Embeddings on the layers ``ple_layer_ids`` names (one-indexed, DeltaNet layers
  only): hashed n-grams (orders 2 .. ``ngram_size``, ``heads_per_ngram`` tables each, of prime
  sizes from ``ngram_vocab_size_base``, hashed with multipliers drawn from ``seed``: the
  functions below port transformers'), gated per stream, then a dilated depthwise conv
  (``ple_conv_kernel_size`` taps ``ngram_size`` apart) whose inputs are kept per sequence
  beside the DeltaNet conv state (`MambaConfig.extra_conv_rows`);
- the QSA indexer (``indexer_*``) of the attention layers (`qwen4_qsa.py`), which keeps, for
  each query, the best ``indexer_budget // indexer_compress_ratio`` whole blocks of
  ``indexer_compress_ratio`` tokens and the tail after the last whole block.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

ARCH = "qwen4_exp"
DEFAULTS = {
    "hc_count": 4, "hc_lowrank": 320, "ple_layer_ids": None, "ple_embed_dim": None,
    "ple_conv_kernel_size": 4, "ngram_size": 3, "heads_per_ngram": 8,
    "ngram_vocab_size_base": 20_000_000, "make_ngram_vocab_size_divisible_by": 128, "seed": 1234,
    "split_ngram_parts": 512, "indexer_n_heads": None, "indexer_budget": None,
    "indexer_compress_ratio": None, "output_gate_type": None, "num_experts_per_tok": 10,
    "num_experts": 512, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
}  # fmt: skip

_MASK64 = (1 << 64) - 1
_GAMMA, _M1, _M2, _PRIME_1 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 10007


def _splitmix64(v: int) -> int:
    v = (v + _GAMMA) & _MASK64
    v = ((v ^ (v >> 30)) * _M1) & _MASK64
    v = ((v ^ (v >> 27)) * _M2) & _MASK64
    return (v ^ (v >> 31)) & _MASK64


def _is_prime(v: int) -> bool:
    if v < 2 or v % 2 == 0:
        return v == 2
    return all(v % d for d in range(3, math.isqrt(v) + 1, 2))


@dataclass(frozen=True)
class Qwen4Exp:
    """Qwen4-Exp's additions to Qwen3.5-MoE (module docstring)."""

    hc_count: int
    hc_lowrank: int
    ple_layers: tuple[int, ...]  # zero-based layer indices, ascending
    ple_embed_dim: int
    ple_kernel: int
    ngram_size: int
    heads_per_ngram: int
    ngram_vocab_base: int
    ngram_divisor: int
    seed: int
    num_layers: int
    eos_token_id: int
    gate_act: str  # the DeltaNet output gate's activation: "silu" or "sigmoid"
    indexer_weights: int = 0  # one attention layer's indexer weights
    indexer_heads: int = 0  # the QSA indexer's query heads (0: no indexer)
    indexer_dim: int = 0
    indexer_budget: int = 0  # tokens kept in whole blocks
    indexer_ratio: int = 1  # tokens per compressed block

    @property
    def indexer_blocks(self) -> int:
        """The blocks a query keeps (``indexer_budget // indexer_compress_ratio``)."""
        return self.indexer_budget // self.indexer_ratio

    @property
    def indexer_dense_limit(self) -> int:
        """The longest sequence whose every query keeps every earlier token."""
        return (self.indexer_blocks + 1) * self.indexer_ratio - 1

    @property
    def ngram_heads(self) -> int:
        return (self.ngram_size - 1) * self.heads_per_ngram

    @property
    def ple_state_len(self) -> int:
        """The PLE conv's inputs kept per sequence: (kernel - 1) x dilation (``ngram_size``)."""
        return (self.ple_kernel - 1) * self.ngram_size

    def extra_conv_rows(self, hidden: int, d_conv: int) -> int:
        """Rows of [d_conv - 1] the PLE conv state [hc_count x hidden, ple_state_len] takes
        beside the DeltaNet conv state (every DeltaNet layer's, 0 without PLE)."""
        if not self.ple_layers:
            return 0
        return self.hc_count * hidden * self.ple_state_len // (d_conv - 1)

    def params(self, hidden: int, attention_layers: int) -> int:
        """The weights Qwen4-Exp adds to Qwen3.5-MoE's layers, less the norms it has not
        (two a layer and the final one): the hyper-connections, the PLE layers (their n-gram
        tables: most of the model), the QSA indexers."""
        wide, r = self.hc_count * hidden, self.hc_lowrank
        mixer = wide + 2 * r * wide
        hcs = (self.num_layers * 2 + 1) * mixer + self.num_layers * 2 * self.hc_count * wide
        e = self.ple_embed_dim
        ple = sum(
            self.head_tables(i)[2] * (e // self.ngram_heads) for i in range(len(self.ple_layers))
        )
        ple += len(self.ple_layers) * (wide * e + hidden * e + 3 * wide + wide * self.ple_kernel)
        norms = (2 * self.num_layers + 1) * hidden
        return hcs + ple + attention_layers * self.indexer_weights - norms

    def head_tables(self, ple_index: int) -> tuple[list[int], list[int], int]:
        """PLE layer `ple_index`'s n-gram heads: (table sizes, offsets, the padded rows)
        (transformers' `Qwen4ExpTextNGramEmbedding`: the n-th primes after the base)."""
        sizes, offsets, total, prime = [], [], 0, self.ngram_vocab_base - 1
        first = ple_index * self.ngram_heads
        for _ in range(first):
            prime += 1
            while not _is_prime(prime):
                prime += 1
        for _ in range(self.ngram_heads):
            prime += 1
            while not _is_prime(prime):
                prime += 1
            sizes.append(prime)
            offsets.append(total)
            total += prime
        return sizes, offsets, math.ceil(total / self.ngram_divisor) * self.ngram_divisor

    def multipliers(self, vocab: int, ple_index: int) -> torch.Tensor:
        """int64 [ngram_size]: the hash's odd multipliers (`_build_layer_multipliers`)."""
        half = max(1, ((1 << 63) - 1) // max(vocab, 1) // 2)
        base = self.seed + _PRIME_1 * ple_index
        out = [2 * (_splitmix64((base + _GAMMA * (i + 1)) & _MASK64) % half) + 1
               for i in range(self.ngram_size)]  # fmt: skip
        return torch.tensor(out, dtype=torch.long)


def _eos(cfg: Mapping[str, Any]) -> int | None:
    eos = cfg.get("eos_token_id")
    return eos[0] if isinstance(eos, list) and eos else eos if not isinstance(eos, list) else None


def read(cfg: Mapping[str, Any], types: list[str], hidden: int) -> Qwen4Exp:
    """`Qwen4Exp` of a text config (its DEFAULTS filled in); ValueError, one line, for what
    transformers' config refuses."""
    n = len(types)
    hc = int(cfg["hc_count"])
    if hc <= 1:
        raise ValueError(f"Qwen4-Exp needs hc_count > 1, got {hc}")
    ids = sorted(set(cfg.get("ple_layer_ids") or ()))
    bad = [i for i in ids if not 1 <= i <= n or types[i - 1] != "linear_attention"]
    if bad:
        raise ValueError(f"ple_layer_ids {bad} must name linear_attention layers in [1, {n}]")
    ngram, per = int(cfg["ngram_size"]), int(cfg["heads_per_ngram"])
    dim = int(cfg.get("ple_embed_dim") or hidden)
    eos = _eos(cfg)
    if ids and ((ngram - 1) * per <= 0 or dim % ((ngram - 1) * per)):
        raise ValueError(f"ple_embed_dim {dim} must be a multiple of the {(ngram - 1) * per} "
                         "n-gram heads ((ngram_size - 1) x heads_per_ngram)")  # fmt: skip
    if ids and eos is None:
        raise ValueError("eos_token_id must be set when Qwen4-Exp PLE layers are enabled")
    act = cfg.get("output_gate_type") or cfg.get("hidden_act") or "silu"
    if act not in ("silu", "sigmoid"):
        raise ValueError(f"output_gate_type {act!r} is not supported in a Qwen4-Exp model "
                         "(silu or sigmoid)")  # fmt: skip
    qsa = [cfg.get(k) for k in ("indexer_n_heads", "indexer_head_dim", "indexer_budget",
                                "indexer_compress_ratio")]  # fmt: skip
    weights, heads, d, budget, ratio = 0, 0, 0, 0, 1
    if any(v is not None for v in qsa):
        if any(v is None or int(v) <= 0 for v in qsa) or int(cfg.get("indexer_kv_heads") or 1) != 1:
            raise ValueError("a Qwen4-Exp QSA indexer needs positive indexer_n_heads, "
                             "indexer_head_dim, indexer_budget, indexer_compress_ratio and one "
                             "key head (indexer_kv_heads 1)")  # fmt: skip
        heads, d = int(cfg["indexer_n_heads"]), int(cfg["indexer_head_dim"])
        budget, ratio = int(cfg["indexer_budget"]), int(cfg["indexer_compress_ratio"])
        weights = (heads + 1) * d * hidden + 2 * d  # index_qk_proj, q and k layernorms
    return Qwen4Exp(
        hc_count=hc, hc_lowrank=int(cfg["hc_lowrank"]), ple_layers=tuple(i - 1 for i in ids),
        ple_embed_dim=dim, ple_kernel=int(cfg["ple_conv_kernel_size"]), ngram_size=ngram,
        heads_per_ngram=per, ngram_vocab_base=int(cfg["ngram_vocab_size_base"]),
        ngram_divisor=int(cfg["make_ngram_vocab_size_divisible_by"]), seed=int(cfg["seed"]),
        num_layers=n, eos_token_id=-1 if eos is None else int(eos), gate_act=act,
        indexer_weights=weights, indexer_heads=heads, indexer_dim=d, indexer_budget=budget,
        indexer_ratio=ratio,
    )  # fmt: skip


def expected_shapes(c, i: int) -> dict[str, tuple[int, ...]]:
    """Layer `i`'s hyper-connection, QSA indexer and PLE tensors (the n-gram table by its shards:
    `ple_names`), and the model's final mixer's on layer 0."""
    q, h, p = c.family.qwen4, c.hidden_size, f"model.layers.{i}."
    wide, r = q.hc_count * h, q.hc_lowrank
    out: dict[str, tuple[int, ...]] = {}
    for name in ("attn_hyper_connection.", "mlp_hyper_connection."):
        out.update({p + name + "hc_norm.weight": (wide,),
                    p + name + "input_mix_weight_down.weight": (r, wide),
                    p + name + "input_mix_weight_up.weight": (wide, r),
                    p + name + "block_inject_weight.weight": (q.hc_count, wide)})  # fmt: skip
    if i == 0:
        m = "model.hyper_connection_mixer."
        out.update({m + "hc_norm.weight": (wide,), m + "input_mix_weight_down.weight": (r, wide),
                    m + "input_mix_weight_up.weight": (wide, r)})  # fmt: skip
    if q.indexer_heads and not c.family.mamba.layers[i]:
        x, d = p + "self_attn.indexer.", q.indexer_dim
        out.update({x + "index_qk_proj.weight": ((q.indexer_heads + 1) * d, h),
                    x + "q_layernorm.weight": (d,), x + "k_layernorm.weight": (d,)})  # fmt: skip
    if i in q.ple_layers:
        e, x = q.ple_embed_dim, p + "ple."
        out.update({x + "key_proj.weight": (wide, e), x + "value_proj.weight": (h, e),
                    x + "norm_key.weight": (wide,), x + "norm_query.weight": (wide,),
                    x + "norm_conv.weight": (wide,), x + "conv1d.weight": (wide, 1, q.ple_kernel)})  # fmt: skip
    return out
