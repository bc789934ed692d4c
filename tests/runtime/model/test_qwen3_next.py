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

Each runs its prompts in 16-token steps (chunked prefill carries the conv and delta states
across steps), three prompts sharing steps with two state slots, then a one-token prompt on a reused slot, then a KV pool so small that requests
are preempted (their states rebuilt by recompute).
"""

from __future__ import annotations

import json

import pytest
import torch
from arch_cases import NEW, SMALL_POOL, built_fixture, case_fixture, check, generate, prompts
from hf_oracle import hf_greedy_plain, make_tiny_model, save_word_tokenizer
from pagoda.runtime import LLM

transformers = pytest.importorskip("transformers")

LIN, FULL = "linear_attention", "full_attention"
SMALL = dict(head_dim=16, num_attention_heads=4, num_key_value_heads=2)
CASES = {
    "qwen3-next": ("Qwen3Next", dict(
        **SMALL, num_hidden_layers=3, layer_types=[LIN, FULL, LIN], linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, mlp_only_layers=[2], norm_topk_prob=False)),
    "qwen3.5": ("Qwen3_5Text", dict(
        **SMALL, num_hidden_layers=3, layer_types=[LIN, LIN, FULL], linear_num_key_heads=2,
        linear_num_value_heads=2, linear_key_head_dim=32, linear_value_head_dim=16,
        linear_conv_kernel_dim=3, tie_word_embeddings=True)),
    "qwen3.5-moe": ("Qwen3_5MoeText", dict(
        **SMALL, num_hidden_layers=2, layer_types=[FULL, LIN], linear_num_key_heads=1,
        linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=32,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32)),
}  # fmt: skip


def _conditional(path):
    """Qwen3_5ForConditionalGeneration with a tiny vision tower, saved as the published
    checkpoints are (config.json's text_config, `model.language_model.` tensors)."""
    text = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                layer_types=[LIN, FULL], linear_num_key_heads=2, linear_num_value_heads=2,
                linear_key_head_dim=16, linear_value_head_dim=16, **SMALL,
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


def _make(name: str, path):
    if name == "qwen3.5-vl":
        return _conditional(path)
    arch, overrides = CASES[name]
    return make_tiny_model(path, arch, **overrides)


built = built_fixture(_make)
case = case_fixture(CASES)


def test_greedy_matches_transformers_chunked_batched_and_preempted(case):
    name, _, model, loaded, reference = case
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, block_size=16,
              max_num_batched_tokens=16, max_num_seqs=2)  # fmt: skip
    assert llm.engine.config.cache.enable_prefix_caching  # (no boundary in these prompts)
    for i, (got, want) in enumerate(zip(generate(llm, prompts()), reference)):
        check(got, want, f"{name}: prompt {i}")
    assert llm.engine.runner.mamba.num_held == 0
    one = [7]  # a one-token prompt: its first step is a decode row
    check(generate(llm, [one])[0], hf_greedy_plain(model, one, NEW), f"{name}: one token")
    small = LLM(loaded=loaded, **SMALL_POOL)
    got = generate(small, prompts())
    assert small.engine.scheduler.num_preemptions > 0
    for i, want in enumerate(reference):
        check(got[i], want, f"{name}: prompt {i}, preempted")
    small.engine.check_integrity()


