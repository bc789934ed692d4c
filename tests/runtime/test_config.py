"""`EngineConfig.create` (what `LLM(...)` passes its keyword arguments to) refuses a value of
the wrong type with a ValueError naming the field: a bool, a float or a string is not an
integer, even where Python would compare it as one (``True`` as 1 rank, ``2.0`` as 2)."""

from __future__ import annotations

import pytest
from pagoda.runtime.config import EngineConfig
from pagoda.runtime.engine.llm import LLM


@pytest.mark.parametrize("value", [True, False, 2.0, "2"])
@pytest.mark.parametrize(
    "field", ["tensor_parallel_size", "nnodes", "node_rank", "master_port", "block_size", "seed"]
)
def test_an_integer_field_refuses_other_types(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"^{field} must be an integer, got {value!r}"):
        EngineConfig.create(**{field: value})


@pytest.mark.parametrize("value", [True, "0.5", [0.5]])
def test_gpu_memory_utilization_must_be_a_number(value: object) -> None:
    with pytest.raises(ValueError, match="gpu_memory_utilization must be in"):
        EngineConfig.create(gpu_memory_utilization=value)


def test_master_addr_must_be_a_string() -> None:
    with pytest.raises(ValueError, match="master_addr must be a string, got 1"):
        EngineConfig.create(master_addr=1)


def test_llm_refuses_before_loading_anything() -> None:
    with pytest.raises(ValueError, match="tensor_parallel_size must be an integer, got True"):
        LLM("no-such-model", tensor_parallel_size=True)


def test_integers_still_pass() -> None:
    cfg = EngineConfig.create(tensor_parallel_size=1, block_size=16, seed=3, master_port=29501)
    assert (cfg.parallel.tensor_parallel_size, cfg.cache.block_size, cfg.seed) == (1, 16, 3)
    assert EngineConfig.create(gpu_memory_utilization=1).cache.gpu_memory_utilization == 1


@pytest.mark.parametrize("value", ["no", 0, 1, None, [True]])
@pytest.mark.parametrize(
    "field",
    ["enable_prefix_caching", "enable_chunked_prefill", "enable_cuda_graphs", "batch_invariant"],
)
def test_a_boolean_field_refuses_other_types(field: str, value: object) -> None:
    """`LLM(enable_prefix_caching="no")` used to turn caching on (a non-empty string is
    truthy); now every boolean knob is True or False, or a ValueError naming it."""
    with pytest.raises(ValueError, match=rf"^{field} must be True or False, got "):
        EngineConfig.create(**{field: value})


def test_async_scheduling_is_a_boolean_or_none() -> None:
    with pytest.raises(
        ValueError, match=r"^async_scheduling must be True, False or None, got 'no'"
    ):
        EngineConfig.create(async_scheduling="no")
    assert EngineConfig.create(async_scheduling=None).async_scheduling is None
    cfg = EngineConfig.create(enable_prefix_caching=False, enable_chunked_prefill=False,
                              async_scheduling=False)  # fmt: skip
    assert not cfg.cache.enable_prefix_caching and not cfg.scheduler.enable_chunked_prefill


def test_vllms_fp8_e4m3_kv_cache_dtype_is_fp8():
    from pagoda.runtime import options
    from pagoda.runtime.config import CacheConfig

    assert CacheConfig(kv_cache_dtype="fp8_e4m3").kv_cache_dtype == "fp8"
    assert options.engine_kwargs({"kv_cache_dtype": "fp8_e4m3"})["kv_cache_dtype"] == "fp8"
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        CacheConfig(kv_cache_dtype="fp8_e5m2")
