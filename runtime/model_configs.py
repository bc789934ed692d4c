"""The frozen sub-configs a model family adds to `FamilyConfig` (runtime/model_config.py) for
its attention and its experts: DeepSeek's latent attention (and DSA's indexer), the expert
routers, Llama 4's, MiMo-V2-Flash's, Laguna's and Gemma 4's layers. The recurrent layers'
(the hybrids' Mamba2 mixers and their kin, Falcon-H1's scales, Nemotron-H's experts, Zamba2's
shared blocks) are in `recurrent_configs.py`. Validated in ``__post_init__`` like the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

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
    `indexer_types`); the first layer is full (GLM-5-Next's: the layers with an indexer,
    `glm5_next_config.indexer`)."""

    n_heads: int
    head_dim: int
    topk: int
    rope_interleave: bool
    full_layers: tuple[bool, ...]
    rope_last: bool = False  # its last qk_rope_head_dim dims rotated, not its first (HY V4's)
    key_norm_eps: float = 1e-6  # its key's LayerNorm's
    # GLM-5-Next's k-pool indexer (model/glm5_next.py): pools of `kpool` tokens scored, each a
    # learned mix of its tokens' keys (a gate score per token cached beside its key), the
    # `topk / kpool` best whole pools and the query's unfinished pool kept (0: per token)
    kpool: int = 0

    def __post_init__(self) -> None:
        for name in ("n_heads", "head_dim", "topk"):
            _positive(f"index_{name}", getattr(self, name))
        if self.kpool < 0 or (self.kpool and self.topk % self.kpool):
            raise ValueError(f"index_topk ({self.topk}) must be divisible by index_kpool "
                             f"({self.kpool})")  # fmt: skip
        if not self.kpool and (not self.full_layers or not self.full_layers[0]):
            raise ValueError("the first layer's indexer must be 'full' (a 'shared' layer reuses "
                             "the previous full layer's choice)")  # fmt: skip


@dataclass(frozen=True)
class BlockIndexConfig:
    """MiniMax-M3's lightning indexer on its `layers` (model/minimax_m3.py): `n_heads` heads of
    `head_dim` (one per KV head) score every earlier key, max-pooled in blocks of `block` keys;
    each KV head's queries attend to its `topk` best blocks, the `local` ones ending at the
    query's own always among them."""

    n_heads: int
    head_dim: int
    block: int
    topk: int
    local: int
    layers: tuple[bool, ...]

    def __post_init__(self) -> None:
        for name in ("n_heads", "head_dim", "block", "topk"):
            _positive(f"index_{name}", getattr(self, name))
        if not 0 <= self.local <= self.topk:
            raise ValueError(f"index_local_blocks must be within 0 .. index_topk_blocks "
                             f"({self.topk}), got {self.local}")  # fmt: skip

    @property
    def dense_reach(self) -> int:
        """The longest sequence of which every token keeps every earlier one."""
        return self.topk * self.block


# DeepSeek-V4, HY V4 (runtime/model/hyper_connection.py): hyper-connections
@dataclass(frozen=True)
class HyperConfig:
    """Hyper-connections: the residual is `mult` streams of the hidden size; each attention and
    MLP block reads their mix by weights ``pre`` and writes its output into each stream by
    ``post``, both computed per token from the streams (`model/hyper_connection.py`).
    `sinkhorn_iters` > 0: DeepSeek-V4's manifold-constrained form (mHC: the streams are also
    mixed by a doubly-stochastic ``comb``, Sinkhorn-Knopp); 0: HY V4's independent form (no
    ``comb``: each stream is carried as it is, ``post`` scaled by `post_magnitude`)."""

    mult: int
    sinkhorn_iters: int
    eps: float  # hc_eps
    norm_eps: float  # the unweighted RMSNorm's (rms_norm_eps)
    post_magnitude: float = 2.0

    def __post_init__(self) -> None:
        _positive("hc_mult", self.mult)
        if isinstance(self.sinkhorn_iters, bool) or self.sinkhorn_iters < 0:
            raise ValueError(f"hc_sinkhorn_iters must be >= 0, got {self.sinkhorn_iters}")


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
    # A.X-K2 (model/axk2.py): q_b_proj reads [normed | raw] bottleneck (2 x q_lora_rank) and
    # gives each head its query and a sigmoid gate (v_head_dim) on its value before o_proj
    output_gate: bool = False
    # Dots3 Note (model/deepseek.py): the q/kv bottleneck norms' eps, the normed bottleneck and
    # latent scaled by sqrt(hidden / rank), an RMSNorm on the shared rotary key before rotary
    # (`k_rope_only_layernorm`) and a sigmoid gate per head on its value (`g_proj`)
    norm_eps: float = 1e-6
    dots: bool = False

    def __post_init__(self) -> None:
        for name in ("kv_lora_rank", "qk_nope_head_dim", "v_head_dim"):
            _positive(name, getattr(self, name))
        # (0: no rotary key at all, GLM-5-Next's NoPE latent attention: model/glm5_next.py)
        option_rules.check_int("qk_rope_head_dim", self.qk_rope_head_dim, low=0)
        if self.q_lora_rank is not None:
            _positive("q_lora_rank", self.q_lora_rank)
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even, got {self.qk_rope_head_dim}")
        ix = self.indexer
        if self.output_gate and self.q_lora_rank is None:
            raise ValueError("the attention's output gate reads q_lora_rank's bottleneck")
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
        the indexer's key where there is an indexer (+ 128: model/dsa.py), and a k-pool
        indexer's gate score (+ 128: model/glm5_next.py)."""
        ix = self.indexer
        extra = 0 if ix is None else ix.head_dim * (2 if ix.kpool else 1)
        return self.kv_lora_rank + self.qk_rope_head_dim + extra


