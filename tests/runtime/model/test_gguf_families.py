"""GGUF files of the newer families (qwen3, qwen3moe, gemma3, gemma2 with its soft caps; Mixtral
as llama with experts; qwen2moe with its shared expert, granite and granitemoe with their scalars
and permuted Q/K, olmo2, olmoe), written here the way llama.cpp's converter writes them (its tensor
names, stacked expert tensors, GraniteMoe's input_linear split, Gemma's norms stored as 1 + w, Q8_0
matrices): the engine matches transformers running
on exactly the dequantized weights, token for token, with experts multiplied from their blocks.
Gemma's SentencePiece vocabulary tokenizes as transformers reads the same file."""

from __future__ import annotations

import itertools

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from hf_oracle import hf_greedy_plain, make_tiny_model
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model.gguf_loader import load_gguf

transformers = pytest.importorskip("transformers")

# HF layer suffix -> llama.cpp name (per family where they differ)
NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "mlp.gate": "ffn_gate_inp",
    "block_sparse_moe.gate": "ffn_gate_inp",
    "block_sparse_moe.router.layer": "ffn_gate_inp",  # GraniteMoe's
    # Qwen2-MoE's shared expert; its gate [1, hidden] stays 2-D (the converter squeezes nothing)
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
    # GLM-4's: the fused gate_up kept whole, its norms after attention and after the MLP
    "mlp.gate_up_proj": "ffn_up",
    "post_self_attn_layernorm": "post_attention_norm",
    "post_mlp_layernorm": "post_ffw_norm",
}
GEMMA3_NAMES = {
    **NAMES,
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
OLMO2_NAMES = {
    **NAMES,
    "post_attention_layernorm": "post_attention_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
EXPERTS = {  # (HF expert names gate, up, down) -> llama.cpp's stacked tensors
    ("gate_proj", "up_proj", "down_proj"): ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"),
    ("w1", "w3", "w2"): ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"),
}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert-time permutation of a Llama model's Q/K rows."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _byte_level_vocab(n: int) -> tuple[list[str], list[int], list[str]]:
    """A small byte-level BPE vocabulary of n tokens (all 256 bytes, a few merges)."""
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = sorted(ByteLevel.alphabet())
    merged = ["Ġt", "he", "Ġthe", "in", "Ġin"]
    tokens = [*alphabet, *merged, "<|endoftext|>"]
    tokens += [f"<extra_{i}>" for i in range(n - len(tokens))]
    types = [1] * len(tokens)
    types[len(alphabet) + len(merged)] = 3
    return tokens, types, ["Ġ t", "h e", "Ġt he", "i n", "Ġ in"]


def add_byte_level_tokenizer(w, n: int, pre: str = "qwen2", specials=()) -> None:
    """`_byte_level_vocab(n)` written as llama.cpp's converter writes a BPE tokenizer (model
    "gpt2", pre-tokenizer `pre`), `specials` (control tokens) over the last ids, EOS the last."""
    tokens, types, merges = _byte_level_vocab(n)
    for i, t in enumerate(specials):
        tokens[-1 - i], types[-1 - i] = t, 3
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(n - 1)


def add_gemma_tokenizer(w, n: int) -> None:
    """`_spm_vocab(n)` written as the converter writes Gemma's SentencePiece tokenizer (model
    "llama", scores 0, BOS 2, EOS 1)."""
    tokens, types = _spm_vocab(n)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)


def _spm_vocab(n: int) -> tuple[list[str], list[int]]:
    """A Gemma-style SentencePiece vocabulary of n tokens: control tokens, byte fallbacks,
    pieces with "\u2581" for spaces, one run of real spaces (as Gemma's files store them)."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    types = [3, 3, 3, 2, 3, 3]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    pieces = ["\u2581", "  ", *"abcdefghijklmnopqrstuvwxyz", "\u2581t", "he", "\u2581the", "an",
              "nd", "\u2581and", "\u2581a", "at", "\u2581c", "\u2581cat", "\u2581h", "\u2581hat"]  # fmt: skip
    tokens += pieces
    types += [1] * len(pieces)
    tokens += [f"<unused{i}>" for i in range(n - len(tokens))]
    types += [5] * (n - len(types))
    return tokens, types


def _llama3_rope_freqs(rope: dict, dim: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py for Llama 3.1's rotary: one divisor per frequency."""
    import math

    freqs = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old_context = rope["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_context / low, old_context / high
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def write_gguf(
    path, hf_dir, arch: str, window: int | None = None, extra=None, squeeze: bool = False
) -> dict[str, torch.Tensor]:
    """The checkpoint in `hf_dir` as llama.cpp's converter writes it (`squeeze`: as its older
    versions, which squeezed every tensor: Qwen2-MoE's shared gate 1-D; `extra(writer)` adds
    metadata); returns the checkpoint's tensors as the file dequantizes them (for the oracle)."""
    from safetensors.torch import load_file

    cfg = transformers.AutoConfig.from_pretrained(hf_dir)
    sd = {k: v.float().numpy() for k, v in load_file(str(hf_dir / "model.safetensors")).items()}
    gemma = arch in ("gemma2", "gemma3")
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    head_dim = getattr(cfg, "head_dim", None)
    if head_dim:  # as the converter: only where config.json has one
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_rope_freq_base(cfg.rope_parameters.get("rope_theta", 10000.0))  # Cohere's: 500k
    if arch in ("command-r", "cohere2"):  # Cohere's LayerNorm eps, its logit scale
        w.add_layer_norm_eps(cfg.layer_norm_eps)
        w.add_logit_scale(cfg.logit_scale)
    else:
        w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if arch == "glm4":  # the converter: head size x partial_rotary_factor
        partial = cfg.rope_parameters.get("partial_rotary_factor", 0.5)
        w.add_rope_dimension_count(int((head_dim or cfg.hidden_size // cfg.num_attention_heads)
                                       * partial))  # fmt: skip
    experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_feed_forward_length(
            getattr(cfg, "moe_intermediate_size", cfg.intermediate_size)
        )
    if getattr(cfg, "shared_expert_intermediate_size", None):  # Qwen2-MoE's
        w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    if window:
        w.add_sliding_window(window)
    if window and arch == "olmo2":  # OLMo 3: the converter's flag per layer
        w.add_sliding_window_pattern([t == "sliding_attention" for t in cfg.layer_types])
    if arch == "gemma2":  # as llama.cpp's converter writes Gemma 2's caps
        w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    if arch.startswith("granite"):  # the converter's *_multiplier -> *_scale, where set
        for key, scale in (("attention_multiplier", w.add_attention_scale),
                           ("embedding_multiplier", w.add_embedding_scale),
                           ("residual_multiplier", w.add_residual_scale),
                           ("logits_scaling", w.add_logit_scale)):  # fmt: skip
            if getattr(cfg, key, None):
                scale(getattr(cfg, key))
    if extra is not None:
        extra(w)
    rope = cfg.rope_parameters
    if rope.get("rope_type") == "yarn":  # as the converter: type, factor, context, betas
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    if rope.get("rope_type") == "llama3":  # the converter's divisors, as a tensor
        w.add_tensor("rope_freqs.weight", _llama3_rope_freqs(rope, head_dim))
    if gemma:
        add_gemma_tokenizer(w, cfg.vocab_size)
        w.add_add_bos_token(True)
    else:
        add_byte_level_tokenizer(w, cfg.vocab_size)
    expected: dict[str, np.ndarray] = {}

    def put(gname: str, arr: np.ndarray, hf: str, qtype=Q.Q8_0, heads: int = 0, shift=0.0):
        shape = arr.shape
        arr = arr.squeeze() if squeeze else arr
        stored = _permute(arr, heads) if heads else arr
        stored = stored + shift
        if arr.ndim == 1 or qtype == Q.F32:
            data, back = stored.astype(np.float32), stored.astype(np.float32)
            qtype = Q.F32
        else:
            data = gguf.quants.quantize(stored, qtype)
            back = gguf.quants.dequantize(data, qtype).reshape(stored.shape)
        w.add_tensor(gname, data, raw_shape=data.shape, raw_dtype=qtype)
        back = back - shift
        expected[hf] = (_permute_back(back, heads) if heads else back).reshape(shape)

    def _permute_back(a, n):
        return a.reshape(n, a.shape[0] // n // 2, 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)

    shift = 1.0 if gemma else 0.0  # llama.cpp stores Gemma's norms as 1 + w
    names = GEMMA3_NAMES if gemma else OLMO2_NAMES if arch == "olmo2" else NAMES
    put("token_embd.weight", sd["model.embed_tokens.weight"], "model.embed_tokens.weight")
    put("output_norm.weight", sd["model.norm.weight"], "model.norm.weight", shift=shift)
    if "lm_head.weight" in sd and not cfg.tie_word_embeddings:
        put("output.weight", sd["lm_head.weight"], "lm_head.weight")
    llama = arch in ("llama", "granite", "granitemoe", "smollm3")  # its LlamaModel: permuted
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}."
        for (suffix, gname), kind in itertools.product(names.items(), ("weight", "bias")):
            hf = f"{pre}{suffix}.{kind}"
            if hf in sd:
                heads = {"attn_q": cfg.num_attention_heads, "attn_k": cfg.num_key_value_heads}
                norm = gname.endswith("norm")
                # the converter keeps routers and norms (Cohere's per-head q/k norms: 2-D) in F32
                qtype = Q.F32 if gname == "ffn_gate_inp" or norm else Q.Q8_0
                put(f"blk.{i}.{gname}.{kind}", sd[hf], hf, qtype, heads.get(gname, 0) if llama else 0,
                    shift if norm else 0.0)  # fmt: skip
        for hf_names, g_names in EXPERTS.items():
            block = "block_sparse_moe." if hf_names[0] == "w1" else "mlp."
            first = f"{pre}{block}experts.0.{hf_names[0]}.weight"
            if first not in sd:
                continue
            for hf_name, gname in zip(hf_names, g_names):
                per = [f"{pre}{block}experts.{e}.{hf_name}.weight" for e in range(experts)]
                stacked = np.stack([sd[n] for n in per])
                put(f"blk.{i}.{gname}.weight", stacked, "stacked")
                for e, n in enumerate(per):
                    expected[n] = expected["stacked"][e]
                del expected["stacked"]
        granite_moe = f"{pre}block_sparse_moe."
        if granite_moe + "input_linear.weight" in sd:  # the converter: gate and up split apart
            gate, up = np.split(sd[granite_moe + "input_linear.weight"], 2, axis=1)
            put(f"blk.{i}.ffn_gate_exps.weight", gate, "gate")
            put(f"blk.{i}.ffn_up_exps.weight", up, "up")
            put(f"blk.{i}.ffn_down_exps.weight", sd[granite_moe + "output_linear.weight"],
                granite_moe + "output_linear.weight")  # fmt: skip
            stacked = np.concatenate([expected.pop("gate"), expected.pop("up")], axis=1)
            expected[granite_moe + "input_linear.weight"] = stacked
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in expected.items()}


QWEN3MOE = dict(head_dim=64, vocab_size=300, num_experts=8, num_experts_per_tok=2,
                moe_intermediate_size=64, norm_topk_prob=True)  # fmt: skip
GEMMA3 = dict(head_dim=64, vocab_size=320, sliding_window=7, num_hidden_layers=2,
              query_pre_attn_scalar=64)  # fmt: skip
# llama.cpp's Gemma 2 (but its 27B) scales the scores by the head size
GEMMA2 = dict(head_dim=64, vocab_size=320, sliding_window=7, num_hidden_layers=2,
              query_pre_attn_scalar=64, attn_logit_softcapping=2.0, final_logit_softcapping=5.0)  # fmt: skip
QWEN2MOE = dict(vocab_size=300, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32,
                shared_expert_intermediate_size=64)  # fmt: skip
GRANITE = dict(vocab_size=300, embedding_multiplier=3.0, residual_multiplier=0.5,
               attention_multiplier=0.05, logits_scaling=2.5, attention_bias=True)  # fmt: skip
GRANITE_SCALARS = ("embedding_multiplier", "residual_multiplier", "attention_multiplier",
                   "logits_scaling")  # fmt: skip
GRANITEMOE = dict(vocab_size=300, num_local_experts=6, num_experts_per_tok=2,
                  intermediate_size=32, embedding_multiplier=2.0, residual_multiplier=0.7,
                  attention_multiplier=0.1, logits_scaling=1.5)  # fmt: skip
OLMOE = dict(vocab_size=300, num_experts=6, num_experts_per_tok=3, intermediate_size=32)
OLMO3 = dict(vocab_size=300, num_hidden_layers=4, sliding_window=7, rope_parameters={
    k: {"rope_type": "default", "rope_theta": 10000.0} for k in ("full_attention",
                                                                 "sliding_attention")})  # fmt: skip
MIXTRAL = dict(head_dim=32, vocab_size=300, num_local_experts=4, num_experts_per_tok=2)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32, "rope_theta": 10000.0}  # fmt: skip
# yarn with betas other than its 32 and 1 (read from rope.scaling.yarn_beta_*)
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
        "beta_fast": 4.0, "beta_slow": 2.0, "rope_theta": 10000.0}  # fmt: skip
