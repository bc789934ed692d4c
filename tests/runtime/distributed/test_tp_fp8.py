"""FP8 with tensor parallelism (`model/parallel_linear.py`, `quantization.fp8.shard`).

* Sharding, in-process: each rank's FP8 codes and scales are exactly that rank's slice of the
  layer one rank builds (column-parallel: rows with their per-channel scales; row-parallel: input
  columns under the whole rows' scales), for ``--quantization fp8`` and for FP8 checkpoints with
  per-channel, per-tensor and static-activation scales; the ranks' partial products sum to the
  whole product (float64).
* Engines on the CPU (gloo, rank 1 a spawned process): two ranks in the FP8 GEMM (Triton's
  interpreter) against one, for ``--quantization fp8`` on a 16-bit checkpoint and for an FP8
  checkpoint; and an FP8 checkpoint where the FP8 kernels do not run (dequantized at load).

Greedy tokens are compared, and the prompts' logits within a tolerance: with dynamic per-token
activations each rank of a row-parallel layer scales its slice of a token by the slice's own
amax, so two ranks round differently from one (not bit-equal, by design; vLLM does the same).
"""

from __future__ import annotations

import json
import os
import shutil

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import pytest
import torch
from fp8_testlib import greedy, write_fp8_pair
from pagoda.kernels import fp8 as math
from pagoda.runtime import LLM
from pagoda.runtime.distributed.layout import TPLayout
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.loader import load_model
from pagoda.runtime.model.parallel_linear import fp8_columns, fp8_rows
from pagoda.runtime.quantization import fp8
from safetensors.torch import load_file, save_file

INTERPRET = os.environ["TRITON_INTERPRET"] == "1"
interpreted = pytest.mark.skipif(
    not INTERPRET, reason="the CPU run of the FP8 kernels needs TRITON_INTERPRET=1"
)
SHAPES = {"l.q_proj": (8, 16), "l.k_proj": (4, 16), "l.o_proj": (16, 8)}
COLUMNS = ["l.q_proj.weight", "l.k_proj.weight"]
ROW = "l.o_proj.weight"


def checkpoint(kind: str) -> tuple[dict[str, torch.Tensor], fp8.Fp8Scheme]:
    """Random float32 projections (`kind` "online"), or their FP8 export with per-channel or
    per-tensor weight scales, or per-channel with static input scales."""
    g = torch.Generator().manual_seed(1)
    dense = {f"{m}.weight": torch.randn(s, generator=g) for m, s in SHAPES.items()}
    if kind == "online":
        return dense, fp8.ONLINE_SCHEME
    tensors = {}
    for name, t in dense.items():
        m = name.removesuffix(".weight")
        if kind == "per-tensor":
            scale = math.scale_from_amax(t.abs().amax()).reshape(1)
            tensors[name], tensors[m + ".weight_scale"] = math.quantize(t, scale), scale
        else:
            tensors[name], tensors[m + ".weight_scale"] = math.quantize_weight(t)
        if kind == "static":
            tensors[m + ".input_scale"] = torch.tensor([0.05])
    activations = "static" if kind == "static" else "dynamic"
    return tensors, fp8.Fp8Scheme(fp8.SERIALIZED_FP8, activations)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def same(a: fp8.Fp8LinearWeights, b: fp8.Fp8LinearWeights) -> bool:
    statics = (a.input_scale is None) == (b.input_scale is None)
    return (
        torch.equal(bits(a.weight), bits(b.weight))
        and torch.equal(a.weight_scale, b.weight_scale)
        and statics
        and (a.input_scale is None or torch.equal(a.input_scale, b.input_scale))
    )


@pytest.mark.parametrize("kind", ["online", "per-channel", "per-tensor", "static"])
def test_each_ranks_fp8_part_is_the_slice_of_the_whole_layer(kind):
    tensors, scheme = checkpoint(kind)
    w = DeviceWeights(tensors, torch.device("cpu"), torch.float32, {}, scheme)
    whole_cols = [w.fp8_weights([n]) for n in COLUMNS]
    whole_row = w.fp8_weights([ROW])
    h = torch.randn(3, 8, dtype=torch.float64)
    partial = torch.zeros(3, 16, dtype=torch.float64)
    for rank in range(2):
        lay = TPLayout(rank, 2)
        parts = [lay.even(SHAPES[n.removesuffix(".weight")][0]) for n in COLUMNS]
        rows = fp8_rows(w, COLUMNS, parts)
        want = fp8.fuse([fp8.shard(c, 0, *p) for c, p in zip(whole_cols, parts)])
        assert same(rows, want)
        # the rows are literally those of the whole layer (codes and per-channel scales)
        (a, b), (c, d) = parts
        assert torch.equal(bits(rows.weight[: b - a]), bits(whole_cols[0].weight[a:b]))
        assert torch.equal(rows.weight_scale[b - a :], whole_cols[1].weight_scale[c:d])
        start, stop = lay.even(8)
        cols = fp8_columns(w, ROW, start, stop)
        assert torch.equal(bits(cols.weight), bits(whole_row.weight[:, start:stop]))
        assert torch.equal(cols.weight_scale, whole_row.weight_scale)  # unchanged per row
        assert (cols.input_scale is None) == (kind != "static")
        partial += h[:, start:stop] @ cols.dequantize(torch.float64).T
    full = h @ whole_row.dequantize(torch.float64).T
    torch.testing.assert_close(partial, full, rtol=1e-12, atol=1e-12)  # the sum is the product