ROUTER_SCORES = ("softmax", "sigmoid", "sqrtsoftplus")  # (sqrt(softplus): DeepSeek-V4's)
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
    # noaux_tc's experts outside the best groups set to 0, not -inf (A.X-K2's router)
    zero_other_groups: bool = False
    # the correction bias added to the logits for the choice, not to the scores (Kolibri's:
    # topk(logits + bias), weighted by the picks' sigmoid scores)
    bias_on_logits: bool = False
    # the checkpoint may leave the correction bias out: then zero (A.X-K1's releases route
    # without one; transformers' saves write zeros)
    bias_optional: bool = False
    # LongCat-Flash's zero-computation experts: the router scores this many more, a pick of
    # one returns its input (`model/longcat_flash.py`)
    zero_experts: int = 0

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
        if self.zero_experts < 0:
            raise ValueError("zero_expert_num must not be negative")

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
class DoryLoops:
    """Dory's looped layers (`model/dory.py`, read by `model/dory_config.py`): the first
    `inputs` layers once, the `recurrent` after them `loops` times (each pass a KV cache of its
    own), the last `outputs` once; nGPT's residual rate (`alpha`) and the `init_range` its
    scaled parameters are stored over."""

    inputs: int
    recurrent: int
    outputs: int
    loops: int
    alpha: float
    init_range: float

    def __post_init__(self) -> None:
        if self.loops < 1 or self.recurrent < 0 or self.inputs < 0 or self.outputs < 0:
            raise ValueError(f"dory n_recurrent_loops must be at least 1 and the layer counts "
                             f"non-negative, got {self}")  # fmt: skip

    def order(self) -> list[int]:
        """The layers in the order they run (the recurrent ones once per loop)."""
        middle = list(range(self.inputs, self.inputs + self.recurrent))
        last = self.inputs + self.recurrent
        return [*range(self.inputs), *middle * self.loops, *range(last, last + self.outputs)]


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
class HrmCycles:
    """HRM-Text's recurrence (`model/hrm_text.py`, read by `model/hrm_text_config.py`): two
    stacks of `per_stack` layers (L, then H), every token through `h_cycles` high cycles of
    `l_cycles` L-stack passes then one H-stack pass, each pass's layers a KV cache of their
    own; the embeddings times `embedding_scale`."""

    per_stack: int
    h_cycles: int
    l_cycles: int
    embedding_scale: float

    def order(self) -> list[int]:
        """The physical layer (L's 0.., then H's) each pass runs, in order: one KV cache each."""
        low, high = list(range(self.per_stack)), list(range(self.per_stack, 2 * self.per_stack))
        return (low * self.l_cycles + high) * self.h_cycles


