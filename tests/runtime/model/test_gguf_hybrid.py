"""GGUFs of Granite 4.0-H (llama.cpp's `granitehybrid`), written here as llama.cpp's converter
(`GraniteHybridModel`) writes them: the `ssm.*` keys, `attention.head_count_kv` a value a layer
(0 on the Mamba2 layers), the mixer's tensors in llama.cpp's forms (A as -exp(A_log) and D as
[n_head, 1], the conv squeezed, the norm [groups, channels / groups], dt_bias as `ssm_dt.bias`),
the shared MLP's and the experts' gate and up apart, Q/K permuted, Q8_0 matrices: the engine
matches transformers running on exactly the dequantized weights, token for token, and the
start-up weights estimate is what the built model holds."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from hf_oracle import hf_greedy_plain, make_tiny_model
from pagoda.runtime.model.gguf_loader import load_gguf
from test_gguf_archs import PROMPTS, _check_estimate, _generate
from test_gguf_families import _byte_level_vocab, _oracle, _permute

transformers = pytest.importorskip("transformers")
MAMBA = dict(mamba_n_heads=4, mamba_d_state=16, mamba_chunk_size=8, mamba_n_groups=2)
CASES = {
    "dense": dict(num_hidden_layers=3, layer_types=["attention", "mamba", "mamba"], **MAMBA,
                  num_local_experts=0, shared_intermediate_size=64, embedding_multiplier=2.0,
                  residual_multiplier=0.5, attention_multiplier=0.1, logits_scaling=1.5),
    "moe": dict(num_hidden_layers=3, layer_types=["mamba", "attention", "mamba"], **MAMBA,
                num_local_experts=4, num_experts_per_tok=2, intermediate_size=32,
                shared_intermediate_size=64),
    # Bamba, which the converter writes as `granitehybrid` too: rotary (half of each head) on
    # its attention layers, a dense biased MLP, no scalars
    "bamba": dict(num_hidden_layers=3, attn_layer_indices=[1], **MAMBA, mamba_d_head=32,
                  mlp_bias=True, max_position_embeddings=512),
}  # fmt: skip


def _store(w, name: str, arr: np.ndarray, qtype=Q.Q8_0) -> np.ndarray:
    """`arr` written as `name` (Q8_0 where 2-D or more, else F32); what the file gives back."""
    if arr.ndim == 1 or qtype == Q.F32:
        data = back = np.ascontiguousarray(arr, dtype=np.float32)
        qtype = Q.F32
    else:
        data = gguf.quants.quantize(np.ascontiguousarray(arr), qtype)
        back = gguf.quants.dequantize(data, qtype).reshape(arr.shape)
    w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
    return back


def convert(path, hf_dir) -> dict[str, torch.Tensor]:
    """The checkpoint as llama.cpp's converter writes a `granitehybrid` file (module
    docstring); the checkpoint's tensors as the file gives them back."""
    from safetensors.torch import load_file

    cfg = transformers.AutoConfig.from_pretrained(hf_dir)
    sd = {k: v.float().numpy() for k, v in load_file(str(hf_dir / "model.safetensors")).items()}
    n, experts = cfg.num_hidden_layers, getattr(cfg, "num_local_experts", 0)
    bamba = cfg.model_type == "bamba"
    if bamba:  # Granite's names for its MLP, its norms
        renamed = {"feed_forward.gate_proj": "shared_mlp.gate", "feed_forward.up_proj":
                   "shared_mlp.up", "feed_forward.down_proj": "shared_mlp.output_linear",
                   "pre_ff_layernorm": "post_attention_layernorm",
                   "final_layernorm": "norm"}  # fmt: skip
        for k in list(sd):
            for old, new in renamed.items():
                if f".{old}." in k:
                    sd[k.replace(old, new)] = sd.pop(k)
        for kind in ("weight", "bias"):
            parts = [sd.pop(f"model.layers.{i}.shared_mlp.{p}.{kind}", None) for i in range(n)
                     for p in ("gate", "up")]  # fmt: skip
            for i in range(n) if parts[0] is not None else ():
                sd[f"model.layers.{i}.shared_mlp.input_linear.{kind}"] = np.concatenate(
                    parts[2 * i : 2 * i + 2]
                )
        attn = list(cfg.attn_layer_indices)
    else:
        attn = [i for i, t in enumerate(cfg.layer_types) if t in ("attention", "full_attention")]
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    inner = cfg.mamba_expand * cfg.hidden_size
    w = gguf.GGUFWriter(str(path), "granitehybrid")
    w.add_block_count(n)
    w.add_context_length(cfg.max_position_embeddings if bamba else 2**20)  # NoPE: 2**20
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(heads)
    w.add_head_count_kv([kv if i in attn else 0 for i in range(n)])
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if bamba:  # (its config's attn_rotary_emb: half of each head, as transformers rotates)
        w.add_rope_dimension_count(cfg.hidden_size // heads // 2)
    else:
        w.add_embedding_scale(cfg.embedding_multiplier)
        w.add_residual_scale(cfg.residual_multiplier)
        w.add_attention_scale(cfg.attention_multiplier)
        w.add_logit_scale(cfg.logits_scaling)
        w.add_expert_shared_feed_forward_length(cfg.shared_intermediate_size)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_ssm_conv_kernel(cfg.mamba_d_conv)
    w.add_ssm_state_size(cfg.mamba_d_state)
    w.add_ssm_group_count(cfg.mamba_n_groups)
    w.add_ssm_inner_size(inner)
    w.add_ssm_time_step_rank(cfg.mamba_n_heads)
    w.add_rope_scaling_finetuned(bamba)  # (llama.cpp: rotary only then)
    tokens, types, merges = _byte_level_vocab(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(cfg.vocab_size - 1)
    out = {"model.embed_tokens.weight": _store(w, "token_embd.weight",
                                               sd["model.embed_tokens.weight"]),
           "model.norm.weight": _store(w, "output_norm.weight", sd["model.norm.weight"])}  # fmt: skip
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = _store(w, "output.weight", sd["lm_head.weight"])
    for i in range(n):
        p, b = f"model.layers.{i}.", f"blk.{i}."

        def put(gname, hf, arr=None, qtype=Q.Q8_0, p=p, b=b):
            out[p + hf] = _store(w, b + gname, sd[p + hf] if arr is None else arr, qtype)

        put("attn_norm.weight", "input_layernorm.weight")
        put("ffn_norm.weight", "post_attention_layernorm.weight")
        if i in attn:
            for g, hf, h in (("attn_q", "q_proj", heads), ("attn_k", "k_proj", kv)):
                stored = _store(w, f"{b}{g}.weight", _permute(sd[f"{p}self_attn.{hf}.weight"], h))
                out[f"{p}self_attn.{hf}.weight"] = _unpermute(stored, h)
            put("attn_v.weight", "self_attn.v_proj.weight")
            put("attn_output.weight", "self_attn.o_proj.weight")
        else:
            m = p + "mamba."
            put("ssm_in.weight", "mamba.in_proj.weight")
            put("ssm_out.weight", "mamba.out_proj.weight")
            put("ssm_conv1d.weight", "mamba.conv1d.weight", sd[m + "conv1d.weight"].squeeze(1),
                Q.F32)  # fmt: skip
            out[m + "conv1d.weight"] = out[m + "conv1d.weight"][:, None, :]
            put("ssm_conv1d.bias", "mamba.conv1d.bias")
            put("ssm_dt.bias", "mamba.dt_bias")
            a = _store(w, b + "ssm_a", -np.exp(sd[m + "A_log"])[:, None], Q.F32)
            out[m + "A_log"] = np.log(-a[:, 0])
            out[m + "D"] = _store(w, b + "ssm_d", sd[m + "D"][:, None], Q.F32)[:, 0]
            g = cfg.mamba_n_groups
            norm = _store(w, b + "ssm_norm.weight", sd[m + "norm.weight"].reshape(g, -1), Q.F32)
            out[m + "norm.weight"] = norm.reshape(-1)
        s, x = ("_shexp", p + "shared_mlp.") if experts else ("", p + "shared_mlp.")
        for kind in ("weight", "bias") if bamba else ("weight",):
            gate, up = np.split(sd[f"{x}input_linear.{kind}"], 2, axis=0)
            out[f"{x}input_linear.{kind}"] = np.concatenate(
                [_store(w, f"{b}ffn_gate{s}.{kind}", gate), _store(w, f"{b}ffn_up{s}.{kind}", up)]
            )
            out[f"{x}output_linear.{kind}"] = _store(w, f"{b}ffn_down{s}.{kind}",
                                                     sd[f"{x}output_linear.{kind}"])  # fmt: skip
        if experts:
            e = p + "block_sparse_moe."
            put("ffn_gate_inp.weight", "block_sparse_moe.router.layer.weight", qtype=Q.F32)
            gate, up = np.split(sd[e + "input_linear.weight"], 2, axis=1)
            out[e + "input_linear.weight"] = np.concatenate(
                [_store(w, b + "ffn_gate_exps.weight", gate),
                 _store(w, b + "ffn_up_exps.weight", up)], axis=1)  # fmt: skip
            put("ffn_down_exps.weight", "block_sparse_moe.output_linear.weight")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in out.items()}


NEMOTRON = dict(layers_block_type=["mamba", "mlp", "attention", "mlp", "mamba"],
                num_hidden_layers=5, mamba_num_heads=4, mamba_head_dim=32, ssm_state_size=16,
                n_groups=2, chunk_size=8, head_dim=16, use_bias=True, mlp_bias=True)  # fmt: skip


NEMOTRON_MOE = dict(NEMOTRON, layers_block_type=["mamba", "moe", "attention", "moe", "mamba"],
                    n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                    moe_shared_expert_intermediate_size=96, n_group=1, topk_group=1,
                    routed_scaling_factor=2.5)  # fmt: skip


def convert_nemotron_h(path, hf_dir) -> dict[str, torch.Tensor]:
    """The checkpoint as llama.cpp's converter (`NemotronHModel`) writes a `nemotron_h` file:
    `attention.head_count_kv` and `feed_forward_length` a value a layer (0 where the layer has
    none), the mixer as Granite 4.0-H's; the tensors as the file gives them back, by the
    checkpoint's (`backbone.`) names. With experts a `nemotron_h_moe` file: the MoE layers'
    `feed_forward_length` the experts' width, the `expert_*` keys, each layer's experts
    stacked (`ffn_up_exps`, `ffn_down_exps`), the router's bias `exp_probs_b.bias`."""
    from pagoda.runtime.model.nemotron_h_config import nemotron_name
    from safetensors.torch import load_file

    cfg = transformers.AutoConfig.from_pretrained(hf_dir)
    sd = {k: v.float().numpy() for k, v in load_file(str(hf_dir / "model.safetensors")).items()}
    types, heads, kv = cfg.layers_block_type, cfg.num_attention_heads, cfg.num_key_value_heads
    n, moe = len(types), "moe" in types
    w = gguf.GGUFWriter(str(path), "nemotron_h_moe" if moe else "nemotron_h")
    w.add_block_count(n)
    w.add_context_length(2**20)
    w.add_embedding_length(cfg.hidden_size)
    if moe:  # (the converter's: only the "moe" layers count, its dense ones' none)
        w.add_feed_forward_length([cfg.moe_intermediate_size if t == "moe" else 0 for t in types])
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        w.add_expert_shared_feed_forward_length(cfg.moe_shared_expert_intermediate_size)
        w.add_expert_count(cfg.n_routed_experts)
        w.add_expert_shared_count(cfg.n_shared_experts)
        w.add_expert_weights_norm(cfg.norm_topk_prob)
        w.add_expert_weights_scale(cfg.routed_scaling_factor)
        w.add_expert_group_count(cfg.n_group)
        if cfg.moe_latent_size is not None:
            w.add_moe_latent_size(cfg.moe_latent_size)
    else:
        w.add_feed_forward_length([cfg.intermediate_size if t == "mlp" else 0 for t in types])
    w.add_head_count(heads)
    w.add_head_count_kv([kv if t in ("attention", "full_attention") else 0 for t in types])
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(cfg.layer_norm_epsilon)
    w.add_ssm_conv_kernel(cfg.conv_kernel)
    w.add_ssm_state_size(cfg.ssm_state_size)
    w.add_ssm_group_count(cfg.n_groups)
    w.add_ssm_inner_size(cfg.mamba_num_heads * cfg.mamba_head_dim)
    w.add_ssm_time_step_rank(cfg.mamba_num_heads)
    w.add_rope_scaling_finetuned(False)
    tokens, types_, merges = _byte_level_vocab(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types_)
    w.add_token_merges(merges)
    w.add_eos_token_id(cfg.vocab_size - 1)
    gnames = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
              "output_norm.weight", "lm_head.weight": "output.weight"}  # fmt: skip
    parts = {"input_layernorm": "attn_norm", "mamba.in_proj": "ssm_in", "mamba.out_proj":
             "ssm_out", "mamba.conv1d": "ssm_conv1d", "mamba.norm": "ssm_norm",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate": "ffn_gate_inp",
             "mlp.shared_experts.up_proj": "ffn_up_shexp",
             "mlp.shared_experts.down_proj": "ffn_down_shexp",
             "mlp.fc1_latent_proj": "ffn_latent_down", "mlp.fc2_latent_proj": "ffn_latent_up"}  # fmt: skip
    out = {}
    for i in range(n) if moe else ():  # each MoE layer's experts, stacked
        for x in ("up", "down"):
            names = [f"backbone.layers.{i}.mixer.experts.{e}.{x}_proj.weight"
                     for e in range(cfg.n_routed_experts)]  # fmt: skip
            if names[0] in sd:
                back = _store(
                    w, f"blk.{i}.ffn_{x}_exps.weight", np.stack([sd.pop(k) for k in names])
                )
                out.update(zip(names, back))
    for stored, arr in sd.items():
        name = stored if stored == "lm_head.weight" else nemotron_name(stored)
        if name in gnames:
            out[stored] = _store(w, gnames[name], arr)
            continue
        i, rest = name.removeprefix("model.layers.").split(".", 1)
        b, (part, kind) = f"blk.{i}.", rest.rsplit(".", 1) if "." in rest else (rest, "")
        if rest == "mamba.A_log":
            out[stored] = np.log(-_store(w, b + "ssm_a", -np.exp(arr)[:, None], Q.F32)[:, 0])
        elif rest == "mamba.D":
            out[stored] = _store(w, b + "ssm_d", arr[:, None], Q.F32)[:, 0]
        elif rest == "mlp.gate.e_score_correction_bias":
            out[stored] = _store(w, b + "exp_probs_b.bias", arr)
        elif rest == "mlp.gate.weight":  # (the router in float32, as llama.cpp keeps it)
            out[stored] = _store(w, b + "ffn_gate_inp.weight", arr, Q.F32)
        elif rest == "mamba.dt_bias":
            out[stored] = _store(w, b + "ssm_dt.bias", arr)
        elif rest == "mamba.conv1d.weight":
            out[stored] = _store(w, b + "ssm_conv1d.weight", arr[:, 0], Q.F32)[:, None]
        elif rest == "mamba.norm.weight":
            g = cfg.n_groups
            out[stored] = _store(w, b + "ssm_norm.weight", arr.reshape(g, -1), Q.F32).reshape(-1)
        elif part in ("self_attn.q_proj", "self_attn.k_proj"):
            h = heads if part == "self_attn.q_proj" else kv
            out[stored] = _unpermute(_store(w, f"{b}{parts[part]}.{kind}", _permute(arr, h)), h)
        else:
            out[stored] = _store(w, f"{b}{parts[part]}.{kind}", arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in out.items()}


