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
    "tests/runtime/model/test_gguf.py",
    "tests/server/test_vision_chat.py",  # a LLaVA server's answers; nothing timed
    "tests/server/test_qwen2_vl_chat.py",  # a Qwen2-VL server's answers; nothing timed
    "tests/runtime/model/test_qwen2_vl.py",  # Qwen2-VL's oracle runs; nothing timed
    "tests/runtime/model/test_llava.py",  # two ranks over gloo; nothing timed
    "tests/runtime/model/test_glm_cohere.py",  # two ranks over gloo; nothing timed
    "tests/runtime/model/test_hybrid_ssm.py",  # two ranks over gloo; nothing timed
    "tests/runtime/model/test_hybrid_fp8.py",  # the interpreter's FP8 GEMM, two ranks; untimed
    "tests/runtime/model/test_glm4_moe.py",  # the interpreter, two ranks; untimed
    "tests/runtime/model/test_deepseek.py",  # the interpreter on the latent cache, two ranks
    "tests/runtime/model/test_dsa.py",  # two ranks over gloo; nothing timed
    "tests/runtime/model/test_dsv4_engine.py",  # two ranks over gloo; nothing timed
    "tests/runtime/model/test_finite_weights.py",  # exit 2 and its one line; untimed
    "tests/runtime/model/test_gemma3n.py",  # two ranks over gloo; nothing timed
    "tests/runtime/model/test_gemma4.py",  # two ranks over gloo; nothing timed
    "tests/runtime/model/test_mimo_v2_flash.py",  # two ranks over gloo; nothing timed
    "tests/runtime/model/test_longcat_flash.py",  # two ranks over gloo; nothing timed
    "tests/runtime/model/test_laguna.py",  # two ranks over gloo; nothing timed
    "tests/runtime/model/test_hy_v4.py",  # two ranks over gloo; nothing timed
    "tests/runtime/model/test_jamba.py",  # two ranks over gloo; nothing timed
    "tests/runtime/model/test_dense_archs.py",  # two ranks over gloo; nothing timed
    "tests/runtime/model/test_position_archs.py",  # two ranks over gloo; nothing timed
    "tests/runtime/model/test_qwen3_next.py",  # two ranks over gloo; nothing timed
    "tests/runtime/model/test_olmo_hybrid.py",  # two ranks over gloo; nothing timed
    "tests/runtime/model/test_kimi_linear.py",  # two ranks over gloo; nothing timed
    "tests/runtime/model/test_bailing_hybrid.py",  # two ranks over gloo; nothing timed
    "tests/runtime/model/test_glm5_next.py",  # two ranks over gloo; nothing timed
    "tests/runtime/model/test_minimax.py",  # two ranks over gloo; nothing timed
    "tests/runtime/model/test_forward_sync_free.py",  # Triton's interpreter, ops recorded
    "tests/runtime/model/test_gpt_oss.py",  # Triton's interpreter in the engine
    "tests/runtime/model/test_llama4.py",  # Triton's interpreter in the engine, two ranks
    "tests/runtime/model/test_moe_families.py",  # two ranks over gloo; nothing timed
    "tests/runtime/model/test_more_archs.py",  # two ranks over gloo; nothing timed
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


# Seconds the tests not marked slow took in a quiet 2-core CI (2026-12-06's --durations), for
# the files where one took 9 s or more: counted by tests alone these files were handed out last
# (test_kernel_compile.py's one 26 s test 276th of 285 files, test_tensor_parallel_server.py's
# 12 s one last), so one worker could still run one while the other had finished.
LONG_UNMARKED_S = {
    "tests/server/test_structured_outputs.py": 40,
    "tests/kernels/test_kernel_compile.py": 26,
    "tests/runtime/distributed/test_tp_fp8.py": 25,
    "tests/server/test_engine_process.py": 14,
    "tests/server/test_reliability.py": 14,
    "tests/server/test_tensor_parallel_server.py": 12,
    "tests/operator/test_operator_faults.py": 11,
    "tests/runtime/quantization/test_fp8_engine.py": 11,
    "tests/runtime/lora/test_lora_fp8.py": 12,  # 2026-12-07, on a busy 2-core machine (its setup)
    "tests/runtime/distributed/test_group.py": 11,
    "tests/benchmarks/test_gpu_serving.py": 10,
    "tests/runtime/engine/test_structured_engine.py": 9,
}
SLOW_TEST_S, TEST_S = 6.0, 0.2  # what a file's other tests are taken to cost


class _LongFilesFirst:
    """On a pytest-xdist worker, the selected tests in file order for `--dist loadfile
    --no-loadscope-reorder`, which hands files out in that order: the longest files first (by
    an estimate: SLOW_TEST_S per slow test, TEST_S per other test, plus LONG_UNMARKED_S), each
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
            seconds[path] += LONG_UNMARKED_S.get(rel, 0)
        items.sort(key=lambda item: -seconds[item.path])


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        config.pluginmanager.register(_LongFilesFirst(), "pagoda-long-files-first")


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
