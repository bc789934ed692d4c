"""`pagoda serve` flags: one source (`pagoda.runtime.options`), a parser importable without torch,
readable help, and clean one-line errors before the HTTP server starts."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pagoda.runtime import options
from pagoda.runtime.server.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
BLOCKER = textwrap.dedent(
    """
    import importlib.abc, sys
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)")
    sys.meta_path.insert(0, Block())
    """
)


def python(code: str, blocked: set[str] = frozenset(), timeout: float = 120):
    script = f"BLOCKED = {sorted(blocked)!r}\n{BLOCKER}\n{textwrap.dedent(code)}"
    return subprocess.run(
        [sys.executable, "-P", "-c", script], capture_output=True, text=True, timeout=timeout,
        cwd=ROOT,
    )  # fmt: skip


def pagoda(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-P", "-m", "pagoda.runtime.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_parser_and_options_import_without_torch_or_web_stack() -> None:
    result = python(
        """
        from pagoda.runtime import options
        from pagoda.runtime.server.cli import build_parser
        args = build_parser().parse_args(options.render_args({"max_num_seqs": 8}))
        assert args.max_num_seqs == 8
        heavy = [m for m in ("torch", "numpy", "uvicorn", "fastapi") if m in sys.modules]
        assert not heavy, heavy
        """,
        blocked={"torch", "numpy", "triton", "transformers", "gguf", "uvicorn", "fastapi"},
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_every_option_is_a_flag_with_its_default() -> None:
    parser = build_parser()
    defaults = vars(parser.parse_args([]))
    assert set(defaults) == set(options.SERVE_FLAGS)
    for dest, f in options.SERVE_FLAGS.items():
        assert defaults[dest] == f.default, dest
    assert defaults["port"] == options.DEFAULT_PORT and defaults["model"] == options.DEFAULT_MODEL


def test_model_positional_as_vllm_serve() -> None:
    parser = build_parser()
    assert parser.parse_args(["/m"]).model == "/m"  # `vllm serve MODEL`
    assert parser.parse_args(["--port", "9", "/m"]).model == "/m"
    assert parser.parse_args(["/m", "--model", "/m"]).model == "/m"  # both, the same: fine
    assert "model_positional" not in vars(parser.parse_args(["/m"]))
    with pytest.raises(SystemExit) as err:
        parser.parse_args(["/a", "--model", "/b"])
    assert err.value.code == 2


@pytest.mark.parametrize(
    "values",
    [
        {"dtype": "bfloat16", "block_size": 32, "enable_prefix_caching": False},
        {"enable_chunked_prefill": False, "max_num_batched_tokens": 8192, "max_model_len": 4096},
        {"served_model_name": ["a", "b"], "port": 9000, "host": "0.0.0.0", "seed": 3},
        {"attention_backend": "triton", "kv_cache_memory": "2G", "enable_debug_endpoints": True},
        {"max_queue_len": 7, "drain_timeout": 5.0, "max_request_bytes": 1 << 20},
        {"long_prefill_token_threshold": 256},
    ],
)
def test_rendered_args_parse_back(values: dict) -> None:
    """What the operator renders with `render_args` is what the real parser reads."""
    args = build_parser().parse_args(options.render_args(values))
    for dest, value in values.items():
        assert getattr(args, dest) == value


def test_choices_come_from_options() -> None:
    parser = build_parser()
    for dest in ("dtype", "attention_backend", "block_size", "log_level"):
        action = next(a for a in parser._actions if a.dest == dest)
        assert tuple(action.choices) == tuple(options.flag(dest).choices)
    with pytest.raises(SystemExit):
        parser.parse_args(["--block-size", "24"])


def test_help_shows_defaults_and_hides_test_flags() -> None:
    result = pagoda("serve", "--help", timeout=60)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    for f in options.SERVE_FLAGS.values():
        if f.hidden:
            assert f.name not in text
            continue
        assert f.name in text
        assert " ".join(f.help.replace("%%", "%").split()) in text, f.name
        if f.default is not None and f.kind != "switch":
            assert f"{f.name}" in text and f"(default: {f.default})" in text, f.name
    assert "tests only" not in text


def test_version() -> None:
    result = pagoda("--version", timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("pagoda 0."), result


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["nosuch"], "model 'nosuch' is neither"),  # positional, as `vllm serve MODEL`
        (["--max-num-seqs", "1e9"], "invalid int value: '1e9'"),  # argparse's, on one line
        (["--kv-cache-memory", "100T"], "--kv-cache-memory 100.0 TiB is more than the"),
    ],
)
def test_bad_flags_exit_with_one_line_before_binding(args: list[str], needle: str) -> None:
    """Each way out before binding, as a process (one case of each: the parser's errors and
    preflight's messages are checked in this process below): argparse's errors, a model that
    is not there, a size that preflight refuses. A process costs ~2 s of CPU, ~5 s where
    preflight runs (the engine process imports torch)."""
    result = pagoda("serve", "--port", "0", *args)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pagoda serve: error:"), result.stderr
    assert needle in lines[0]
    assert "Traceback" not in result.stderr and "Uvicorn" not in result.stderr + result.stdout
    assert "listening on" not in result.stderr + result.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["/a", "--model", "/b"], "the model is given twice: '/a' and --model '/b'"),
        (["--kv-cache-memory", "lots"], "kv_cache_memory"),
        (["--port", "70000"], "port"),
        (["--max-num-seqs", "1e9"], "invalid int value: '1e9'"),
        (["--reasoning-parser", "granite"], "--reasoning-parser: invalid choice: 'granite'"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2_before_preflight(args, needle, capsys, monkeypatch):
    """The parser's ways out and the flags' own checks, as `run` meets them before preflight
    (the process test above runs argparse's; each flag's line is checked here)."""
    from pagoda.runtime.server.cli import fail, server_config

    monkeypatch.setenv("PAGODA_TERMINATION_LOG", "")
    with pytest.raises(SystemExit) as exit_:
        parsed = build_parser().parse_args(["--port", "0", *args])
        try:  # `run`'s first checks and its handler
            server_config(parsed), options.engine_kwargs(vars(parsed))
        except ValueError as e:
            fail(e)
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pagoda serve: error:"), lines
    assert needle in lines[0]


def engine_config(*argv: str, profile: str | None = None):
    from pagoda.runtime.server.cli import server_config
    from pagoda.runtime.server.launch import preflight

    args = build_parser().parse_args(argv)
    return preflight(server_config(args), options.engine_kwargs(vars(args)), profile)[0]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (("--max-model-len", "1000000000"),
         "max_model_len 1000000000 is more than the model's context length (8192 tokens"),
        (("--max-model-len", "16384"), "more than the model's context length"),
        # a prompt token and one generated: 1 passed, then warm-up's prompt killed the engine
        (("--max-model-len", "1"), "max_model_len must be an integer in 2..16777216, got 1"),
        # more context than the KV cache holds: was served capped to 32 tokens, with a warning
        (("--max-model-len", "8192", "--kv-cache-memory", "1MiB"),
         "--max-model-len 8192 does not fit in the KV cache: 1.0 MiB holds 32 tokens"),
        # a GPU this machine lacks: was torch's "AssertionError: Torch not compiled with CUDA"
        (("--device", "cuda:63"), "--device cuda:63: this machine has "),
        (("--max-num-seqs", "1000000000"), "max_num_seqs must be an integer in 1..16384"),
        (("--max-num-batched-tokens", "100000000000"),
         "max_num_batched_tokens must be an integer in 1..2097152"),
        (("--max-num-batched-tokens", "1000000"),
         "more than one step can ever schedule (max_num_seqs 64 × max_model_len 8192"),
        (("--kv-cache-memory", "1KiB"), "holds fewer than 2 blocks"),
        (("--long-prefill-token-threshold", "-1"),
         "long_prefill_token_threshold must be an integer in 0..2097152, got -1"),
        (("--no-enable-chunked-prefill", "--long-prefill-token-threshold", "256"),
         "long_prefill_token_threshold (256) needs chunked prefill"),
        (("--kv-cache-memory", "100T"), "lower --kv-cache-memory"),
        (("--model", "nosuch"), "model 'nosuch' is neither"),  # the process test: positional
        (("--no-enable-chunked-prefill", "--max-num-batched-tokens", "256"),
         "without chunked prefill, max_num_batched_tokens (256) must be >= max_model_len (8192)"),
        (("--max-num-seqs", "0"), "max_num_seqs must be an integer in 1..16384, got 0"),
        (("--speculative-config", '{"method": "eagle", "num_speculative_tokens": 2}'),
         "speculative_config: method 'eagle' is not supported"),
        (("--pooler-config", '{"pooling_type": "MEAN"}'),
         "pooler_config applies to the pooling runner only"),  # (auto: SmolLM2 generates)
        (("--runner", "pooling", "--pooler-config", '{"pooling_type": "MAX"}'),
         "pooler_config: pooling_type must be one of LAST, MEAN, CLS, got 'MAX'"),
        (("--runner", "pooling", "--speculative-config", '{"num_speculative_tokens": 2}'),
         "speculative decoding is not supported with the pooling runner"),
        (("--mm-processor-kwargs", '{"max_pixels": 4096}'),
         "--mm-processor-kwargs: this model reads no images"),  # (SmolLM2: text only)
        (("--mm-processor-kwargs", "[4096]"), "mm_processor_kwargs must be a JSON object"),
        (("--media-io-kwargs", '{"video": {"num_frames": 0}}'),
         "media_io_kwargs' video num_frames must be an integer >= 1 or -1, got 0"),
        (("--media-io-kwargs", '{"image": {}}'), "media_io_kwargs takes {'video'"),
        (("--limit-mm-per-prompt", '{"audio": 1}'), "images and videos are the modalities"),
        (("--limit-mm-per-prompt", '{"video": -1}'),
         "limit_mm_per_prompt's video count must be an integer >= 0, got -1"),
    ],
)  # fmt: skip
def test_impossible_sizes_are_refused_before_loading(argv, needle) -> None:
    with pytest.raises(ValueError) as err:
        engine_config(*argv)
    assert needle in str(err.value), err.value


def test_speculative_decoding_is_served_with_async_scheduling() -> None:
    cfg = engine_config("--speculative-config", '{"num_speculative_tokens": 2}',
                        "--async-scheduling")  # fmt: skip
    assert cfg.speculative_config is not None and cfg.uses_async_scheduling()


def test_a_checkpoint_directory_without_weights_or_tokenizer_is_refused_before_loading(
    tmp_path,
) -> None:
    """config.json alone passes the metadata checks; `pagoda serve` must still refuse a
    directory without its weights or a readable tokenizer with one line before binding, not die in the
    engine's load after `listening on` (exit 1, a traceback)."""
    from hf_oracle import make_tiny_llama

    make_tiny_llama(tmp_path)
    argv = ("--model", str(tmp_path), "--device", "cpu", "--dtype", "float32")
    assert engine_config(*argv).model == str(tmp_path)  # complete: accepted
    tokenizer = tmp_path / "tokenizer.json"
    text = tokenizer.read_text()
    for broken in (text[: len(text) // 2], "version https://git-lfs.github.com/spec/v1\n", ""):
        tokenizer.write_text(broken)  # truncated, a Git LFS pointer, empty
        with pytest.raises(ValueError) as err:
            engine_config(*argv)
        assert str(err.value) == (
            f"model {str(tmp_path)!r}: {tokenizer} is not a JSON object (truncated, or a Git "
            "LFS pointer?)"
        )
    tokenizer.unlink()
    with pytest.raises(ValueError) as err:
        engine_config(*argv)
    assert str(err.value) == (
        f"model {str(tmp_path)!r}: {tmp_path} has no tokenizer.json (nor tiktoken.model, "
        "vocab.json with merges.txt, or tokenizer.model)"
    )
    (tmp_path / "vocab.json").write_text("version https://git-lfs.github.com/spec/v1\n")
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")  # GPT-2's files (OPT's), a pointer
    with pytest.raises(ValueError, match=r"vocab.json is not a JSON object \(truncated, or a Git"):
        engine_config(*argv)
    (tmp_path / "vocab.json").unlink()
    (tmp_path / "merges.txt").unlink()
    (tmp_path / "tiktoken.model").write_text("version https://git-lfs.github.com/spec/v1\n")
    with pytest.raises(ValueError, match=r"tiktoken.model is not a tiktoken file"):
        engine_config(*argv)
    (tmp_path / "tiktoken.model").write_text("IQ== 0\n")  # tiktoken ranks, unknown code
    (tmp_path / "tokenizer_config.json").write_text('{"auto_map": {"AutoTokenizer": ["x.T"]}}')
    with pytest.raises(ValueError, match=r"tokenizer code \(x\) is not one whose split regex"):
        engine_config(*argv)
    (tmp_path / "tiktoken.model").unlink()
    (tmp_path / "tokenizer.model").write_text("version https://git-lfs.github.com/spec/v1\n")
    with pytest.raises(ValueError, match=r"tokenizer.model is not a SentencePiece model"):
        engine_config(*argv)
    (tmp_path / "tokenizer.model").write_bytes(b"\x0a\x05<unk>")  # a model's first bytes
    with pytest.raises(ValueError, match=r"tokenizer code \(x.py\) is not one reproduced here"):
        engine_config(*argv)
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "LlamaTokenizer"}')
    assert engine_config(*argv).model == str(tmp_path)  # read at load
    (tmp_path / "tokenizer.model").unlink()
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ValueError) as err:
        engine_config(*argv)
    assert str(err.value) == (
        f"model {str(tmp_path)!r}: {tmp_path} has no *.safetensors files (nor pytorch_model.bin)"
    )


@pytest.mark.slow
def test_memory_check_names_what_to_lower(monkeypatch) -> None:
    from pagoda.runtime.server import memory, weights

    monkeypatch.setattr(memory, "host_available", lambda: (600 << 20, "MemAvailable"))
    with pytest.raises(ValueError, match=r"600\.0 MiB is on this machine .*lower --kv-cache"):
        engine_config("--kv-cache-memory", "512MiB")
    monkeypatch.setattr(memory, "host_available", lambda: (100 << 20, "MemAvailable"))
    monkeypatch.setattr(weights, "estimate", lambda *a, **k: weights.Weights(1 << 20, "(test)"))
    f32 = ("--dtype", "float32", "--kv-cache-memory", "16MiB")
    with pytest.raises(ValueError, match=r"block tables .*lower --max-num-seqs or --max-model-len"):
        engine_config(*f32, "--max-num-seqs", "16384")
    cfg = engine_config(*f32, "--max-num-seqs", "256")
    assert cfg.scheduler.max_num_seqs == 256  # what fits is left alone


@pytest.mark.parametrize(
    ("scheduler", "needle"),
    [
        ({"max_num_seqs": 1_000_000_000}, "scheduler.max_num_seqs must be an integer in 1..16384"),
        ({"max_num_seqs": True}, "scheduler.max_num_seqs must be an integer in 1..16384, got True"),
        ({"max_num_batched_tokens": 1e9}, "got 1000000000.0"),
    ],
)
def test_a_profiles_sizes_are_checked_like_flags(tmp_path, scheduler, needle) -> None:
    from pagoda.kernels import config as kc
    from pagoda.runtime.tuned_profile import ProfileError
    from profile_testlib import make_profile

    make_profile(tmp_path, scheduler=scheduler)
    try:
        with pytest.raises(ProfileError) as err:
            engine_config("--dtype", "float32", "--device", "cpu", profile=str(tmp_path))
    finally:
        kc.set_config_dirs(())
    assert "profile.json" in str(err.value) and needle in str(err.value), err.value


def test_a_profile_within_bounds_but_too_big_for_this_machine_names_the_profile(
    tmp_path, monkeypatch
) -> None:
    from pagoda.kernels import config as kc
    from pagoda.runtime.server import memory, weights
    from profile_testlib import make_profile

    monkeypatch.setattr(memory, "host_available", lambda: (100 << 20, "MemAvailable"))
    monkeypatch.setattr(weights, "estimate", lambda *a, **k: weights.Weights(1 << 20, "(test)"))
    make_profile(tmp_path, scheduler={"max_num_seqs": 16384, "max_num_batched_tokens": 16384})
    try:
        with pytest.raises(ValueError, match=r"tuned profile .* sets max_num_batched_tokens 16384"):
            engine_config("--dtype", "float32", "--device", "cpu", "--kv-cache-memory", "16MiB",
                          profile=str(tmp_path))  # fmt: skip
    finally:
        kc.set_config_dirs(())


def test_a_port_in_use_or_a_foreign_host_fails_at_once_with_one_line() -> None:
    import socket
    import time

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for args, needle in (
            (["--port", str(port)], f"port {port} is already in use on 127.0.0.1:{port}"),
            (["--host", "192.0.2.1"], "host '192.0.2.1' is not an address of this machine"),
            (["--host", "no-such-host.invalid"], "is not an address or a name"),
        ):
            t0 = time.monotonic()
            result = pagoda("serve", "--port", "0", *args)
            took = time.monotonic() - t0
            assert result.returncode == 2, result
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1 and needle in lines[0], result.stderr
            assert not result.stdout
            print(f"{args}: exit 2 after {took:.2f} s")


@pytest.mark.slow
def test_without_chunked_prefill_the_default_budget_fits_the_context() -> None:
    sched = engine_config("--no-enable-chunked-prefill").scheduler
    assert sched.max_model_len == 8192  # the model's, resolved once before the engine starts
    assert sched.max_num_batched_tokens == 8192
    chunked = engine_config("--max-model-len", "8192")
    assert chunked.scheduler.max_num_batched_tokens == options.DEFAULT_MAX_NUM_BATCHED_TOKENS


def test_a_default_context_is_shortened_to_a_small_kv_cache_not_refused() -> None:
    cfg = engine_config("--kv-cache-memory", "1MiB")  # the engine caps 8192 to 32 tokens
    assert cfg.scheduler.max_model_len == 8192 and cfg.cache.kv_cache_memory == 1 << 20
    assert engine_config("--max-model-len", "32", "--kv-cache-memory", "1MiB")


def test_long_prefill_threshold_reaches_the_engine_config() -> None:
    assert (
        engine_config("--long-prefill-token-threshold", "64").scheduler.long_prefill_token_threshold
        == 64
    )
    default = engine_config().with_device_defaults().scheduler  # this machine: a CPU
    assert default.long_prefill_token_threshold == options.CPU_LONG_PREFILL_TOKEN_THRESHOLD
