"""The frozen sub-configs a model family adds to `FamilyConfig` (runtime/model_config.py):
DeepSeek's latent attention, the expert routers, Llama 4's attention, Falcon-H1's scales,
Nemotron-H's experts, the Mamba2 mixers of the hybrid models and Zamba2's shared blocks.
Validated in ``__post_init__`` like the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
from pagoda.runtime import option_rules

if TYPE_CHECKING:
    from pagoda.runtime.model_config import ModelConfig


def _positive(name: str, value: int) -> None:
    """A positive integer (a bool is not one), at most `option_rules.SIZE_LIMITS[name]` if named there."""
    option_rules.check_int(name, value)


# DeepSeek-V3.2, GLM-5 (runtime/model/dsa.py): DeepSeek Sparse Attention's lightning indexer
@dataclass(frozen=True)
class IndexerConfig:
    """The lightning indexer of each latent attention layer (DeepSeek Sparse Attention): `n_heads`
    heads of `head_dim` (its first `qk_rope_head_dim` dims rotated: in pairs with
    `rope_interleave`, GLM-5; rotate-half, V3.2) score every earlier token of the sequence, and
    the layer attends to the `topk` best only (all of them while there are no more). A layer
    that is not `full_layers[i]` reuses the previous full layer's choice (GLM-5's "shared"
    `indexer_types`); the first layer is full."""

    n_heads: int
    head_dim: int
    topk: int
    rope_interleave: bool
    full_layers: tuple[bool, ...]

    def __post_init__(self) -> None:
        for name in ("n_heads", "head_dim", "topk"):
            _positive(f"index_{name}", getattr(self, name))
        if not self.full_layers or not self.full_layers[0]:
            raise ValueError("the first layer's indexer must be 'full' (a 'shared' layer reuses "
                             "the previous full layer's choice)")  # fmt: skip


# DeepSeek-V2/V3 (runtime/model/deepseek.py): multi-head latent attention and a grouped router
@dataclass(frozen=True)
class MlaConfig:
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi K2, Moonlight): q from the hidden state
    (`q_proj`) or through a low-rank bottleneck (`q_a_proj`, its norm, `q_b_proj`); one latent
    of `kv_lora_rank` plus a shared rotary key of `qk_rope_head_dim` per token
    (`kv_a_proj_with_mqa`), the latent normed and expanded per head (`kv_b_proj`) into the
    key's unrotated part and the value. The engine caches the latent and the rotary key, one
    row of `cache_width` values per token (`ModelConfig`: one KV head of that head size), and
    attends in the absorbed form (model/deepseek.py)."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None  # None: q_proj (DeepSeek-V2-Lite)
    rope_interleave: bool = True  # rotary pairs (x0, x1), (x2, x3), ... (V2 always, V3's flag)
    indexer: IndexerConfig | None = None  # DeepSeek Sparse Attention (V3.2, GLM-5)

    def __post_init__(self) -> None:
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            _positive(name, getattr(self, name))
        if self.q_lora_rank is not None:
            _positive("q_lora_rank", self.q_lora_rank)
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even, got {self.qk_rope_head_dim}")
        ix = self.indexer
        if ix is not None and (ix.head_dim < self.qk_rope_head_dim or self.q_lora_rank is None):
            raise ValueError(f"the indexer reads q_lora_rank's bottleneck (got {self.q_lora_rank}"
                             f") and rotates qk_rope_head_dim ({self.qk_rope_head_dim}) of its "
                             f"index_head_dim ({ix.head_dim}) dims")  # fmt: skip

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def cache_width(self) -> int:
        """A latent cache row: the normed latent, then the rotated shared key (512 + 64), then
        the indexer's key where there is an indexer (+ 128: model/dsa.py)."""
        extra = 0 if self.indexer is None else self.indexer.head_dim
        return self.kv_lora_rank + self.qk_rope_head_dim + extra


ROUTER_SCORES = ("softmax", "sigmoid")
# sparsemixer: PhiMoE's two experts, each by its own masked softmax (moe_routing.sparsemixer)
TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc", "sparsemixer")


@dataclass(frozen=True)
class MiMoAttention:
    """MiMo-V2-Flash's attention (`model/mimo_v2_flash.py`, read by
    `model/mimo_v2_flash_config.py`): the sliding-window layers have `swa_kv_heads` KV heads
    (twice the full-attention layers' `ModelConfig.num_kv_heads`) and attention sinks
    (`self_attn.attention_sink_bias`); every layer's values are `v_head_dim` wide (the keys':
    `ModelConfig.head_dim`), scaled by `v_scale`. The KV cache holds values padded to the
    keys' size (zeros), the attention output sliced back."""

    swa_kv_heads: int
    v_head_dim: int
    v_scale: float = 1.0

    def __post_init__(self) -> None:
        _positive("swa_kv_heads", self.swa_kv_heads)
        _positive("v_head_dim", self.v_head_dim)