CASES = {
    "qwen3": ("Qwen3", dict(head_dim=64, vocab_size=300), None),
    "qwen3-yarn": ("Qwen3", dict(head_dim=64, vocab_size=300, rope_parameters=YARN), None),
    # Llama 3.1's rotary: llama.cpp writes no scaling type but a rope_freqs tensor
    "llama3-rope": ("Llama", dict(vocab_size=300, rope_parameters=LLAMA3), None),
    "qwen3moe": ("Qwen3Moe", QWEN3MOE, None),
    "qwen2moe": ("Qwen2Moe", QWEN2MOE, None),  # a shared expert; q/k/v biases; not renormalised
    "qwen2moe-squeezed": ("Qwen2Moe", QWEN2MOE, None),  # its shared gate 1-D, as older files
    "gemma3": ("Gemma3Text", GEMMA3, 7),
    "granite": ("Granite", GRANITE, None),
    "granitemoe": ("GraniteMoe", GRANITEMOE, None),  # input_linear split as gate and up
    "olmo2": ("Olmo2", dict(vocab_size=300), None),  # norms after; q/k norms over every head
    "olmo3": ("Olmo3", OLMO3, 7),  # olmo2 with a window on three layers of four
    # permuted q/k; NoPE on every fourth layer (llama.cpp's fixed step, as the HF default)
    "smollm3": ("SmolLM3", dict(vocab_size=300, num_hidden_layers=4), None),
    "olmoe": (
        "Olmoe",
        OLMOE,
        None,
    ),  # whole q/k norms, experts, not renormalised  # its four scalars; q/k (and their biases) permuted
    "gemma2": ("Gemma2", GEMMA2, 7),
    "llama": ("Mixtral", MIXTRAL, None),
    # fused gate_up as ffn_up, two more norms, q/k/v biases, half the head rotating interleaved
    "glm4": ("Glm4", dict(vocab_size=300, head_dim=32), None),
    # LayerNorms, parallel attention and MLP, per-head q/k norms, logit scale, tied embeddings
    "command-r": ("Cohere", dict(vocab_size=300, use_qk_norm=True, logit_scale=0.5), None),
    # window layers rotated, every fourth layer global and NoPE (llama.cpp's fixed pattern)
    "cohere2": ("Cohere2", dict(vocab_size=300, num_hidden_layers=4, sliding_window=10), 10),
}
GGUF_ARCH = {"qwen3": "qwen3", "qwen3-yarn": "qwen3", "qwen3moe": "qwen3moe", "gemma3": "gemma3", "llama": "llama",
             "llama3-rope": "llama", "gemma2": "gemma2", "qwen2moe": "qwen2moe",
             "qwen2moe-squeezed": "qwen2moe",
             "granite": "granite", "granitemoe": "granitemoe", "olmo2": "olmo2", "olmoe": "olmoe",
             "olmo3": "olmo2", "smollm3": "smollm3", "glm4": "glm4", "command-r": "command-r",
             "cohere2": "cohere2"}  # fmt: skip
