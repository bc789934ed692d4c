"""GGUFs of Jamba (`jamba`) as llama.cpp's converter writes them (its JambaModel), read as
`gguf_classic` reads its families: the checkpoint's config.json (transformers' `JambaConfig`
keys) rebuilt from the file's keys (`hf_config`), the tensors under the names
`model/jamba.py` reads.

What the converter wrote, read back here:
- its attention layers as a per-layer `attention.head_count_kv` (0: a Mamba-1 mixer) and its
  expert layers by their `ffn_gate_inp`, read back as the config's offsets and periods (a
  pattern without one refused);
- its mixer as Mamba-1's (`gguf_classic.SSM`; A as -exp(A_log), the conv squeezed: read back
  by `gguf_mamba.mamba_value`), with its dt/B/C norms (`ssm_*_norm`); its MLP and the norm
  before it under llama.cpp's `ffn_*` names (`NAMES`), its final norm `output_norm`;
- the experts stacked (`gguf_classic`'s expert names, by `moe_names`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ENGINE_ARCH = {"jamba": "jamba"}
HF_ARCH = {"jamba": "JambaForCausalLM"}
ARCHS = tuple(HF_ARCH)  # the engine's
# its Mamba-1 mixer's dt/B/C norms, its MLP and its norm (llama.cpp's name -> the checkpoint's)
NAMES = {"ssm_dt_norm": "mamba.dt_layernorm", "ssm_b_norm": "mamba.b_layernorm",
         "ssm_c_norm": "mamba.c_layernorm", "ffn_norm": "pre_ff_layernorm",
         **{f"ffn_{p}": f"feed_forward.{p}_proj" for p in ("gate", "up", "down")}}  # fmt: skip
FINAL_NORM = "model.final_layernorm.weight"  # the file's `output_norm.weight`
Get = Callable[..., Any]  # get(key, default): the file's `jamba.<key>`


def global_name(name: str) -> str | None:
    """The checkpoint's name of a global tensor where it differs from Llama's: the final norm."""
    return FINAL_NORM if name == "output_norm.weight" else None


def hf_name(layer: str, part: str, kind: str) -> str | None:
    """The checkpoint's name of `blk.{layer}.{part}.{kind}` for the parts in `NAMES` (None for
    the others: the mixer's and the experts' names are `gguf_classic`'s)."""
    return f"model.layers.{layer}.{NAMES[part]}.{kind}" if part in NAMES else None


def hf_config(get: Get, tensors: set[str], vocab: int) -> dict[str, Any]:
    """Jamba's config.json: its attention layers where the per-layer `attention.head_count_kv`
    is not 0 and its expert layers where `ffn_gate_inp` is (the converter writes neither
    period: read back as `*_layer_offset` / `*_layer_period`, refused where not periodic); the
    Mamba-1 mixers' sizes from `ssm.*` (d_inner `ssm.inner_size`, dt rank `time_step_rank`)."""
    n, hidden = int(get("block_count")), int(get("embedding_length"))
    kv = get("attention.head_count_kv")
    if not isinstance(kv, list) or len(kv) != n:
        raise ValueError(f"GGUF jamba needs attention.head_count_kv with a value for each of its "
                         f"{n} layers (0 on the Mamba layers)")  # fmt: skip
    attn = [bool(k) for k in kv]
    experts = int(get("expert_count", 0) or 0)
    moe = [f"blk.{i}.ffn_gate_inp.weight" in tensors for i in range(n)]
    first = attn.index(False) if False in attn else 0  # a Mamba layer
    cfg: dict[str, Any] = {
        "architectures": [HF_ARCH["jamba"]], "vocab_size": vocab, "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")), "num_hidden_layers": n,
        "num_attention_heads": int(get("attention.head_count")),
        "num_key_value_heads": max(int(k) for k in kv),
        "max_position_embeddings": int(get("context_length", 2048)), "hidden_act": "silu",
        "tie_word_embeddings": "output.weight" not in tensors,
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "mamba_d_state": int(get("ssm.state_size")), "mamba_d_conv": int(get("ssm.conv_kernel")),
        "mamba_expand": int(get("ssm.inner_size")) // hidden,
        "mamba_dt_rank": int(get("ssm.time_step_rank")),
        "mamba_conv_bias": f"blk.{first}.ssm_conv1d.bias" in tensors,
        "mamba_proj_bias": f"blk.{first}.ssm_in.bias" in tensors,
        "num_experts": experts if any(moe) else 1,
        "num_experts_per_tok": int(get("expert_used_count", 1) or 1),
    }  # fmt: skip
    if int(get("ssm.inner_size")) % hidden:
        raise ValueError("GGUF jamba ssm.inner_size must be a multiple of embedding_length")
    for kind, flags in (("attn", attn), ("expert", moe)):
        offset, period = _periodic(kind, flags) if any(flags) else (0, 1)  # (none: dense)
        cfg.update({f"{kind}_layer_offset": offset, f"{kind}_layer_period": period})
    return cfg


def _periodic(kind: str, flags: list[bool]) -> tuple[int, int]:
    """(offset, period) with flags[i] == (i % period == offset); ValueError where none."""
    on = [i for i, f in enumerate(flags) if f]
    if on:
        offset = on[0]
        period = on[1] - on[0] if len(on) > 1 else len(flags)
        if period > offset and all(f == (i % period == offset) for i, f in enumerate(flags)):
            return offset, period
    raise ValueError(f"GGUF jamba's {kind} layers {on} are not every period-th layer from an "
                     f"offset ({kind}_layer_period / {kind}_layer_offset)")  # fmt: skip
