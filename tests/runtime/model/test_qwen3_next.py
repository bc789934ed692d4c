"""Qwen3-Next and Qwen3.5 (Gated DeltaNet layers among gated attention layers,
`model/qwen3_next.py`) against transformers, token for token, on tiny random checkpoints
transformers writes itself (tests/runtime/hf_oracle.py): float32, logits within 1e-3 of
transformers' plain greedy loop (its torch chunked delta rule over the whole sequence; no
flash-linear-attention here) at every step.

- Qwen3-Next: experts with the shared expert and its gate, a dense layer (`mlp_only_layers`),
  two value heads per key head, top-k not renormalised;
- Qwen3.5: a dense MLP, as many key heads as value heads, key heads wider than value heads, a
  conv of 3, tied;
- Qwen3.5-MoE: attention first, experts in every layer;
- Qwen3.5's multimodal checkpoint read text-only (its `text_config`, `model.language_model.`).

The cases are rows of tests/runtime/hybrid_cases.py (checkpoints written once a session by its
`built` fixture); each runs `hybrid_checks.check_chunked_batched_preempted` (16-token steps,
chunked prefill carrying the conv and delta states across steps, three prompts sharing steps
with two state slots, again in reverse order, a one-token prompt, a KV pool so small that
requests are preempted and their states rebuilt by recompute).
"""

from __future__ import annotations

import json

import pytest
import torch
from arch_cases import NEW, SMALL_POOL, case_fixture, check, generate, prompts
from hf_oracle import hf_greedy_plain, save_word_tokenizer
from hybrid_cases import DELTA_HEADS, FULL, LIN, check_missing_refused, check_refused
from hybrid_checks import (
    check_chunked_batched_preempted,
    check_decode_slots_out_of_order,
    check_warm_prefix,
    warm_prompts,
)
from pagoda.runtime import LLM

transformers = pytest.importorskip("transformers")

QWEN = ("qwen3-next", "qwen3.5", "qwen3.5-moe")


def _conditional(path):
    """Qwen3_5ForConditionalGeneration with a tiny vision tower, saved as the published
    checkpoints are (config.json's text_config, `model.language_model.` tensors)."""
    text = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                layer_types=[LIN, FULL], linear_num_key_heads=2, linear_num_value_heads=2,
                linear_key_head_dim=16, linear_value_head_dim=16, **DELTA_HEADS,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                 "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 0],
                                 "mrope_interleaved": True})  # fmt: skip
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64,
                  patch_size=4, num_position_embeddings=16)  # fmt: skip
    cfg = transformers.Qwen3_5Config(text_config=text, vision_config=vision)
    torch.manual_seed(0)
    model = transformers.Qwen3_5ForConditionalGeneration(cfg).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0) if p.dim() > 1 else p.add_(0.2 * torch.randn(p.shape, generator=g))
    model.save_pretrained(path)
    save_word_tokenizer(path, 300)
    return model


case = case_fixture(QWEN)


def test_greedy_matches_transformers_chunked_batched_and_preempted(case):
    check_chunked_batched_preempted(case)


def test_long_and_short_prompts_in_one_step(built):
    """One step holds a decode row (a one-token prompt), a prompt of three of the rule's
    64-token chunks and one of two, in the packed layout (each sequence in chunks of its
    own); every sequence reads as transformers'."""
    from arch_cases import generate as run

    _, model, loaded, _ = built("qwen3-next")
    ps = [[9], [(3 * i + 1) % 290 + 5 for i in range(150)], [(7 * i) % 290 + 5 for i in range(70)]]
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20,
              max_num_batched_tokens=512, max_num_seqs=4)  # fmt: skip
    for i, (p, got) in enumerate(zip(ps, run(llm, ps))):
        check(got, hf_greedy_plain(model, p, NEW), f"prompt {i}")


