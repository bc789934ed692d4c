"""The frozen configs of a model's recurrent layers (`FamilyConfig.mamba`, runtime/model_config.py):
the Mamba2 mixers of the hybrid models and their kin (LFM2's short convs, Mamba-1, Gated DeltaNet,
KDA: `MambaConfig.mixer`), with what sizes their weights and per-sequence states, and what rides
on them: Falcon-H1's scales, Nemotron-H's experts, Zamba2's shared blocks, MiniMax's residual
weights (`conv_attention_configs.py` holds Zaya's and Inkling's conv-fed attention layers).
Validated in ``__post_init__`` like the rest (`model_configs.py` holds the attention and expert
sub-configs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
from pagoda.runtime import option_rules
from pagoda.runtime.conv_attention_configs import Inkling2Layers, InklingLayers, ZayaCCA
from pagoda.runtime.model_configs import ExpertRouting

if TYPE_CHECKING:
    from pagoda.runtime.model_config import ModelConfig


def _positive(name: str, value: int) -> None:
    """A positive integer (a bool is not one), at most `option_rules.SIZE_LIMITS[name]` if named there."""
    option_rules.check_int(name, value)


@dataclass(frozen=True)
class FalconH1Scales:
    """Falcon-H1's µP multipliers (`model/falcon_h1.py`), 1.0 where none."""

    embedding: float = 1.0
    lm_head: float = 1.0
    key: float = 1.0  # k before rotary
    attention_in: float = 1.0
    attention_out: float = 1.0
    ssm_in: float = 1.0
    ssm_out: float = 1.0
    zxbcdt: tuple[float, ...] = (1.0,) * 5  # the Mamba in_proj's z, x, B, C and dt parts
    mlp_gate: float = 1.0
    mlp_down: float = 1.0


@dataclass(frozen=True)
class NemotronHExperts:
    """Nemotron-H's MoE blocks (Nemotron 3; `model/nemotron_h.py`): ungated ReLU² experts of
    `intermediate` (on a `latent`-wide projection of the input where set), routed by DeepSeek-V3's
    sigmoid router (`routing`, with `e_score_correction_bias`), beside an ungated shared expert
    of `shared_intermediate`."""

    layers: tuple[bool, ...]  # per layer: True = a MoE block
    num_experts: int
    top_k: int
    intermediate: int
    shared_intermediate: int
    routing: ExpertRouting
    norm_topk_prob: bool = True
    latent: int | None = None

    def params(self, hidden: int) -> int:
        """One block's weights: experts, shared expert, router and its bias, latent projections."""
        width = self.latent or hidden
        experts = self.num_experts * 2 * width * self.intermediate
        latent = 2 * hidden * self.latent if self.latent else 0
        return (
            experts
            + 2 * hidden * self.shared_intermediate
            + self.num_experts * (hidden + 1)
            + latent
        )


