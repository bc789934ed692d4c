"""How long the engine loop stops stepping while a LoRA adapter is read, on the embedded
SmolLM2-135M (an adapter of ``--rank`` 16 on all seven projections of its 30 layers: 19.5 MB of
safetensors, written by the script).

The engine runs on its thread (`AsyncEngine`, as ``pagoda serve`` without the engine process),
``--batch`` base requests decoding; mid-stream one adapter is loaded, each way alternated
``--reps`` times (a fresh adapter id each, so each is read from the file):

- "in the loop": ``core.add_lora`` as a call on the engine thread, which is what a request
  naming an adapter not in host memory and ``POST /v1/load_lora_adapter`` did before the read
  moved off the loop;
- "load_lora_adapter": the route's call now (`EngineCore.load_lora`: the read on the reader
  thread, answered once it is done). A request naming an adapter not read yet waits for the
  same read (`tests/runtime/lora/test_lora_reads.py`); it is not timed here, since its steps
  then run the adapter (its slot filled, its product), which is not the read's cost.

Per way: the time the engine thread spent in the load's calls (the stall: no step runs then),
the base stream's longest gap between two steps while the load was under way (a step's own
gap before it is the base line; on a busy machine this one is noisy), and how long the load
took::

    OMP_WAIT_POLICY=PASSIVE python -P benchmarks/lora_load_stall.py
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch (and OpenMP) load

import argparse
import asyncio
import functools
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, markdown_table
from lora_adapters import write_adapter
from pagoda.runtime import LoRARequest, SamplingParams
from pagoda.runtime.config import EngineConfig
from pagoda.runtime.engine.async_engine import AsyncEngine
from pagoda.runtime.engine.core import EngineCore
from pagoda.runtime.engine.deferred import Deferred
from pagoda.runtime.lora_config import LoRAConfig
from pagoda.runtime.model.loader import load_model
from pagoda.runtime.server.lora_adapters import _engine_load


def _in_loop(request: LoRARequest, core) -> None:
    core.add_lora(request)  # the read on the engine thread (the old way)


BLOCKED: list[float] = []  # per load: the engine thread's time in its calls


def _timed(fn, request: LoRARequest, core):
    """`fn(request, core)`, its time on the engine thread (a `Deferred`'s finish included)
    added to `BLOCKED`."""
    t = time.perf_counter()
    out = fn(request, core)
    BLOCKED.append(time.perf_counter() - t)
    if not isinstance(out, Deferred):
        return out

    def finish(c):
        t = time.perf_counter()
        try:
            return out.finish(c)
        finally:
            BLOCKED[-1] += time.perf_counter() - t

    return Deferred(out.wait, finish)


async def _one(engine: AsyncEngine, way: str, lora: LoRARequest, prompt, params) -> tuple:
    """(longest step gap during the load, median gap before it, load seconds, the engine
    thread's time in the load's calls) of one load."""
    ends: list[float] = []

    async def base(i: int) -> None:
        async for _ in engine.add_request(prompt, params):
            if i == 0:
                ends.append(time.perf_counter())

    runs = [asyncio.ensure_future(base(i)) for i in range(engine.batch)]
    while len(ends) < 12:  # decoding steadily
        await asyncio.sleep(0.001)
    t0 = time.perf_counter()
    fn = _in_loop if way == "in the loop" else _engine_load
    await engine.run_in_engine(functools.partial(_timed, fn, lora))
    t1 = time.perf_counter()
    await asyncio.gather(*runs)
    before = [b - a for a, b in itertools.pairwise(ends) if b < t0]
    during = [b - a for a, b in itertools.pairwise(ends) if b > t0 and a < t1]
    step = statistics.median(before)
    return max(during, default=0.0), step, t1 - t0, BLOCKED[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dtype", default="auto")
    args = ap.parse_args()
    print(machine())
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at start, {os.cpu_count()} CPUs")
    loaded = load_model("smollm2-135m")
    path = Path(tempfile.mkdtemp(prefix="pagoda-lora-stall-")) / "a"
    write_adapter(path, loaded.config, args.rank, 0)
    size = (path / "adapter_model.safetensors").stat().st_size
    cfg = EngineConfig.create(loaded.path, dtype=args.dtype, max_model_len=512,
                              max_num_seqs=args.batch + 1, kv_cache_memory=64 << 20,
                              lora=LoRAConfig(1, args.rank, max_cpu_loras=64))  # fmt: skip
    core = EngineCore(cfg, loaded)
    tok = loaded.tokenizer
    prompt = tok.encode("<|im_start|>user\nWhy is the sky blue?<|im_end|>\n<|im_start|>"
                        "assistant\n", add_special_tokens=False)  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    ways = ["in the loop", "load_lora_adapter"]
    results: dict[str, list[tuple]] = {w: [] for w in ways}

    async def run() -> None:
        engine = AsyncEngine(lambda: core)
        engine.batch = args.batch
        engine.start()
        await engine.wait_started()
        ids = iter(range(1, 1000))
        try:
            for _ in range(args.reps):
                for way in ways:  # alternated: load changes hit all alike
                    lora = LoRARequest(f"a{next(ids)}", next(ids), str(path))
                    results[way].append(await _one(engine, way, lora, prompt, params))
        finally:
            engine.stop()

    asyncio.run(run())
    print(f"adapter: rank {args.rank}, {size / 1e6:.1f} MB; dtype {core.runner.dtype}; "
          f"batch {args.batch} decoding; {args.reps} loads each way")  # fmt: skip
    rows = []
    for way, rs in results.items():
        med = [statistics.median(r[k] for r in rs) * 1e3 for k in range(4)]
        rows.append([way, f"{med[3]:.2f}", f"{med[1]:.1f}", f"{med[0]:.1f}",
                     f"{max(r[0] for r in rs) * 1e3:.1f}", f"{med[2]:.1f}"])  # fmt: skip
    print(markdown_table(["load", "engine thread blocked, ms", "step gap before, ms",
                          "longest gap during, ms", "(max of the loads)", "load took, ms"], rows))  # fmt: skip
    print("(medians over the loads)")
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at end")


if __name__ == "__main__":
    main()