def test_the_multimodal_checkpoint_reads_as_its_text_model(built):
    """Qwen3_5ForConditionalGeneration as published (architectures and text_config in
    config.json, the text weights under `model.language_model.`, a vision tower beside them,
    the multimodal rotary's sections): its text model serves, transformers' tokens chunked and
    batched."""
    from safetensors import safe_open

    path, _, loaded, reference = built("qwen3.5-vl", _conditional)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3_5ForConditionalGeneration"] and "text_config" in cfg
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    assert any(n.startswith("model.language_model.layers.0.linear_attn.") for n in names)
    assert any(n.startswith("model.visual.") for n in names)
    assert loaded.config.architecture == "qwen3_5" and not loaded.config.tie_word_embeddings
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, block_size=16,
              max_num_batched_tokens=16, max_num_seqs=3)  # fmt: skip
    for i, (got, want) in enumerate(zip(generate(llm, prompts()), reference)):
        check(got, want, f"qwen3.5-vl: prompt {i}")


# Qwen/Qwen3-Next-80B-A3B-Instruct's config.json (its keys as published)
QWEN3_NEXT_80B = {
    "architectures": ["Qwen3NextForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645,
    "full_attention_interval": 4, "head_dim": 256, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 5120, "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "linear_value_head_dim": 128, "max_position_embeddings": 262144, "mlp_only_layers": [],
    "model_type": "qwen3_next", "moe_intermediate_size": 512, "norm_topk_prob": True,
    "num_attention_heads": 16, "num_experts": 512, "num_experts_per_tok": 10,
    "num_hidden_layers": 48, "num_key_value_heads": 2, "output_router_logits": False,
    "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 10000000, "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 512,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936,
}  # fmt: skip


@pytest.mark.parametrize("name", ["qwen3-next", "qwen3.5"])
def test_estimates_checks_and_refusals(built, tmp_path, name):
    """The weights estimate against the built model (one rank, and rank 0 of two); state slots of a conv state [q k v
    channels, kernel - 1] and a float32 state [v heads, key dim, value dim] per DeltaNet layer
    (the prefill temporaries counted); the checkpoint check naming a DeltaNet tensor; a tensor
    parallel size that does not divide the key heads, and FP8, refused in one line; Qwen3-Next-80B's config.json read without
    weights (its default layer pattern, a quarter of each head rotated, 80B parameters)."""
    from model_bytes import check_estimate
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.distributed.layout import check as tp_check
    from pagoda.runtime.model import mamba2
    from pagoda.runtime.model.loader import read_model_config
    from pagoda.runtime.server import memory

    path, _, loaded, _ = built(name)
    mc = loaded.config
    check_estimate(path, rel=0.02)
    cfg = EngineConfig.create(str(path), device="cpu", dtype="bfloat16", max_num_seqs=8)
    state = memory.estimate(mc, cfg, path, torch.device("cpu")).parts()["Mamba state"]
    m = mc.family.mamba
    per = m.conv_dim * (m.d_conv - 1) * 2 + m.n_heads * m.d_state * m.head_dim * 4
    assert state == 8 * m.num_layers * per and mamba2.scan_bytes(mc, 256, 8) > 0
    check_refused(name, mc)
    tp_check(mc, 2)
    check_estimate(path, tp=2, rel=0.02)  # rank 0's share
    check_missing_refused(loaded, ["model.layers.0.linear_attn.dt_bias"])
    if name != "qwen3-next":
        return
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_NEXT_80B))
    hub = read_model_config(str(tmp_path))
    assert hub.family.mamba.layers == tuple(i % 4 != 3 for i in range(48))
    assert hub.num_kv_layers == 12 and hub.rope_scaling["partial_rotary_factor"] == 0.25
    assert hub.rope_theta == 1e7 and hub.family.num_experts == 512
    assert 79e9 < hub.num_params < 82e9  # Qwen3-Next-80B-A3B


