"""FP8 inside the engine: the loader's three paths and the FP8 KV cache, on a tiny Llama.

* An FP8 checkpoint written by hand (safetensors, ``quantization_config`` quant_method fp8,
  per-channel or per-tensor scales) loads where the FP8 kernels do not run (a CPU) by
  dequantizing at load: the same greedy tokens as the 16-bit checkpoint of its dequantized
  weights, bit for bit (float32).
* Where the FP8 kernels run (CUDA with FP8; here Triton's interpreter), the same checkpoint runs
  its projections in the FP8 GEMM, and ``--quantization fp8`` on the 16-bit original quantizes
  the same codes at load: both give the same tokens, and their logits are within FP8's error
  of the unquantized original in the same dtype (`fp8_testlib.assert_quantization_error`: the
  quantization's error alone, not float32 against another dtype).
* ``kv_cache_dtype="fp8"``: E4M3 K/V (scale 1.0 or the checkpoint's k_scale/v_scale) through
  the Triton kernels: 4x the blocks of a float32 cache in the same memory, logits within FP8's
  error of the float32 cache's.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import pytest
import torch
from fp8_testlib import PROMPTS, assert_quantization_error, greedy, write_fp8_pair
from hf_oracle import make_tiny_llama
from pagoda.runtime import LLM, SamplingParams, options
from pagoda.runtime.model.loader import load_model
from safetensors.torch import load_file, save_file

INTERPRET = os.environ["TRITON_INTERPRET"] == "1"
ENGINE = dict(dtype="float32", max_num_batched_tokens=16, max_num_seqs=4)


@pytest.fixture
def no_fp8_kernels(monkeypatch):
    """This process as a CPU without the interpreter: the FP8 kernels do not run here."""
    from pagoda.runtime import config
    from pagoda.runtime.worker import model_build

    monkeypatch.setattr(config, "fp8_runs_on", lambda device: False)
    monkeypatch.setattr(model_build, "fp8_runs_on", lambda device: False)


@pytest.mark.parametrize("per_tensor", [False, True], ids=["per-channel", "per-tensor"])
def test_fp8_checkpoint_dequantized_on_a_cpu_matches_its_dense_twin(
    tmp_path, no_fp8_kernels, per_tensor
):
    _, q, deq = write_fp8_pair(tmp_path, per_tensor)
    fp8_llm = LLM(loaded=load_model(str(q)), kv_cache_memory=4 << 20, **ENGINE)
    assert fp8_llm.engine.runner.model.layers[0].qkv.__class__.__name__ == "Linear"
    dense = LLM(loaded=load_model(str(deq)), kv_cache_memory=4 << 20, **ENGINE)
    assert greedy(fp8_llm) == greedy(dense)


def test_quantization_fp8_is_refused_where_fp8_cannot_run(tmp_path, no_fp8_kernels):
    from pagoda.runtime.config import EngineConfig

    for kwargs in ({"quantization": "fp8"}, {"kv_cache_dtype": "fp8"}):
        with pytest.raises(ValueError, match=r"needs a GPU with FP8 tensor cores.*this is a CPU"):
            EngineConfig.create(str(tmp_path), device="cpu", **kwargs)


def test_unsupported_checkpoint_quantization_fails_with_the_metadata(tmp_path):
    from pagoda.runtime.model.loader import read_model_config

    make_tiny_llama(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="checkpoint quantization 'gptq' is not supported"):
        read_model_config(str(tmp_path))


interpreted = pytest.mark.skipif(
    not INTERPRET, reason="the CPU run of the FP8 kernels needs TRITON_INTERPRET=1"
)


@interpreted
def test_fp8_gemm_serves_the_checkpoint_and_online_quantization_alike(tmp_path):
    """Serialized FP8 and ``quantization="fp8"`` on its 16-bit original give the same E4M3
    codes and scales, hence the same tokens, through the FP8 GEMM; close to the unquantized
    model and to the dense twin."""
    from pagoda.runtime.model.fp8_linear import Fp8Linear

    orig, q, deq = write_fp8_pair(tmp_path)
    args = dict(attention_backend="triton", kv_cache_memory=2 << 20, **ENGINE)
    served = LLM(loaded=load_model(str(q)), **args)
    online = LLM(loaded=load_model(str(orig)), quantization="fp8", **args)
    layers = [served.engine.runner.model.layers[0], online.engine.runner.model.layers[0]]
    for a in ("qkv", "o_proj"):
        x, y = (getattr(layer, a) for layer in layers)
        assert isinstance(x, Fp8Linear) and isinstance(y, Fp8Linear)
        assert torch.equal(x.weight.view(torch.uint8), y.weight.view(torch.uint8))
        assert torch.equal(x.weight_scale, y.weight_scale)
    assert type(served.engine.runner.model.lm_head).__name__ == "Linear"  # the head stays 16-bit
    ours, theirs = [], []
    assert greedy(served, 3, first=ours) == greedy(online, 3)
    # against the unquantized original in the same dtype (float32, no FP8 anywhere): the whole
    # quantization error, weights' included, which the twin below cannot see (a weight scale
    # that clips is in the twin too)
    original = []
    greedy(LLM(loaded=load_model(str(orig)), kv_cache_memory=2 << 20, **ENGINE), 1,
           first=original)  # fmt: skip
    assert_quantization_error(ours, original)
    # against the dense twin (the same E4M3 weights dequantized: the activations' FP8 error
    # alone): the prompts' logits within FP8's error, and the same pick wherever the dense
    # model's top two are further apart than that
    dense = LLM(loaded=load_model(str(deq)), kv_cache_memory=2 << 20, **ENGINE)
    greedy(dense, 1, first=theirs)
    assert_close_picks(ours, theirs)


def assert_close_picks(ours: list, theirs: list) -> None:
    """Logits within FP8's error of the reference's, and the same pick wherever the
    reference's top two are further apart than that error."""
    ours, theirs = torch.stack(ours), torch.stack(theirs)
    err = (ours - theirs).abs().max()
    assert 0 < err < 0.1 * theirs.abs().max()
    top2 = theirs.topk(2, dim=-1).values
    clear = top2[:, 0] - top2[:, 1] > 2 * err
    assert clear.any() and (ours.argmax(-1) == theirs.argmax(-1))[clear].all()


