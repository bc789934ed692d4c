"""Llama 4's text model in a GGUF (`llama4`), written here as llama.cpp's converter writes it
(`Llama4Model`: Q/K as stored, not permuted; `gate_up_proj` split into `ffn_gate_exps` and
`ffn_up_exps` [E, N, hidden], `down_proj` transposed to `ffn_down_exps`; the router as
`ffn_gate_inp`, the shared expert as `ffn_*_shexp`, the dense layers' MLP as `ffn_*`;
`feed_forward_length` the dense width, `expert_feed_forward_length` the experts';
`interleave_moe_layer_step`; llama3 scaling as `rope_freqs`), Q8_0 matrices: the engine
matches transformers running on exactly the dequantized weights, token for token, with
llama.cpp's built-in Llama 4 values (no GGUF keys: chunks of 8192 on three layers of four, the
fourth NoPE with the q temperature of floor 8192 and scale 0.1, q/k L2 norms unless 128
experts); `attention.sliding_window` 0 (the converter's for an all-full-attention config):
rotary everywhere, no chunks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from arch_cases import LLAMA3
from gguf import GGMLQuantizationType as Q
from hf_oracle import _LM_CLASSES, hf_greedy_plain, make_tiny_model
from pagoda.runtime.model.gguf_loader import load_gguf
from test_gguf_archs import PROMPTS, _check_estimate, _generate, _llama_extra, convert
from test_gguf_families import _oracle

transformers = pytest.importorskip("transformers")
_LM_CLASSES.setdefault("Llama4Text", "Llama4ForCausalLM")
# llama.cpp's Llama 4 values where transformers' config has keys for them
LLAMA4 = dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32,
              intermediate_size_mlp=96, num_hidden_layers=4, head_dim=16,
              no_rope_layer_interval=4, interleave_moe_layer_step=2, use_qk_norm=True,
              attn_temperature_tuning=True, floor_scale=8192, attn_scale=0.1,
              attention_chunk_size=8192, rope_parameters=LLAMA3)  # fmt: skip
FULL = dict(LLAMA4, no_rope_layers=[1, 1, 1, 1], layer_types=["full_attention"] * 4)


def _llama4_extra(stacked: dict[str, tuple[str, int]]):
    """Llama4Model's converter on top of LlamaModel's: the experts' width and the MoE step,
    the stacked experts split and transposed (`stacked`: the file's stacks by the HF tensor
    they come from), the router in float32; `attention.sliding_window` 0 where every layer is
    full attention."""

    def extra(w, cfg, sd, put):
        done = _llama_extra(w, cfg, sd, put)
        w.add_interleave_moe_layer_step(cfg.interleave_moe_layer_step)
        w.add_expert_feed_forward_length(cfg.intermediate_size)
        if all(t == "full_attention" for t in cfg.layer_types):
            w.add_sliding_window(0)
        n = cfg.intermediate_size
        for i in cfg.moe_layers:
            p = f"model.layers.{i}.feed_forward."
            gate_up, down = sd[p + "experts.gate_up_proj"], sd[p + "experts.down_proj"]
            for part, arr in (("gate", gate_up[..., :n]), ("up", gate_up[..., n:]),
                              ("down", down)):  # fmt: skip
                put(f"blk.{i}.ffn_{part}_exps.weight", np.ascontiguousarray(arr.swapaxes(1, 2)),
                    f"{part}{i}")  # fmt: skip
            put(f"blk.{i}.ffn_gate_inp.weight", sd[p + "router.weight"], p + "router.weight",
                Q.F32)  # fmt: skip
            done += [p + "experts.gate_up_proj", p + "experts.down_proj", p + "router.weight"]
        return done

    return extra


def _as_checkpoint(expected: dict, layers) -> None:
    """The file's expert stacks back in the checkpoint's layout, for the oracle."""
    for i in layers:
        p = f"model.layers.{i}.feed_forward.experts."
        gate, up, down = (expected.pop(f"{part}{i}") for part in ("gate", "up", "down"))
        expected[p + "gate_up_proj"] = torch.cat([gate, up], dim=1).transpose(1, 2).contiguous()
        expected[p + "down_proj"] = down.transpose(1, 2).contiguous()


@pytest.mark.parametrize("case", ["chunked", "full"])
def test_llama4_gguf_matches_transformers_on_its_dequantized_weights(tmp_path, case):
    """Top-2 sigmoid routing before the experts, a shared expert, dense MLPs between; a NoPE
    layer with its q temperature (chunked) or rotary everywhere (full); llama3 scaling."""
    overrides = LLAMA4 if case == "chunked" else FULL
    model = make_tiny_model(tmp_path / "hf", "Llama4Text", **overrides)
    path = tmp_path / f"llama4-{case}.gguf"
    expected = convert(path, tmp_path / "hf", "llama4", pre="llama4", extra=_llama4_extra({}))
    _as_checkpoint(expected, model.config.moe_layers)
    oracle = _oracle(tmp_path, expected)
    config = load_gguf(path)[0]
    f = config.family
    assert config.architecture == "llama4" and config.intermediate_size == 96
    assert f.moe_layers == (False, True, False, True) and f.num_experts_per_tok == 2
    assert f.moe_intermediate_size == f.shared_expert_intermediate_size == 32
    assert f.llama4.qk_norm and f.rope_interleaved
    if case == "chunked":
        assert f.rope_layers == f.chunk_layers == (True, True, True, False)
        assert f.attention_chunk_size == 8192 and f.llama4.temperature_tuning
        assert (f.llama4.floor_scale, f.llama4.attn_scale) == (8192.0, 0.1)
    else:
        assert f.rope_layers == (True,) * 4 and f.attention_chunk_size is None
    want = [hf_greedy_plain(oracle, p, 6)[0] for p in PROMPTS]
    assert _generate(path, PROMPTS) == want, case
    if case == "chunked":  # (float32: the experts' Q8_0 blocks multiplied in place)
        _check_estimate(path, "bfloat16")
        _check_estimate(path, "float32")
