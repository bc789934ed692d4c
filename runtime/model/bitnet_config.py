"""BitNet b1.58's config.json and checkpoint (`model/bitnet.py`, `bitlinear.py`): its
`quantization_config` read into `FamilyConfig.bitnet`, what it refuses in one line, the tensors
a checkpoint must hold (`checkpoint_check`) and the form the engine holds them in (the
weights estimate, `server/held_forms.py`).

transformers' `BitNetQuantConfig`: quant_method "bitnet", linear_class "bitlinear" (its
default) or "autobitlinear", quantization_mode "offline" (default) or "online", use_rms_norm,
modules_to_not_convert. Served: autobitlinear, offline (packed uint8 matrices with a
`weight_scale`: microsoft/bitnet-b1.58-2B-4T) or online (master weights: its -bf16 twin), the
LM head not converted. Refused: linear_class "bitlinear" (another layer: the scale divides, the
activations round in the model's dtype), use_rms_norm (a norm inside every linear layer), a
modules_to_not_convert naming layers inside the decoder, and q/k/v biases (transformers scales
them with the output).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pagoda.runtime.config import ModelConfig
    from pagoda.runtime.distributed.layout import TPLayout

# the decoder's BitLinear matrices (their packed form: uint8 [rows / 4, cols], a weight_scale)
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
MATRIX = re.compile(r"^model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)"
                     r"\.weight$")  # fmt: skip
QUANT_METHOD = "bitnet"


def family_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """`FamilyConfig.bitnet` from config.json's quantization_config ("" without one: transformers
    then runs the projections as plain Linears); ValueError, one line, for what is refused."""
    qc = cfg.get("quantization_config")
    if qc is None:
        return {"bitnet": ""}
    if cfg.get("attention_bias"):
        raise ValueError("BitNet with attention_bias is not supported (transformers scales the "
                         "biases with the BitLinear outputs; no published checkpoint has them)")  # fmt: skip
    if not isinstance(qc, Mapping) or qc.get("quant_method") != QUANT_METHOD:
        method = qc.get("quant_method") if isinstance(qc, Mapping) else qc
        raise ValueError(f"a BitNet checkpoint's quantization {method!r} is not supported "
                         "(quant_method 'bitnet')")  # fmt: skip
    linear_class = qc.get("linear_class", "bitlinear")
    if linear_class != "autobitlinear":
        raise ValueError(f"BitNet linear_class {linear_class!r} is not supported (only "
                         "'autobitlinear', the published checkpoints')")  # fmt: skip
    mode = qc.get("quantization_mode", "offline")
    if mode not in ("offline", "online"):
        raise ValueError(f"BitNet quantization_mode {mode!r} is not 'offline' or 'online'")
    if qc.get("use_rms_norm"):
        raise ValueError("BitNet with use_rms_norm (an RMSNorm inside every BitLinear) is not "
                         "supported")  # fmt: skip
    kept = [m for m in qc.get("modules_to_not_convert") or () if m != "lm_head"]
    if kept:
        raise ValueError(f"BitNet modules_to_not_convert {kept} is not supported (only the LM "
                         "head stays unquantized)")  # fmt: skip
    return {"bitnet": mode}


def expected_shapes(c: ModelConfig, out: dict[str, tuple[int, ...]]) -> None:
    """`out` (`checkpoint_shapes.expected_shapes`) with BitNet's sub-norms, its MLPs (their width
    is config.json's: ffn_sub_norm's) and, packed, each matrix as uint8 [rows / 4, cols] with its
    one-element weight_scale."""
    h, i = c.hidden_size, c.intermediate_size
    for n in range(c.num_layers):
        a, m = f"model.layers.{n}.self_attn.", f"model.layers.{n}.mlp."
        out[a + "attn_sub_norm.weight"], out[m + "ffn_sub_norm.weight"] = (h,), (i,)
        out.update({m + "gate_proj.weight": (i, h), m + "up_proj.weight": (i, h),
                    m + "down_proj.weight": (h, i)})  # fmt: skip
        if c.family.bitnet != "offline":
            continue
        for p in [a + x for x in ATTENTION] + [m + x for x in MLP]:
            rows, cols = out[p + ".weight"]
            if rows % 4:
                raise ValueError(f"{p}.weight has {rows} rows, which a packed BitNet matrix "
                                 "(four rows a byte) cannot hold")  # fmt: skip
            out[p + ".weight"] = (rows // 4, cols)
            out[p + ".weight_scale"] = (1,)


def check_dtypes(headers: Mapping[str, tuple[str, list[int]]]) -> None:
    """A packed checkpoint's matrices are uint8 (the shapes are checked with the others')."""
    for name, (dtype, _) in headers.items():
        if MATRIX.match(name) and dtype != "U8":
            raise ValueError(f"checkpoint tensor {name} is {dtype}; a packed BitNet matrix "
                             "(quantization_mode offline) is U8")  # fmt: skip


def rank_rows(layer: int, part: str, rows: int, cols: int, c: ModelConfig, lay: TPLayout):
    """A rank's (elements, 1) of a layer's vectors (`model/bitnet.py`): the sub-norms' channels
    and the column-parallel matrices' scales (one per output row: q's by its heads, k's and v's
    by its KV heads, gate's and up's by rows; o's and down's whole), or None for the others
    (`distributed/tp_families.py`; the matrices by the shared rules)."""
    if part.endswith("_sub_norm.weight"):
        return rows // lay.size, cols
    if not part.endswith(".bitnet_scale") or part.startswith(("self_attn.o_", "mlp.down_")):
        return None
    if part.startswith("self_attn."):
        q, kv = lay.heads(c.num_heads), lay.kv_heads(c.num_kv_heads)
        start, stop = q if part.startswith("self_attn.q_") else kv
        return (stop - start) * c.head_dim, cols
    return rows // lay.size, cols