def test_layers_the_scheme_leaves_16_bit_stay_16_bit_and_a_half_fused_group_is_refused():
    tensors, _ = checkpoint("online")
    w = DeviceWeights(tensors, torch.device("cpu"), torch.float32, {}, None)
    assert fp8_rows(w, COLUMNS, [(0, 4), (0, 2)]) is None and fp8_columns(w, ROW, 0, 4) is None
    mixed = fp8.Fp8Scheme(fp8.ONLINE, "dynamic", ignored=("k_proj",))
    w = DeviceWeights(tensors, torch.device("cpu"), torch.float32, {}, mixed)
    with pytest.raises(ValueError, match=r"quantizes some of .* but not all"):
        fp8_rows(w, COLUMNS, [(0, 4), (0, 2)])


def test_shard_refuses_a_range_outside_the_weight():
    layer = fp8.quantize_linear(torch.randn(4, 8))
    for dim, start, stop in ((0, 0, 5), (1, 4, 4), (2, 0, 1)):
        with pytest.raises(ValueError, match="cannot take"):
            fp8.shard(layer, dim, start, stop)


def test_launch_no_longer_refuses_fp8_with_tensor_parallelism(tmp_path):
    from hf_oracle import make_tiny_llama
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.server.launch import check_parallel

    make_tiny_llama(tmp_path)
    mc = load_model(str(tmp_path)).config
    cfg = EngineConfig.create(str(tmp_path), quantization="fp8", tensor_parallel_size=2)
    check_parallel(mc, cfg)  # no FP8 refusal; the layout checks still run
    with pytest.raises(ValueError, match="does not divide the model's 4 attention heads"):
        check_parallel(mc, EngineConfig.create(str(tmp_path), quantization="fp8",
                                               tensor_parallel_size=8))  # fmt: skip


ENGINE = dict(dtype="float32", max_num_batched_tokens=16, max_num_seqs=3, kv_cache_memory=2 << 20)


def assert_close_logits(ours: list, theirs: list, tol: float) -> None:
    ours, theirs = torch.stack(ours), torch.stack(theirs)
    assert (ours - theirs).abs().max() <= tol * theirs.abs().max()


def one_and_two(path, **args) -> tuple[list, list, list, list, tuple]:
    """Tokens and first logits from one rank, then from two (closed after), and the first
    decoder layer of each (rank 0's of the two)."""
    loaded = load_model(str(path))
    one = LLM(str(path), loaded=loaded, **ENGINE, **args)
    first_one, first_two = [], []
    tokens_one = greedy(one, 4, first=first_one)
    with LLM(str(path), loaded=loaded, tensor_parallel_size=2, **ENGINE, **args) as two:
        tokens_two = greedy(two, 4, first=first_two)
        layers = one.engine.runner.model.layers[0], two.engine.runner.model.layers[0]
    return tokens_one, tokens_two, first_one, first_two, layers


def static_copy(q, root):
    """The FP8 checkpoint `q` with static per-tensor activation scales (0.05 everywhere)."""
    out = root / "static"
    shutil.copytree(q, out)
    tensors = load_file(str(out / "model.safetensors"))
    for name in [n for n in tensors if n.endswith(".weight_scale")]:
        tensors[name.removesuffix("weight_scale") + "input_scale"] = torch.tensor([0.05])
    save_file(tensors, str(out / "model.safetensors"))
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"]["activation_scheme"] = "static"
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@interpreted
@pytest.mark.parametrize("source", ["online", "checkpoint", "static"])
def test_two_ranks_in_fp8_give_one_ranks_results(tmp_path, source):
    """Rank 0's FP8 parts are its slices of one rank's layers. Static activation scales: the
    same quantized operands, so the same tokens (logits up to the summation order). Dynamic
    (``--quantization fp8``, the checkpoint's ``dynamic``): logits within FP8's error of one
    rank's and the same pick wherever one rank's top two are further apart than that error;
    on this tiny model one prompt's top two are 0.007 apart and the ranks pick differently
    there (two ranks then agree with the float32 model; one rank does not)."""
    from pagoda.runtime.model.fp8_linear import Fp8Linear

    orig, q, _ = write_fp8_pair(tmp_path)
    path, args = {"online": (orig, dict(quantization="fp8")), "checkpoint": (q, {}),
                  "static": (static_copy(q, tmp_path), {})}[source]  # fmt: skip
    t1, t2, l1, l2, (one, two) = one_and_two(path, **args)
    # rank 0 here: q rows [0, 32) (2 of 4 heads of 16), its KV head of 2, each with its scale
    assert isinstance(two.qkv, Fp8Linear) and isinstance(two.o_proj.inner, Fp8Linear)
    keep = torch.cat([torch.arange(0, 32), torch.arange(64, 80), torch.arange(96, 112)])
    assert torch.equal(bits(two.qkv.weight), bits(one.qkv.weight[keep]))
    assert torch.equal(two.qkv.weight_scale, one.qkv.weight_scale[keep])
    assert torch.equal(bits(two.o_proj.inner.weight), bits(one.o_proj.weight[:, :32]))
    assert torch.equal(two.o_proj.inner.weight_scale, one.o_proj.weight_scale)
    assert isinstance(two.mlp.gate_up, Fp8Linear) and isinstance(two.mlp.down.inner, Fp8Linear)
    if source == "static":
        assert two.o_proj.inner.input_scale is not None
        assert t2 == t1
        assert_close_logits(l2, l1, 1e-4)
        return
    ours, theirs = torch.stack(l2), torch.stack(l1)
    err = (ours - theirs).abs().max()
    assert 0 < err < 0.1 * theirs.abs().max()
    top2 = theirs.topk(2, dim=-1).values
    clear = top2[:, 0] - top2[:, 1] > 2 * err
    assert clear.any() and (ours.argmax(-1) == theirs.argmax(-1))[clear].all()
    assert [t for t, c in zip(t2, clear) if c] == [t for t, c in zip(t1, clear) if c]