def test_the_chunked_rule_is_transformers_over_the_packed_layout():
    """`gated_delta.prefill` over three sequences (3 chunks of 8, one token, a whole chunk)
    packed together, each from its own state, against transformers' torch chunked rule run
    on each alone (q/k normalised inside it); then one `recurrent_step` of all three against
    transformers' recurrent rule."""
    from pagoda.runtime.model import gated_delta
    from pagoda.runtime.model.mamba2 import ScanGroup
    from pagoda.runtime.model.ssd import pack
    from transformers.models.qwen3_next import modeling_qwen3_next as hf

    torch.manual_seed(0)
    lens, H, K, V, chunk = [19, 1, 8], 2, 16, 8, 8
    T = sum(lens)
    q, k = torch.randn(T, H, K), torch.randn(T, H, K)
    v, g, beta = torch.randn(T, H, V), -torch.rand(T, H) * 2, torch.rand(T, H)
    start = torch.randn(3, H, K, V)
    ssm = torch.zeros(5, H, K, V)
    slots = torch.tensor([3, 0, 4])
    ssm[slots] = start
    p = pack(lens, chunk, 4)
    groups = [ScanGroup(grp.counts, grp.num_chunks, slots[torch.from_numpy(p.order)][slice(*grp.seqs)],
                        *(torch.from_numpy(a) for a in (grp.tokens, grp.rows, grp.chunk_of, grp.in_chunk)))
              for grp in p.groups]  # fmt: skip
    qn, kn = gated_delta.l2norm(q) * K**-0.5, gated_delta.l2norm(k)
    out = gated_delta.prefill(qn, kn, v, g, beta, ssm, groups, chunk)
    off = 0
    for i, n in enumerate(lens):
        rows = slice(off, off + n)
        want, final = hf.torch_chunk_gated_delta_rule(
            q[None, rows], k[None, rows], v[None, rows], g[None, rows], beta[None, rows],
            chunk_size=chunk, initial_state=start[i : i + 1], output_final_state=True,
            use_qk_l2norm_in_kernel=True)  # fmt: skip
        torch.testing.assert_close(out[rows], want[0], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(ssm[slots[i]], final[0], atol=1e-4, rtol=1e-4)
        off += n
    state = ssm[slots].clone()
    x = [torch.randn(3, H, d) for d in (K, K, V)]
    gt, bt = -torch.rand(3, H), torch.rand(3, H)
    got = gated_delta.recurrent_step(state, gated_delta.l2norm(x[0]) * K**-0.5,
                                     gated_delta.l2norm(x[1]), x[2], gt, bt)  # fmt: skip
    want, final = hf.torch_recurrent_gated_delta_rule(
        x[0][:, None], x[1][:, None], x[2][:, None], gt[:, None], bt[:, None],
        initial_state=ssm[slots], output_final_state=True, use_qk_l2norm_in_kernel=True)  # fmt: skip
    torch.testing.assert_close(got, want[:, 0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state, final, atol=1e-5, rtol=1e-5)


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

    path, _, loaded, reference = built("qwen3.5-vl")
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
    import re
    from types import SimpleNamespace

    from model_bytes import check_estimate
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.distributed.layout import check as tp_check
    from pagoda.runtime.engine.core import check_dtype
    from pagoda.runtime.model import mamba2
    from pagoda.runtime.model.checkpoint_check import check_checkpoint
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
    with pytest.raises(ValueError, match=re.escape("--tensor-parallel-size 4 does not divide "
                                                   "the Gated DeltaNet key heads "
                                                   "(linear_num_key_heads 2)")):  # fmt: skip
        tp_check(mc, 4)
    tp_check(mc, 2)
    check_estimate(path, tp=2, rel=0.02)  # rank 0's share
    fp8 = SimpleNamespace(quantization="fp8", torch_dtype=lambda: torch.bfloat16)  # (a CPU
    # refuses the config itself: what check_dtype reads of one)
    with pytest.raises(ValueError, match=r"fp8 is not supported .*\(gated_deltanet layers\)"):
        check_dtype(fp8, mc)
    headers = {n: loaded.weights.dtype_and_shape(n) for n in loaded.weights}
    check_checkpoint(mc, headers)
    gone = "model.layers.0.linear_attn.dt_bias"
    del headers[gone]
    with pytest.raises(ValueError, match=re.escape(f"missing tensor '{gone}'")):
        check_checkpoint(mc, headers)
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
    """A request that finishes early gives its slot to the next one: the decode rows' slots
    are then not one run (0, 2, 1: gathered and scattered back) where before they were (the
    states updated where they lie); every sequence still reads as transformers'."""
    from pagoda.runtime import SamplingParams
    from pagoda.runtime.worker import mamba_state

    _, model, loaded, _ = built("qwen3.5")
    runs = []
    step = mamba_state.MambaState.device_step

    def record(self, host, to_device):
        out = step(self, host, to_device)
        runs.append(out.decode_run if out.num_decodes > 1 else "one")
        return out

    monkeypatch.setattr(mamba_state.MambaState, "device_step", record)
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, max_num_seqs=3)
    ps = [[5 + i, 17, 42 + i, 9] for i in range(4)]
    lens = [NEW, 2, NEW, NEW]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lens]
    seen: dict[str, list[torch.Tensor]] = {}
    llm.engine.runner.logits_hook = lambda reqs, lg: [
        seen.setdefault(r.request_id, []).append(row.clone()) for r, row in zip(reqs, lg.float())
    ]
    outs = llm.generate([{"prompt_token_ids": p} for p in ps], params)
    for i, (p, n, o) in enumerate(zip(ps, lens, outs)):
        check((o.outputs[0].token_ids, seen[o.request_id]), hf_greedy_plain(model, p, n), f"{i}")
    assert None in runs and any(r not in (None, "one") for r in runs)


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
    first, second, want = _warm_prompts(model)
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
    from pagoda.runtime.worker import model_runner

    monkeypatch.setattr(config, "fp8_runs_on", lambda device: False)
    monkeypatch.setattr(model_runner, "fp8_runs_on", lambda device: False)
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


def _warm_prompts(model):
    """A 153-token prompt, one sharing its first 140 tokens, transformers' reference of it."""
    shared = [(11 * i + 3) % 290 + 5 for i in range(150)]
    second = [*shared[:140], 21, 22]
    return [*shared, 7, 8, 9], second, hf_greedy_plain(model, second, NEW)


def test_a_warm_prefix_restores_the_delta_state(built, monkeypatch):
    """Prefix caching: snapshots of the conv and delta states every 64 tokens (the 16-token
    blocks' and the rule's 64-token chunks' common multiple), saved from inside the chunked
    rule (a whole 153-token prompt in one step: its packed chunks' start states, the conv
    inputs before them) or from the slots (16-token steps: boundaries at a chunk's end). A
    prompt sharing 140 tokens then restores the one at 128 and computes the rest: transformers'
    tokens and logits, 128 cached tokens; with the restore replaced by zeros, it does not."""
    from pagoda.runtime.worker.mamba_state import MambaState

    _, model, loaded, _ = built("qwen3.5")
    first, second, want = _warm_prompts(model)
    for budget in (256, 16):
        llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, block_size=16,
                  max_num_batched_tokens=budget, max_num_seqs=2, max_model_len=256)  # fmt: skip
        generate(llm, [first])
        hits = llm.engine.kv.prefix_hits
        check(generate(llm, [second])[0], want, f"warm after {budget}-token steps")
        assert llm.engine.kv.prefix_hits - hits == 128
    restored = []

    def zeroed(self, slots, entries):  # what a hit would compute without the snapshot
        restored.append(len(slots))
        for conv, state in self.states.values():
            conv.index_fill_(0, slots, 0)
            state.index_fill_(0, slots, 0)

    monkeypatch.setattr(MambaState, "restore", zeroed)
    with pytest.raises(AssertionError):
        check(generate(llm, [second])[0], want, "restore skipped")
    assert restored == [1]
