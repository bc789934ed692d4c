"""RWKV-4's config as transformers 5 reads it (`RwkvForCausalLM`: RWKV/rwkv-4-169m-pile to
14b, rwkv-raven), for `model/rwkv.py`; reached through `mamba_config`. Kept apart from the
model so that reading a config imports no layer code.

Every layer a time-mix (`attention_hidden_size` wide, hidden_size by default) and a channel-mix
(`intermediate_size` wide, 4 x hidden by default), each after its LayerNorm (`ln1`, `ln2`, with
biases, `layer_norm_epsilon`), the first layer's input normalised once more (`pre_ln`); no
attention, no rotary. The recurrent state (`MambaConfig.mixer` "wkv") per sequence and layer:
the two mixes' previous normalised inputs (a conv state of one column over 2 x hidden rows:
`extra_conv_rows`) and the wkv recurrence's numerator, denominator and running maximum (SSM
slots [1, attention_hidden_size, 3], float32). `rescale_every` (transformers halves the stream
every few layers in inference, a float16 guard that LayerNorm undoes) is not applied.

The checkpoint's names (`rwkv.embeddings`, `rwkv.blocks.{i}.`, `rwkv.ln_out`, `head`) are read as
``model.embed_tokens``, ``model.layers.{i}.`` (`ln1` / `ln2` as ``input_layernorm`` /
``post_attention_layernorm``), ``model.norm`` and ``lm_head`` (`rwkv_name`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pagoda.runtime.recurrent_configs import MambaConfig

if TYPE_CHECKING:  # (model_config.py calls in here: no module-level cycle)
    from pagoda.runtime.config import ModelConfig
    from pagoda.runtime.distributed.layout import TPLayout

ARCHITECTURES = {"RwkvForCausalLM": "rwkv"}
# transformers' RwkvConfig defaults, where config.json leaves one out
DEFAULTS = {
    "rwkv": {"vocab_size": 50277, "context_length": 1024, "hidden_size": 4096,
             "num_hidden_layers": 32, "layer_norm_epsilon": 1e-5, "rescale_every": 6,
             "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 0},
}  # fmt: skip
_RENAMES = tuple((re.compile(a), b) for a, b in (
    (r"^rwkv\.embeddings\.", "model.embed_tokens."), (r"^rwkv\.ln_out\.", "model.norm."),
    (r"^rwkv\.blocks\.(\d+)\.ln1\.", r"model.layers.\1.input_layernorm."),
    (r"^rwkv\.blocks\.(\d+)\.ln2\.", r"model.layers.\1.post_attention_layernorm."),
    (r"^rwkv\.blocks\.", "model.layers."), (r"^head\.", "lm_head."),
))  # fmt: skip


def rwkv_name(stored: str) -> str:
    """A checkpoint tensor's name as the engine reads it (module docstring)."""
    for pattern, new in _RENAMES:
        stored = pattern.sub(new, stored)
    return stored


def _widths(cfg: Mapping[str, Any]) -> tuple[int, int, int]:
    hidden = int(cfg["hidden_size"])
    att = int(cfg.get("attention_hidden_size") or hidden)
    return hidden, att, int(cfg.get("intermediate_size") or 4 * hidden)


def overrides(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """No attention: heads of 64 stand in; the channel-mix's width, LayerNorm's eps, the
    context length."""
    hidden, att, inter = _widths(cfg)
    if att > 2 * hidden:
        raise ValueError(f"an rwkv model with attention_hidden_size {att} over 2 x hidden_size "
                         f"({2 * hidden}) is not supported")  # fmt: skip
    heads = max(1, hidden // 64)
    return {"num_attention_heads": heads, "num_key_value_heads": heads,
            "head_dim": hidden // heads, "intermediate_size": inter,
            "rms_norm_eps": cfg["layer_norm_epsilon"], "attention_bias": False,
            "max_position_embeddings": cfg["context_length"]}  # fmt: skip


def family_fields(cfg: Mapping[str, Any], n: int) -> dict[str, Any]:
    hidden, att, _ = _widths(cfg)
    mamba = MambaConfig(
        layers=(True,) * n,
        n_heads=1,
        head_dim=att,
        d_state=3,  # (the wkv state: numerator, denominator, maximum a channel)
        d_conv=2,  # (the token shift: one input before)
        chunk_size=1,  # (its recurrence position by position: `ssd.pack` in chunks of one)
        conv_bias=False,
        ssm_float32=True,
        mixer="wkv",
        extra_conv_rows=2 * hidden - att,  # the two mixes' shift states: 2 x hidden rows
    )
    # (the channel-mix's key and value counted as an ungated ReLU² MLP's)
    return {"mamba": mamba, "rope_layers": (False,) * n, "gated_mlp": False, "hidden_act": "relu2"}


def expected_shapes(c: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """Layer `i`'s tensors: its LayerNorms' biases (their weights are checked as the hybrids'
    norms), the first layer's `pre_ln`, the time-mix and the channel-mix."""
    m, h, p = c.family.mamba, c.hidden_size, f"model.layers.{i}."
    a, f, att, inter = p + "attention.", p + "feed_forward.", m.d_inner, c.intermediate_size
    out = {p + "input_layernorm.bias": (h,), p + "post_attention_layernorm.weight": (h,),
           p + "post_attention_layernorm.bias": (h,),
           a + "key.weight": (att, h), a + "value.weight": (att, h),
           a + "receptance.weight": (att, h), a + "output.weight": (h, att),
           a + "time_decay": (att,), a + "time_first": (att,), a + "time_mix_key": (1, 1, h),
           a + "time_mix_value": (1, 1, h), a + "time_mix_receptance": (1, 1, h),
           f + "key.weight": (inter, h), f + "receptance.weight": (h, h),
           f + "value.weight": (h, inter), f + "time_mix_key": (1, 1, h),
           f + "time_mix_receptance": (1, 1, h)}  # fmt: skip
    if i == 0:
        out.update({p + "pre_ln.weight": (h,), p + "pre_ln.bias": (h,)})
    return out


_BY_ROWS = ("attention.key.weight", "attention.value.weight", "attention.receptance.weight",
            "feed_forward.key.weight")  # fmt: skip
_BY_COLUMNS = ("attention.output.weight", "feed_forward.value.weight")


def rank_rows(layer: int, part: str, rows: int, cols: int, c: ModelConfig, lay: TPLayout):
    """A rank's (rows, columns) of a layer's matrices (`model/rwkv.py`: the time-mix's k, v, r
    and the channel-mix's key by rows, the outputs by input columns; the channel-mix's
    receptance whole), or None for the other tensors (`distributed/tp_families.py`)."""
    if part in _BY_ROWS:
        return rows // lay.size, cols
    if part in _BY_COLUMNS:
        return rows, cols // lay.size
    if part == "feed_forward.receptance.weight":
        return rows, cols
    return None
