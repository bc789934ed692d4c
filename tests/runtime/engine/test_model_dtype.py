"""--dtype float16 on a model that overflows it: Gemma 2 (and Gemma 3) are refused in one line,
before the server binds and in the engine, as vLLM refuses them (`_FLOAT16_NOT_SUPPORTED_MODELS`:
numerical instability); Phi-3 and the others still run in float16."""

from __future__ import annotations

import pytest
from hf_oracle import make_tiny_model
from pagoda.runtime import LLM, options
from pagoda.runtime.model.loader import load_model
from pagoda.runtime.server.cli import build_parser, server_config
from pagoda.runtime.server.launch import preflight

pytest.importorskip("transformers")
GEMMA2 = dict(head_dim=16, num_hidden_layers=1, query_pre_attn_scalar=16)


def _preflight(path, dtype: str):
    args = build_parser().parse_args(["--model", str(path), "--dtype", dtype,
                                      "--kv-cache-memory", "4MiB"])  # fmt: skip
    return preflight(server_config(args), options.engine_kwargs(vars(args)))[0]


def test_gemma2_in_float16_is_refused_before_the_server_binds_and_by_the_engine(tmp_path):
    make_tiny_model(tmp_path, "Gemma2", **GEMMA2)
    with pytest.raises(ValueError, match=r"^a gemma2 model does not run in float16 .*float32$"):
        _preflight(tmp_path, "float16")
    assert _preflight(tmp_path, "bfloat16").dtype == "bfloat16"
    with pytest.raises(ValueError, match="does not run in float16"):
        LLM(loaded=load_model(str(tmp_path)), dtype="float16", kv_cache_memory=4 << 20)


def test_phi3_in_float16_is_still_served(tmp_path):
    make_tiny_model(tmp_path, "Phi3", num_hidden_layers=1)
    assert _preflight(tmp_path, "float16").dtype == "float16"
