"""What a checkpoint describes, read once by the loaders: `ModelConfig` (the Llama-family
decoder's sizes, rotary, special tokens) and `FamilyConfig` (what a family changes in the Llama
layer; its per-family sub-configs in `model_configs.py`). Frozen and validated in
``__post_init__`` like the engine's settings (`config.py`, which re-exports both)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pagoda.runtime import option_rules
from pagoda.runtime.model_configs import (
    BlockIndexConfig,
    DogeAttention,
    DoryLoops,
    ExpertRouting,
    Gemma4Layers,
    HrmCycles,
    HyperConfig,
    LagunaAttention,
    Llama4Attention,
    MiMoAttention,
    MlaConfig,
)
from pagoda.runtime.recurrent_configs import MambaConfig

# What a model family changes in the Llama decoder, read once from the checkpoint's config by
# the loaders; the model files (runtime/model/qwen3.py, gemma3.py, moe.py) read these fields, the
# attention backends only the sliding window, the attention chunk and the soft cap.
# SwiGLU (Llama, Qwen, Mixtral), GeGLU (Gemma's tanh approximation; Zamba2's exact "gelu"),
# relu(gate)² * up (BitNet's)
ACTIVATIONS = ("silu", "gelu_tanh", "gelu", "relu2")
# an ungated MLP's (`FamilyConfig.gated_mlp` false): StarCoder2's GELU, Arcee's ReLU²,
# Apertus' xIELU (its parameters per layer, from the checkpoint)
UNGATED_ACTIVATIONS = ("gelu_tanh", "relu2", "xielu", "gelu", "relu")  # (gelu: exact; relu: OPT's)
POSITIONS = ("rope", "learned", "alibi", "sinusoidal")  # `FamilyConfig.positions`
# families with biases on q, k, v, the output, both MLP matrices and every LayerNorm (their
# q/k norms' too), counted in `num_params`
ALL_BIASES = ("persimmon", "xglm", "openai_gpt", "biogpt", "ctrl")


def _on_layer(value: int | None, flags: tuple[bool, ...], layer: int) -> int | None:
    """`value` where `flags` (one a layer; () for all of them) marks `layer`, else None."""
    return None if value is None or (flags and not flags[layer]) else value


@dataclass(frozen=True)
class FamilyConfig:
    """The defaults are Llama's: a Llama, Mistral or Qwen2 checkpoint changes nothing here but
    Mistral's sliding window."""

    # attention
    qk_norm: bool = False  # an RMSNorm over each head of q and of k before rotary (Qwen3, Gemma 3)
    sliding_window: int | None = None  # keys a window layer sees, its own position included
    window_layers: tuple[bool, ...] = ()  # per layer: True = a window layer; () = all of them
    local_rope_theta: float | None = None  # window layers' rotary base (Gemma 3), no scaling
    # chunked attention (Llama 4): a chunked layer's query at p sees the keys p - p % C .. p
    attention_chunk_size: int | None = None
    chunk_layers: tuple[bool, ...] = ()  # per layer: True = chunked; () = all of them
    query_pre_attn_scalar: float | None = None  # softmax scale = this ** -0.5 (None: head_dim)
    # scores = cap * tanh(scores / cap) (Gemma 2's; Gemma 3 configs carry it unused)
    attn_logit_softcapping: float | None = None
    # Gemma 3's layer: (1 + w) RMSNorm, norms after attention and around the MLP, the embedding
    # scaled by sqrt(hidden_size) in the model's dtype
    gemma_norms: bool = False
    norms_hold_one_plus_w: bool = False  # the checkpoint stores 1 + w (llama.cpp's Gemma GGUFs)
    final_logit_softcapping: float | None = None  # logits = cap * tanh(logits / cap)
    hidden_act: str = "silu"  # the gated MLP's activation (`ACTIVATIONS`)
    # mixture of experts: router softmax, top-k, SwiGLU experts
    num_experts: int = 0  # 0: a dense MLP in every layer
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True  # renormalise the top-k probabilities to sum to 1 (Mixtral: yes)
    round_topk_to_model_dtype: bool = False  # Qwen3-MoE rounds the routing weights (HF does)
    moe_layers: tuple[bool, ...] = ()  # per layer: True = experts; () = all (when num_experts)
    # a shared expert of this width beside the routed ones (0: none), its output scaled by
    # sigmoid(shared_expert_gate(x)) in Qwen2-MoE, ungated where `routing` is set (DeepSeek)
    shared_expert_intermediate_size: int = 0
    shared_expert_average: bool = False  # (routed + shared) / 2, not their sum (Cohere 2 MoE)
    # OLMo 2's layer: norms on attention's and the MLP's outputs (none on their inputs), RMSNorm
    # scaling in float32 (EXAONE 4's: the same layer, Llama's RMSNorm)
    olmo2_norms: bool = False
    qk_norm_whole: bool = False  # an RMSNorm over all of q and of k (OLMo 2, OLMoE), not per head
    # Granite: embeddings x embedding_multiplier, each residual branch x residual_multiplier,
    # softmax scale attention_multiplier (None: head_dim ** -0.5), logits / logits_scaling
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    attention_multiplier: float | None = None
    logits_scaling: float = 1.0
    # rotary: per layer, True = rotated; () = every layer (SmolLM3's NoPE layers, Cohere 2's
    # global layers attend without positions)
    rope_layers: tuple[bool, ...] = ()
    # rotary base per layer (GraniteSWA's `layer_rope_theta`, 0 on its NoPE layers); () =
    # `ModelConfig.rope_theta` on every rotating layer
    rope_thetas: tuple[float, ...] = ()
    rope_interleaved: bool = False  # rotate pairs (2i, 2i + 1), not halves (GLM, Cohere)
    # GLM-4's layer: RMSNorms on attention's and the MLP's outputs too, before their residual adds
    glm4_norms: bool = False
    # Cohere's layer: LayerNorm (weight, no bias) for RMSNorm, attention and the MLP in parallel
    # off one norm (x + attn(n) + mlp(n)); with qk_norm, a LayerNorm over each head of q and of
    # k with a weight per head ([heads, head_dim])
    cohere_layer: bool = False
    cohere_rms_norm: bool = False  # Cohere's layer over Llama's RMSNorm (Cohere 2 MoE's option)
    logit_scale: float = 1.0  # logits x this (Cohere's `logit_scale`)
    # DeepSeek-V2/V3 (model/deepseek.py): latent attention (its softmax scale in
    # attention_multiplier), the grouped router, and an ungated shared expert of
    # shared_expert_intermediate_size (moe_intermediate_size x n_shared_experts)
    mla: MlaConfig | None = None
    routing: ExpertRouting | None = None
    # A.X-K2 (model/axk2.py): the norm before attention (and before the experts) gated by
    # sigmoid(W_up(silu(W_down(y)))) of its output y, W_down this wide (0: plain norms)
    gated_norm_rank: int = 0
    # gpt-oss (`model/gpt_oss.py`): a learned logit per head that joins each softmax's
    # denominator only (`self_attn.sinks`), and experts with biases running the clamped SwiGLU
    # (up + 1) * gate * sigmoid(alpha * gate), gate <= limit, |up| <= limit
    attention_sinks: bool = False
    # Inkling (model/inkling.py): each layer's relative-position logits join the scores (the
    # attention backends' `rel_logits`: the torch backend's)
    relative_logits: bool = False
    swiglu_alpha: float = 1.702
    swiglu_limit: float | None = None  # None: the experts run plain SwiGLU (silu)
    # HY V4 (model/hy_v4.py): the residual as hyper-connected streams (DeepSeek-V4's form too)
    hyper: HyperConfig | None = None
    # BailingHybrid's KDA forget gate (model/bailing_hybrid.py): kda_lower_bound * sigmoid(.)
    kda_lower_bound: float = -5.0
    # MiniMax-M3's lightning indexer (model/minimax_m3.py): its block-sparse layers
    block_index: BlockIndexConfig | None = None
    # Ministral 3's (Llama 4's) q scale by position p: 1 + beta * log(1 + floor(p / context))
    # (`llama_4_scaling_beta`, the rotary's `original_max_position_embeddings`; 0: none)
    query_scale_beta: float = 0.0
    query_scale_context: int = 0
    # the MLP: down(act(up(x))), no gate (`model/ungated_mlp.py`: Arcee, Apertus, StarCoder2)
    gated_mlp: bool = True
    # StarCoder2's norms: LayerNorm with a weight and a bias (in the model's dtype) for RMSNorm
    layer_norm_bias: bool = False
    # biases on attention's output projection (with `ModelConfig.attention_bias`) and on the LM
    # head: PhiMoE's (the model reads them where the checkpoint has them; `server/weights.py`'s
    # count from the config alone needs to know)
    o_proj_bias: bool = False
    lm_head_bias: bool = False
    # an LM head pruned to the vocabulary's first `head_rows` ids (Apertus 1.5's
    # `output_vocab_size`: model/apertus.py), the embedding keeping every id; 0: the vocabulary
    head_rows: int = 0
    # Llama 4 (model/llama4.py): its attention's extras; its experts are routed by sigmoids of
    # the top-k logits that scale the experts' inputs, beside an ungated shared expert
    llama4: Llama4Attention | None = None
    clip_qkv: float | None = None  # OLMo's: q, k and v clamped to [-clip_qkv, clip_qkv]
    # a fused q/k/v's layout ("multi_query", "grouped", "per_head", "stacked": Falcon's, GPT-NeoX's,
    # GPT-2's, StarCoder 1's, BLOOM's, MPT's) and Falcon's layer's norms ("one", "two",
    # "sequential"): model/falcon.py
    falcon_qkv: str = ""
    falcon_norms: str = ""
    # hybrid state-space models (Granite 4.0, Bamba): the Mamba2 layers, None: all attention
    mamba: MambaConfig | None = None
    # Gemma 4 (model/gemma4.py): head sizes, KV heads and MLP widths by layer, KV-shared
    # layers, per-layer inputs, the MoE block beside the MLP
    gemma4: Gemma4Layers | None = None
    # Laguna (model/laguna.py): query heads by layer, the output gate, the sliding layers' rotary
    laguna: LagunaAttention | None = None
    # Dory (model/dory.py): recurrent layers run in loops, each loop's pass its own KV cache
    dory: DoryLoops | None = None
    # Doge (model/doge.py): the dynamic mask's key biases, the product-key experts
    doge: DogeAttention | None = None
    # HRM-Text (model/hrm_text.py): its L and H stacks run in cycles, each pass a KV cache
    hrm: HrmCycles | None = None
    # MiMo-V2-Flash (model/mimo_v2_flash.py): more KV heads and sinks in the window layers,
    # values narrower than the keys
    mimo: MiMoAttention | None = None
    # Qwen4-Exp (model/qwen4_exp.py): hyper-connections, Per-Layer Embeddings, the QSA limit
    qwen4: Any = None  # `qwen4_exp_config.Qwen4Exp`
    # Kolibri 1.1 (model/kolibri1.py): its KV-shared layers, its indexed layers' budget
    kolibri11: Any = None  # `kolibri1_config.Kolibri11`
    # DeepSeek-V4 (model/dsv4_engine.py): its whole config.json read apart (`dsv4_config`)
    dsv4: Any = None  # `dsv4_config.Dsv4Config`
    # how positions enter (`POSITIONS`): "rope" (rotary), "learned" (a table of absolute
    # positions added to the token embeddings: GPT-2, StarCoder 1, OPT, its row p +
    # position_offset), "alibi" (a per-head linear bias on the scores: BLOOM, MPT; the slopes'
    # formula `alibi_slopes`: "bloom" or "mpt", with MPT's `alibi_bias_max`), "sinusoidal"
    # (learned's, the table computed: XGLM's)
    positions: str = "rope"
    position_offset: int = 0  # OPT's 2
    # GPT-2's scale_attn_by_inverse_layer_idx: layer i's scores / (i + 1) (q scaled)
    q_scale_by_layer: bool = False
    alibi_slopes: str = ""
    alibi_bias_max: float = 8.0
    # OPT: norms after each sublayer's residual add (`do_layer_norm_before` false: opt-350m),
    # and the embedding's width where it differs from hidden_size (`word_embed_proj_dim`:
    # project_in / project_out around the layers; 0: none)
    post_norm: bool = False
    embed_proj_dim: int = 0
    # BERT's and RoBERTa's token-type table's rows (token type 0's added to every token's
    # embedding: model/bert.py); 0: none
    type_vocab_size: int = 0
    # an encoder's sentence-transformers `max_seq_length` (sentence_bert_config.json: the
    # length it was trained to embed, below its position table's), which bounds the context
    # as vLLM bounds it; 0: none
    max_seq_length: int = 0
    # a sequence classifier's labels (`*ForSequenceClassification`: model/classifier_head.py;
    # one: a cross-encoder's score); 0: none; and, where a cross-encoder's pairs take token
    # types, the [SEP] id after which a pair's type is 1
    num_labels: int = 0
    # ModernBERT (model/modernbert.py): its local layers' keys either side of a query
    # (`window_layers`; 0: none, every layer global), its classifier head's activation
    encoder_window: int = 0
    classifier_act: str = ""
    # a decoder classifier's head made of its LM head's rows (model/classifier_config.py):
    # their ids, and how ("from_2_way_softmax": the second less the first, Qwen3-Reranker's;
    # "no_post_processing": the rows themselves); (): its `score` matrix
    classifier_tokens: tuple[int, ...] = ()
    classifier_method: str = ""
    sep_token_id: int = -1
    # BitNet b1.58 (model/bitnet.py, bitlinear.py): its projections' ternary weights stored packed
    # ("offline") or as master weights quantized at load ("online"); "": dense (no
    # quantization_config: transformers runs plain Linears)
    bitnet: str = ""
    # Ergo (model/ergo.py): the full-attention layers' scores × this (q and k × its root)
    global_attention_scale: float | None = None
    # DiffLlama (model/diffllama.py): differential attention, its KV cache twice the KV heads
    diff_attention: bool = False

    @property
    def transforms_logits(self) -> bool:
        """The logits are changed after the LM head (Gemma's soft cap, Granite's and Cohere's
        scales)."""
        return (
            bool(self.final_logit_softcapping)
            or self.logits_scaling != 1.0
            or self.logit_scale != 1.0
        )

    def __post_init__(self) -> None:
        if self.positions not in POSITIONS:
            raise ValueError(f"positions must be one of {', '.join(POSITIONS)}, got "
                             f"{self.positions!r}")  # fmt: skip
        if self.bitnet not in ("", "offline", "online"):
            raise ValueError(f"bitnet must be 'offline', 'online' or '', got {self.bitnet!r}")
        if self.positions == "alibi" and self.alibi_slopes not in ("bloom", "mpt"):
            raise ValueError(f"ALiBi slopes must be 'bloom' or 'mpt', got {self.alibi_slopes!r}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be positive, got {self.sliding_window}")
        if self.attention_chunk_size is not None and self.attention_chunk_size < 1:
            raise ValueError(f"attention_chunk_size must be positive, got "
                             f"{self.attention_chunk_size}")  # fmt: skip
        allowed = ACTIVATIONS if self.gated_mlp else UNGATED_ACTIVATIONS
        if self.hidden_act not in allowed:
            which = "a gated" if self.gated_mlp else "an ungated"
            raise ValueError(f"hidden activation {self.hidden_act!r} in {which} MLP is not one "
                             f"of {', '.join(allowed)}")  # fmt: skip
        for name in ("attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar",
                     "attention_multiplier", "logits_scaling", "logit_scale", "swiglu_limit"):  # fmt: skip
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if self.query_scale_beta and self.query_scale_context < 1:
            raise ValueError("query_scale_context must be positive with a query_scale_beta")
        if self.num_experts:
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise ValueError(
                    f"num_experts_per_tok must be in [1, {self.num_experts}], "
                    f"got {self.num_experts_per_tok}"
                )
            if self.moe_intermediate_size < 1:
                raise ValueError("moe_intermediate_size must be positive")
            if self.shared_expert_intermediate_size < 0:
                raise ValueError("shared_expert_intermediate_size must not be negative")
            if self.routing is not None and self.num_experts % self.routing.n_group:
                raise ValueError(f"n_group ({self.routing.n_group}) must divide the "
                                 f"{self.num_experts} routed experts")  # fmt: skip

    def window(self, layer: int) -> int | None:
        """The sliding window of `layer`, or None where it attends to its whole context."""
        return _on_layer(self.sliding_window, self.window_layers, layer)

    def chunk(self, layer: int) -> int | None:
        """The attention chunk of `layer` (chunked attention), or None where it has none."""
        return _on_layer(self.attention_chunk_size, self.chunk_layers, layer)

    def has_rope(self, layer: int) -> bool:
        """Whether `layer` rotates q and k (`rope_layers`)."""
        return not self.rope_layers or self.rope_layers[layer]

    def has_experts(self, layer: int) -> bool:
        """Whether `layer`'s MLP is a mixture of experts."""
        if not self.num_experts:
            return False
        return not self.moe_layers or self.moe_layers[layer]

    def attention_scale(self, head_dim: int) -> float:
        """The softmax scale applied to q . k."""
        if self.attention_multiplier is not None:
            return self.attention_multiplier
        return (self.query_pre_attn_scalar or head_dim) ** -0.5


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a Llama-family decoder (Llama, Mistral, Qwen2/3, Gemma 3, Mixtral, ...);
    what a family changes in the Llama layer is in `family`."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 has biases on q/k/v projections
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    architecture: str = "llama"
    family: FamilyConfig = field(default_factory=FamilyConfig)
    # a vision-language model's image side (`multimodal.config.VisionConfig`); None: text only
    vision: Any = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers"):
            option_rules.check_int(name, getattr(self, name))
        for name in ("num_heads", "num_kv_heads", "head_dim", "max_position_embeddings"):
            option_rules.check_int(name, getattr(self, name))
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.rms_norm_eps <= 0 or self.rope_theta <= 0:
            raise ValueError("rms_norm_eps and rope_theta must be positive")
        for name in ("window_layers", "moe_layers", "rope_layers", "chunk_layers"):
            if len(getattr(self.family, name)) not in (0, self.num_layers):
                raise ValueError(f"{name} must name each of the {self.num_layers} layers")
        m = self.family.mamba
        if m is not None and len(m.layers) != self.num_layers and m.inkling2 is None:
            raise ValueError(f"the Mamba layers must name each of the {self.num_layers} layers")
        g = self.family.gemma4
        if g is not None and len(g.head_dims) != self.num_layers:
            raise ValueError(f"the Gemma 4 layers must name each of the {self.num_layers} layers")

    def hybrid_params(self, tp: int = 1) -> int:
        """What a hybrid's layers hold beyond (or short of) Llama's shape on one of `tp` ranks:
        its Mamba2 mixers (the rank's heads, `MambaConfig.on_ranks`), less attention where a
        layer has none and (Nemotron-H) the MLP where it has none (both split by the ranks, KV
        heads replicated when fewer); Nemotron-H's experts and shared expert split by width."""
        m, h = self.family.mamba, self.hidden_size
        if m is None:
            return 0
        if m.zamba2 is not None:  # Zamba2's (Zamba's) own count, less Llama's shape (a rank's)
            kv = max(1, self.num_kv_heads // tp)
            attn = h * self.head_dim * (self.num_heads * 2 // tp + kv * 2)
            emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
            mlp = 3 * h * self.intermediate_size // tp
            llama = self.num_layers * (attn + 2 * h + mlp) + emb + h
            return m.zamba2.params(self, tp) - llama
        if m.inkling is not None or m.inkling2 is not None:  # its layers' own beyond Llama's
            return (m.inkling or m.inkling2).params(self, tp)
        if m.zaya is not None:  # its layers' own (a rank's), less the first's router state
            # scale, and the embeddings' scale and bias
            return self.num_layers * m.zaya.params(self, tp) - m.zaya.router_hidden + 2 * h
        kv = max(1, self.num_kv_heads // tp)
        attn = h * self.head_dim * (self.num_heads * 2 // tp + kv * 2)
        if self.family.mla is not None:  # latent attention (Kimi Linear's), the rank's heads
            attn = mla_params(h, self.num_heads, self.family.mla, tp)
        mixer = m.on_ranks(tp).mixer_params(h)
        out = m.num_layers * mixer - (self.num_layers - self.num_kv_layers) * attn
        if m.attn_output_gate:  # q_proj's gate rows (Qwen3-Next's attention)
            out += self.num_kv_layers * h * self.head_dim * self.num_heads // tp
        if m.attn_head_gate:  # g_proj, one gate a head (LFM3's attention)
            out += self.num_kv_layers * h * self.num_heads // tp
        if m.mixer == "wkv":  # RWKV's LayerNorms' biases, its first layer's pre_ln
            out += self.num_layers * 2 * h + 3 * h
        if m.mixer == "rglru":  # RecurrentGemma's MLP biases (every layer's), o_proj's bias
            out += self.num_layers * (2 * self.intermediate_size + h) + self.num_kv_layers * h
        if m.mlp_layers:  # an MLP in those layers only (Nemotron-H's ungated; Mamba2's none)
            mats = 3 if self.family.gated_mlp else 2
            out -= (self.num_layers - sum(m.mlp_layers)) * mats * h * self.intermediate_size // tp
        if m.moe is not None:  # Nemotron-H's MoE blocks: the router and latent projections
            e = m.moe  # whole on every rank
            split = (
                e.num_experts * 2 * (e.latent or h) * e.intermediate + 2 * h * e.shared_intermediate
            )
            out += sum(e.layers) * (e.params(h) - split + split // tp)
        if self.family.qwen4 is not None:  # hyper-connections, n-gram tables (one rank only)
            out += self.family.qwen4.params(h, self.num_kv_layers)
        return out

    @property
    def num_kv_layers(self) -> int:
        """The layers that keep a KV cache: all but a hybrid's Mamba layers and Gemma 4's
        KV-shared layers (they read an earlier layer's)."""
        m, g = self.family.mamba, self.family.gemma4
        if g is not None:
            return sum(not g.shares_kv(i) for i in range(self.num_layers))
        if self.family.kolibri11 is not None:  # (its KV-shared layers read an earlier one's)
            return sum(not self.family.kolibri11.shares_kv(i) for i in range(self.num_layers))
        if self.family.dory is not None:  # (a KV cache per loop of its recurrent layers)
            return len(self.family.dory.order())
        if self.family.hrm is not None:  # (a KV cache per pass of its stacks)
            return len(self.family.hrm.order())
        return self.num_layers if m is None else sum(map(m.attention, range(len(m.layers))))

    @property
    def kv_layer_shapes(self) -> tuple[tuple[int, int], ...]:
        """(KV heads, head size) of each layer that keeps a KV cache, in layer order: the
        model's for every one, or Gemma 4's by layer."""
        g, m = self.family.gemma4, self.family.mimo
        if self.family.doge is not None:  # (the keys' bias column, padded)
            return ((self.num_kv_heads, DogeAttention.cache_head_dim(self.head_dim)),) * (
                self.num_layers
            )
        m2 = self.family.mamba
        ink = None if m2 is None else (m2.inkling or m2.inkling2)
        if ink is not None:  # (the window layers' own)
            return tuple(ink.kv_shape(self, i) for i in range(len(m2.layers)))
        if m is not None:  # (values padded to the keys' size)
            return tuple((m.swa_kv_heads if self.family.window(i) else self.num_kv_heads,
                          self.head_dim) for i in range(self.num_layers))  # fmt: skip
        if self.family.diff_attention:  # (k twice, each half of v's heads twice)
            return ((2 * self.num_kv_heads, self.head_dim),) * self.num_kv_layers
        if g is None:
            return ((self.num_kv_heads, self.head_dim),) * self.num_kv_layers
        return tuple((g.kv_heads[i], g.head_dims[i]) for i in range(self.num_layers)
                     if not g.shares_kv(i))  # fmt: skip

    @property
    def context_length(self) -> int:
        """The longest sequence the model serves (the default and the bound of max_model_len),
        derived as vLLM derives it: `max_position_embeddings`, stretched by a `linear` scaling's
        factor or to a `yarn` scaling's original context times its factor. llama3's scaling is
        in max_position_embeddings already, Gemma 3's linear factor is its global layers' own
        rotary, and a `dynamic` base would move with the length (`ops.check_rope_context`)."""
        s, context = self.rope_scaling or {}, self.max_position_embeddings
        if self.family.doge is not None:  # (transformers keeps only some keys past it)
            context = min(context, self.family.doge.keep_window)
        if self.family.max_seq_length:  # (an encoder's sentence-transformers length)
            context = min(context, self.family.max_seq_length)
        kind = s.get("rope_type", s.get("type", "default"))
        if self.architecture == "gemma3" or kind not in ("linear", "yarn") or not s.get("factor"):
            return context
        base = s.get("original_max_position_embeddings") if kind == "yarn" else None
        return max(context, int((base or context) * float(s["factor"])))

    @property
    def kv_tensors(self) -> int:
        """KV-cache tensors per layer: K and V (2), or one latent row serving as both (1:
        multi-head latent attention, `MlaConfig`; `num_kv_heads` 1, `head_dim` its width)."""
        return 1 if self.family.mla is not None else 2

    @property
    def num_params(self) -> int:
        """Parameter count (embedding counted once when tied)."""
        if self.family.gemma4 is not None:  # its tensors, layer by layer
            shapes = self.family.gemma4.tensor_shapes(self).values()
            return sum(math.prod(s) for s in shapes)
        if self.family.dsv4 is not None:  # DeepSeek-V4's tensors (dsv4_config.expected_shapes)
            return self.family.dsv4.num_params()
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        if self.family.hrm is not None:  # q, k, v, gate, o and the MLP a layer; weightless
            head = 1 if self.tie_word_embeddings else 2  # norms; z_L_init
            q = self.num_heads * d
            return self.num_layers * (5 * h * q + 3 * h * i) + head * self.vocab_size * h + h
        attn = h * d * (self.num_heads * 2 + self.num_kv_heads * 2)
        f = self.family
        if f.mla is not None:
            attn = mla_params(h, self.num_heads, f.mla)
        if self.architecture == "minicpm5_moe":  # q_proj's gate rows (as q)
            attn += h * d * self.num_heads
        moe = sum(f.has_experts(n) for n in range(self.num_layers))
        mats = 3 if f.gated_mlp else 2  # gate, up, down; an ungated MLP: up, down
        experts = moe * f.num_experts * (mats * h * f.moe_intermediate_size + h)  # + the router
        if f.shared_expert_intermediate_size:  # the shared expert (and Qwen2-MoE's gate)
            gate = h if f.routing is None else 0
            experts += moe * (mats * h * f.shared_expert_intermediate_size + gate)
        mlps = (self.num_layers - moe) * mats * h * i + experts
        head = 0 if self.tie_word_embeddings else f.head_rows or self.vocab_size
        emb = (self.vocab_size + head) * h
        if self.architecture == "mllama":  # its embedding's 8 rows past the vocabulary
            emb += 8 * h
        attn_all = self.num_layers * (attn + 2 * h) + indexer_params(h, f.mla)
        if f.block_index is not None:  # MiniMax-M3's indexers: q_proj, k_proj, their norms
            b = f.block_index
            attn_all += sum(b.layers) * ((b.n_heads + 1) * h + 2) * b.head_dim
        if f.hyper is not None:  # HY V4's hyper-connections, attention's gates and sinks
            n, gate = f.hyper.mult, self.num_heads * f.mla.v_head_dim * h + self.num_heads
            attn_all += self.num_layers * (2 * (2 * n * n * h + 2 * n + 2) + gate)
            attn_all += n * n * h + n + 1  # the head's fold
        if self.architecture == "bitnet":  # its sub-norms (attention's output, the MLP's)
            attn_all += self.num_layers * (h + i)
        if self.architecture == "beam":  # two more norms, the output gate and its bias
            attn_all += self.num_layers * (2 * h + self.num_heads * (d * h + 1))
        if f.gated_norm_rank:  # A.X-K2's norm gates: before attention, before the experts
            attn_all += (self.num_layers + moe) * 2 * h * f.gated_norm_rank
        if f.attention_sinks:  # a sink logit per head (gpt-oss's, GraniteSWA's)
            attn_all += self.num_layers * self.num_heads
        if f.qk_norm and not f.cohere_layer:  # per-head q/k norms: a weight of head_dim each
            attn_all += self.num_kv_layers * 2 * d  # (a hybrid's attention layers')
        if f.glm4_norms:  # GLM-4's norms on attention's and the MLP's outputs
            attn_all += self.num_layers * 2 * h
        if self.architecture == "axk1":  # a norm on each MoE block's output
            attn_all += moe * h
        if f.dory is not None:  # attention's gate and nGPT's scaled vectors, no norms; the
            q = self.num_heads * d  # logit scale, no final norm
            attn_all += self.num_layers * (q * h + 2 * q + 2 * i) + self.vocab_size - h
        if f.doge is not None:  # A, dt_proj, two residual scales a layer; the experts' router
            kv, e = self.num_kv_heads, f.doge.num_experts  # and tables beside the dense MLP
            attn_all += self.num_layers * (kv + kv * kv * d + 2 * h)
            attn_all += self.num_layers * (2 * f.doge.num_keys * h + 2 * e * h) if e else 0
        if self.architecture == "ergo":  # two more norms and two residual gates a layer, q/k
            # norms; each expert's norm, the correction bias, the shared expert's norm
            attn_all += self.num_layers * (4 * h + 2 * d) + moe * (f.num_experts * (h + 1) + h)
        if f.kolibri11 is not None:  # its KV-shared layers: no k_proj nor v_proj; their q
            # norms (the q/k norms above are counted by the layers with a KV cache)
            shared = sum(map(f.kolibri11.shares_kv, range(self.num_layers)))
            attn_all -= shared * (2 * h * self.num_kv_heads * d - d)
        if f.diff_attention:  # DiffLlama's lambda_q1, lambda_k1, lambda_q2, lambda_k2
            attn_all += self.num_layers * 4 * d
        if self.architecture in ALL_BIASES:  # the projections', the MLP's, the norms'
            q_k_norms = 2 * d if f.qk_norm else 0
            kv = self.num_kv_heads * d
            attn_all += self.num_layers * (self.num_heads * d + 2 * kv + 4 * h + i + q_k_norms) + h
        if self.architecture in ("openai_gpt", "biogpt"):  # their stored position tables
            attn_all += (self.max_position_embeddings + f.position_offset) * h
        if self.architecture == "openai_gpt":  # no final norm (nor its bias)
            attn_all -= 2 * h
        if self.architecture == "ctrl":  # its head's bias
            attn_all += self.vocab_size
        if self.architecture == "gpt_neox_japanese":  # its LayerNorms' biases, the last o_proj's
            attn_all += (2 * self.num_layers + 2) * h
        return attn_all + mlps + emb + h + self.hybrid_params()


def indexer_params(hidden: int, m: MlaConfig | None) -> int:
    """The lightning indexers' weights (DeepSeek Sparse Attention), over the layers that run
    one: wq_b, wk, k_norm's weight and bias, weights_proj (and a k-pool indexer's position
    weights and gate projection, GLM-5-Next's)."""
    ix = None if m is None else m.indexer
    if ix is None:
        return 0
    one = (m.q_lora_rank * ix.n_heads + hidden + 2) * ix.head_dim + ix.n_heads * hidden
    if ix.kpool:
        one += (ix.kpool + hidden) * ix.head_dim
    return sum(ix.full_layers) * one


def mla_params(hidden: int, heads: int, m: MlaConfig, tp: int = 1) -> int:
    """The weights of one latent attention layer (`MlaConfig`): its projections and norms; on
    one of `tp` ranks, its heads' (`model/deepseek.py`: the bottleneck, latent and norms whole)."""
    heads //= tp
    q = hidden * heads * m.qk_head_dim
    if m.q_lora_rank is not None:
        q = hidden * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * heads * m.qk_head_dim
    if m.dots:  # Dots3 Note's rotary key norm and gate per head
        q += m.qk_rope_head_dim + heads * hidden
    if m.output_gate:  # A.X-K2's q_b_proj: [normed | raw] bottleneck -> each head's q and gate
        q += m.q_lora_rank * heads * (m.qk_head_dim + 2 * m.v_head_dim)
    kv_a = hidden * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
    kv_b = m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
    return q + kv_a + kv_b + heads * m.v_head_dim * hidden
