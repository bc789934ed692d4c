"""Shared test settings: keep torch to the machine's cores and make e2e tool checks strict in CI."""

import os
from collections import Counter
from pathlib import Path

# Before torch loads libgomp (as `pagoda serve` and `pagoda tune` do): OpenMP threads that spin
# at barriers while another process holds a core make each small op a scheduler time slice
# slower. On 2 busy cores a tiny-model engine step took 96-209 ms with spinning threads and
# 5-6 ms with passive ones; the suite's processes (pytest, its servers) compete for 2 cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
import torch

# Under pytest-xdist (`make test-fast` runs one worker per core) each worker keeps to one thread,
# so the workers share the cores instead of each asking for all of them.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1) // _WORKERS))

REQUIRE_E2E = os.environ.get("PAGODA_REQUIRE_E2E") == "1"


def skip_or_fail(reason: str) -> None:
    """Skip locally when a tool is missing; fail in CI, where .ci/run installs everything."""
    if REQUIRE_E2E:
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


# Slow tests that share the cores well: no timing bounds, so they may run beside others (their
# servers bind free loopback ports). `make test` runs them with the tests not marked slow on the
# xdist workers; every other slow test is marked `serial` and runs alone after: the operator's
# autoscaling, autotune, peering and chaos runs, which assert how soon something happens, and
# the hf:// download then serve (its blocking subprocess runs starve the in-process API server;
# beside other tests on a loaded machine its server was not ready within the test's 240 s).
SLOW_IN_PARALLEL = (
    "tests/benchmarks/",
    "tests/docs/test_readme.py",  # `make serve`'s command answers the README's examples
    "tests/docs/test_structured_outputs_doc.py",  # the doc's SDK examples, as written
    "tests/kernels/test_kernel_invariance.py",
    "tests/runtime/attention/test_kv_int8.py",  # g++ builds, KL against float32
    "tests/runtime/cpu/test_cpu_attention.py",
    "tests/runtime/cpu/test_host_memory.py",  # its own subprocess's resident growth
    "tests/runtime/distributed/test_tensor_parallel.py",  # a NaN refused over gloo; untimed
    "tests/runtime/distributed/test_tp_hybrid.py",  # two ranks over gloo; nothing timed
    "tests/runtime/engine/test_async_scheduling.py",
    "tests/runtime/engine/test_differential.py",
    "tests/runtime/engine/test_exit.py",  # an inner pytest run's last line
    "tests/runtime/engine/test_invariance.py",
    "tests/runtime/engine/test_llm_internlm3_spm.py",  # tokens equal transformers'
    "tests/runtime/engine/test_warmup.py",  # which kernel variants a run launches
    "tests/server/test_vision_chat.py",  # a LLaVA server's answers; nothing timed
    # the families' files (two ranks over gloo, Triton's interpreter in the engine, GGUF reads,
    # exit 2 and its one line): tokens and logits against transformers, nothing timed (2026-12-07:
    # no slow test of the folder reads a clock). The whole folder, so that a new family's
    # two-rank test does not land in the serial pass (test_mllama's, test_apertus1p5's and
    # test_hrm_text's did); a slow test that bounds a time belongs elsewhere
    "tests/runtime/model/",
    "tests/server/test_gemma3_vision_chat.py",  # a Gemma 3 server's image answers; nothing timed
    "tests/server/test_qwen2_vl_chat.py",  # a Qwen2-VL server's answers; nothing timed
    "tests/server/test_video_chat.py",  # a Qwen2-VL server's answers to videos; nothing timed
    "tests/server/test_llava_next_chat.py",  # LLaVA-NeXT / OneVision servers; nothing timed
    "tests/server/test_pixtral_chat.py",  # a Mistral 3 server's image answers; nothing timed
    "tests/server/test_internvl_chat.py",  # an InternVL server's image answers; nothing timed
    "tests/server/test_llama4_vision_chat.py",  # a Llama 4 server's image answers; untimed
    "tests/runtime/quantization/test_fp8_engine.py",  # tokens equal across batch and chunking
    "tests/runtime/spec/test_draft_model.py",  # a sampled law chi-square tested; untimed
    "tests/runtime/test_correctness_hf.py",
    "tests/runtime/tune/test_moe_sweep.py",
    "tests/runtime/tune/test_tune_interpreter.py",
    "tests/runtime/tune/test_tune_revision.py",  # the commit recorded; targets as loose as above
    "tests/runtime/tune/test_tune_e2e.py",  # a profile written, resumed, served; bounds of 60 s
    "tests/server/test_async_scheduling_server.py",  # texts equal the offline engine's
    "tests/server/test_cli.py",  # flags resolved to configs; exit 2 before loading
    "tests/server/test_fuzz.py",  # no 5xx, the engine intact after
    "tests/server/test_glm45_api.py",  # calls and thinking parsed as written
    "tests/server/test_minimax_m2_api.py",  # calls and thinking parsed as written
    "tests/server/test_harmony_tools_api.py",  # a steered model's harmony calls
    "tests/server/test_hybrid_serve.py",  # answers equal transformers'
    "tests/server/test_lifecycle.py",  # /ready 503 while loading; SIGTERM drains (10 s bound)
    "tests/server/test_parallel_flags.py",  # exit 2 before loading
    "tests/server/test_reasoning_api.py",  # replies split as the completions oracle's text
    "tests/server/test_reasoning_qwen3.py",  # replies split as the template renders them
    "tests/server/test_spm_server.py",  # ids and tokens equal transformers'
    # a dead rank ends the server within 20 s (its engine-process case always ran on the
    # workers); two nodes serve one rank's tokens and stop together: 20 s of the serial pass
    "tests/server/test_tensor_parallel_server.py",
    "tests/server/test_structured_outputs.py",  # every output validates
    "tests/server/test_tiktoken_server.py",  # ids and tokens equal the references
    "tests/server/test_base_model_serve.py",  # texts equal transformers'
    "tests/server/test_tool_markers_api.py",  # random weights held to harmony/DeepSeek calls
)