@dataclass(frozen=True)
class DogeAttention:
    """Doge's dynamic mask attention and cross-domain MoE (`model/doge.py`, read by
    `model/doge_config.py`): every key's score gains its own bias exp(A * softplus(dt_proj(v)))
    (one per KV head, from all KV heads' values), which rides in the keys' extra columns
    (`cache_head_dim`); `keep_window` the keys beyond which transformers keeps only the
    top-biased ones (the context is bounded by it instead); `num_experts` product-key experts
    (0: a dense MLP), `top_k` of them per token."""

    keep_window: int
    num_experts: int = 0
    top_k: int = 0
    norm_topk_prob: bool = False

    @property
    def num_keys(self) -> int:
        """The router's keys per half: the experts are the pairs (floor(sqrt(num_experts))²)."""
        return math.isqrt(self.num_experts)

    @staticmethod
    def cache_head_dim(head_dim: int) -> int:
        """The cached key/value width: the head, one bias column, zeros to a multiple of 16."""
        return -(-(head_dim + 1) // 16) * 16


@dataclass(frozen=True)
class Gemma3nParts:
    """What Gemma 3n's layers add to the table it shares with Gemma 4 (`Gemma4Layers.gemma3n`;
    `model/gemma3n.py`, read by `model/gemma3n_config.py`): AltUp's `altup_inputs` streams
    (the layer runs on `altup_active`'s), Laurel's rank, and each layer's activation sparsity
    (0: a plain gate; else the Gaussian top-k's target fraction of zeros)."""

    altup_inputs: int
    altup_active: int
    altup_correct_scale: bool
    laurel_rank: int
    sparsity: tuple[float, ...]
    # the multimodal wrapper's embedders of its image and audio token ids (none in a causal
    # LM's checkpoint): (name, first id, ids, width, eps), `model.embed_<name>.`
    embedders: tuple[tuple[str, int, int, int, float], ...] = ()

    def __post_init__(self) -> None:
        _positive("altup_num_inputs", self.altup_inputs)
        _positive("laurel_rank", self.laurel_rank)
        if not 0 <= self.altup_active < self.altup_inputs:
            raise ValueError(f"gemma3n altup_active_idx {self.altup_active} must be in "
                             f"0..{self.altup_inputs - 1}")  # fmt: skip
        if any(not 0.0 <= s < 1.0 for s in self.sparsity):
            raise ValueError(f"gemma3n activation_sparsity_pattern {list(self.sparsity)} must "
                             "hold fractions in [0, 1)")  # fmt: skip

    def model_shapes(self, h: int) -> dict[str, tuple[int, ...]]:
        """AltUp's projections into and out of its extra streams (outside the layers), and the
        wrapper's embedders of image and audio token ids."""
        out = {}
        for name, _, rows, width, _ in self.embedders:
            e = f"model.embed_{name}."
            out.update({e + "embedding.weight": (rows, width), e + "hard_embedding_norm.weight":
                        (width,), e + "embedding_projection.weight": (h, width)})  # fmt: skip
        for i in range(self.altup_inputs - 1):
            for name in ("altup_projections", "altup_unembed_projections"):
                out[f"model.{name}.{i}.weight"] = (h, h)
        return out

    def layer_shapes(self, x: str, h: int) -> dict[str, tuple[int, ...]]:
        """Layer `x`'s AltUp router and coefficients, and its Laurel branch."""
        a, r = self.altup_inputs, self.laurel_rank
        return {x + "altup.correct_output_scale": (h,), x + "altup.correction_coefs.weight": (a, a),
                x + "altup.prediction_coefs.weight": (a * a, a),
                x + "altup.modality_router.weight": (a, h), x + "altup.router_norm.weight": (h,),
                x + "laurel.linear_left.weight": (r, h), x + "laurel.linear_right.weight": (h, r),
                x + "laurel.post_laurel_norm.weight": (h,)}  # fmt: skip


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
    gemma3n: Gemma3nParts | None = None  # Gemma 3n's AltUp, Laurel, sparsity (no layer scalar)

    def __post_init__(self) -> None:
        n = len(self.head_dims)
        if self.gemma3n is not None and len(self.gemma3n.sparsity) != n:
            raise ValueError(f"gemma3n activation_sparsity_pattern must name each of the {n} "
                             "layers")  # fmt: skip
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
        if g.gemma3n is not None:
            out.update(g.gemma3n.model_shapes(h))
        if p:
            out.update({"model.embed_tokens_per_layer.weight": (g.per_layer_vocab, n * p),
                        "model.per_layer_model_projection.weight": (n * p, h),
                        "model.per_layer_projection_norm.weight": (p,)})  # fmt: skip
        for i in range(n):
            x, d, kv = f"model.layers.{i}.", g.head_dims[i], g.kv_heads[i] * g.head_dims[i]
            a = x + "self_attn."
            out.update({a + "q_proj.weight": (heads * d, h), a + "o_proj.weight": (h, heads * d),
                        a + "q_norm.weight": (d,)})  # fmt: skip
            if g.gemma3n is None:
                out[x + "layer_scalar"] = (1,)
            else:
                out.update(g.gemma3n.layer_shapes(x, h))
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
