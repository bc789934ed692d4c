"""ALiBi (arXiv 2108.12409): no rotary; every head adds ``slope_h * (key_pos - query_pos)`` to
its scores before the softmax (the attention backends' `alibi_slopes`). The slopes, float32 per
head, as transformers computes them:

- "bloom" (`BloomForCausalLM`, falcon-rw): the geometric series ``2^(-8 i / n)``, i = 1..n, for
  the largest power of two n <= heads; the remaining heads take every other term of the
  series for 2n (``_get_alibi_slopes``);
- "mpt" (`MPTForCausalLM`): ``1 / 2^(i * bias_max / n)``, i = 1..n, n the next power of two;
  for a head count that is not one, the odd terms then the even ones, cut to the heads
  (``build_mpt_alibi_tensor``).

transformers adds ``slope * key_pos`` (BLOOM) or ``slope * (key_pos - last_pos)`` (MPT): each row
of scores shifted by a constant, which the softmax does not see; the backends add the relative
form, vLLM's.
"""

from __future__ import annotations

import math

import torch
from pagoda.runtime.config import ModelConfig


def bloom_slopes(num_heads: int) -> torch.Tensor:
    n = 2 ** math.floor(math.log2(num_heads))
    base = torch.tensor(2 ** (-(2 ** -(math.log2(n) - 3))), dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, 1 + n, dtype=torch.int32))
    if n != num_heads:
        extra = torch.tensor(2 ** (-(2 ** -(math.log2(2 * n) - 3))), dtype=torch.float32)
        rest = min(n, num_heads - n)
        slopes = torch.cat([slopes, torch.pow(extra, torch.arange(1, 1 + 2 * rest, 2,
                                                                  dtype=torch.int32))])  # fmt: skip
    return slopes


def mpt_slopes(num_heads: int, bias_max: float = 8.0) -> torch.Tensor:
    n = 2 ** math.ceil(math.log2(num_heads))
    base = torch.arange(1, n + 1, dtype=torch.int64).float() * (bias_max / n)
    slopes = 1.0 / torch.pow(2, base)
    if n != num_heads:
        slopes = torch.cat([slopes[1::2], slopes[::2]])[:num_heads]
    return slopes


def slopes(config: ModelConfig, heads: tuple[int, int] | None = None) -> torch.Tensor | None:
    """float32 [heads] of an ALiBi model (None for any other): all of them, or the heads
    [start, stop) a tensor-parallel rank holds."""
    f = config.family
    if f.positions != "alibi":
        return None
    n = config.num_heads
    out = bloom_slopes(n) if f.alibi_slopes == "bloom" else mpt_slopes(n, f.alibi_bias_max)
    return out if heads is None else out[heads[0] : heads[1]].contiguous()