def _may_hold_serial_tests(path: Path, rootpath: Path) -> bool:
    """What `-m serial` collects: a test file outside SLOW_IN_PARALLEL that says `mark.slow`."""
    rel = path.relative_to(rootpath).as_posix()
    return not rel.startswith(SLOW_IN_PARALLEL) and b"mark.slow" in path.read_bytes()


def pytest_ignore_collect(collection_path: Path, config):
    """`make test`'s last pass (`-m serial`) imports only the files that may hold serial tests,
    not all ~300 (importing them took 17 s of a quiet 2-core Xeon's time)."""
    if (
        config.getoption("markexpr", "") == "serial"
        and collection_path.is_file()
        and collection_path.name.startswith("test_")
        and collection_path.suffix == ".py"
        and not _may_hold_serial_tests(collection_path, config.rootpath)
    ):
        return True
    return None


@pytest.hookimpl(tryfirst=True)  # before `-m` selects
def pytest_collection_modifyitems(config, items):
    serial = pytest.mark.serial
    checked: set[Path] = set()
    for item in items:
        if "slow" in item.keywords and not item.nodeid.startswith(SLOW_IN_PARALLEL):
            item.add_marker(serial)
            if item.path not in checked and not _may_hold_serial_tests(item.path, config.rootpath):
                raise pytest.UsageError(
                    f"{item.nodeid} is slow but its file never says `mark.slow`, so `-m serial` "
                    "would not collect it: mark it with pytest.mark.slow in its own file"
                )
            checked.add(item.path)
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


# Seconds each file's tests took in pass 1 of the last clean CI of main (2026-12-07, a40f95a2):
# the sum of its rows among `--durations=250`'s (a test of 5.5 s or more), scaled from that
# loaded run (pass 1 58:51, load 8-11) to a quiet one (16:13) by 1/3.63; files of 9 s or more.
# The estimate before (6 s per slow test) put test_forward_sync_free.py (17 slow tests, none of
# 5.5 s) and test_tp_hybrid.py (14, one) first and test_kernel_compile.py (one test: 26 s with a
# warm Triton cache, 55-136 s with CI's cold one) 23rd. Refresh from a full CI:
# `PAGODA_TEST_SECONDS=FILE make test` writes each file's seconds there (`_FileSeconds`).
FILE_SECONDS = {
    "tests/kernels/test_kernel_compile.py": 60,  # measured cold, quiet: 55 s (sm90_compile)
    "tests/runtime/test_correctness_hf.py": 55,  # ci2: 1,100-token long prompt, 54 -> 51.5 s CPU
    "tests/runtime/engine/test_invariance.py": 41,  # ci2: 5 tokens, 35 -> 30 s CPU
    "tests/runtime/quantization/test_fp8_engine.py": 37,  # ci2: 31 -> 28 s CPU
    "tests/kernels/test_prefill_attention.py": 39,
    "tests/server/test_tensor_parallel_server.py": 36,
    "tests/kernels/test_fused_moe.py": 31,
    "tests/runtime/distributed/test_tp_fp8.py": 25,
    "tests/runtime/engine/test_async_scheduling.py": 24,
    "tests/server/test_engine_process.py": 23,
    "tests/server/test_structured_outputs.py": 23,
    "tests/runtime/engine/test_warmup.py": 23,
    "tests/runtime/tune/test_tune_interpreter.py": 23,
    "tests/server/test_reliability.py": 22,
    "tests/runtime/test_triton_engine.py": 22,
    "tests/runtime/tune/test_tune_e2e.py": 20,
    "tests/benchmarks/test_gpu_imports.py": 18,
    "tests/runtime/engine/test_structured_engine.py": 18,
    "tests/runtime/cpu/test_cpu_attention.py": 17,
    "tests/docs/test_structured_outputs_doc.py": 17,
    "tests/runtime/model/test_gguf.py": 16,
    "tests/runtime/engine/test_core_client.py": 15,
    "tests/server/test_reasoning_qwen3.py": 15,
    "tests/kernels/test_sdpa_prefill.py": 15,
    "tests/docs/test_readme.py": 14,
    "tests/server/test_async_scheduling_server.py": 14,
    "tests/server/test_cli.py": 11,  # ci2: 3 processes not 8, 31.5 -> 25.5 s CPU
    "tests/benchmarks/test_offline_before_after.py": 13,
    "tests/server/test_glm45_api.py": 13,
    "tests/runtime/tune/test_moe_sweep.py": 13,
    "tests/server/test_lifecycle.py": 13,
    "tests/benchmarks/test_decode_ab.py": 13,
    "tests/benchmarks/test_kv_cache_dtype.py": 13,
    "tests/server/test_spm_server.py": 13,
    "tests/runtime/model/test_hybrid_fp8.py": 12,
    "tests/server/test_minimax_m2_api.py": 12,
    "tests/benchmarks/test_gpu_serving.py": 12,
    "tests/runtime/engine/test_stress.py": 12,
    "tests/runtime/attention/test_kv_int8.py": 12,
    "tests/runtime/model/test_gpt_oss.py": 12,
    "tests/runtime/structured/test_schema.py": 11,
    "tests/runtime/cpu/test_qgemm.py": 11,
    "tests/server/test_base_model_serve.py": 10,
    "tests/runtime/lora/test_lora_fp8.py": 9,
    "tests/benchmarks/test_autoscale_sim.py": 9,
    "tests/benchmarks/test_start_to_ready.py": 9,
}
# What a test outside those rows is taken to cost (none took 1.5 s quiet): a slow one ~1 s, as
# test_forward_sync_free's and test_tp_hybrid's; another 0.1 s, the mean of the ~6,900 others
# ((2 x 58:51 - the 250 rows' 4,688 s) / 3.63)
SLOW_TEST_S, TEST_S = 1.0, 0.1