def test_a_published_qwen3_5_moe_checkpoint_with_stacked_experts(built, tmp_path):
    """Qwen3.5-MoE as published (Qwen3.5-35B-A3B): `Qwen3_5MoeForConditionalGeneration`, the
    text config under `text_config`, the weights under `model.language_model.`, each layer's
    experts stacked (`mlp.experts.gate_up_proj` [E, 2N, hidden], gate first, and `down_proj`
    [E, hidden, N], no `.weight`): the tiny Qwen3.5-MoE rewritten so reads as transformers'
    per-expert one; the weights estimate matches the model built from it; a stacked tensor of
    the wrong shape is refused in one line."""
    import re

    from model_bytes import check_estimate
    from pagoda.runtime.model.loader import load_model
    from safetensors.torch import load_file, save_file

    path, _, _, reference = built("qwen3.5-moe")
    flat = load_file(str(path / "model.safetensors"))
    cfg = json.loads((path / "config.json").read_text())
    out, experts = {}, cfg["num_experts"]
    for name, t in flat.items():
        m = re.fullmatch(r"(model\.layers\.\d+\.mlp\.experts\.)(\d+)\.(\w+)\.weight", name)
        if m is None:
            out[name.replace("model.", "model.language_model.", 1)] = t
        elif m[2] == "0":
            p = m[1]
            per = [[flat[f"{p}{e}.{x}.weight"] for e in range(experts)] for x in
                   ("gate_proj", "up_proj", "down_proj")]  # fmt: skip
            if m[3] == "gate_proj":
                gate_up = [torch.cat([g, u]) for g, u in zip(per[0], per[1])]
                out[p.replace("model.", "model.language_model.", 1) + "gate_up_proj"] = torch.stack(
                    gate_up
                ).contiguous()
            elif m[3] == "down_proj":
                out[p.replace("model.", "model.language_model.", 1) + "down_proj"] = torch.stack(
                    per[2]
                ).contiguous()
    save_file(out, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    top = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
           "text_config": {**cfg, "model_type": "qwen3_5_moe_text"}, "tie_word_embeddings": False,
           "vision_config": {"depth": 27, "hidden_size": 1152}}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(top))
    save_word_tokenizer(tmp_path, 300)
    loaded = load_model(str(tmp_path))
    assert loaded.config.architecture == "qwen3_5_moe"
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, block_size=16,
              max_num_batched_tokens=16, max_num_seqs=3)  # fmt: skip
    for i, (got, want) in enumerate(zip(generate(llm, prompts()), reference)):
        check(got, want, f"stacked experts: prompt {i}")
    check_estimate(tmp_path, rel=0.02)
    bad = "model.language_model.layers.1.mlp.experts.down_proj"
    out[bad] = out[bad][:, :, :-1].contiguous()
    save_file(out, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=re.escape(f"checkpoint tensor {bad} is [4, 64, 31]")):
        load_model(str(tmp_path))


def test_decode_slots_in_a_run_and_out_of_order(built, monkeypatch):
    _, model, loaded, _ = built("qwen3.5")
    check_decode_slots_out_of_order(model, loaded, monkeypatch)


