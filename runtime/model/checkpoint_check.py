"""Does a safetensors checkpoint hold what its config.json describes (`checkpoint_shapes.py`)?
Checked from the files' headers (no tensor is read) when the model's config is read, so that
`pagoda serve` refuses a checkpoint that does not match before it binds (one line naming the
tensor, exit 2) rather than failing at load or, worse, in the first forward (a q/k/v split of
the wrong widths)."""

from __future__ import annotations

from collections.abc import Mapping

from pagoda.runtime.config import ModelConfig
from pagoda.runtime.model import (
    bailing_hybrid_config,
    bitnet_config,
    glm5_next_config,
    kimi_linear_config,
    olmo_hybrid_config,
    qwen3_next_config,
)
from pagoda.runtime.model.checkpoint_shapes import HEAD, OWN_EXPERTS, expected_shapes, mlp_triples

FP8_DTYPES = ("F8_E4M3",)


def _check_stacked_experts(c: ModelConfig, headers: Mapping[str, tuple[str, list[int]]]) -> None:
    """Qwen3-VL-MoE's stacked experts: transformers 5's gate_up [E, 2N, h] and down [E, h, N],
    or the hub's, transposed (`model/qwen3_vl.py` reads either, as transformers does)."""
    e, n, h = c.family.num_experts, c.family.moe_intermediate_size, c.hidden_size
    for i in filter(c.family.has_experts, range(c.num_layers)):
        p = f"model.layers.{i}.mlp.experts."
        got = tuple(tuple(headers[p + x][1]) if p + x in headers else None
                    for x in ("gate_up_proj", "down_proj"))  # fmt: skip
        if got not in (((e, 2 * n, h), (e, h, n)), ((e, h, 2 * n), (e, n, h))):
            raise ValueError(f"checkpoint tensors {p}gate_up_proj and down_proj are {got}; "
                             f"the config needs {[e, 2 * n, h]} and {[e, h, n]}, or both "
                             "transposed")  # fmt: skip


