"""A model's shape fingerprint: the dimensions a tuned profile depends on.

Kernel configs are chosen by shapes (the matmuls' weight shapes, attention's heads and head
size, the fused-MoE expert shape) and the scheduler knobs by the step times those shapes give,
never by the weights' values. `pagoda tune` records the fingerprint in ``profile.json``
(``shape_fingerprint``) and `pagoda serve --tuned-profile` compares it with the model it reads:
the same fingerprint, the profile fits (another commit of the model included); another, it was
measured for another architecture (`pagoda.runtime.tuned_profile.TunedProfile.mismatches`). The
dtype is the profile's identity already (``dtype``), so it is not repeated here.
"""

from __future__ import annotations

from typing import Any

from pagoda.runtime.config import ModelConfig

NO_QUANTIZATION = "none"
# what selects kernel configs and times a step; `quantization` says how the linear layers run
FINGERPRINT_KEYS = (
    "hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim", "vocab_size",
    "num_layers", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
    "shared_expert_intermediate_size", "num_moe_layers", "quantization", "mlp_matrices",
)  # fmt: skip
# DeepSeek's latent attention (`model_configs.MlaConfig`): its projections' shapes, recorded only for
# the models that have it (a profile compares the keys both fingerprints hold)
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
# a hybrid's Mamba2 layers (`recurrent_configs.MambaConfig`): how many, and their projections' and state's
# shapes, recorded only for the models that have them
MAMBA_KEYS = ("mamba_layers", "attention_layers", "mamba_heads", "mamba_head_dim",
              "mamba_d_state", "mamba_n_groups")  # fmt: skip


def _mamba(config: ModelConfig) -> dict[str, int]:
    m = config.family.mamba
    if m is None:
        return {}
    values = (m.num_layers, config.num_kv_layers, m.n_heads, m.head_dim, m.d_state, m.n_groups)
    return dict(zip(MAMBA_KEYS, values, strict=True))


def shape_fingerprint(config: ModelConfig, quantization: str) -> dict[str, int | str]:
    """The fingerprint of a model (`config`) whose linear layers run as `quantization`
    (`weight_format`)."""
    f = config.family
    mla = {} if f.mla is None else {k: getattr(f.mla, k) or 0 for k in MLA_KEYS}
    return {
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_heads": config.num_heads,
        "num_kv_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "vocab_size": config.vocab_size,
        "num_layers": config.num_layers,
        "num_experts": f.num_experts,
        "num_experts_per_tok": f.num_experts_per_tok,
        "moe_intermediate_size": f.moe_intermediate_size,
        # Qwen2-MoE's shared expert (a third GEMM shape per MoE layer) and how many layers have
        # experts (decoder_sparse_step, mlp_only_layers: the others run the dense MLP)
        "shared_expert_intermediate_size": f.shared_expert_intermediate_size,
        "num_moe_layers": sum(map(f.has_experts, range(config.num_layers))),
        "quantization": quantization,
        # a dense MLP's matrices: gate/up and down (3), or an ungated one's up and down (2:
        # Arcee, Apertus, StarCoder2), whose first GEMM is half as wide
        "mlp_matrices": 3 if f.gated_mlp else 2,
        **mla,
        **_mamba(config),
    }


def weight_format(model_path: str, quantization: str | None) -> str:
    """How the linear layers run: ``fp8`` with engine ``--quantization fp8`` or an FP8
    checkpoint (``fp8 block RxC`` for block-wise scales), else ``none``. `model_path`: the local
    model (a GGUF file or an HF directory)."""
    if quantization is not None:
        return quantization
    from pagoda.runtime.model.hf_loader import read_quantization
    from pagoda.runtime.model.loader import resolve_model_path

    path = resolve_model_path(model_path)
    scheme = read_quantization(path) if path.is_dir() else None
    if scheme is None:
        return NO_QUANTIZATION
    return "fp8" if scheme.block is None else f"fp8 block {scheme.block[0]}x{scheme.block[1]}"


def model_fingerprint(
    model_path: str, quantization: str | None, config: ModelConfig | None = None
) -> dict[str, Any]:
    """`shape_fingerprint` of the model at `model_path` (its config read unless given)."""
    if config is None:
        from pagoda.runtime.model.loader import read_model_config

        config = read_model_config(model_path)
    return shape_fingerprint(config, weight_format(model_path, quantization))