ARCH = {**GGUF_ARCH, "llama": "mixtral", "command-r": "cohere"}  # the engine's


def _oracle(tmp_path, tensors: dict[str, torch.Tensor]):
    """transformers' model of the checkpoint with `tensors` (the file's values) in float32."""
    from safetensors.torch import load_file, save_file

    (tmp_path / "oracle").mkdir()
    (tmp_path / "oracle" / "config.json").write_bytes(
        (tmp_path / "hf" / "config.json").read_bytes()
    )
    saved = load_file(str(tmp_path / "hf" / "model.safetensors"))
    save_file({**saved, **tensors}, str(tmp_path / "oracle" / "model.safetensors"))
    oracle = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "oracle", dtype=torch.float32
    )
    return oracle.eval()


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_family_matches_transformers_on_its_dequantized_weights(tmp_path, case):
    from pagoda.runtime.cpu import qgemm

    arch, overrides, window = CASES[case]
    if case == "gemma3":  # llama.cpp's Gemma 3: a global layer every sixth, head-size scale
        overrides = {**overrides, "layer_types": ["sliding_attention"] * 2}
    make_tiny_model(tmp_path / "hf", arch, **overrides)
    path = tmp_path / f"{case}.gguf"
    squeeze = case.endswith("squeezed")
    expected = write_gguf(path, tmp_path / "hf", GGUF_ARCH[case], window, squeeze=squeeze)
    model = _oracle(tmp_path, expected)
    config, weights, _, _ = load_gguf(path)
    assert config.architecture == ARCH[case]
    if case == "gemma2":  # its caps from the file; llama.cpp's layers: even ones slide
        f = config.family
        assert (f.attn_logit_softcapping, f.final_logit_softcapping) == (2.0, 5.0)
        assert (f.window_layers, f.query_pre_attn_scalar, f.qk_norm) == ((True, False), 64, False)
    if case == "smollm3":  # llama.cpp's NoPE layers are transformers' default ones
        assert config.family.rope_layers == tuple(map(bool, model.config.no_rope_layers))
    if case == "cohere2":  # llama.cpp's pattern: every fourth layer global, without rotary
        f = config.family
        assert (
            f.window_layers
            == f.rope_layers
            == (True, True, True, False)
            == tuple(t == "sliding_attention" for t in model.config.layer_types)
        )
    if case == "olmo3":  # the file's window and per-layer flags
        assert (config.family.sliding_window, config.family.window_layers) == (
            7,
            (True, True, True, False),
        )
    if config.family.num_experts:  # llama.cpp renormalises Mixtral's and Qwen3-MoE's top-k only
        assert config.family.norm_topk_prob == getattr(model.config, "norm_topk_prob", True)
    if case.startswith("granite"):  # the scalars from the file (logits_scaling: greedy-blind)
        f = config.family
        scalars = (f.embedding_multiplier, f.residual_multiplier, f.attention_multiplier,
                   f.logits_scaling)  # fmt: skip
        assert scalars == pytest.approx(tuple(overrides[k] for k in GRANITE_SCALARS))
    for name, want in expected.items():
        if name.endswith("gate_up_proj.weight"):  # GLM-4's ffn_up read as gate and up rows
            got = torch.cat([weights[name.replace("gate_up", part)] for part in ("gate", "up")])
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6, msg=name)
        elif "experts." not in name and "_linear." not in name:  # Gemma's norms stored: 1 + w
            shift = 1.0 if case.startswith("gemma") and name.endswith("norm.weight") else 0.0
            torch.testing.assert_close(weights[name] - shift, want, rtol=0, atol=1e-6, msg=name)
    llm = LLM(str(path), dtype="float32", kv_cache_memory=8 << 20, max_num_batched_tokens=16,
              max_num_seqs=4)  # fmt: skip
    if config.family.num_experts and qgemm.load() is not None:  # experts from their Q8_0 blocks
        moe = llm.engine.runner.model.layers[0].mlp
        moe = getattr(moe, "routed", moe)  # Qwen2-MoE's routed experts beside its shared one
        assert all(pair[0].fast.kinds == ("Q8_0",) for pair in moe.experts)
    prompts = [[(7 * i + 3) % 250 + 5 for i in range(n)] for n in (3, 29)]
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
    )
    for out, p in zip(outs, prompts):
        assert out.outputs[0].token_ids == hf_greedy_plain(model, p, 6)[0], f"{case}: {len(p)}"