def _check_gpt_oss_experts(c: ModelConfig, headers: Mapping[str, tuple[str, list[int]]]) -> None:
    """gpt-oss's stacked experts, bf16/float32 ([E, hidden, 2I] and [E, I, hidden], as x @ W)
    or MXFP4 (`mxfp4.py`: uint8 `_blocks` [E, rows, cols / 32, 16] and `_scales` [E, rows,
    cols / 32] of the transposed matrices)."""
    h, e, n = c.hidden_size, c.family.num_experts, c.family.moe_intermediate_size
    for i in range(c.num_layers):
        p = f"model.layers.{i}.mlp.experts."
        mxfp4 = p + "gate_up_proj_blocks" in headers
        for name, (rows, cols) in (("gate_up_proj", (2 * n, h)), ("down_proj", (h, n))):
            want = {p + name: ("", (e, cols, rows))}
            if mxfp4:
                if cols % 32:
                    raise ValueError(f"{p}{name}: MXFP4 needs a width that is a multiple of 32, "
                                     f"config.json gives {cols}")  # fmt: skip
                want = {p + name + "_blocks": ("U8", (e, rows, cols // 32, 16)),
                        p + name + "_scales": ("U8", (e, rows, cols // 32))}  # fmt: skip
            for t, (dtype, shape) in want.items():
                if t not in headers:
                    raise ValueError(f"checkpoint is missing tensor {t!r} (config.json has "
                                     f"{c.num_layers} layers)")  # fmt: skip
                got_dtype, got = headers[t][0], tuple(headers[t][1])
                if got != shape or (dtype and got_dtype != dtype):
                    raise ValueError(f"checkpoint tensor {t} is {got_dtype} {list(got)}, config.json "
                                     f"(hidden_size {h}, intermediate_size {n}, num_local_experts "
                                     f"{e}) needs {dtype or 'a float'} {list(shape)}")  # fmt: skip


def _check_mlp(c: ModelConfig, headers: Mapping[str, tuple[str, list[int]]]) -> None:
    """Every MLP's gate, up and down present, of one width: gate and up [I, h], down [h, I]."""
    for gate, up, down in mlp_triples(c):
        for name in (gate, up, down):
            if name not in headers:
                raise ValueError(f"checkpoint is missing tensor {name!r}")
        width = int(headers[gate][1][0]) if headers[gate][1] else 0
        want = {gate: (width, c.hidden_size), up: (width, c.hidden_size),
                down: (c.hidden_size, width)}  # fmt: skip
        for name, shape in want.items():
            if tuple(headers[name][1]) != shape:
                raise ValueError(f"checkpoint tensor {name} is {list(headers[name][1])}; with "
                                 f"{gate} {[width, c.hidden_size]} it must be {list(shape)}")  # fmt: skip


def _bitnet_dtypes(c: ModelConfig, headers: Mapping[str, tuple[str, list[int]]]) -> None:
    if c.family.bitnet == "offline":  # packed: uint8 matrices
        bitnet_config.check_dtypes(headers)


# a family's own checks of the headers, after the shared ones: architecture -> (config,
# headers) -> None, ValueError in one line
_HEADER_CHECKS = {
    **dict.fromkeys(OWN_EXPERTS, qwen3_next_config.check_experts),  # its stacked experts
    "olmo_hybrid": olmo_hybrid_config.check_conv,  # its DeltaNet convs, whole or in three parts
    "kimi_linear": kimi_linear_config.check_conv,  # its KDA convs, whole or in three parts
    "bailing_hybrid": bailing_hybrid_config.check_conv,  # (the same)
    "glm5_next": glm5_next_config.check_conv,  # its KDA convs
    "gpt_oss": _check_gpt_oss_experts,  # its experts' MXFP4 blocks or stacked matrices
    "bitnet": _bitnet_dtypes,
    "qwen3_vl_moe": _check_stacked_experts,
}


def _describe(c: ModelConfig) -> str:
    return (f"vocab_size {c.vocab_size}, hidden_size {c.hidden_size}, num_attention_heads "
            f"{c.num_heads}, num_key_value_heads {c.num_kv_heads}, head_dim {c.head_dim}")  # fmt: skip


def check_checkpoint(
    config: ModelConfig, headers: Mapping[str, tuple[str, list[int]]], fp8_block=None
) -> None:
    """ValueError, one line, where `headers` (name -> (safetensors dtype, shape)) lacks a tensor
    `config` needs, holds one of another shape, or an FP8 weight without usable scales."""
    if config.family.dsv4 is not None:  # DeepSeek-V4: its own names (dsv4_config.py)
        from pagoda.runtime.model.dsv4_config import check_headers

        check_headers(config.family.dsv4, headers)
        return
    for name, shape in expected_shapes(config).items():
        if name == HEAD and name not in headers:  # vLLM refuses it; transformers draws one
            raise ValueError(f"checkpoint is missing tensor {HEAD!r} (config.json says "
                             "tie_word_embeddings false: the head is not the embedding)")  # fmt: skip
        if name not in headers:
            raise ValueError(f"checkpoint is missing tensor {name!r} (config.json has "
                             f"{config.num_layers} layers)")  # fmt: skip
        got = tuple(headers[name][1])
        if got != shape:
            raise ValueError(f"checkpoint tensor {name} is {list(got)}, config.json "
                             f"({_describe(config)}) needs {list(shape)}")  # fmt: skip
    head = (config.vocab_size, config.family.embed_proj_dim or config.hidden_size)
    if config.tie_word_embeddings and HEAD in headers and tuple(headers[HEAD][1]) != head:
        # transformers keeps a head that differs from the embedding, and cannot load this one
        raise ValueError(f"checkpoint tensor {HEAD} is {list(headers[HEAD][1])}, config.json "
                         f"({_describe(config)}) needs {list(head)}")  # fmt: skip
    _check_mlp(config, headers)
    own = _HEADER_CHECKS.get(config.architecture)  # the family's own
    if own is not None:
        own(config, headers)
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
