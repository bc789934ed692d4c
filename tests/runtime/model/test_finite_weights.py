"""A checkpoint whose weights hold NaN or Inf is refused at load, naming the first such tensor:
16-bit safetensors, a GGUF (its blocks dequantized on the device), an FP8 checkpoint (its E4M3
NaN codes and its scales), and `pagoda serve` (one line, exit 2, after the server listened: the
engine loads in its own process)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from pagoda.runtime import LLM
from pagoda.runtime.model.finite_check import FiniteCheck, NonFiniteWeights, non_finite
from safetensors.torch import load_file, save_file

pytest.importorskip("transformers")

BAD = "model.layers.1.mlp.down_proj.weight"
# a small KV pool: the CPU default (2 GiB) is 262,144 of the tiny model's blocks to build
SMALL = dict(device="cpu", dtype="float32", max_model_len=64, kv_cache_memory=1 << 20)


def _poison(directory, name: str, value: float) -> None:
    path = str(directory / "model.safetensors")
    tensors = load_file(path)
    t = tensors[name].clone()
    t.view(-1)[7] = value
    tensors[name] = t
    save_file(tensors, path)


def test_non_finite_flags_without_a_sync_per_tensor():
    check = FiniteCheck()
    check.add("a", torch.randn(4, 4))
    check.add("ids", torch.arange(3))  # not floating point: nothing to check
    check.check()  # all finite
    for bad in (float("nan"), float("inf"), float("-inf")):
        t = torch.randn(8, 8).bfloat16()
        t[3, 5] = bad
        assert bool(non_finite(t))
    codes = torch.zeros(4, dtype=torch.uint8)
    codes[2] = 0xFF  # E4M3FN's -NaN
    assert bool(non_finite(codes.view(torch.float8_e4m3fn)))
    assert not bool(non_finite(torch.full((4,), 448.0).to(torch.float8_e4m3fn)))
    check.add("ok", torch.ones(3))
    check.add("first", torch.tensor([1.0, float("nan")]))
    check.add("second", torch.tensor([float("inf")]))
    with pytest.raises(NonFiniteWeights, match=r"tensor first holds NaN or Inf .*1 more"):
        check.check()


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_safetensors_checkpoint_with_a_non_finite_weight_is_refused(tmp_path, value):
    from hf_oracle import make_tiny_llama

    make_tiny_llama(tmp_path)
    LLM(str(tmp_path), **SMALL)  # clean: loads
    _poison(tmp_path, BAD, value)
    with pytest.raises(ValueError, match=rf"checkpoint tensor {BAD} holds NaN or Inf"):
        LLM(str(tmp_path), **SMALL)
    # --no-check-weights: loaded as it is (the user's call, for the seconds it saves)
    LLM(str(tmp_path), **SMALL, check_weights=False)


def test_an_fp8_checkpoint_with_a_nan_scale_or_code_is_refused(tmp_path, monkeypatch):
    from fp8_testlib import write_fp8_pair

    _, q, _ = write_fp8_pair(tmp_path)
    LLM(str(q), **SMALL)  # clean: loads
    scale = "model.layers.0.self_attn.o_proj.weight_scale"
    tensors = load_file(str(q / "model.safetensors"))
    s = tensors[scale].clone()
    s.view(-1)[0] = float("nan")
    save_file({**tensors, scale: s}, str(q / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"{scale} (must be finite|holds NaN)"):  # fp8's own
        LLM(str(q), **SMALL)
    codes = tensors["model.layers.1.mlp.up_proj.weight"].clone()
    codes.view(torch.uint8).view(-1)[3] = 0x7F  # E4M3FN's NaN
    save_file({**tensors, "model.layers.1.mlp.up_proj.weight": codes},
              str(q / "model.safetensors"))  # fmt: skip
    with pytest.raises(ValueError, match=r"tensor model.layers.1.mlp.up_proj.weight holds NaN"):
        LLM(str(q), **SMALL)
    # where the FP8 GEMM does not run, the codes are dequantized at load and checked once, as
    # values (not also as codes: "1 more" tensor, itself)
    from pagoda.runtime.worker import model_build

    monkeypatch.setattr(model_build, "fp8_runs_on", lambda device: False)
    with pytest.raises(ValueError, match=r"up_proj.weight holds NaN or Inf values; the"):
        LLM(str(q), **SMALL)


@pytest.mark.slow
def test_serve_exits_2_with_one_line_naming_the_tensor(tmp_path):
    from hf_oracle import make_tiny_llama

    make_tiny_llama(tmp_path)
    _poison(tmp_path, BAD, float("nan"))
    log = tmp_path / "termination-log"
    env = {**os.environ, "PAGODA_TERMINATION_LOG": str(log)}
    argv = [sys.executable, "-P", "-m", "pagoda.runtime.cli", "serve", "--model", str(tmp_path),
            "--device", "cpu", "--dtype", "float32", "--port", "0", "--max-model-len", "64",
            "--log-level", "warning"]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("pagoda serve: error")]
    assert errors == [f"pagoda serve: error: checkpoint tensor {BAD} holds NaN or Inf values; "
                      "the checkpoint is broken (re-download or re-convert it)"]  # fmt: skip
    assert log.read_text().startswith(f"InvalidCheckpoint: checkpoint tensor {BAD} holds NaN")


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")  # gguf's Q8_0 of NaN
def test_a_gguf_whose_dequantized_weight_holds_nan_is_refused(tmp_path):
    pytest.importorskip("gguf")
    from hf_oracle import make_tiny_model
    from test_gguf_families import write_gguf

    make_tiny_model(tmp_path / "hf", "Llama", vocab_size=300, num_hidden_layers=1)
    _poison(tmp_path / "hf", "model.layers.0.mlp.down_proj.weight", float("nan"))
    write_gguf(tmp_path / "m.gguf", tmp_path / "hf", "llama")
    with pytest.raises(ValueError, match=r"tensor model.layers.0.mlp.down_proj.weight holds NaN"):
        LLM(str(tmp_path / "m.gguf"), dtype="float32", kv_cache_memory=8 << 20)


@pytest.mark.slow
def test_tune_exits_2_with_one_line_naming_the_tensor(tmp_path, capsys, monkeypatch):
    from hf_oracle import make_tiny_llama
    from pagoda.runtime.cli import main

    make_tiny_llama(tmp_path / "m")
    _poison(tmp_path / "m", BAD, float("inf"))
    monkeypatch.setenv("PAGODA_TERMINATION_LOG", str(tmp_path / "termination"))
    code = main(["tune", "--model", str(tmp_path / "m"), "--output", str(tmp_path / "profile"),
                 "--dtype", "float32", "--max-model-len", "64", "--kv-cache-memory", "4MiB",
                 "--quick", "--time-budget", "2m"])  # fmt: skip
    assert code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert errors == [f"pagoda tune: error: checkpoint tensor {BAD} holds NaN or Inf values; "
                      "the checkpoint is broken (re-download or re-convert it)"]  # fmt: skip