@pytest.mark.parametrize("moe", [None, 0, 32], ids=["dense", "moe", "moe-latent"])
def test_nemotron_h_gguf_matches_transformers_on_its_dequantized_weights(tmp_path, moe):
    from pagoda.runtime.model.nemotron_h_config import nemotron_name

    hf = NEMOTRON if moe is None else dict(NEMOTRON_MOE, moe_latent_size=moe or None)
    make_tiny_model(tmp_path / "hf", "NemotronH", **hf)
    path = tmp_path / "nemotron_h.gguf"
    expected = convert_nemotron_h(path, tmp_path / "hf")
    oracle = _oracle(tmp_path, expected)
    config, weights, _, _ = load_gguf(path)
    assert config.architecture == "nemotron_h"
    m = config.family.mamba
    assert m.layers == (True, False, False, False, True)
    if moe is not None:
        assert m.moe.latent == (moe or None)
        assert not any(m.mlp_layers) and m.moe.layers == (False, True, False, True, False)
        assert m.moe.routing.routed_scaling_factor == 2.5 and m.moe.shared_intermediate == 96
        for i in (1, 3):  # the experts stacked as the file holds them
            for x in ("up", "down"):
                stack = weights[f"model.layers.{i}.mlp.experts.{x}_proj.weight"]
                for e in range(4):
                    want = expected[f"backbone.layers.{i}.mixer.experts.{e}.{x}_proj.weight"]
                    torch.testing.assert_close(stack[e], want, rtol=1e-6, atol=1e-6)
        expected = {k: v for k, v in expected.items() if ".experts." not in k}
    else:
        assert m.mlp_layers == (False, True, False, True, False)
    assert [m.attention(i) for i in range(5)] == [False, False, True, False, False]
    for name, want in expected.items():
        name = name if name == "lm_head.weight" else nemotron_name(name)
        torch.testing.assert_close(weights[name], want, rtol=1e-6, atol=1e-6,
                                   msg=name)  # fmt: skip
    want = [hf_greedy_plain(oracle, p, 6)[0] for p in PROMPTS]
    assert _generate(path, PROMPTS) == want
    _check_estimate(path, "bfloat16", rel=0)  # its float32 norms counted: exactly


