"""What a built model really holds, for checking the start-up weight count (`server/weights.py`)
against it: imported by tests/server/test_weights.py and benchmarks/weights_estimate.py."""

from __future__ import annotations

import torch

# attributes that hold no weights (shared objects, the RoPE tables counted apart)
SKIP = {"rope_caches", "backend", "ops", "config", "tp", "ctx", "act_and_mul", "rms_norm"}


def held_bytes(model) -> int:
    """Bytes of every tensor the model object holds (each storage once; oneDNN's packed weights
    by their own size), the RoPE tables, attention backend and ops left out."""
    seen, total, stack, visited = set(), 0, [model], set()
    while stack:
        o = stack.pop()
        if id(o) in visited or isinstance(o, (int, float, str, bool, type(None))):
            continue
        visited.add(id(o))
        if isinstance(o, torch.Tensor):
            if o.is_mkldnn:
                key, n = ("mkldnn", torch.ops.mkldnn.data_ptr(o)), torch.ops.mkldnn._nbytes(o)
            else:
                key, n = o.untyped_storage().data_ptr(), o.untyped_storage().nbytes()
            if key not in seen:
                seen.add(key)
                total += n
        elif isinstance(o, (list, tuple)):
            stack.extend(o)
        elif isinstance(o, dict):
            stack.extend(o.values())
        else:
            names = list(getattr(o, "__dict__", {}))
            names += [n for c in type(o).__mro__ for n in getattr(c, "__slots__", ())]
            stack.extend(getattr(o, n) for n in names if n not in SKIP and hasattr(o, n))
    return total


def build(path, dtype: torch.dtype, device: str = "cpu", tp=None, fp8=None):
    """The model `pagoda serve` builds (`model_build.build_model`'s arguments), torch attention;
    `fp8`: a scheme to run in FP8 (``ONLINE_SCHEME``: ``--quantization fp8``), else the runner's
    choice for the checkpoint (`engine_scheme`: an FP8 checkpoint dequantized where the FP8
    kernels do not run, and a block-wise one everywhere)."""
    from pagoda.runtime.attention import get_attention_backend
    from pagoda.runtime.config import fp8_runs_on
    from pagoda.runtime.model.loader import load_model
    from pagoda.runtime.model.ops import select_ops
    from pagoda.runtime.model.registry import build_model
    from pagoda.runtime.quantization.fp8 import engine_scheme

    loaded, dev = load_model(str(path)), torch.device(device)
    mc = loaded.config
    fp8 = fp8 or engine_scheme(None, loaded.fp8_scheme, fp8_runs_on(dev))
    backend = get_attention_backend("torch", dev, mc.num_heads, mc.num_kv_heads, mc.head_dim, 1.0)
    # a rank built alone (`tp` without a process group) has no peers to agree on NaNs with
    return build_model(mc, loaded.weights, quantized=loaded.quantized, dtype=dtype, device=dev,
                       backend=backend, ops=select_ops(dev, backend.name), max_positions=64,
                       tp=tp, fp8=fp8, check_weights=tp is None)  # fmt: skip


def check_estimate(path, tp: int = 1, rel: float = 0.02) -> None:
    """`server/weights.py`'s estimate of the checkpoint at `path` (bf16, `tp` ranks: rank 0's
    share) within `rel` (2%; 0: exactly) of what the model built from it holds."""
    import pytest
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.distributed.group import TPGroup
    from pagoda.runtime.distributed.layout import TPLayout
    from pagoda.runtime.model.loader import read_model_config
    from pagoda.runtime.server import weights

    group = None if tp == 1 else TPGroup(TPLayout(0, tp), torch.device("cpu"), None, None)
    held = held_bytes(build(path, torch.bfloat16, tp=group))
    cfg = EngineConfig.create(str(path), device="cpu", dtype="bfloat16",
                              tensor_parallel_size=tp)  # fmt: skip
    got = weights.estimate(read_model_config(str(path)), cfg, path)
    assert got.bytes == pytest.approx(held, rel=rel, abs=0), (got, held)
