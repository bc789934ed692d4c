"""FP8 checkpoint formats (`pagoda.runtime.quantization.fp8`): the ``quantization_config``s real
FP8 checkpoints carry, their tensors written and read back with safetensors, and the refusals."""

from __future__ import annotations

import pytest
import torch
from pagoda.kernels import fp8 as math
from pagoda.runtime.quantization import fp8
from safetensors.torch import load_file, save_file

# vLLM / AutoFP8 "fp8" export with static activations (e.g. Meta-Llama-3-8B-Instruct-FP8)
VLLM_STATIC = {"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head"]}
# HF FineGrainedFP8 / Qwen3-FP8: block-wise scales
HF_BLOCK = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
            "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]}  # fmt: skip
# llm-compressor FP8_DYNAMIC (e.g. Meta-Llama-3.1-8B-Instruct-FP8-dynamic)
CT_DYNAMIC = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "ignore": ["lm_head"],
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "dynamic": False,
                    "symmetric": True},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True,
                              "symmetric": True},
    }},
}  # fmt: skip


def _with(cfg: dict, **group_changes) -> dict:
    group = {**cfg["config_groups"]["group_0"], **group_changes}
    return {**cfg, "config_groups": {"group_0": group}}


def test_schemes_of_real_checkpoint_configs():
    s = fp8.scheme_from_hf_config({"quantization_config": VLLM_STATIC})
    assert (s.source, s.activations, s.serialized) == ("fp8", "static", True)
    assert s.quantizes("model.layers.0.self_attn.q_proj") and not s.quantizes("lm_head")
    s = fp8.scheme_from_hf_config({"quantization_config": {"quant_method": "fp8"}})
    assert s.activations == "dynamic"
    s = fp8.scheme_from_hf_config({"quantization_config": CT_DYNAMIC})
    assert (s.source, s.activations) == ("compressed-tensors", "dynamic")
    assert s.quantizes("model.layers.3.mlp.down_proj") and not s.quantizes("lm_head")
    static = _with(CT_DYNAMIC, input_activations={"num_bits": 8, "type": "float",
                                                  "strategy": "tensor", "dynamic": False})  # fmt: skip
    assert fp8.scheme_from_hf_config({"quantization_config": static}).activations == "static"
    weight_only = fp8.scheme_from_hf_config(
        {"quantization_config": _with(CT_DYNAMIC, input_activations=None)}
    )
    assert weight_only.activations == "none"
    attn_only = _with(CT_DYNAMIC, targets=[r"re:.*self_attn\.(q|k|v|o)_proj$"])
    s = fp8.scheme_from_hf_config({"text_config": {"quantization_config": attn_only}})
    assert s.quantizes("model.layers.0.self_attn.k_proj") and not s.quantizes(
        "model.layers.0.mlp.up_proj"
    )
    assert fp8.scheme_from_hf_config({"architectures": ["LlamaForCausalLM"]}) is None


@pytest.mark.parametrize(
    ("qc", "match"),
    [
        ({**HF_BLOCK, "weight_block_size": [128]}, "weight_block_size must be two positive"),
        (
            _with(
                CT_DYNAMIC,
                weights={"num_bits": 8, "type": "float", "strategy": "block"},
            ),
            "block_structure must be two positive",
        ),
        ({"quant_method": "gptq", "bits": 4}, "'gptq' is not supported"),
        ({"quant_method": "fp8", "activation_scheme": "static_per_token"}, "activation_scheme"),
        ({"quant_method": "fp8", "fmt": "e5m2"}, "only e4m3"),
        (
            _with(CT_DYNAMIC, weights={"num_bits": 4, "type": "int", "strategy": "group"}),
            "8-bit floats",
        ),
        ({**CT_DYNAMIC, "format": "pack-quantized"}, "format 'pack-quantized'"),
    ],
)
def test_unsupported_checkpoints_are_refused_in_one_line(qc, match):
    with pytest.raises(ValueError, match=match) as err:
        fp8.scheme_from_hf_config({"quantization_config": qc})
    assert "\n" not in str(err.value)


def test_the_flag_and_the_checkpoint():
    assert fp8.resolve_scheme(None, {}) is None
    assert fp8.resolve_scheme("fp8", {}) == fp8.ONLINE_SCHEME
    assert not fp8.ONLINE_SCHEME.serialized and not fp8.ONLINE_SCHEME.quantizes("lm_head")
    ckpt = {"quantization_config": VLLM_STATIC}
    assert fp8.resolve_scheme(None, ckpt).source == fp8.resolve_scheme("fp8", ckpt).source == "fp8"
    with pytest.raises(ValueError, match="quantization must be one of fp8"):
        fp8.resolve_scheme("int4", {})


