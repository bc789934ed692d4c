"""Dory (`DoryForCausalLM`, model/dory.py) against transformers' plain greedy loop, token for
token and logits within 1e-3 (float32), on a tiny random checkpoint transformers writes itself
(its config.json in the published two-block layout): one input layer, two recurrent layers run
three times (each pass its own KV cache), one output layer; sliding layers with their own rotary
base and a window shorter than the prompts, a full one; nGPT's scaled parameters drawn away from
their initial values. Prompts chunked into 16-token steps, three prompts sharing steps, a warm
prefix cache, a pool small enough to preempt; the published tensor layout (each layer an
attention block and an mlp block) read alike; the checkpoint check; what is refused."""

from __future__ import annotations

import json

import pytest
import torch
from arch_cases import FULL, SLIDING, built_fixture, case_fixture, generate, greedy_test, prompts
from hf_oracle import make_tiny_model
from pagoda.runtime.model.loader import read_model_config

transformers = pytest.importorskip("transformers")
CASES = {
    "dory": dict(
        num_hidden_layers=4, n_input_layers=1, n_output_layers=1, n_recurrent_loops=3,
        head_dim=16, sliding_window=8, intermediate_size=96,
        layer_types=[SLIDING, SLIDING, FULL, SLIDING]),
}  # fmt: skip


def write_case(name: str, path):
    """nGPT's scaled parameters (stored over `initializer_range`) drawn within 50% of their
    initial values (noise as large as the other 1-D weights' would scale q by thousands: the
    softmax then turns on rounding), the logit scale 20-30 times its own."""
    model = make_tiny_model(path, "Dory", **CASES[name])
    g, init = torch.Generator().manual_seed(2), model.config.initializer_range
    with torch.no_grad():
        for key, t in model.named_parameters():
            if key.endswith(("sqk", "s_gate", "lambda_1", "lambda_2")):
                t.copy_(init * (1 + 0.5 * torch.rand(t.shape, generator=g)))
            if key.endswith("logit_scale"):  # (logits of unit vectors: scaled up to separate)
                t.copy_(init * (20 + 10 * torch.rand(t.shape, generator=g)))
    model.save_pretrained(path)
    return model


built = built_fixture(write_case)
case = case_fixture(CASES)

test_greedy_matches_transformers_chunked_cached_batched_and_preempted = greedy_test()


@pytest.mark.slow  # a second process (gloo)
def test_two_ranks_match_transformers(built):
    """Two ranks (gloo), the small pool (preempted) then a warm cache: each rank its heads (q/k/v,
    the output gate's rows, sqk, s_gate) and MLP rows (suv_*), the L2 norms of attention's gated
    output and of the MLP's product over every rank's channels; transformers' tokens and
    logits; rank 0's weights estimate."""
    from arch_cases import check_two_ranks
    from model_bytes import check_estimate

    path, _, loaded, reference = built("dory")
    check_two_ranks(path, loaded, reference, "dory", kv_heads=1)
    check_estimate(path, 2, rel=1e-6)


def test_loops_checkpoint_check_and_refusals(built):
    """The layers in loop order (the recurrent ones' weights shared, a KV cache each pass), the
    checkpoint check naming a missing scaled parameter, the weights estimate, a
    tensor-parallel size that does not divide the heads and FP8 refused."""
    from types import SimpleNamespace

    from hybrid_cases import check_missing_refused
    from model_bytes import build, check_estimate
    from pagoda.runtime.distributed.layout import check
    from pagoda.runtime.engine.start_checks import check_dtype

    path, _, loaded, _ = built("dory")
    mc = loaded.config
    loops = mc.family.dory
    assert (loops.inputs, loops.recurrent, loops.outputs, loops.loops) == (1, 2, 1, 3)
    assert loops.order() == [0, 1, 2, 1, 2, 1, 2, 3] and mc.num_kv_layers == 8
    assert mc.family.window_layers == (True, True, False, True)
    layers = build(path, torch.float32).layers
    assert len(layers) == 8 and layers[1].qkv is layers[3].qkv is layers[5].qkv
    assert [x.index for x in layers] == list(range(8))
    check_estimate(path, rel=1e-6)
    check_missing_refused(loaded, ["model.layers.2.lambda_1", "model.layers.1.self_attn.sqk",
                                   "lm_head.logit_scale"])  # fmt: skip
    with pytest.raises(ValueError, match="tensor-parallel-size 3 does not divide the model's 4"):
        check(mc, 3)
    with pytest.raises(ValueError, match="fp8 is not supported for a dory"):
        check_dtype(SimpleNamespace(quantization="fp8", torch_dtype=lambda: torch.bfloat16), mc)
    cfg = json.loads((path / "config.json").read_text())
    assert "mlp" in cfg["layer_types"] and cfg["num_hidden_layers"] == 8  # (two-block)


def test_the_published_two_block_layout_reads_alike(built, tmp_path):
    """The same weights under the published names (layer 2i's `mixer` its attention, 2i + 1's
    its MLP, `attn_alpha` / `mlp_alpha`, `g_proj`): transformers' tokens."""
    from pagoda.runtime import LLM
    from pagoda.runtime.model.loader import load_model
    from safetensors.torch import load_file, save_file

    path, _, _, reference = built("dory")
    renamed = {}
    for name, t in load_file(str(path / "model.safetensors")).items():
        parts = name.split(".")
        if parts[:2] == ["backbone", "layers"]:
            i, rest = int(parts[2]), parts[3:]
            if rest[0] in ("lambda_1", "lambda_2"):
                alpha = "attn_alpha" if rest[0] == "lambda_1" else "mlp_alpha"
                name = f"backbone.layers.{2 * i + (rest[0] == 'lambda_2')}.{alpha}"
            else:
                block = 2 * i + (rest[0] == "mlp")
                name = f"backbone.layers.{block}.mixer.{'.'.join(rest[1:])}"
        renamed[name] = t
    save_file(renamed, str(tmp_path / "model.safetensors"))
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / f).write_text((path / f).read_text())
    llm = LLM(loaded=load_model(str(tmp_path)), dtype="float32", kv_cache_memory=16 << 20,
              block_size=16, max_num_batched_tokens=16, max_num_seqs=4)  # fmt: skip
    got = generate(llm, prompts())
    assert [g[0] for g in got] == [r[0] for r in reference]


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        ({"recurrent_kv_cache_mode": "last_loop"}, "recurrent_kv_cache_mode 'last_loop'"),
        ({"n_input_layers": 1, "n_output_layers": 1}, "at least one recurrent layer"),
        ({"attention_bias": True}, "attention_bias / mlp_bias are not supported"),
    ],
)
def test_what_it_does_not_run_is_refused_in_one_line(tmp_path, edit, words):
    cfg = {"architectures": ["DoryForCausalLM"], "model_type": "dory", "num_hidden_layers": 2,
           "n_input_layers": 1, "n_output_layers": 0, **edit}  # fmt: skip
    if "n_output_layers" in edit:
        cfg["num_hidden_layers"] = 2
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=words) as e:
        read_model_config(str(tmp_path))
    assert "\n" not in str(e.value)