@dataclass(frozen=True)
class ExpertRouting:
    """DeepSeek's router (`moe_routing.GroupedRouter`; GLM-4.5's is V3's): scores of the router
    logits (softmax: V2; sigmoid: V3), experts picked from the best `topk_group` of `n_group`
    groups (a group's score: its best expert's for V2's group_limited_greedy, its best two's sum
    for V3's noaux_tc, which adds the checkpoint's `e_score_correction_bias` to the scores for
    the choice only), weights from the uncorrected scores, renormalised with
    `FamilyConfig.norm_topk_prob`, then times `routed_scaling_factor`. The correction bias also
    beside a greedy choice with `correction_bias` (ERNIE 4.5 MoE, MiniMax-M2, AfMoE; its tensor
    where `model/moe_names.py` says); PhiMoE's sparsemixer is its own `topk_method`."""

    scoring: str = "softmax"
    topk_method: str = "greedy"
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    # a correction bias beside greedy or grouped choice (ERNIE 4.5's softmax router: `bias`)
    correction_bias: bool = False
    jitter_eps: float = 0.0  # sparsemixer's mask: logits this far below the best are out
    renorm_eps: float = 1e-20  # added to the picks' sum when renormalised (LFM2-MoE's: 1e-6)

    def __post_init__(self) -> None:
        if self.scoring not in ROUTER_SCORES:
            raise ValueError(f"scoring_func must be one of {', '.join(ROUTER_SCORES)}, "
                             f"got {self.scoring!r}")  # fmt: skip
        if self.topk_method not in TOPK_METHODS:
            raise ValueError(f"topk_method must be one of {', '.join(TOPK_METHODS)}, "
                             f"got {self.topk_method!r}")  # fmt: skip
        _positive("n_group", self.n_group)
        if not 1 <= self.topk_group <= self.n_group:
            raise ValueError(f"topk_group must be in [1, n_group {self.n_group}], "
                             f"got {self.topk_group}")  # fmt: skip
        if not self.routed_scaling_factor > 0:
            raise ValueError("routed_scaling_factor must be positive")

    @property
    def bias(self) -> bool:
        """Whether the checkpoint holds `e_score_correction_bias` (noaux_tc, or
        `correction_bias`)."""
        return self.topk_method == "noaux_tc" or self.correction_bias