def _write_fp8_layers(path, per_tensor: bool) -> dict[str, torch.Tensor]:
    """Two projections of one input (q and k) in a serialized FP8 checkpoint, as the exporters
    write them; returns the original 16-bit weights."""
    gen = torch.Generator().manual_seed(0)
    originals, tensors = {}, {}
    for name, rows, gain in (("q_proj", 16, 1.0), ("k_proj", 8, 30.0)):
        w = torch.randn(rows, 32, generator=gen) * gain
        prefix = f"model.layers.0.self_attn.{name}"
        if per_tensor:
            scale = math.scale_from_amax(w.abs().max()).reshape(())  # a 0-d tensor, as AutoFP8
            tensors[prefix + ".weight"] = math.quantize(w, scale)
            tensors[prefix + ".weight_scale"] = scale
        else:
            q, scale = math.quantize_weight(w)
            tensors[prefix + ".weight"], tensors[prefix + ".weight_scale"] = q, scale[:, None]
        tensors[prefix + ".input_scale"] = torch.tensor([0.02 * gain])
        originals[prefix] = w
    save_file(tensors, str(path))
    return originals


@pytest.mark.parametrize("per_tensor", [True, False], ids=["per-tensor", "per-channel"])
def test_load_and_fuse_serialized_layers(tmp_path, per_tensor):
    originals = _write_fp8_layers(tmp_path / "model.safetensors", per_tensor)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    scheme = fp8.scheme_from_hf_config({"quantization_config": VLLM_STATIC})
    layers = [fp8.load_linear(tensors, p, scheme) for p in originals]
    for layer, (prefix, w) in zip(layers, originals.items(), strict=True):
        assert layer.weight.dtype == torch.float8_e4m3fn and layer.weight_scale.shape == (
            w.shape[0],
        )
        assert torch.equal(
            layer.weight.view(torch.uint8), tensors[prefix + ".weight"].view(torch.uint8)
        )
        err = (layer.dequantize(torch.float32) - w).abs()
        assert (err <= w.abs() * 2.0**-4 + layer.weight_scale[:, None] * 2.0**-9).all()
    fused = fp8.fuse(layers)
    assert fused.weight.shape == (24, 32) and torch.equal(
        fused.weight_scale, torch.cat([layers[0].weight_scale, layers[1].weight_scale])
    )
    assert fused.input_scale.item() == pytest.approx(0.6)  # the larger of the two
    x = torch.randn(3, 32)
    y = math.fp8_linear(x=x, weight=fused.weight, weight_scale=fused.weight_scale,
                        x_scale=fused.input_scale, out_dtype=torch.float32)  # fmt: skip
    want = x @ torch.cat(list(originals.values())).T
    assert (y - want).abs().max() < 0.1 * want.abs().max()


def test_load_errors_name_the_tensor(tmp_path):
    originals = _write_fp8_layers(tmp_path / "m.safetensors", per_tensor=False)
    tensors = load_file(str(tmp_path / "m.safetensors"))
    prefix = next(iter(originals))
    static = fp8.scheme_from_hf_config({"quantization_config": VLLM_STATIC})
    dynamic = fp8.scheme_from_hf_config({"quantization_config": {"quant_method": "fp8"}})
    assert fp8.load_linear(tensors, prefix, dynamic).input_scale is None
    cases = {
        "is missing": {k: v for k, v in tensors.items() if k != prefix + ".weight"},
        "weight_scale is missing": {
            k: v for k, v in tensors.items() if k != prefix + ".weight_scale"
        },
        "input_scale is missing": {
            k: v for k, v in tensors.items() if k != prefix + ".input_scale"
        },
        "expected a 2-D float8_e4m3fn": {**tensors, prefix + ".weight": originals[prefix]},
        "16 \\(per output channel\\)": {**tensors, prefix + ".weight_scale": torch.ones(5)},
        "finite and positive": {**tensors, prefix + ".weight_scale": torch.zeros(16)},
    }
    for match, mapping in cases.items():
        with pytest.raises(ValueError, match=match):
            fp8.load_linear(mapping, prefix, static)
    block = {k: v for k, v in tensors.items() if k != prefix + ".weight_scale"}
    block[prefix + ".weight_scale_inv"] = torch.ones(1, 1)
    with pytest.raises(ValueError, match="block-wise scales, not supported"):
        fp8.load_linear(block, prefix, static)
    with pytest.raises(ValueError, match="quantize_linear"):
        fp8.load_linear(tensors, prefix, fp8.ONLINE_SCHEME)


def test_online_quantization_and_kv_scales():
    w = torch.randn(12, 40, dtype=torch.bfloat16)
    layer = fp8.quantize_linear(w)
    q, s = math.quantize_weight(w)
    assert torch.equal(layer.weight.view(torch.uint8), q.view(torch.uint8)) and torch.equal(
        layer.weight_scale, s
    )
    assert layer.dequantize().dtype == torch.bfloat16 and layer.to("cpu").weight.shape == (12, 40)
    with pytest.raises(ValueError, match="static and dynamic"):
        fp8.fuse([layer, fp8.Fp8LinearWeights(q, s, torch.tensor([1.0]))])
    attn = "model.layers.2.self_attn"
    vllm = {f"{attn}.k_scale": torch.tensor(0.5), f"{attn}.v_scale": torch.tensor(0.25)}
    k, v = fp8.checkpoint_kv_scales(vllm, attn)
    assert k.tolist() == [0.5] and v.tolist() == [0.25] and k.dtype == torch.float32
    ct = {
        f"{attn}.k_proj.output_scale": torch.tensor([0.1]),
        f"{attn}.v_proj.output_scale": torch.tensor([0.2]),
    }
    assert fp8.checkpoint_kv_scales(ct, attn)[1].tolist() == [pytest.approx(0.2)]
    assert fp8.checkpoint_kv_scales({}, attn) is None
    # older AutoFP8 exports: one kv_scale for both, as vLLM reads it (was ignored: scale 1.0)
    k, v = fp8.checkpoint_kv_scales({f"{attn}.kv_scale": torch.tensor(0.125)}, attn)
    assert k.tolist() == v.tolist() == [0.125]


