"""Host memory: loading leaves no float32 copy of the model resident.

The heap settings of `host_memory.keep_freed_memory` keep freed blocks in the process (so step
temporaries are not re-faulted); without a trim after loading, the float32 tensors a GGUF is
dequantized into before `qgemm` takes its blocks (or before bf16 conversion) would stay
resident for the life of the process: ~1 GB for the 135M model where its weights need ~0.25.
Token embeddings are read from the LM head's blocks (tied), so no float32 table stays either."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pagoda.runtime.cpu import qgemm

SCRIPT = r"""
import json, os
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
from pagoda.runtime import LLM
before = rss()
llm = LLM("smollm2-135m", dtype="float32", kv_cache_memory=16 << 20)
print(json.dumps({"grew": rss() - before, "params": llm.engine.model_config.num_params}))
"""


@pytest.mark.slow
def test_a_float32_engine_keeps_no_float32_copy_of_its_gguf_weights():
    if qgemm.load() is None:
        pytest.skip("without qgemm a float32 model multiplies by float32 weights")
    run = subprocess.run(
        [sys.executable, "-P", "-c", SCRIPT], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    float32_model = 4 * got["params"]  # 540 MB: what the loader dequantizes to
    # resident growth: the Q4_1/Q8_0 blocks (~100 MB), which also serve the embedding lookups,
    # the 16 MB KV cache and the libraries loaded on the way: 159 MB measured (272 with a float32
    # embedding table, 811 with the float32 model kept)
    assert got["grew"] < 0.45 * float32_model, got


def _rss() -> int:
    import os

    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_zeros_maps_a_large_cpu_tensor_without_touching_it():
    """A 64 MiB `zeros` takes no resident memory until written (a memset would fault in all of
    it), is page-aligned and writable, and keeps its mapping alive by itself."""
    import gc

    import torch
    from pagoda.runtime.cpu.host_memory import zeros

    before = _rss()
    t = zeros((1024, 16, 2, 1024), torch.bfloat16, torch.device("cpu"))  # 64 MiB
    assert _rss() - before < 8 << 20
    assert t.shape == (1024, 16, 2, 1024) and t.dtype == torch.bfloat16 and t.is_contiguous()
    assert t.data_ptr() % 4096 == 0
    gc.collect()  # nothing but the tensor holds the mapping
    t[3, 5] = 2.0
    assert t.count_nonzero().item() == 2 * 1024 and t.sum().item() == 2.0 * 2 * 1024
    t.zero_()  # every page written: now it is resident
    assert _rss() - before > 48 << 20


@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "int8", "float8_e4m3fn"])
def test_zeros_is_zero_where_freed_memory_held_garbage(dtype):
    """Never earlier data, whatever the heap held: NaN in a KV block's unused slots would
    survive a multiplication by 0. Small tensors (torch.zeros) and large ones (mappings)."""
    import torch
    from pagoda.runtime.cpu.host_memory import keep_freed_memory, zeros

    keep_freed_memory()  # freed blocks stay in the heap, as in a CPU engine
    dt = getattr(torch, dtype)
    for _ in range(3):
        garbage = torch.full((8 << 20,), float("nan"))  # 32 MiB of NaN, freed again
        del garbage
        for shape in ((3, 7, 16, 64), (2, 300, 16, 64)):  # 43 KiB and 1.2 MiB in bytes at int8
            t = zeros(shape, dt, torch.device("cpu"))
            assert t.shape == shape and t.dtype == dt
            assert not t.view(torch.uint8).any(), (dtype, shape)


def test_cpu_kv_caches_are_lazy_zeros():
    """Both CPU layouts (the attention kernel's packed one, the torch path's head-major one)
    and the base class's allocate through `zeros`: all zero, and not resident until written
    (2 x 64 MiB each, more than any freed heap a test before left)."""
    import torch
    from pagoda.runtime.attention.base import AttentionBackend
    from pagoda.runtime.attention.torch_backend import TorchAttentionBackend

    cpu = torch.device("cpu")
    for softcap in (None, 30.0):  # a soft cap takes the torch path
        be = TorchAttentionBackend(4, 2, 64, 0.125, softcap=softcap)
        before = _rss()
        k, v = be.allocate_kv_cache(16384, 16, torch.bfloat16, cpu)
        assert _rss() - before < 8 << 20, softcap
        assert (be.kernel is None) == (softcap is not None)
        assert not k.view(torch.uint8).any() and not v.view(torch.uint8).any()
        del k, v
    before = _rss()
    k, _v = AttentionBackend.allocate_kv_cache(be, 16384, 16, torch.bfloat16, cpu)
    assert _rss() - before < 8 << 20 and k.shape == (16384, 16, 2, 64)
    assert not k.view(torch.uint8).any()