def test_gemma3_sentencepiece_vocabulary_tokenizes_as_transformers_reads_it(tmp_path):
    make_tiny_model(tmp_path / "hf", "Gemma3Text", head_dim=64, vocab_size=320,
                    num_hidden_layers=1)  # fmt: skip
    path = tmp_path / "gemma.gguf"
    write_gguf(path, tmp_path / "hf", "gemma3", 7)
    _, _, ours, _ = load_gguf(path)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    texts = ["the cat and the hat", "  two  spaces   and\ttabs", "that hat, éclair 🙂",
             "<start_of_turn>user\nthe cat<end_of_turn>", "andandand the"]  # fmt: skip
    for text in texts:
        want = theirs.encode(text, add_special_tokens=False)
        assert ours.encode(text, add_special_tokens=False) == want, text
        assert ours.decode(want, skip_special_tokens=False) == theirs.decode(want), text
    assert ours.encode("the cat")[:1] == [2]  # <bos>, as llama.cpp adds it


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (lambda w: w.add_rope_dimension_count(8), "partial rotary"),
        (lambda w: w.add_rope_scaling_type(gguf.RopeScalingType.LONGROPE), "'longrope'"),
        (lambda w: w.add_rope_scaling_attn_factors(0.5), "attn_factor"),
    ],
)
def test_gguf_rotary_the_engine_does_not_run_is_refused(tmp_path, extra, words):
    make_tiny_model(tmp_path / "hf", "Llama", vocab_size=300, num_hidden_layers=1)
    write_gguf(tmp_path / "m.gguf", tmp_path / "hf", "llama", extra=extra)
    with pytest.raises(ValueError, match=words):
        load_gguf(tmp_path / "m.gguf")


