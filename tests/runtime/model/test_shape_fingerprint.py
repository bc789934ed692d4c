"""The shape fingerprint a tuned profile records: the dimensions of the config.json that
`pagoda serve` reads, experts and FP8 weights included (a config alone: no weights needed)."""

from __future__ import annotations

import json

import pytest
from pagoda.runtime.model.shape_fingerprint import FINGERPRINT_KEYS, model_fingerprint

MIXTRAL = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": 1000,
    "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 8,
    "num_experts_per_tok": 2, "max_position_embeddings": 256,
}  # fmt: skip


@pytest.mark.parametrize(
    ("quantization_config", "flag", "want"),
    [
        (None, None, "none"),
        (None, "fp8", "fp8"),  # --quantization fp8 on a 16-bit checkpoint
        ({"quant_method": "fp8", "activation_scheme": "dynamic"}, None, "fp8"),
        ({"quant_method": "fp8", "activation_scheme": "dynamic",
          "weight_block_size": [128, 128]}, None, "fp8 block 128x128"),
    ],
)  # fmt: skip
def test_the_fingerprint_of_a_config(tmp_path, quantization_config, flag, want):
    config = {**MIXTRAL, **({"quantization_config": quantization_config}
                            if quantization_config else {})}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    shapes = model_fingerprint(str(tmp_path), flag)
    assert tuple(shapes) == FINGERPRINT_KEYS
    assert shapes == {
        "hidden_size": 64, "intermediate_size": 96, "num_heads": 4, "num_kv_heads": 2,
        "head_dim": 16, "vocab_size": 1000, "num_layers": 3, "num_experts": 8,
        "num_experts_per_tok": 2, "moe_intermediate_size": 96, "quantization": want,
    }  # fmt: skip