@interpreted
def test_fp8_kv_cache_holds_more_tokens_and_keeps_the_tokens(tmp_path):
    make_tiny_llama(tmp_path)
    loaded = load_model(str(tmp_path))
    args = dict(attention_backend="triton", kv_cache_memory=1 << 20, **ENGINE)
    plain = LLM(loaded=loaded, **args)
    small = LLM(loaded=loaded, kv_cache_dtype="fp8", **args)
    k_cache, _ = small.engine.runner.kv_caches[0]
    assert k_cache.dtype == torch.float8_e4m3fn
    assert small.engine.runner.num_blocks == 4 * plain.engine.runner.num_blocks
    ours, theirs = [], []
    greedy(small, 1, first=ours)
    greedy(plain, 1, first=theirs)
    assert_close_picks(ours, theirs)


@interpreted
def test_fp8_kv_cache_reads_the_checkpoints_kv_scales(tmp_path):
    """vLLM's ``self_attn.k_scale``/``v_scale`` tensors become the layer's cache scales."""
    make_tiny_llama(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    for i in range(2):
        tensors[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor(0.05 * (i + 1))
        tensors[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor([0.02, 0.03])
    save_file(tensors, str(tmp_path / "model.safetensors"))
    llm = LLM(loaded=load_model(str(tmp_path)), attention_backend="triton", kv_cache_dtype="fp8",
              kv_cache_memory=1 << 20, **ENGINE)  # fmt: skip
    k_scale, v_scale = llm.engine.runner.model.layers[1].kv_scales
    assert k_scale.tolist() == pytest.approx([0.1, 0.1])  # per tensor, with per-head V's
    assert v_scale.tolist() == pytest.approx([0.02, 0.03])
    assert len(greedy(llm, 2)[0]) == 2  # a prefill, then a decode reading the scaled cache


@pytest.mark.gpu
def test_gpu_fp8_greedy_tokens_invariant_to_batch_chunking_and_cache(tmp_path):
    """FP8 weights and KV on a GPU with FP8: a prompt's greedy tokens are the same alone, in a
    batch, chunked or whole, with its prefix cached or not (compiled kernels, CUDA graphs)."""
    from pagoda.kernels.fp8 import fp8_supported
    from pagoda.runtime.model.fp8_linear import Fp8Linear

    if not torch.cuda.is_available() or INTERPRET or not fp8_supported("cuda"):
        pytest.skip("needs a CUDA GPU with FP8 and compiled Triton kernels (TRITON_INTERPRET=0)")
    make_tiny_llama(tmp_path, hidden_size=576, intermediate_size=1536, num_hidden_layers=8,
                    num_attention_heads=9, num_key_value_heads=3, vocab_size=8192,
                    max_position_embeddings=2048)  # fmt: skip
    loaded = load_model(str(tmp_path))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 8192, (n,), generator=g).tolist() for n in (1, 16, 33, 300, 900)]
    common = dict(quantization="fp8", kv_cache_dtype="fp8", kv_cache_memory=1 << 30,
                  max_model_len=2048, max_num_seqs=8)  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)

    def run(llm, batch):
        outs = llm.generate([{"prompt_token_ids": p} for p in batch], params)
        return [o.outputs[0].token_ids for o in outs]

    chunked = LLM(loaded=loaded, max_num_batched_tokens=64, **common)
    assert isinstance(chunked.engine.runner.model.layers[0].qkv, Fp8Linear)
    batched = run(chunked, prompts)
    alone = [run(chunked, [p])[0] for p in prompts]  # prefixes now cached
    whole = run(LLM(loaded=loaded, max_num_batched_tokens=2048, **common), prompts[::-1])[::-1]
    assert batched == alone == whole