@pytest.mark.parametrize(
    ("arch", "overrides", "window", "extra", "words"),
    [
        ("Olmoe", dict(num_experts=4, intermediate_size=32), None,
         lambda w: w.add_clamp_kqv(8.0), "clamp_kqv"),
        ("GraniteMoe", dict(num_local_experts=4, intermediate_size=32), None,
         lambda w: w.add_expert_shared_feed_forward_length(32), "GraniteMoeShared"),
    ],
)  # fmt: skip
def test_gguf_variants_the_engine_does_not_run_are_refused(
    tmp_path, arch, overrides, window, extra, words
):
    make_tiny_model(tmp_path / "hf", arch, vocab_size=300, num_hidden_layers=1, **overrides)
    write_gguf(tmp_path / "m.gguf", tmp_path / "hf", arch.lower(), window, extra)
    with pytest.raises(ValueError, match=words):
        load_gguf(tmp_path / "m.gguf")


@pytest.mark.parametrize(
    ("pre", "pieces"),
    [
        ("dbrx", ["abc", "Ġ", "123", "45", "'S"]),  # llama.cpp's DBRX: llama3's regex
        ("olmo", ["abc", "Ġ12345", "'", "S"]),  # OLMoE's: GPT-2's
    ],
)
def test_gguf_pre_tokenizers_of_the_olmo_families_split_as_llama_cpp(pre, pieces):
    from pagoda.runtime.model.tokenizer import build_bpe_tokenizer

    tokens, types, merges = _byte_level_vocab(300)
    tok = build_bpe_tokenizer(tokens, merges, types, pre)
    assert [p for p, _ in tok.pre_tokenizer.pre_tokenize_str("abc 12345'S")] == pieces