def test_engine_quantization_choices_and_the_plan():
    """Only fp8 is a quantization; a checkpoint's own FP8 format wins; where the FP8 kernels do
    not run, an FP8 checkpoint is dequantized (None) and ``quantization="fp8"`` refused."""
    from pagoda.runtime.config import EngineConfig

    with pytest.raises(ValueError, match="quantization must be one of fp8"):
        EngineConfig.create("/nonexistent", quantization="awq")
    ckpt = fp8.scheme_from_hf_config({"quantization_config": CT_DYNAMIC})
    assert fp8.engine_scheme(None, None, True) is None
    assert fp8.engine_scheme("fp8", None, True) is fp8.ONLINE_SCHEME
    assert fp8.engine_scheme("fp8", ckpt, True) is ckpt
    assert fp8.engine_scheme(None, ckpt, False) is None
    with pytest.raises(ValueError, match="FP8 tensor cores"):
        fp8.engine_scheme("fp8", ckpt, False)


def test_a_projection_the_checkpoint_stores_16_bit_runs_16_bit_unlisted_or_not():
    """An FP8 export may keep a projection 16-bit without naming it in its ignore list (e.g. a
    hand-merged checkpoint): that layer runs as stored, the FP8 ones in the FP8 GEMM; a fused
    group split between the two is refused by name."""
    from pagoda.runtime.model.device_weights import DeviceWeights

    gen = torch.Generator().manual_seed(0)
    q, q_scale = math.quantize_weight(torch.randn(8, 16, generator=gen))
    tensors = {"l.q_proj.weight": q, "l.q_proj.weight_scale": q_scale,
               "l.k_proj.weight": torch.randn(4, 16, generator=gen),
               "l.o_proj.weight": torch.randn(16, 8, generator=gen)}  # fmt: skip
    scheme = fp8.Fp8Scheme(fp8.SERIALIZED_FP8, "dynamic")  # ignores nothing
    w = DeviceWeights(tensors, torch.device("cpu"), torch.float32, {}, scheme)
    assert w.fp8_weights(["l.o_proj.weight"]) is None  # stays 16-bit
    assert torch.equal(
        w.fp8_weights(["l.q_proj.weight"]).weight.view(torch.uint8), q.view(torch.uint8)
    )
    with pytest.raises(ValueError, match=r"quantizes some of l.q_proj, l.k_proj but not all"):
        w.fp8_weights(["l.q_proj.weight", "l.k_proj.weight"])


def test_an_fbgemm_fp8_checkpoint_serves_its_dequantized_weights(tmp_path, monkeypatch):
    """quant_method "fbgemm_fp8" (Meta's Llama 3.1 405B FP8 export): per-channel
    ``weight_scale [N, 1]``, an ``input_scale_ub`` per layer; where FP8 does not run it gives
    its dequantized twin's tokens bit for bit."""
    import json

    from fp8_testlib import greedy, write_fp8_pair
    from pagoda.runtime import LLM
    from pagoda.runtime import config as engine_config
    from pagoda.runtime.model.loader import load_model
    from pagoda.runtime.worker import model_build

    monkeypatch.setattr(engine_config, "fp8_runs_on", lambda device: False)
    monkeypatch.setattr(model_build, "fp8_runs_on", lambda device: False)
    _, q, deq = write_fp8_pair(tmp_path)
    tensors = load_file(str(q / "model.safetensors"))
    for name in [n for n in tensors if n.endswith(".weight_scale")]:
        tensors[name] = tensors[name].reshape(-1, 1)
        tensors[name.removesuffix("weight_scale") + "input_scale_ub"] = torch.tensor([1200.0])
    save_file(tensors, str(q / "model.safetensors"))
    cfg = json.loads((q / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
                                  "modules_to_not_convert": ["lm_head"]}  # fmt: skip
    (q / "config.json").write_text(json.dumps(cfg))
    loaded = load_model(str(q))
    assert (loaded.fp8_scheme.source, loaded.fp8_scheme.activations) == ("fp8", "dynamic")
    assert not loaded.fp8_scheme.quantizes("lm_head")
    engine = dict(
        dtype="float32", kv_cache_memory=4 << 20, max_num_batched_tokens=16, max_num_seqs=4
    )
    assert greedy(LLM(loaded=loaded, **engine)) == greedy(
        LLM(loaded=load_model(str(deq)), **engine)
    )
