"""LoRA adapters over tensor-parallel ranks (`lora/slots.shards`): each rank holds its part of
every adapter, cut as the base layer is, and the row-parallel layers' adapter products join the
base layer's all-reduce. Here each mode's product on two ranks' shards against the whole layer's;
two engine ranks against one rank and peft: `test_lora_oracle.py` (its checkpoints)."""

from __future__ import annotations

import pytest
import torch
from pagoda.runtime.lora.layer import MODES, LoRALinear, LoRAStep
from pagoda.runtime.lora.slots import shards


@pytest.mark.parametrize("mode", MODES)
def test_shards_of_each_layer_add_up_to_the_whole(mode):
    """Every mode on each rank's `Shard`: the column-parallel layers' outputs are the whole
    layer's columns of that rank, the row-parallel layers' partial products sum to the whole
    (what the all-reduce does), for tokens of two adapters and the base."""
    from pagoda.runtime.config import ModelConfig
    from pagoda.runtime.distributed.layout import TPLayout
    from pagoda.runtime.lora.adapter import module_shapes

    mc = ModelConfig(300, 64, 128, 2, 4, 2, 16, architecture="llama")
    shapes, g = module_shapes(mc), torch.Generator().manual_seed(0)
    adapters = [{m: (torch.randn(r, fin, generator=g), torch.randn(fout, r, generator=g))
                 for m, (fin, fout) in shapes.items()} for r in (8, 4)]  # fmt: skip
    index = torch.tensor([0, 1, 2, 1, 2, 0])
    step = LoRAStep(index=index, mode=mode)
    step.onehot = torch.nn.functional.one_hot(index, 3).float().unsqueeze(2)
    step.groups = [(s, torch.nonzero(index == s).flatten()) for s in (1, 2)]

    def layers(lay):
        out = {}
        for first, (parts, fin, shard) in shards(mc, lay).items():
            width = sum(w for _, w in parts)
            zero = lambda x, width=width: x.new_zeros(x.shape[0], width)  # noqa: E731
            w = LoRALinear(zero, parts, fin, 3, 8, step, torch.float32, torch.device("cpu"),
                           shard=shard)  # fmt: skip
            for slot, ad in enumerate(adapters, 1):
                w.load(slot, ad)
            out[first] = w
        return out

    whole, ranks = layers(None), [layers(TPLayout(r, 2)) for r in range(2)]
    for first, w in whole.items():
        x = torch.randn(len(index), w.a.shape[2], generator=g)
        want = w(x)
        if first in ("o_proj", "down_proj"):
            got = sum(rk[first](x.chunk(2, dim=1)[r]) for r, rk in enumerate(ranks))
        else:  # each part's columns of rank r, in the part's order
            got = torch.cat([rk[first](x) for rk in ranks], dim=1)
            want = torch.cat([p.chunk(2, dim=1)[r] for r in range(2)
                              for p in want.split([pw for _, pw in whole[first].parts], 1)], 1)  # fmt: skip
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
