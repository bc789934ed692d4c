"""Does a safetensors checkpoint hold what its config.json describes? Checked from the files'
headers (no tensor is read) when the model's config is read, so that `pagoda serve` refuses a
checkpoint that does not match before it binds (one line naming the tensor, exit 2) rather than
failing at load or, worse, in the first forward (a q/k/v split of the wrong widths)."""

from __future__ import annotations

from collections.abc import Mapping

from pagoda.runtime.config import ModelConfig

EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"
FP8_DTYPES = ("F8_E4M3",)


def expected_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The tensors every layer of `c` needs, with their shapes (the MLP's and experts' are the
    loader's to read: their widths come from the weights)."""
    h, d = c.hidden_size, c.head_dim
    q, kv = c.num_heads * d, c.num_kv_heads * d
    out: dict[str, tuple[int, ...]] = {EMBED: (c.vocab_size, h), "model.norm.weight": (h,)}
    for i in range(c.num_layers):
        a = f"model.layers.{i}.self_attn."
        out.update({a + "q_proj.weight": (q, h), a + "k_proj.weight": (kv, h),
                    a + "v_proj.weight": (kv, h), a + "o_proj.weight": (h, q),
                    f"model.layers.{i}.input_layernorm.weight": (h,)})  # fmt: skip
        if c.family.qk_norm:
            out[a + "q_norm.weight"] = out[a + "k_norm.weight"] = (d,)
    if not c.tie_word_embeddings:
        out[HEAD] = (c.vocab_size, h)  # where the checkpoint has one (else tied)
    return out


def _describe(c: ModelConfig) -> str:
    return (f"vocab_size {c.vocab_size}, hidden_size {c.hidden_size}, num_attention_heads "
            f"{c.num_heads}, num_key_value_heads {c.num_kv_heads}, head_dim {c.head_dim}")  # fmt: skip


def check_checkpoint(
    config: ModelConfig, headers: Mapping[str, tuple[str, list[int]]], fp8_block=None
) -> None:
    """ValueError, one line, where `headers` (name -> (safetensors dtype, shape)) lacks a tensor
    `config` needs, holds one of another shape, or an FP8 weight without usable scales."""
    for name, shape in expected_shapes(config).items():
        if name not in headers:
            if name == HEAD:
                continue
            raise ValueError(f"checkpoint is missing tensor {name!r} (config.json has "
                             f"{config.num_layers} layers)")  # fmt: skip
        got = tuple(headers[name][1])
        if got != shape:
            raise ValueError(f"checkpoint tensor {name} is {list(got)}, config.json "
                             f"({_describe(config)}) needs {list(shape)}")  # fmt: skip
    for name, (dtype, shape) in headers.items():
        if dtype.startswith("F8_") and dtype not in FP8_DTYPES:
            raise ValueError(f"checkpoint tensor {name} is {dtype}; FP8 weights must be E4M3")
        if dtype in FP8_DTYPES and name.endswith(".weight"):
            _check_scales(name, shape, headers, fp8_block)


def _check_scales(name: str, shape: list[int], headers, block) -> None:
    base = name.removesuffix("weight")
    scale = next((base + s for s in ("weight_scale", "weight_scale_inv") if base + s in headers),
                 None)  # fmt: skip
    if scale is None or len(shape) != 2:
        raise ValueError(f"checkpoint tensor {name} is FP8 {shape} without a "
                         f"{base}weight_scale")  # fmt: skip
    got = headers[scale][1]
    numel = 1
    for n in got:
        numel *= n
    tiles = None if block is None else [-(-a // b) for a, b in zip(shape, block)]
    if numel in (1, shape[0]) or list(got) == tiles:
        return
    want = f"1 or {shape[0]} elements" + ("" if tiles is None else f", or {tiles} tiles")
    raise ValueError(f"checkpoint tensor {scale} is {list(got)}; the FP8 weight {list(shape)} "
                     f"needs {want}")  # fmt: skip