class _LongFilesFirst:
    """On a pytest-xdist worker, the selected tests in file order for `--dist loadfile
    --no-loadscope-reorder`, which hands files out in that order: the longest files first (by
    FILE_SECONDS, else an estimate: SLOW_TEST_S per slow test, TEST_S per other test), each
    file's tests in their own order. The last files handed out are then short ones and neither
    worker waits long for the other at the end (xdist's own reorder counts tests only, which
    left files of one or two long tests last)."""

    @pytest.hookimpl(trylast=True)  # after `-m` deselects
    def pytest_collection_modifyitems(self, config, items):
        seconds: Counter = Counter()
        for item in items:
            seconds[item.path] += SLOW_TEST_S if "slow" in item.keywords else TEST_S
        for path in seconds:
            rel = path.relative_to(config.rootpath).as_posix()
            seconds[path] = max(seconds[path], FILE_SECONDS.get(rel, 0))
        items.sort(key=lambda item: -seconds[item.path])


class _FileSeconds:
    """`PAGODA_TEST_SECONDS=FILE`: each file's seconds (setup, call and teardown of its tests,
    as `--durations` counts them) added to the JSON object in FILE, on the xdist controller or
    a plain run, for FILE_SECONDS."""

    def __init__(self, out: str) -> None:
        self.out, self.seconds = Path(out), Counter()

    def pytest_runtest_logreport(self, report):
        self.seconds[report.nodeid.split("::", 1)[0]] += report.duration

    def pytest_sessionfinish(self, session):
        import json

        old = json.loads(self.out.read_text()) if self.out.is_file() else {}
        new = {**old, **{f: round(s, 1) for f, s in self.seconds.items()}}
        self.out.write_text(json.dumps(dict(sorted(new.items(), key=lambda x: -x[1])), indent=0))


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        config.pluginmanager.register(_LongFilesFirst(), "pagoda-long-files-first")
    elif os.environ.get("PAGODA_TEST_SECONDS"):
        config.pluginmanager.register(_FileSeconds(os.environ["PAGODA_TEST_SECONDS"]))


@pytest.fixture(autouse=True)
def _kernel_config_dirs_restored():
    """A test that applies a tuned profile (`server/tuned.py`, `pagoda tune`) sets the kernel
    launch configs' search directories for the process: put them back after it, so a later
    test on the same xdist worker does not read (or save into) that test's profile."""
    import sys

    kc = sys.modules.get("pagoda.kernels.config")
    before = kc.config_dirs() if kc is not None else ()
    yield
    kc = sys.modules.get("pagoda.kernels.config")
    if kc is not None and kc.config_dirs() != before:
        kc.set_config_dirs(before)


@pytest.fixture(autouse=True, scope="session")
def _children_forked_from_a_server():
    """Rank 1 of a two-rank engine and the engine process of `engine_process=True` forked from
    a server that imported the engine once, not spawned to import it again
    (tests/forkserver_testlib.py: 2.5-7 s less a two-rank case).
    PAGODA_TEST_SPAWN_RANKS=1 spawns them as `pagoda serve` does (to rule the server out)."""
    if os.environ.get("PAGODA_TEST_SPAWN_RANKS") == "1":
        yield None
        return
    from forkserver_testlib import ForkedContext
    from pagoda.runtime.engine import core_client, executor

    forked = ForkedContext()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(executor, "rank_context", lambda: forked)
        mp.setattr(core_client, "engine_context", lambda: forked)
        yield forked