@pytest.mark.slow  # a second process (gloo): ~6 s on 2 busy cores
def test_two_ranks_match_transformers(built):
    """Tensor parallelism over gloo, two ranks: each holds one of Qwen3-Next's two key heads
    and the two value heads it serves (their rows of the DeltaNet projection, conv channels, A,
    dt_bias and state slots; out_proj row-parallel), two of the four query heads with their
    gates and one KV head, the experts and the shared expert split by width; on the small pool
    (16-token chunks, three prompts sharing steps, preempted and recomputed), then from each
    rank's snapshots of its states on a warm prefix: transformers' tokens and logits."""
    path, model, loaded, reference = built("qwen3-next")
    with LLM(str(path), loaded=loaded, tensor_parallel_size=2, **SMALL_POOL) as two:
        got = generate(two, prompts())
        core = two.engine
        assert core.scheduler.num_preemptions > 0
        m = loaded.config.family.mamba
        conv, state = core.runner.mamba.states[0]  # this rank's heads
        assert state.shape[1:] == (m.n_heads // 2, m.d_state, m.head_dim)
        assert conv.shape[1] == m.conv_dim // 2
        core.check_integrity()
    for i, g in enumerate(got):
        check(g, reference[i], f"qwen3-next: prompt {i}, two ranks")
    # prefix caching: each rank's snapshots of its heads' states, restored on a hit
    first, second, want = warm_prompts(model)
    with LLM(str(path), loaded=loaded, tensor_parallel_size=2, dtype="float32",
             kv_cache_memory=16 << 20, block_size=16, max_num_batched_tokens=256,
             max_num_seqs=2, max_model_len=256) as two:  # fmt: skip
        generate(two, [first])
        hits = two.engine.kv.prefix_hits
        check(generate(two, [second])[0], want, "two ranks, warm")
        assert two.engine.kv.prefix_hits - hits == 128


def test_an_fp8_checkpoint_reads_dequantized(built, tmp_path, monkeypatch):
    """An FP8 export of the tiny Qwen3-Next (every projection E4M3 with a scale per output row,
    the DeltaNet's interleaved `in_proj_qkvz` and `in_proj_ba` and attention's gated q_proj
    among them; the routers and the shared expert's gate kept 16-bit, as the published FP8
    checkpoints keep them): where the FP8 kernels do not run its weights are dequantized at
    load, and it reads as transformers over the dequantized weights. The kernels are made
    absent: under TRITON_INTERPRET=1 (as CI runs) a CPU counts as running them, and the
    layers they take would quantize their activations per token (logits ~0.1 off)."""
    from pagoda.kernels import fp8 as math
    from pagoda.runtime import config
    from pagoda.runtime.model.loader import load_model
    from pagoda.runtime.worker import model_build

    monkeypatch.setattr(config, "fp8_runs_on", lambda device: False)
    monkeypatch.setattr(model_build, "fp8_runs_on", lambda device: False)
    from safetensors.torch import load_file, save_file

    path, _, _, _ = built("qwen3-next")
    quant, dense = {}, {}
    for name, t in load_file(str(path / "model.safetensors")).items():
        kept = name.endswith(("mlp.gate.weight", "shared_expert_gate.weight", "norm.weight"))
        if t.dim() != 2 or kept or name in ("model.embed_tokens.weight", "lm_head.weight"):
            quant[name] = dense[name] = t
            continue
        codes, scale = math.quantize_weight(t)
        quant[name], quant[name.removesuffix("weight") + "weight_scale"] = codes, scale
        dense[name] = math.dequantize(codes, scale.reshape(-1, 1))
    fp8, deq = tmp_path / "fp8", tmp_path / "dequantized"
    for d, tensors in ((fp8, quant), (deq, dense)):
        d.mkdir()
        for f in path.iterdir():
            if f.name != "model.safetensors":
                (d / f.name).write_bytes(f.read_bytes())
        save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((fp8 / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                  "ignored_layers": ["lm_head"]}  # fmt: skip
    (fp8 / "config.json").write_text(json.dumps(cfg))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(deq), dtype=torch.float32)
    llm = LLM(loaded=load_model(str(fp8)), dtype="float32", kv_cache_memory=16 << 20,
              block_size=16, max_num_batched_tokens=16, max_num_seqs=3)  # fmt: skip
    for i, (p, got) in enumerate(zip(prompts(), generate(llm, prompts()))):
        check(got, hf_greedy_plain(model.eval(), p, NEW), f"fp8 checkpoint: prompt {i}")


def test_a_warm_prefix_restores_the_delta_state(built, monkeypatch):
    _, model, loaded, _ = built("qwen3.5")
    check_warm_prefix("qwen3.5", model, loaded, monkeypatch)