def _bamba_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Bamba's checkpoint names of `convert`'s tensors (Granite's: its MLP, its norms)."""
    out = {}
    for k, v in tensors.items():
        if ".shared_mlp.input_linear." in k:
            gate, up = v.chunk(2)
            kind = k.rsplit(".", 1)[1]
            out[k.replace(f"shared_mlp.input_linear.{kind}", f"feed_forward.gate_proj.{kind}")] = (
                gate
            )
            out[k.replace(f"shared_mlp.input_linear.{kind}", f"feed_forward.up_proj.{kind}")] = up
            continue
        k = k.replace("shared_mlp.output_linear", "feed_forward.down_proj")
        k = k.replace("post_attention_layernorm", "pre_ff_layernorm")
        out[k.replace("model.norm.", "model.final_layernorm.")] = v
    return out


def _unpermute(a, n):
    return a.reshape(n, a.shape[0] // n // 2, 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)


@pytest.mark.parametrize("case", list(CASES))
def test_granite_hybrid_gguf_matches_transformers_on_its_dequantized_weights(tmp_path, case):
    make_tiny_model(tmp_path / "hf", "Bamba" if case == "bamba" else "GraniteMoeHybrid",
                    **CASES[case])  # fmt: skip
    path = tmp_path / f"{case}.gguf"
    expected = convert(path, tmp_path / "hf")
    oracle = _oracle(tmp_path, _bamba_names(expected) if case == "bamba" else expected)
    config, weights, _, _ = load_gguf(path)
    assert config.architecture == "granitemoehybrid"
    m = config.family.mamba
    types = CASES[case].get("layer_types") or ["mamba", "attention", "mamba"]
    assert m.layers == tuple(t == "mamba" for t in types)
    assert (m.n_heads, m.head_dim, m.n_groups, m.d_state) == (4, 32, 2, 16)
    if case == "bamba":  # half of each head rotates; NoPE otherwise
        assert config.rope_scaling == {"partial_rotary_factor": 0.5}
    assert config.family.rope_layers == (() if case == "bamba" else (False,) * 3)
    for name, want in expected.items():  # (Bamba's under Granite's names)
        torch.testing.assert_close(weights[name], want, rtol=1e-6, atol=1e-6, msg=name)
    want = [hf_greedy_plain(oracle, p, 6)[0] for p in PROMPTS]
    assert _generate(path, PROMPTS) == want, case
    _check_estimate(path, "bfloat16")  # (the mixer's tensors counted in the shapes it holds)


FALCON = dict(num_hidden_layers=2, mamba_n_heads=4, mamba_d_head=16, mamba_d_ssm=64,
              mamba_d_state=16, mamba_n_groups=2, mamba_chunk_size=8, mamba_rms_norm=True,
              mamba_norm_before_gate=False, tie_word_embeddings=False, embedding_multiplier=2.0,
              lm_head_multiplier=0.5, key_multiplier=0.7, attention_in_multiplier=1.3,
              attention_out_multiplier=0.8, ssm_in_multiplier=1.1, ssm_out_multiplier=0.9,
              ssm_multipliers=[1.2, 0.8, 1.1, 0.9, 1.5], mlp_multipliers=[1.2, 0.7])  # fmt: skip


def convert_falcon_h1(path, hf_dir) -> dict[str, torch.Tensor]:
    """The checkpoint as llama.cpp's converter (`FalconH1Model`) writes a `falcon-h1` file: the
    µP multipliers multiplied into the weights (embedding, lm_head, q/k/v by attention_in and k
    by key too, o, the mixer's in by ssm_in and its z/x/B/C/dt rows, out, the MLP's gate and
    down), the mixer as Granite 4.0-H's, Q/K as they are; the checkpoint's tensors as the file
    gives them back (divided by their multipliers again: what transformers multiplies)."""
    from safetensors.torch import load_file

    cfg = transformers.AutoConfig.from_pretrained(hf_dir)
    sd = {k: v.float().numpy() for k, v in load_file(str(hf_dir / "model.safetensors")).items()}
    n, inner, g = cfg.num_hidden_layers, cfg.mamba_d_ssm, cfg.mamba_n_groups
    w = gguf.GGUFWriter(str(path), "falcon-h1")
    w.add_block_count(n)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    head_dim = cfg.hidden_size // cfg.num_attention_heads  # (its config's)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_ssm_conv_kernel(cfg.mamba_d_conv)
    w.add_ssm_inner_size(inner)
    w.add_ssm_state_size(cfg.mamba_d_state)
    w.add_ssm_time_step_rank(inner // cfg.mamba_d_head)
    w.add_ssm_group_count(g)
    tokens, types, merges = _byte_level_vocab(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(cfg.vocab_size - 1)
    gs = g * cfg.mamba_d_state
    rows = np.ones(2 * inner + 2 * gs + cfg.mamba_n_heads, dtype=np.float32)
    for m, (a, b) in zip(cfg.ssm_multipliers, ((0, inner), (inner, 2 * inner),
                         (2 * inner, 2 * inner + gs), (2 * inner + gs, 2 * inner + 2 * gs),
                         (2 * inner + 2 * gs, len(rows)))):  # fmt: skip
        rows[a:b] = m
    att = cfg.attention_in_multiplier
    scale = {"self_attn.q_proj": att, "self_attn.k_proj": att * cfg.key_multiplier,
             "self_attn.v_proj": att, "self_attn.o_proj": cfg.attention_out_multiplier,
             "mamba.out_proj": cfg.ssm_out_multiplier,
             "mamba.in_proj": cfg.ssm_in_multiplier * rows[:, None],
             "feed_forward.gate_proj": cfg.mlp_multipliers[0],
             "feed_forward.down_proj": cfg.mlp_multipliers[1]}  # fmt: skip
    parts = {"input_layernorm": "attn_norm", "pre_ff_layernorm": "ffn_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mamba.in_proj": "ssm_in", "mamba.out_proj": "ssm_out",
             "mamba.conv1d": "ssm_conv1d", "feed_forward.gate_proj": "ffn_gate",
             "feed_forward.up_proj": "ffn_up", "feed_forward.down_proj": "ffn_down"}  # fmt: skip
    top = {"model.embed_tokens.weight": ("token_embd.weight", cfg.embedding_multiplier),
           "lm_head.weight": ("output.weight", cfg.lm_head_multiplier),
           "model.final_layernorm.weight": ("output_norm.weight", 1.0)}  # fmt: skip
    out = {}
    for stored, arr in sd.items():
        if stored in top:
            gname, mult = top[stored]
            out[stored] = _store(w, gname, arr * mult) / mult
            continue
        i, rest = stored.removeprefix("model.layers.").split(".", 1)
        b, (part, kind) = f"blk.{i}.", rest.rsplit(".", 1)
        if rest == "mamba.A_log":
            out[stored] = np.log(-_store(w, b + "ssm_a", -np.exp(arr)[:, None], Q.F32)[:, 0])
        elif rest == "mamba.D":
            out[stored] = _store(w, b + "ssm_d", arr[:, None], Q.F32)[:, 0]
        elif rest == "mamba.dt_bias":
            out[stored] = _store(w, b + "ssm_dt.bias", arr)
        elif rest == "mamba.conv1d.weight":
            out[stored] = _store(w, b + "ssm_conv1d.weight", arr[:, 0], Q.F32)[:, None]
        elif rest == "mamba.norm.weight":
            out[stored] = _store(w, b + "ssm_norm.weight", arr.reshape(g, -1), Q.F32).reshape(-1)
        else:
            mult = scale.get(part, 1.0) if kind == "weight" else 1.0
            out[stored] = _store(w, f"{b}{parts[part]}.{kind}", arr * mult) / mult
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in out.items()}


@pytest.mark.parametrize("norm", [True, False], ids=["ssm-norm", "gate-only"])
def test_falcon_h1_gguf_matches_transformers_with_its_multipliers_baked_in(tmp_path, norm):
    make_tiny_model(tmp_path / "hf", "FalconH1", **dict(FALCON, mamba_rms_norm=norm))
    path = tmp_path / "falcon_h1.gguf"
    expected = convert_falcon_h1(path, tmp_path / "hf")
    oracle = _oracle(tmp_path, expected)
    config, _, _, _ = load_gguf(path)
    assert config.architecture == "falcon_h1"
    m = config.family.mamba
    assert m.parallel_attention and m.gated_norm == norm and not m.norm_before_gate
    assert m.falcon.embedding == m.falcon.lm_head == 1.0  # (in the weights)
    want = [hf_greedy_plain(oracle, p, 6)[0] for p in PROMPTS]
    assert _generate(path, PROMPTS) == want
    _check_estimate(path, "bfloat16")
