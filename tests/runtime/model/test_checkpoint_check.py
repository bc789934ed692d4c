"""A checkpoint that does not match its config.json is refused when the config is read (from
the safetensors headers, no tensor read), in one line naming the tensor: `pagoda serve` exits 2
before it binds, instead of failing in the first forward (a q/k/v split of the wrong widths) or
serving tokens past the vocabulary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hf_oracle import make_tiny_model
from pagoda.runtime.model.loader import load_model, read_model_config
from safetensors.torch import load_file, save_file

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3")
    make_tiny_model(path, "Qwen3", head_dim=32, num_key_value_heads=1)
    return path


def _copy(src: Path, dst: Path, **config_changes) -> Path:
    dst.mkdir(exist_ok=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, **config_changes}))
    return dst


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"num_key_value_heads": 2}, r"k_proj.weight is \[32, 64\], config.json .* needs \[64, 64\]"),
        ({"head_dim": 16}, r"q_proj.weight is \[128, 64\], .* needs \[64, 64\]"),
        ({"vocab_size": 250}, r"embed_tokens.weight is \[300, 64\], .* needs \[250, 64\]"),
        ({"num_hidden_layers": 3}, r"missing tensor 'model.layers.2.self_attn.q_proj.weight'"),
    ],
)  # fmt: skip
def test_a_config_the_weights_do_not_match_is_refused_in_one_line(good, tmp_path, change, match):
    bad = _copy(good, tmp_path, **change)
    for read in (read_model_config, load_model):
        with pytest.raises(ValueError, match=match) as e:
            read(str(bad))
        assert "\n" not in str(e.value)


def test_an_fp8_weight_without_its_scale_is_refused(good, tmp_path):
    import torch

    bad = _copy(good, tmp_path, quantization_config={"quant_method": "fp8"})
    tensors = load_file(str(bad / "model.safetensors"))
    name = "model.layers.1.mlp.down_proj.weight"
    tensors[name] = tensors[name].to(torch.float8_e4m3fn)
    save_file(tensors, str(bad / "model.safetensors"))
    with pytest.raises(ValueError, match=f"{name} is FP8 .* without a .*down_proj.weight_scale"):
        read_model_config(str(bad))
    tensors[name.removesuffix("weight") + "weight_scale"] = torch.ones(3)
    save_file(tensors, str(bad / "model.safetensors"))
    with pytest.raises(ValueError, match=r"weight_scale is \[3\]; .* needs 1 or 64 elements"):
        read_model_config(str(bad))


def test_pagoda_serve_exits_2_before_binding(good, tmp_path):
    bad = _copy(good, tmp_path, num_key_value_heads=2)
    result = subprocess.run(
        [sys.executable, "-P", "-m", "pagoda.runtime.cli", "serve", "--port", "0", "--model",
         str(bad)],
        capture_output=True, text=True, timeout=180, cwd=Path(__file__).resolve().parents[3],
    )  # fmt: skip
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "k_proj.weight is [32, 64]" in lines[0], result.stderr


def _edit_tensors(src: Path, dst: Path, edit) -> Path:
    bad = _copy(src, dst)
    tensors = load_file(str(bad / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(bad / "model.safetensors"))
    return bad


def _widen(name: str):
    import torch

    return lambda t: t.__setitem__(name, torch.cat([t[name], t[name]]))


SMALL = {"Mixtral": dict(num_local_experts=4),
         "Qwen2Moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                          shared_expert_intermediate_size=48),
         "GraniteMoe": dict(num_local_experts=4)}  # fmt: skip


@pytest.mark.parametrize(
    ("arch", "edit", "match"),
    [
        ("Qwen3", lambda t: t.pop("model.layers.1.mlp.down_proj.weight"),
         "missing tensor 'model.layers.1.mlp.down_proj.weight'"),
        ("Qwen3", _widen("model.layers.0.mlp.up_proj.weight"),
         r"up_proj.weight is \[256, 64\]; with .*gate_proj.weight \[128, 64\] it must be"),
        ("Qwen3", lambda t: t.pop("model.layers.0.post_attention_layernorm.weight"),
         "missing tensor 'model.layers.0.post_attention_layernorm.weight'"),
        ("Mixtral", lambda t: t.pop("model.layers.1.block_sparse_moe.experts.2.w3.weight"),
         "missing tensor 'model.layers.1.block_sparse_moe.experts.2.w3.weight'"),
        ("Gemma3Text", lambda t: t.pop("model.layers.0.pre_feedforward_layernorm.weight"),
         "missing tensor 'model.layers.0.pre_feedforward_layernorm.weight'"),
        ("Qwen2Moe", lambda t: t.pop("model.layers.1.mlp.shared_expert_gate.weight"),
         "missing tensor 'model.layers.1.mlp.shared_expert_gate.weight'"),
        ("Qwen2Moe", _widen("model.layers.0.mlp.shared_expert.up_proj.weight"),
         r"shared_expert.up_proj.weight is \[96, 64\]; with .*gate_proj.weight \[48, 64\]"),
        ("GraniteMoe", lambda t: t.pop("model.layers.1.block_sparse_moe.output_linear.weight"),
         "missing tensor 'model.layers.1.block_sparse_moe.output_linear.weight'"),
        ("Olmo2", lambda t: t.pop("model.layers.1.post_feedforward_layernorm.weight"),
         "missing tensor 'model.layers.1.post_feedforward_layernorm.weight'"),
        # OLMo 2 normalises k over all its heads at once: a per-head norm is not its checkpoint
        ("Olmo2", lambda t: t.__setitem__("model.layers.0.self_attn.k_norm.weight",
                                          t["model.layers.0.self_attn.k_norm.weight"][:16]),
         r"k_norm.weight is \[16\], config.json .* needs \[32\]"),
        # untied by config.json: transformers gives it a random head, vLLM refuses (it was
        # served with the embedding as its head)
        ("Qwen3", lambda t: t.pop("lm_head.weight"),
         "missing tensor 'lm_head.weight' .*tie_word_embeddings false"),
    ],
)  # fmt: skip
def test_mlps_experts_and_norms_are_checked_too(tmp_path, arch, edit, match):
    """(They failed at the model's build in the engine process, or in the first forward for a
    width that does not agree, after the server had bound.)"""
    make_tiny_model(tmp_path / "good", arch, **SMALL.get(arch, {}))
    bad = _edit_tensors(tmp_path / "good", tmp_path / "bad", edit)
    with pytest.raises(ValueError, match=match) as e:
        read_model_config(str(bad))
    assert "\n" not in str(e.value)