@dataclass(frozen=True)
class Llama4Attention:
    """Llama 4's attention on top of Llama's (`model/llama4.py`): the rotary layers' q and k
    L2-normalised per head after rotary (`qk_norm`: a weightless RMSNorm), and the NoPE layers'
    q scaled by log1p(floor((position + 1) / floor_scale)) x attn_scale + 1
    (`temperature_tuning`)."""

    qk_norm: bool = True
    temperature_tuning: bool = True
    floor_scale: float = 8192.0
    attn_scale: float = 0.1


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
    MLP's gate_up (and on q, k and v where `attention_adapters`), then a linear of its own."""

    hybrid: tuple[bool, ...]  # per layer: True = a shared block before the Mamba2 mixer
    blocks: int
    adapter_rank: int
    attention_adapters: bool

    def __post_init__(self) -> None:
        _positive("num_mem_blocks", self.blocks)
        _positive("adapter_rank", self.adapter_rank)

    def block(self, layer: int) -> tuple[int, int]:
        """(the shared block, the use's index among the hybrid layers) of hybrid layer `layer`."""
        use = sum(self.hybrid[:layer])
        return use % self.blocks, use

    def params(self, c: ModelConfig) -> int:
        """The model's weights: the embedding (and head), every layer's mixer and norm, each
        hybrid layer's linear and adapters, the shared blocks, the final norm."""
        m, h = c.family.mamba, c.hidden_size
        z, inter, wide, r = m.zamba2, c.intermediate_size, 2 * c.hidden_size, m.zamba2.adapter_rank
        q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        biases = m.proj_bias * (2 * inter + h)  # (add_bias_linear: the MLP's; the mixers' in
        block = wide * (q + 2 * kv) + q * h + 3 * h * inter + wide + h + biases  # mixer_params)
        uses = sum(z.hybrid)
        adapter = r * (h + 2 * inter) + z.attention_adapters * 3 * r * 2 * wide
        mixer = m.mixer_params(h) + m.proj_bias * (m.d_inner + m.conv_dim + m.n_heads + h) + h
        emb = c.vocab_size * h * (1 if c.tie_word_embeddings else 2)
        total = (
            emb + h + c.num_layers * mixer + uses * (h * h + adapter) + min(z.blocks, uses) * block
        )
        return math.ceil(total)


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
    moe: NemotronHExperts | None = None  # Nemotron-H's MoE blocks
    # the recurrent layers' kind: "mamba2" (the mixer above), "short_conv" (LFM2's gated
    # short convolutions, `model/lfm2.py`: a conv state over d_inner = hidden channels, no SSM
    # state; n_heads 1, head_dim hidden, d_state and n_groups 1 unread) or "mamba1" (Mamba-1's
    # selective scan, `model/mamba1.py`: n_heads 1, head_dim d_inner, A [d_inner, d_state], a
    # conv over d_inner channels; dt from a `dt_rank` projection, FalconMamba's weightless RMS
    # norms on B, C and dt where `bcdt_eps` is set, Jamba's with weights where `bcdt_weighted`)
    # or "gated_deltanet" (Qwen3-Next's and Qwen3.5's linear attention, `model/qwen3_next.py`:
    # n_heads value heads of head_dim, n_groups key heads of d_state; a conv over q, k, v and a
    # state [n_heads, d_state, head_dim] per sequence) or "kda" (Kimi Linear's, `model/kimi_linear.py`:
    # the same shapes, n_groups = n_heads, a decay per key channel: `model/kda.py`)
    mixer: str = "mamba2"
    dt_rank: int = 0
    bcdt_eps: float | None = None
    bcdt_weighted: bool = False
    # the attention layers' q_proj also gives an output gate per head (Qwen3-Next's)
    attn_output_gate: bool = False
    # Gated DeltaNet's beta = 2 sigmoid(b), in [0, 2] (OLMo Hybrid's `linear_allow_neg_eigval`)
    allow_neg_eigval: bool = False
    # Zamba2: a Mamba2 mixer in every layer, shared attention blocks before it on some
    zamba2: Zamba2Blocks | None = None

    def __post_init__(self) -> None:
        if self.mixer not in ("mamba2", "short_conv", "mamba1", "gated_deltanet", "kda"):
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
        return 1 if self.mixer in ("mamba1", "short_conv") else self.chunk_size

    @property
    def conv_dim(self) -> int:
        """The channels the causal conv runs over: x, B and C (a short conv's: d_inner; Gated
        DeltaNet's: q, k and v, shaped as x, B and C)."""
        if self.mixer not in ("mamba2", "gated_deltanet", "kda"):
            return self.d_inner
        return self.d_inner + 2 * self.n_groups * self.d_state

    @property
    def ssm_shape(self) -> tuple[int, ...]:
        """One sequence's SSM state in one layer: [n_heads, head_dim, d_state]; (0,) for a
        short conv (no SSM state: an empty slot tensor, so the slot code needs no branch)."""
        if self.mixer == "short_conv":
            return (0,)
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
        else the one group a rank's heads read (replicated)."""
        if tp == 1:
            return self
        groups = self.n_groups // tp if self.n_groups % tp == 0 else 1
        return replace(self, n_heads=self.n_heads // tp, n_groups=groups)

    def mixer_params(self, hidden: int) -> int:
        """One Mamba2 mixer's weights: in_proj, out_proj, the conv, the norm, A, D, dt_bias (a
        short conv's: in_proj [3 d, hidden], out_proj, the conv, their biases)."""
        c = self.conv_dim
        if self.mixer == "short_conv":
            return 4 * c * hidden + c * self.d_conv + self.conv_bias * 5 * c
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

    def ssm_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return torch.float32 if self.ssm_float32 else dtype

    def state_bytes(self, dtype: torch.dtype, seqs: int) -> int:
        """The state slots of `seqs` sequences over every Mamba layer: conv [conv_dim,
        d_conv - 1] in `dtype`, SSM [heads, head_dim, d_state] in `ssm_dtype`."""
        conv = self.conv_dim * (self.d_conv - 1) * dtype.itemsize
        ssm = math.prod(self.ssm_shape) * self.ssm_dtype(dtype).itemsize
        return self.num_layers * (conv + ssm) * seqs


@dataclass(frozen=True)
class LagunaAttention:
    """Laguna's attention (`model/laguna.py`, read by `model/laguna_config.py`): query heads
    by layer (`num_attention_heads_per_layer`; KV heads and head size are the model's), the
    softplus output gate's width (one per head, or per head element), and the sliding layers'
    rotary (base, rotating fraction of the head); the full-attention layers' is
    `ModelConfig.rope_theta` / `rope_scaling`'s `partial_rotary_factor`."""

    heads: tuple[int, ...]
    gate_per_head: bool = True
    local_rope_theta: float = 10_000.0
    local_rotary: float = 1.0


@dataclass(frozen=True)
class Gemma4Layers:
    """Gemma 4's text model (`model/gemma4.py`, read by `model/gemma4_config.py`): what differs
    layer by layer, and the per-layer inputs. `ModelConfig.head_dim` / `num_kv_heads` are the
    sliding layers'; the full-attention layers' may differ (`head_dims`, `kv_heads`). A layer
    whose `kv_source` is another (an earlier layer of its kind: `num_kv_shared_layers`) has no
    K/V projections and no KV cache of its own: it attends over that layer's. Per-layer inputs
    (`per_layer_input` wide, 0: none) come from a table of `per_layer_vocab` rows."""

    head_dims: tuple[int, ...]
    kv_heads: tuple[int, ...]
    kv_source: tuple[int, ...]
    k_eq_v: tuple[bool, ...]  # values are the keys' projection (no v_proj)
    mlp_widths: tuple[int, ...]  # the dense MLP's (double wide in the KV-shared layers)
    global_rope_theta: float  # the full-attention layers' rotary ("proportional")
    global_rotary: float = 1.0  # partial_rotary_factor: the rest of the head's angles are 0
    global_rope_factor: float = 1.0
    per_layer_input: int = 0
    per_layer_vocab: int = 0
    num_experts: int = 0  # a MoE block beside the dense MLP in every layer (0: none)
    top_k: int = 0
    moe_intermediate_size: int = 0

    def __post_init__(self) -> None:
        n = len(self.head_dims)
        for name in ("kv_heads", "kv_source", "k_eq_v", "mlp_widths"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"gemma4 {name} must name each of the {n} layers")
        for i, src in enumerate(self.kv_source):
            if not 0 <= src <= i or self.kv_source[src] != src:
                raise ValueError(f"gemma4 layer {i} cannot read layer {src}'s KV cache")
            if (self.head_dims[src], self.kv_heads[src]) != (self.head_dims[i], self.kv_heads[i]):
                raise ValueError(f"gemma4 layer {i} reads layer {src}'s KV cache of another shape")
        for d in (*self.head_dims, *self.kv_heads, *self.mlp_widths):
            _positive("head_dim", d)
        if self.num_experts and not 0 < self.top_k <= self.num_experts:
            raise ValueError(f"gemma4 top_k_experts {self.top_k} must be in 1..{self.num_experts}")

    def shares_kv(self, layer: int) -> bool:
        """Whether `layer` reads another layer's KV cache (and keeps none)."""
        return self.kv_source[layer] != layer

    def tensor_shapes(self, c: ModelConfig) -> dict[str, tuple[int, ...]]:
        """Every tensor the model reads, with its shape (the checkpoint check, the weights
        estimate and the parameter count read it; `model/gemma4_config.expected_shapes`)."""
        g, h, heads = self, c.hidden_size, c.num_heads
        out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, h),
                                           "model.norm.weight": (h,)}  # fmt: skip
        if not c.tie_word_embeddings:
            out["lm_head.weight"] = (c.vocab_size, h)
        n, p = c.num_layers, g.per_layer_input
        if p:
            out.update({"model.embed_tokens_per_layer.weight": (g.per_layer_vocab, n * p),
                        "model.per_layer_model_projection.weight": (n * p, h),
                        "model.per_layer_projection_norm.weight": (p,)})  # fmt: skip
        for i in range(n):
            x, d, kv = f"model.layers.{i}.", g.head_dims[i], g.kv_heads[i] * g.head_dims[i]
            a = x + "self_attn."
            out.update({a + "q_proj.weight": (heads * d, h), a + "o_proj.weight": (h, heads * d),
                        a + "q_norm.weight": (d,), x + "layer_scalar": (1,)})  # fmt: skip
            if not g.shares_kv(i):
                out.update({a + "k_proj.weight": (kv, h), a + "k_norm.weight": (d,)})
                if not g.k_eq_v[i]:
                    out[a + "v_proj.weight"] = (kv, h)
            for norm in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                         "post_feedforward_layernorm"):  # fmt: skip
                out[f"{x}{norm}.weight"] = (h,)
            w = g.mlp_widths[i]
            out.update({x + "mlp.gate_proj.weight": (w, h), x + "mlp.up_proj.weight": (w, h),
                        x + "mlp.down_proj.weight": (h, w)})  # fmt: skip
            if p:
                out.update({x + "per_layer_input_gate.weight": (p, h),
                            x + "per_layer_projection.weight": (h, p),
                            x + "post_per_layer_input_norm.weight": (h,)})  # fmt: skip
            if g.num_experts:
                e, m = g.num_experts, g.moe_intermediate_size
                out.update({x + "router.proj.weight": (e, h), x + "router.scale": (h,),
                            x + "router.per_expert_scale": (e,),
                            x + "experts.gate_up_proj": (e, 2 * m, h),
                            x + "experts.down_proj": (e, h, m)})  # fmt: skip
                for norm in ("post_feedforward_layernorm_1", "post_feedforward_layernorm_2",
                             "pre_feedforward_layernorm_2"):  # fmt: skip
                    out[f"{x}{norm}.weight"] = (h,)
        return out