@interpreted
def test_warm_up_launches_the_fp8_cache_variants(monkeypatch):
    """Warm-up's scratch cache has the engine cache's dtype and scale size, so the KV_FP8
    variants (and the scales' stride specialisation) compile before /ready."""
    import pagoda.kernels as kernels
    from pagoda.runtime.engine import warmup

    geo = warmup.Geometry(4, 2, 16, 16, torch.float32, torch.device("cpu"), torch.float8_e4m3fn, 2)
    seen, real = [], kernels.paged_attention

    def recorded(**kw):
        seen.append((kw["k_cache"].dtype, tuple(kw["k_scale"].shape)))
        return real(**kw)

    monkeypatch.setattr(kernels, "paged_attention", recorded)
    assert warmup.run_kernel_case(geo, 2, 16, 5) == len(seen) > 0
    assert set(seen) == {(torch.float8_e4m3fn, (2,))}


def test_pagoda_serve_refuses_fp8_on_a_cpu_in_one_line(
    tmp_path, monkeypatch, capsys, no_fp8_kernels
):
    """Without the interpreter a CPU runs no FP8 kernel: `pagoda serve`'s preflight refuses it
    before loading, one line and the termination message, through `run`'s handler (a process
    exiting 2 on a preflight refusal: test_cli.py's `--kv-cache-memory 100T`, test_fit.py)."""
    from pagoda.runtime.server.cli import build_parser, fail, server_config
    from pagoda.runtime.server.launch import preflight

    monkeypatch.setenv("PAGODA_TERMINATION_LOG", str(tmp_path / "t"))
    args = build_parser().parse_args(["--device", "cpu", "--port", "0", "--quantization", "fp8",
                                      "--kv-cache-dtype", "fp8"])  # fmt: skip
    with pytest.raises(SystemExit) as exit_:
        try:
            preflight(server_config(args), options.engine_kwargs(vars(args)))
        except ValueError as e:
            fail(e)
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("pagoda serve: error: quantization 'fp8' and kv_cache_dtype 'fp8' "
                               "need a GPU with FP8 tensor cores")  # fmt: skip
    assert "this is a CPU" in lines[0]
    assert (tmp_path / "t").read_text().startswith("InvalidConfiguration: ")


@interpreted
def test_quantization_fp8_on_a_gguf_is_refused_in_one_line():
    """Where FP8 runs, `--quantization fp8` on a GGUF (its own Q4/Q8 blocks) was quantized again
    from the dequantized values; refused before loading, as vLLM does, in `pagoda serve`'s
    preflight and in the engine (`LLM(...)`)."""
    from pagoda.runtime.model.loader import builtin_model_path
    from pagoda.runtime.quantization.fp8 import check_checkpoint_form
    from pagoda.runtime.server.cli import build_parser, server_config
    from pagoda.runtime.server.launch import preflight

    gguf = str(builtin_model_path("smollm2-135m"))
    args = build_parser().parse_args(["--model", gguf, "--device", "cpu", "--quantization", "fp8"])
    with pytest.raises(ValueError, match=r"is a GGUF file .*serve it without --quantization$"):
        preflight(server_config(args), options.engine_kwargs(vars(args)))
    check_checkpoint_form("fp8", "/m/model")  # a directory: quantized online
    check_checkpoint_form(None, gguf)


@pytest.mark.slow  # ~1.5 min on 2 busy cores: every FP8 GEMM in Triton's interpreter
@interpreted
def test_fp8_greedy_tokens_do_not_depend_on_batch_or_chunking(tmp_path):
    """FP8 weights and KV through the invariant kernels: each prompt's tokens alone (whole
    prefill) equal its tokens in a chunked batch (the GPU check repeats this compiled)."""
    make_tiny_llama(tmp_path)
    loaded = load_model(str(tmp_path))
    args = dict(attention_backend="triton", quantization="fp8", kv_cache_dtype="fp8",
                kv_cache_memory=1 << 20, dtype="float32", max_num_seqs=4)  # fmt: skip
    prompts, params = PROMPTS[::2], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)

    def run(llm, batch):
        return [o.outputs[0].token_ids for o in llm.generate(
            [{"prompt_token_ids": p} for p in batch], params)]  # fmt: skip

    chunked = run(LLM(loaded=loaded, max_num_batched_tokens=8, **args), prompts)
    whole = LLM(loaded=loaded, max_num_batched_tokens=32, **args)
    assert chunked == [run(whole, [p])[0] for p in prompts]
