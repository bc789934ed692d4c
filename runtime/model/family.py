"""What a model family changes in the Llama decoder, read once from the checkpoint's config.

`ModelConfig.family` holds one `FamilyConfig`; its defaults are Llama's, so a Llama, Mistral or
Qwen2 checkpoint leaves everything here at rest except, for Mistral, the sliding window. The
model files (`qwen3.py`, `gemma3.py`, `moe.py`) read these fields; the attention backends read
only `sliding_window` and `attn_logit_softcapping`.
"""

from __future__ import annotations

from dataclasses import dataclass

ACTIVATIONS = ("silu", "gelu_tanh")  # SwiGLU (Llama, Qwen, Mixtral) and GeGLU (Gemma)


@dataclass(frozen=True)
class FamilyConfig:
    # attention
    qk_norm: bool = False  # an RMSNorm over each head of q and of k before rotary (Qwen3, Gemma 3)
    sliding_window: int | None = None  # keys a window layer sees, its own position included
    window_layers: tuple[bool, ...] = ()  # per layer: True = a window layer; () = all of them
    local_rope_theta: float | None = None  # window layers' rotary base (Gemma 3), no scaling
    query_pre_attn_scalar: float | None = None  # softmax scale = this ** -0.5 (None: head_dim)
    # scores = cap * tanh(scores / cap) (Gemma 2's; Gemma 3 configs carry it unused)
    attn_logit_softcapping: float | None = None
    # Gemma 3's layer: (1 + w) RMSNorm, norms after attention and around the MLP, the embedding
    # scaled by sqrt(hidden_size) in the model's dtype
    gemma_norms: bool = False
    final_logit_softcapping: float | None = None  # logits = cap * tanh(logits / cap)
    hidden_act: str = "silu"  # the gated MLP's activation (`ACTIVATIONS`)
    # mixture of experts: router softmax, top-k, SwiGLU experts
    num_experts: int = 0  # 0: a dense MLP in every layer
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True  # renormalise the top-k probabilities to sum to 1 (Mixtral: yes)
    round_topk_to_model_dtype: bool = False  # Qwen3-MoE rounds the routing weights (HF does)
    moe_layers: tuple[bool, ...] = ()  # per layer: True = experts; () = all (when num_experts)

    def __post_init__(self) -> None:
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be positive, got {self.sliding_window}")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(
                f"hidden activation {self.hidden_act!r} is not one of {', '.join(ACTIVATIONS)}"
            )
        for name in ("attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if self.num_experts:
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise ValueError(
                    f"num_experts_per_tok must be in [1, {self.num_experts}], "
                    f"got {self.num_experts_per_tok}"
                )
            if self.moe_intermediate_size < 1:
                raise ValueError("moe_intermediate_size must be positive")

    def window(self, layer: int) -> int | None:
        """The sliding window of `layer`, or None where it attends to its whole context."""
        if self.sliding_window is None:
            return None
        if self.window_layers and not self.window_layers[layer]:
            return None
        return self.sliding_window

    def has_experts(self, layer: int) -> bool:
        """Whether `layer`'s MLP is a mixture of experts."""
        if not self.num_experts:
            return False
        return not self.moe_layers or self.moe_layers[layer]

    def attention_scale(self, head_dim: int) -> float:
        """The softmax scale applied to q . k."""
        return (self.query_pre_attn_scalar or head_dim) ** -0.5