@dataclass(frozen=True)
class Zamba2Blocks:
    """Zamba2's shared transformer blocks (`model/zamba2.py`): `blocks` of them (attention over
    the concatenated [stream, embeddings], then a gated MLP), reused in turn by the hybrid
    layers `hybrid` marks, each use with LoRA adapters of rank `adapter_rank` of its own on the
    MLP's gate_up (and on q, k and v where `attention_adapters`), then a linear of its own.
    Zamba (`model/zamba.py`, Mamba-1 mixers): one block, no adapters (`adapter_rank` 0)."""

    hybrid: tuple[bool, ...]  # per layer: True = a shared block before the Mamba2 mixer
    blocks: int
    adapter_rank: int
    attention_adapters: bool

    def __post_init__(self) -> None:
        _positive("num_mem_blocks", self.blocks)
        if self.adapter_rank < 0 or (self.attention_adapters and not self.adapter_rank):
            raise ValueError(f"adapter_rank must be positive, got {self.adapter_rank}")

    def block(self, layer: int) -> tuple[int, int]:
        """(the shared block, the use's index among the hybrid layers) of hybrid layer `layer`."""
        use = sum(self.hybrid[:layer])
        return use % self.blocks, use

    def params(self, c: ModelConfig, tp: int = 1) -> int:
        """The model's weights (on one of `tp` ranks: the mixers' heads, the blocks' heads and
        MLP width, the adapters' B by their projections' rows; `model/zamba2.py`): the embedding
        (and head, whole), every layer's mixer and norm, each hybrid layer's linear and
        adapters, the shared blocks, the final norm."""
        m, h, t = c.family.mamba.on_ranks(tp), c.hidden_size, tp
        z, inter, wide, r = (
            m.zamba2,
            c.intermediate_size / t,
            2 * c.hidden_size,
            m.zamba2.adapter_rank,
        )
        q, kv = c.num_heads * c.head_dim / t, max(1, c.num_kv_heads // t) * c.head_dim
        zamba2 = m.mixer == "mamba2"  # (Zamba's Mamba-1 mixers: their biases in mixer_params)
        biases = zamba2 * m.proj_bias * (2 * inter + h)  # (add_bias_linear: the MLP's; the
        block = wide * (q + 2 * kv) + q * h + 3 * h * inter + wide + h + biases  # mixers' below)
        uses = sum(z.hybrid)
        adapter = r * (h + 2 * inter) + z.attention_adapters * 3 * r * (wide + (q + 2 * kv) / 3)
        mixer_bias = zamba2 * m.proj_bias * (m.d_inner + m.conv_dim + m.n_heads + h)
        mixer = m.mixer_params(h) + mixer_bias + h
        emb = c.vocab_size * h * (1 if c.tie_word_embeddings else 2)
        total = (
            emb + h + c.num_layers * mixer + uses * (h * h + adapter) + min(z.blocks, uses) * block
        )
        return math.ceil(total)


@dataclass(frozen=True)
class MiniMaxScales:
    """MiniMax-Text-01's residual weights (`model/minimax.py`): each sublayer's output is
    ``alpha * x + beta * f(x)`` of its normalised input x, by sublayer kind."""

    full_attn: tuple[float, float] = (1.0, 1.0)  # (alpha, beta) after softmax attention
    linear_attn: tuple[float, float] = (1.0, 1.0)  # after lightning attention
    mlp: tuple[float, float] = (1.0, 1.0)  # after the MoE


@dataclass(frozen=True)
class MambaConfig:
    """The Mamba2 mixers of a hybrid model (`model/mamba2.py`; Granite 4.0, Bamba): the layers
    `layers` marks run one in place of attention, each keeping a recurrent state per sequence
    (`worker/mamba_state.py`): a conv state [conv_dim, d_conv - 1] and an SSM state
    [n_heads, head_dim, d_state]."""

    layers: tuple[bool, ...]  # per layer: True = a Mamba2 mixer, False = attention
    n_heads: int
    head_dim: int
    d_state: int
    n_groups: int = 1
    d_conv: int = 4
    chunk_size: int = 256
    conv_bias: bool = True
    proj_bias: bool = False
    dt_min: float = 0.0  # the softplus'd time step clamped to [dt_min, dt_max]
    dt_max: float = float("inf")
    # Nemotron-H: layers that are an MLP alone (neither a Mamba mixer nor attention); () none
    mlp_layers: tuple[bool, ...] = ()
    ssm_float32: bool = False  # the SSM state kept in float32 whatever the model's dtype
    # the output norm: y * silu(z) normalised per group (False: y * silu(z) alone, Falcon-H1
    # without `mamba_rms_norm`); `norm_before_gate`: norm(y) * silu(z) (Falcon-H1's)
    gated_norm: bool = True
    norm_before_gate: bool = False
    parallel_attention: bool = False  # attention beside the mixer in every layer (Falcon-H1)
    falcon: FalconH1Scales | None = None
    minimax: MiniMaxScales | None = None  # MiniMax-Text-01's residual weights
    moe: NemotronHExperts | None = None  # Nemotron-H's MoE blocks
    # the recurrent layers' kind: "mamba2" (the mixer above), "short_conv" (LFM2's gated
    # short convolutions, `model/lfm2.py`: a conv state over d_inner = hidden channels, no SSM
    # state; n_heads 1, head_dim hidden, d_state and n_groups 1 unread) or "mamba1" (Mamba-1's
    # selective scan, `model/mamba1.py`: n_heads 1 (Zamba's n_mamba_heads, each its own B and
    # C), head_dim d_inner / n_heads, A [d_inner, d_state], a
    # conv over d_inner channels; dt from a `dt_rank` projection, FalconMamba's weightless RMS
    # norms on B, C and dt where `bcdt_eps` is set, Jamba's with weights where `bcdt_weighted`)
    # or "gated_deltanet" (Qwen3-Next's and Qwen3.5's linear attention, `model/qwen3_next.py`:
    # n_heads value heads of head_dim, n_groups key heads of d_state; a conv over q, k, v and a
    # state [n_heads, d_state, head_dim] per sequence) or "kda" (Kimi Linear's, `model/kimi_linear.py`:
    # the same shapes, n_groups = n_heads, a decay per key channel: `model/kda.py`) or
    # "lightning" (MiniMax-Text-01's lightning attention, `model/minimax.py`: Mamba2's scan with
    # dt 1, A the heads' decays, B = k, C = q, x = v, one group a head; no conv: conv_dim 0)
    mixer: str = "mamba2"
    dt_rank: int = 0
    bcdt_eps: float | None = None
    bcdt_weighted: bool = False
    # the attention layers' q_proj also gives an output gate per head (Qwen3-Next's)
    attn_output_gate: bool = False
    # the attention layers' output scaled per head by sigmoid(g_proj(x)) (LFM3's, BailingHybrid's)
    attn_head_gate: bool = False
    # KDA's forget and output gates one full-rank projection each, f_proj and g_proj [H K,
    # hidden] (BailingHybrid's, `model/bailing_hybrid.py`), not Kimi's f_a f_b and g_a g_b
    kda_full_gates: bool = False
    # Gated DeltaNet's beta = 2 sigmoid(b), in [0, 2] (OLMo Hybrid's `linear_allow_neg_eigval`)
    allow_neg_eigval: bool = False
    # xLSTM's mLSTM ("mlstm"): its gates' soft cap, the eps of its output's denominator
    gate_soft_cap: float = 15.0
    kernel_eps: float = 1e-6
    fused_projections: bool = False  # its `weight_mode` "fused": q/k/v/o, i/f, the FFN's gate/up
    # Zamba2: a Mamba2 mixer in every layer, shared attention blocks before it on some
    zamba2: Zamba2Blocks | None = None
    # Zaya: a short conv state beside attention in every layer, feeding its q/k/v
    zaya: ZayaCCA | None = None
    # Inkling: four short convs' inputs beside attention in every layer, relative logits
    inkling: InklingLayers | None = None
    inkling2: Inkling2Layers | None = None  # Inkling 2's
    # rows of [d_conv - 1] each layer's conv state carries past `conv_dim`: Qwen4-Exp's PLE
    # conv inputs (`model/qwen4_exp.py`), snapshotted with the rest
    extra_conv_rows: int = 0
    # (KV heads, head size) of each kind of layer whose k and v channels lead the conv state,
    # the widest's rows kept (Inkling's and Inkling 2's full and window layers): a rank keeps
    # its KV heads' (`on_ranks`); the rest of the state (their sublayers' outputs) whole
    kv_convs: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.mixer not in ("mamba2", "short_conv", "mamba1", "gated_deltanet", "kda",
                              "lightning", "rglru", "wkv", "mlstm"):  # fmt: skip
            raise ValueError(f"unknown recurrent mixer {self.mixer!r}")
        for name in ("n_heads", "head_dim", "d_state", "n_groups", "d_conv", "chunk_size"):
            _positive(name, getattr(self, name))
        if self.n_heads % self.n_groups:
            raise ValueError(f"mamba n_groups ({self.n_groups}) must divide its "
                             f"{self.n_heads} heads")  # fmt: skip

    @property
    def d_inner(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def snapshots(self) -> bool:
        """Whether prefix caching keeps snapshots of these layers' states
        (`core/state_snapshots.py`): every mixer saves them (the chunked scans and rules at
        their chunk boundaries, Mamba-1's scan and LFM2's short conv at any token), so any
        model with a recurrent layer."""
        return self.num_layers > 0

    @property
    def snapshot_chunk(self) -> int:
        """The tokens a snapshot boundary inside a step's prefill chunk must be a multiple of
        (from the chunk's start, `core/state_snapshots.py`): the chunk of a chunked scan or
        rule (Mamba2's SSD, the Gated DeltaNet's, KDA's), whose chunk boundaries alone hold a
        state; 1 for Mamba-1's scan (it passes through the state at every token) and LFM2's
        short conv (its state is the inputs before a token), so their boundaries fall every
        block and the scheduler cuts no prefill chunk for them."""
        if self.mixer in ("mamba1", "short_conv", "rglru", "wkv", "mlstm"):
            return 1
        return self.chunk_size

    @property
    def conv_dim(self) -> int:
        """The channels the causal conv runs over: x, B and C (a short conv's: d_inner; Gated
        DeltaNet's: q, k and v, shaped as x, B and C)."""
        if self.mixer in ("lightning", "mlstm"):  # (no conv: an empty conv state)
            return 0
        if self.mixer not in ("mamba2", "gated_deltanet", "kda"):
            return self.d_inner
        return self.d_inner + 2 * self.n_groups * self.d_state

    @property
    def ssm_shape(self) -> tuple[int, ...]:
        """One sequence's SSM state in one layer: [n_heads, head_dim, d_state]; (0,) for a
        short conv (no SSM state: an empty slot tensor, so the slot code needs no branch)."""
        if self.mixer == "short_conv":
            return (0,)
        if self.mixer == "mlstm":  # xLSTM's C [heads, dqk, dv], then its n and m columns
            return (self.n_heads, self.d_state, self.head_dim + 2)
        if self.mixer in ("gated_deltanet", "kda"):  # [value heads, key_dim, value_dim]
            return (self.n_heads, self.d_state, self.head_dim)
        return (self.n_heads, self.head_dim, self.d_state)

    @property
    def num_layers(self) -> int:
        return sum(self.layers)

    def attention(self, layer: int) -> bool:
        """Whether `layer` attends (keeps a KV cache)."""
        if self.parallel_attention:
            return True
        if self.zamba2 is not None:  # the hybrid layers: a shared block's use attends
            return self.zamba2.hybrid[layer]
        moe = self.moe is not None and self.moe.layers[layer]
        return (
            not self.layers[layer] and not (self.mlp_layers and self.mlp_layers[layer]) and not moe
        )

    def on_ranks(self, tp: int) -> MambaConfig:
        """The mixers' shapes on one of `tp` ranks (`model/mamba_shard.py`, which says which
        heads and groups): n_heads / tp heads, and n_groups / tp groups where tp divides them,
        else the one group a rank's heads read (replicated); a Mamba-1 mixer's (one head of
        d_inner) d_inner / tp channels (`model/mamba1.py`), RWKV's wkv channels likewise;
        Zaya's conv state its heads' q/k channels and the delayed values whole, Inkling's its
        KV heads' k and v channels and the outputs' whole."""
        if tp == 1:
            return self
        if self.zaya is not None:  # Zaya's conv state: its heads' q/k, every delayed value
            qk = (self.head_dim - self.zaya.delayed) // tp  # (`model/zaya.py`)
            return replace(self, head_dim=qk + self.zaya.delayed)
        if self.kv_convs:  # Inkling's: k and v of a rank's KV heads (split, or one replicated)
            whole, local = (2 * max((k // n if k >= n else 1) * d for k, d in self.kv_convs)
                            for n in (1, tp))  # fmt: skip
            return replace(self, head_dim=self.head_dim - whole + local)
        if self.mixer in ("mamba1", "short_conv") and self.n_heads == 1:  # by channels
            return replace(self, head_dim=self.head_dim // tp)  # (Jamba's, LFM2's: `lfm2.py`)
        if self.mixer == "wkv":  # RWKV's: its wkv channels; every rank both token shifts whole
            local = self.head_dim // tp  # (`model/rwkv.py`: the conv rows stay 2 x hidden)
            return replace(self, head_dim=local, extra_conv_rows=self.conv_state_rows - local)
        groups = self.n_groups // tp if self.n_groups % tp == 0 else 1
        return replace(self, n_heads=self.n_heads // tp, n_groups=groups)

    def mixer_params(self, hidden: int) -> int:
        """One Mamba2 mixer's weights: in_proj, out_proj, the conv, the norm, A, D, dt_bias (a
        short conv's: in_proj [3 d, hidden], out_proj, the conv, their biases)."""
        c = self.conv_dim
        if self.mixer == "lightning":  # qkv_proj, output_gate, out_proj, the norm
            return 5 * self.d_inner * hidden + self.d_inner
        if self.mixer == "short_conv":
            return 4 * c * hidden + c * self.d_conv + self.conv_bias * 5 * c
        if self.mixer == "mlstm":  # q, k, v, o, the two gates (biased), the norm, out_proj
            qk, v = self.n_heads * self.d_state, self.d_inner
            return (2 * qk + 3 * v) * hidden + 2 * self.n_heads * (hidden + 1) + v
        if self.mixer == "wkv":  # RWKV's time-mix (k, v, r, output; decay, bonus, 3 mixes), the
            d = self.d_inner  # channel-mix's receptance and 2 mixes (its key and value: the
            return 4 * d * hidden + 2 * d + hidden * hidden + 5 * hidden  # ungated MLP's)
        if self.mixer == "rglru":  # linear_y, linear_x, linear_out, the conv (all biased), the
            d, p = self.d_inner, self.head_dim  # recurrent param, two gates per head block
            return 3 * d * hidden + 2 * d + hidden + d * (self.d_conv + 1) + d + 2 * d * (p + 1)
        if self.mixer == "mamba1":  # in_proj, out_proj (their biases), the conv, x_proj,
            d, n, r = self.d_inner, self.d_state, self.dt_rank  # dt_proj, A_log, D (and
            proj = 3 * d * hidden + self.proj_bias * (2 * d + hidden)  # Jamba's dt/B/C norms)
            return (
                proj
                + self.bcdt_weighted * (r + 2 * n)
                + d * (self.d_conv + self.conv_bias)
                + d * (r + 2 * n)
                + d * (r + 1)
                + d * (n + 1)
            )
        if (
            self.mixer == "kda"
        ):  # q k v, b, f_a f_b, g_a g_b, o_proj, the conv, o_norm, A_log, dt_bias
            d, k = self.d_inner, self.head_dim
            proj = (3 * d + self.n_heads + 2 * k) * hidden + 2 * k * d + hidden * d
            if self.kda_full_gates:  # f_proj and g_proj for f_a f_b and g_a g_b
                proj = (5 * d + self.n_heads) * hidden + hidden * d
            return proj + c * self.d_conv + k + self.n_heads + d
        if self.mixer == "gated_deltanet":  # q k v z b a, out_proj, the conv, norm, A_log, dt_bias
            proj = (c + self.d_inner + 2 * self.n_heads) * hidden + hidden * self.d_inner
            return proj + c * self.d_conv + self.head_dim + 2 * self.n_heads
        proj = (self.d_inner + c + self.n_heads) * hidden + hidden * self.d_inner
        return (
            proj
            + c * (self.d_conv + self.conv_bias)
            + self.d_inner * self.gated_norm
            + 3 * self.n_heads
        )

    @property
    def conv_state_rows(self) -> int:
        """The rows of a layer's conv state: `conv_dim`, and `extra_conv_rows`."""
        return self.conv_dim + self.extra_conv_rows

    def ssm_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return torch.float32 if self.ssm_float32 else dtype

    def state_bytes(self, dtype: torch.dtype, seqs: int) -> int:
        """The state slots of `seqs` sequences over every Mamba layer: conv [conv_dim,
        d_conv - 1] in `dtype`, SSM [heads, head_dim, d_state] in `ssm_dtype`."""
        conv = self.conv_state_rows * (self.d_conv - 1) * dtype.itemsize
        ssm = math.prod(self.ssm_shape) * self.ssm_dtype(dtype).itemsize
        return self.num_layers * (conv + ssm) * seqs
