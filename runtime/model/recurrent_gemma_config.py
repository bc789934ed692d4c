"""RecurrentGemma's config as transformers 5 reads it (`RecurrentGemmaForCausalLM`: Google's
recurrentgemma-2b and 9b, their -it models), for `model/recurrent_gemma.py`; reached through
`mamba_config`. Kept apart from the model so that reading a config imports no layer code.

- `block_types` (repeated over the layers; ("recurrent", "recurrent", "attention") by default):
  a recurrent block (`MambaConfig.mixer` "rglru": linear_y and linear_x, lru_width wide, a
  depthwise conv of `conv1d_width` with a bias on x, the RG-LRU over `num_attention_heads`
  blocks of its channels, linear_out; every projection biased) or local attention (a window of
  `attention_window_size` keys, rotary on half of each head, `num_key_value_heads`, o_proj
  biased); then the MLP (gate, up and down biased, `intermediate_size` / 2 wide, GeGLU of
  `hidden_activation`);
- Gemma's (1 + w) norms, the embedding scaled by sqrt(hidden) rounded to bfloat16, the logits
  soft-capped at `logits_soft_cap`; tied.

The checkpoint's names (`temporal_pre_norm`, `channel_pre_norm`, `mlp_block`, the attention's
`temporal_block.{q,k,v,o}_proj`, `final_norm`) are read as Llama's
(`safetensors_weights._PHI_RENAMES`); a recurrent block's tensors stay under
``temporal_block.``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pagoda.runtime.recurrent_configs import MambaConfig

if TYPE_CHECKING:  # (model_config.py calls in here: no module-level cycle)
    from pagoda.runtime.config import ModelConfig
    from pagoda.runtime.distributed.layout import TPLayout

ARCHITECTURES = {"RecurrentGemmaForCausalLM": "recurrent_gemma"}
# transformers' RecurrentGemmaConfig defaults, where config.json leaves one out
DEFAULTS = {
    "recurrent_gemma": {"vocab_size": 256000, "hidden_size": 2560, "intermediate_size": 7680,
                        "num_hidden_layers": 26, "num_attention_heads": 10,
                        "attention_window_size": 2048, "conv1d_width": 4,
                        "logits_soft_cap": 30.0, "rms_norm_eps": 1e-6,
                        "hidden_activation": "gelu_pytorch_tanh",
                        "block_types": ["recurrent", "recurrent", "attention"],
                        "attention_bias": False, "tie_word_embeddings": True,
                        "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                        "max_position_embeddings": 8192},
}  # fmt: skip
_KINDS = ("recurrent", "attention")


def block_types(cfg: Mapping[str, Any], n: int) -> list[str]:
    """Each layer's block: `block_types` repeated over the layers (transformers')."""
    types = list(cfg["block_types"])
    unknown = sorted({t for t in types if t not in _KINDS})
    if unknown or not types:
        raise ValueError(f"block_types {unknown or types} are not supported in a recurrent_gemma "
                         "model (recurrent, attention)")  # fmt: skip
    return (types * -(-n // len(types)))[:n]


def overrides(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The MLP's width (half `intermediate_size`), the attention's head size."""
    if cfg.get("attention_bias"):
        raise ValueError("a recurrent_gemma model with attention_bias is not supported")
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    return {"intermediate_size": int(cfg["intermediate_size"]) // 2, "head_dim": hidden // heads,
            "attention_bias": False}  # fmt: skip


def family_fields(cfg: Mapping[str, Any], n: int) -> dict[str, Any]:
    heads = int(cfg["num_attention_heads"])
    width = int(cfg.get("lru_width") or cfg["hidden_size"])
    if width % heads:
        raise ValueError(f"num_attention_heads ({heads}) must divide lru_width ({width})")
    types = block_types(cfg, n)
    mamba = MambaConfig(
        layers=tuple(t == "recurrent" for t in types),
        n_heads=heads,
        head_dim=width // heads,
        d_state=1,  # (the RG-LRU's state: one value a channel, float32)
        d_conv=int(cfg["conv1d_width"]),
        chunk_size=1,  # (its scan: position by position, `ssd.pack` in chunks of one token)
        conv_bias=True,
        proj_bias=True,
        ssm_float32=True,
        mixer="rglru",
    )
    return {"mamba": mamba, "gemma_norms": True, "o_proj_bias": True,
            "final_logit_softcapping": float(cfg["logits_soft_cap"]),
            "sliding_window": int(cfg["attention_window_size"]),
            "window_layers": tuple(t == "attention" for t in types)}  # fmt: skip


def expected_shapes(c: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """Layer `i`'s tensors besides attention's projections and the two norms (checked as the
    hybrids'): its recurrent block or o_proj's bias, and its MLP (biased)."""
    m, h, p = c.family.mamba, c.hidden_size, f"model.layers.{i}."
    out: dict[str, tuple[int, ...]] = {}
    if m.layers[i]:
        d, b, r = m.d_inner, p + "temporal_block.", p + "temporal_block.rg_lru."
        heads, hd = m.n_heads, m.head_dim
        for name in ("linear_y", "linear_x"):
            out.update({f"{b}{name}.weight": (d, h), f"{b}{name}.bias": (d,)})
        out.update({b + "linear_out.weight": (h, d), b + "linear_out.bias": (h,),
                    b + "conv_1d.weight": (d, 1, m.d_conv), b + "conv_1d.bias": (d,),
                    r + "recurrent_param": (d,), r + "input_gate_weight": (heads, hd, hd),
                    r + "input_gate_bias": (heads, hd), r + "recurrent_gate_weight": (heads, hd, hd),
                    r + "recurrent_gate_bias": (heads, hd)})  # fmt: skip
    else:
        out[p + "self_attn.o_proj.bias"] = (h,)
    s, f = c.intermediate_size, p + "mlp."
    out.update({f + "gate_proj.weight": (s, h), f + "up_proj.weight": (s, h),
                f + "down_proj.weight": (h, s), f + "gate_proj.bias": (s,),
                f + "up_proj.bias": (s,), f + "down_proj.bias": (h,)})  # fmt: skip
    return out


_BY_ROWS = tuple(f"temporal_block.linear_{n}.{t}" for n in "yx" for t in ("weight", "bias"))


def rank_rows(layer: int, part: str, rows: int, cols: int, c: ModelConfig, lay: TPLayout):
    """A rank's (rows, columns) of a recurrent block's projections (`model/recurrent_gemma.py`:
    its channels of linear_y and linear_x, their biases, linear_out's input columns), or None
    for the other tensors (`distributed/tp_families.py`)."""
    if part in _BY_ROWS:
        return rows // lay.size, cols
    if part == "temporal_block.linear_out.weight":
        return rows, cols // lay.size
    return None