def test_an_fp8_checkpoint_without_fp8_kernels_splits_dequantized(tmp_path, monkeypatch):
    """Where the FP8 kernels do not run (here: the interpreter off, in both ranks), an FP8
    checkpoint is dequantized at load and split as float32: the tokens one rank serves."""
    from pagoda.runtime import config
    from pagoda.runtime.worker import model_build

    monkeypatch.setattr(config, "fp8_runs_on", lambda device: False)
    monkeypatch.setattr(model_build, "fp8_runs_on", lambda device: False)
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the spawned rank: no FP8 kernels either
    _, q, deq = write_fp8_pair(tmp_path)
    t1, t2, l1, l2, (_, two) = one_and_two(q)
    assert type(two.qkv).__name__ == "Linear" and type(two.o_proj.inner).__name__ == "Linear"
    assert t2 == t1
    assert_close_logits(l2, l1, 1e-4)  # float32, only the summation order differs
    dense = LLM(loaded=load_model(str(deq)), **ENGINE)  # the dequantized weights as float32
    assert greedy(dense, 4) == t1


@interpreted
@pytest.mark.parametrize("case", ["qwen3moe-top2-step2", "qwen2moe-shared-dense1"])
def test_a_mixture_of_experts_in_fp8_over_two_ranks(tmp_path, case):
    """Qwen3-MoE (experts every second layer) and Qwen2-MoE (a dense layer after one of experts
    with their shared expert) with ``--quantization fp8``: attention, the dense MLPs and the
    shared expert split in FP8 (its down projection's partial sum joins the experts'), the
    experts split by width in 16 bits (they are 16-bit with one rank too); logits within FP8's
    error of one rank's."""
    from arch_cases import CASES
    from hf_oracle import make_tiny_model
    from pagoda.runtime.model.fp8_linear import Fp8Linear

    arch, overrides, engine_args = CASES[case]
    make_tiny_model(tmp_path, arch, **overrides)
    _, _, l1, l2, (_, two) = one_and_two(tmp_path, quantization="fp8", **engine_args)
    assert isinstance(two.qkv, Fp8Linear)
    if case.startswith("qwen3moe"):  # layer 0: dense
        assert isinstance(two.mlp.down.inner, Fp8Linear)
    else:  # layer 0: experts and the shared expert, its down projection not reduced on its own
        assert isinstance(two.mlp.shared.down, Fp8Linear)
    ours, theirs = torch.stack(l2), torch.stack(l1)
    assert (ours - theirs).abs().max() < 0.1 * theirs.abs().max()


@interpreted
def test_per_head_kv_cache_scales_are_split_with_the_kv_heads(tmp_path):
    """An FP8 KV cache with the checkpoint's per-KV-head ``k_scale``/``v_scale`` (4 KV heads
    over 2 ranks): each rank takes its heads' scales (was: every rank the whole vector, which
    the kernels refused at start); the tokens are one rank's."""
    from hf_oracle import make_tiny_model

    make_tiny_model(tmp_path, "Llama", num_key_value_heads=4)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    for i in range(2):
        tensors[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor([0.01, 0.02, 0.03, 0.04])
        tensors[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor([0.006, 0.008, 0.01, 0.012])
    save_file(tensors, str(tmp_path / "model.safetensors"))
    args = dict(attention_backend="triton", kv_cache_dtype="fp8", dtype="float32",
                kv_cache_memory=4 << 20, max_num_batched_tokens=16, max_num_seqs=4)  # fmt: skip
    want = greedy(LLM(str(tmp_path), **args), 3)
    with LLM(str(tmp_path), tensor_parallel_size=2, **args) as two:
        k_scale, v_scale = two.engine.runner.model.layers[1].kv_scales  # rank 0: heads 0 and 1
        assert k_scale.tolist() == pytest.approx([0.01, 0.02])
        assert v_scale.tolist() == pytest.approx([0.006, 0.008])
        assert greedy(two, 3) == want
