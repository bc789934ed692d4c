"""A process that built an engine and ran Triton ends quietly: pytest's summary is the last line.

The engine freezes its start-up objects (`gc.freeze`); frozen objects are never collected, not
even at exit, so Triton's nanobind bindings used to print ~40 lines of "nanobind: leaked ..."
after the summary. The engine unfreezes them at exit. (A process that imports Triton and calls
`gc.freeze()` prints exactly what CI printed after `make test`'s summary: 4 leaked
`ir.attribute` instances, 64 types, 518 functions; this test fails without the fix.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from hf_oracle import make_tiny_llama

pytest.importorskip("triton")

INNER = """
    import os

    import torch
    from pagoda.kernels import rms_norm
    from pagoda.runtime import LLM, SamplingParams


    def test_triton_kernel_then_an_engine():
        x = torch.randn(2, 16)
        assert torch.isfinite(rms_norm(x=x, weight=torch.ones(16), eps=1e-6)).all()
        llm = LLM(os.environ["TINY_MODEL"], dtype="float32", kv_cache_memory=1 << 20,
                  attention_backend="triton", max_num_seqs=2, max_num_batched_tokens=16)
        params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
        assert len(llm.generate([{"prompt_token_ids": [1, 2, 3]}], params)) == 1
"""


@pytest.mark.slow
def test_a_triton_run_ends_with_the_summary_line(tmp_path):
    make_tiny_llama(tmp_path / "model")
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER))
    env = {**os.environ, "TRITON_INTERPRET": "1", "TINY_MODEL": str(tmp_path / "model")}
    args = ["-q", "-p", "no:cacheprovider", "-o", "asyncio_default_fixture_loop_scope=function"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *args, "test_inner.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "nanobind" not in out, out
    assert proc.stdout.rstrip().splitlines()[-1].startswith("1 passed"), out
    assert proc.stderr.strip() == "", out
