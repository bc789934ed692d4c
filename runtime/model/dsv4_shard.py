"""Which part of DeepSeek-V4's tensors one tensor-parallel rank holds (`distributed.layout`'s
arithmetic; the engine: `dsv4_engine`, the weights estimate: `server/rank_share.py`).

Split (rank r of N):

- the attention's query heads: ``q_b_proj``'s rows and the ``sinks`` of heads
  ``[r H/N, (r+1) H/N)``; the grouped output projection by its groups (``o_groups`` must divide
  by N: a group's heads then sit on one rank): ``o_a_proj``'s rows of the rank's groups, and
  ``o_b_proj``'s input columns of them, the ranks' products summed by one all-reduce;
- the routed and shared experts by width (``moe_intermediate_size``), as `moe.py` splits them:
  gate and up by rows, down by input columns, one all-reduce of the experts' and the shared
  expert's sum;
- the vocabulary (embedding and LM head) as every family's (`parallel_linear.vocab_parallel`).

Replicated: what every head shares. The attention is MQA-like (one KV row a token, K = V), so
its KV projection, the compressors and their entries, CSA's Ca tails and the open-window slots
are whole on every rank (a rank's cache is all of the cache: `dsv4_engine.block_bytes`); the
lightning indexer (its heads' ReLU scores summed before the top-k) whole too, so each rank
picks the same entries; ``q_a_proj`` and its norm (the queries' shared latent), the
hyper-connections' mixing, the norms and the routers.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from pagoda.runtime.model.dsv4_config import expected_shapes

if TYPE_CHECKING:
    import torch
    from pagoda.runtime.config import ModelConfig
    from pagoda.runtime.distributed.layout import TPLayout
    from pagoda.runtime.model.dsv4_config import Dsv4Config

# held in float32 whatever the dtype, as transformers keeps them (`_keep_in_fp32_modules_strict`)
FLOAT32 = re.compile(r"attn_hc\.|ffn_hc\.|hc_head\.|\.sinks$|position_bias|e_score_correction"
                     r"|q_a_norm|kv_norm|layernorm|^model\.norm\.")  # fmt: skip

_EXPERT = re.compile(
    r"\.mlp\.(experts\.\d+|shared_experts)\.(gate_proj|up_proj|down_proj)\.weight$"
)


def tp_problem(config: ModelConfig, size: int) -> str | None:
    """Why `size` ranks cannot split DeepSeek-V4 (one line), or None
    (`distributed/tp_families.py`): beyond the heads and the experts' width (its config's
    ``intermediate_size``, `layout.check`'s), the output projection's groups must divide, a
    group's heads on one rank."""
    c = config.family.dsv4
    if c is not None and c.o_groups % size:
        return (f"--tensor-parallel-size {size} does not divide DeepSeek-V4's output projection "
                f"groups (o_groups {c.o_groups})")  # fmt: skip
    return None


def part(c: Dsv4Config, name: str, lay: TPLayout) -> tuple[int, int, int] | None:
    """(dim, start, stop) of tensor ``name`` (`dsv4_config.canonical`'s) this rank holds; None
    where it holds it whole (module docstring). The vocabulary's rows may pass its end
    (`TPLayout.vocab`: zero rows)."""
    if lay.size == 1:
        return None
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return (0, *lay.vocab(c.vocab_size))
    d, r = c.head_dim, c.o_lora_rank
    if name.endswith(".self_attn.q_b_proj.weight"):  # (not the indexer's)
        h0, h1 = lay.heads(c.num_heads)
        return 0, h0 * d, h1 * d
    if name.endswith(".self_attn.sinks"):
        return (0, *lay.heads(c.num_heads))
    if name.endswith((".self_attn.o_a_proj.weight", ".self_attn.o_b_proj.weight")):
        g0, g1 = lay.even(c.o_groups)
        return (0 if "o_a_proj" in name else 1), g0 * r, g1 * r
    m = _EXPERT.search(name) if "experts." in name else None
    if m:
        return (1 if m.group(2) == "down_proj" else 0, *lay.even(c.moe_intermediate_size))
    return None


def local_shape(c: Dsv4Config, name: str, shape: tuple[int, ...], lay: TPLayout):
    """Tensor ``name``'s shape on rank ``lay.rank`` (`part`)."""
    p = part(c, name, lay)
    if p is None:
        return tuple(shape)
    out = list(shape)
    out[p[0]] = p[2] - p[1]
    return tuple(out)


def held_bytes(c: Dsv4Config, dtype: torch.dtype, lay: TPLayout) -> int:
    """The weights one rank of the engine holds (`dsv4_engine.Dsv4EngineModel`): every tensor
    (`expected_shapes`) at its rank's shape (`part`), in ``dtype`` or float32 (`FLOAT32`), the
    hash layers' ``tid2eid`` as int64, and the routers' float32 copies where ``dtype`` is
    narrower (the weights estimate's figure: `server/weights.py`)."""
    total = 0
    expert = c.hidden_size * (c.moe_intermediate_size // lay.size)  # (one of its matrices)
    for name, shape in expected_shapes(c).items():
        if ".experts." in name:  # (the routed experts: most names, one size)
            total += dtype.itemsize * expert
            continue
        n = math.prod(local_shape(c, name, shape, lay))
        if name.endswith("tid2eid"):
            total += 8 * n
        elif FLOAT32.search(name):
            total += 4 * n
        else:
            total += dtype.itemsize * n
            if name.endswith(".mlp.gate.weight") and dtype.itemsize < 4:
                total += 4 * n  # (`dsv4_model.Dsv4Moe`'s float32 router)
    return total
