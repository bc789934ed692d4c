"""Audit cases on checkpoints shaped as published ones (config.json as on the hub, shrunk), each
a failure found and fixed; transformers writes the weights."""

from __future__ import annotations

import pytest
import torch
from hf_oracle import make_tiny_model

transformers = pytest.importorskip("transformers")


def test_a_rank_of_a_bf16_checkpoint_holds_only_its_embedding_rows(tmp_path):
    """A bfloat16 checkpoint (Command R's tied 256k-row table, say) served in bfloat16 by two
    ranks on a CPU: a rank's rows of the embedding came out of `DeviceWeights.part` as a view of
    the whole table (no dtype or device change copied them), so every rank held all of it. The
    start-up estimate (one rank's share) is what the rank holds."""
    from model_bytes import build, held_bytes
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.distributed.group import TPGroup
    from pagoda.runtime.distributed.layout import TPLayout
    from pagoda.runtime.model.loader import read_model_config
    from pagoda.runtime.server import weights

    model = make_tiny_model(tmp_path, "Cohere", num_hidden_layers=1, use_qk_norm=True)
    model.to(torch.bfloat16).save_pretrained(tmp_path)
    group = TPGroup(TPLayout(0, 2), torch.device("cpu"), None, None)
    built = build(tmp_path, torch.bfloat16, tp=group)
    table = built.embed.table
    assert table.untyped_storage().nbytes() == table.nbytes == 150 * 64 * 2
    cfg = EngineConfig.create(str(tmp_path), device="cpu", dtype="bfloat16",
                              tensor_parallel_size=2)  # fmt: skip
    got = weights.estimate(read_model_config(str(tmp_path)), cfg, tmp_path)
    assert got.bytes == held_bytes(built)
