"""GGUFs of the families llama.cpp converts under architectures of their own (`gguf_archs.py`):
gpt-oss (sinks, window layers, experts apart or fused in MXFP4 with their biases, the harmony
EOS ids and chat template), Phi-3 (fused qkv and gate/up, longrope as tensors, a partial
rotary, its SentencePiece vocabulary), EXAONE 4 (and 4.5's MTP block), Seed-OSS, ERNIE 4.5,
StarCoder2, Arcee, Apertus (xIELU from metadata), Mistral 3 / Ministral 3, GLM-4.5, and OLMo
3's yarn attention factor, written here as llama.cpp's converter writes them (gguf-py's tensor
names for the architecture, its metadata keys, Q/K permuted where its LlamaModel permutes them,
Q8_0 matrices): the engine matches transformers running on exactly the dequantized weights,
token for token, and the start-up weights estimate is what the built model holds."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from arch_cases import FULL, LLAMA3, MINISTRAL3_YARN, SLIDING
from gguf import GGMLQuantizationType as Q
from hf_oracle import hf_greedy_plain, make_tiny_model
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model import mxfp4
from pagoda.runtime.model.gguf_loader import load_gguf
from pagoda.runtime.model.loader import read_model_config
from test_gguf_families import _oracle, _permute, add_byte_level_tokenizer

transformers = pytest.importorskip("transformers")
TEMPLATE = (
    "{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endfor %}"
)
HARMONY = ["<|return|>", "<|call|>", "<|end|>", "<|start|>", "<|message|>"]


def _put(w, expected, gname, arr, hf, qtype=Q.Q8_0, heads=0):
    """`arr` stored as `gname` (permuted for `heads`, quantized as `qtype` where 2-D or more);
    what the file gives back, in the checkpoint's layout, under `hf` in `expected`."""
    stored = _permute(arr, heads) if heads else arr
    if arr.ndim == 1 or qtype == Q.F32:
        data = back = stored.astype(np.float32)
        qtype = Q.F32
    else:
        data = gguf.quants.quantize(np.ascontiguousarray(stored), qtype)
        back = gguf.quants.dequantize(data, qtype).reshape(stored.shape)
    w.add_tensor(gname, data, raw_shape=data.shape, raw_dtype=qtype)
    if heads:  # the rows as the checkpoint has them
        back = _unpermute(back, heads)
    expected[hf] = back.reshape(arr.shape)


def _unpermute(a, n):
    return a.reshape(n, a.shape[0] // n // 2, 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)


def _spm_vocab(n: int) -> tuple[list[str], list[float], list[int]]:
    """A Llama-style SentencePiece vocabulary of n tokens: <unk>, <s>, </s>, byte fallbacks,
    pieces scored so that the merge order matters, Phi-3's chat tokens, unused fillers."""
    tokens, types = ["<unk>", "<s>", "</s>"], [2, 3, 3]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    pieces = ["\u2581t", "he", "\u2581the", "an", "nd", "\u2581and", "\u2581a", "at", "\u2581c",
              "\u2581cat", "\u2581h", "\u2581hat", "\u2581", *"acdehnt"]  # fmt: skip
    # by score "\u2581a" merges before "an" (in the file's order, after): "\u2581and" whole
    order = {"\u2581a": 1.5}
    scores = [0.0] * len(tokens) + [order.get(p, -float(i)) for i, p in enumerate(pieces)]
    tokens += pieces
    types += [1] * len(pieces)
    for t in ("<|user|>", "<|end|>", "<|assistant|>"):
        tokens, types, scores = [*tokens, t], [*types, 3], [*scores, 0.0]
    fill = n - len(tokens)
    return ([*tokens, *(f"<unused{i}>" for i in range(fill))], [*scores, *[0.0] * fill],
            [*types, *[5] * fill])  # fmt: skip


def convert(path, hf_dir, arch: str, pre: str = "qwen2", extra=None, tokens_extra=(),
            spm: bool = False, mtp: int = 0):  # fmt: skip
    """The checkpoint in `hf_dir` as llama.cpp's converter writes it for `arch` (module
    docstring); `extra(writer, cfg, sd, put)` writes what the family's converter adds and
    returns the HF names it took care of. Returns the tensors as the file dequantizes them."""
    from safetensors.torch import load_file

    cfg = transformers.AutoConfig.from_pretrained(hf_dir)
    sd = {k: v.float().numpy() for k, v in load_file(str(hf_dir / "model.safetensors")).items()}
    w = gguf.GGUFWriter(str(path), arch)
    n = cfg.num_hidden_layers
    w.add_block_count(n + mtp)  # EXAONE 4.5's converter counts its MTP blocks
    if mtp:
        w.add_nextn_predict_layers(mtp)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(getattr(cfg, "intermediate_size_mlp", cfg.intermediate_size))
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    if getattr(cfg, "head_dim", None) and arch != "phi3":
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
    rope = cfg.rope_parameters
    w.add_rope_freq_base(rope.get("rope_theta", 10000.0))
    if getattr(cfg, "norm_epsilon", None):  # StarCoder2's LayerNorm
        w.add_layer_norm_eps(cfg.norm_epsilon)
    else:
        w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if getattr(cfg, "num_local_experts", None):
        w.add_expert_count(cfg.num_local_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
    if rope.get("rope_type") == "yarn":  # the base converter's
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        for key, add in (("beta_fast", w.add_rope_scaling_yarn_beta_fast),
                         ("beta_slow", w.add_rope_scaling_yarn_beta_slow)):  # fmt: skip
            if rope.get(key) is not None:
                add(rope[key])
    if spm:  # SentencePiece, as the converters write Phi-3's and ERNIE 4.5's
        tokens, scores, types = _spm_vocab(cfg.vocab_size)
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
    else:
        add_byte_level_tokenizer(w, cfg.vocab_size, pre, specials=tokens_extra)
    expected: dict[str, np.ndarray] = {}

    def put(gname, arr, hf, qtype=Q.Q8_0, heads=0):
        _put(w, expected, gname, arr, hf, qtype, heads)

    done = set(extra(w, cfg, sd, put) if extra else ())
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[_ARCH_ENUM[arch]], n)
    permute = arch in ("arcee", "mistral3")
    for hf, arr in sd.items():
        if hf in done or (hf == "lm_head.weight" and cfg.tie_word_embeddings):
            continue
        gname = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        assert gname is not None, hf
        heads = 0
        if permute and hf.endswith("q_proj.weight"):
            heads = cfg.num_attention_heads
        if permute and hf.endswith("k_proj.weight"):
            heads = cfg.num_key_value_heads
        put(gname, arr, hf, Q.F32 if "norm" in hf else Q.Q8_0, heads)
        if mtp and gname.startswith("blk.0."):  # an MTP block after the decoder's: layer 0's
            w.add_tensor(gname.replace("blk.0.", f"blk.{n}.", 1), arr.astype(np.float32))
    if mtp:
        w.add_tensor(f"blk.{n}.nextn.eh_proj.weight", np.ones((8, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in expected.items()}


_ARCH_ENUM = {"gpt-oss": "GPT_OSS", "phi3": "PHI3", "exaone4": "EXAONE4", "seed_oss": "SEED_OSS",
              "ernie4_5": "ERNIE4_5", "starcoder2": "STARCODER2", "arcee": "ARCEE",
              "apertus": "APERTUS", "mistral3": "MISTRAL3", "glm4moe": "GLM4_MOE",
              "llama4": "LLAMA4"}  # fmt: skip


def _gpt_oss_extra(fused: bool):
    """gpt-oss's converter: the window, the experts' width, sinks, the experts apart (or fused:
    gate rows, then up) in MXFP4 (gate rows 0::2, up rows 1::2 of gate_up, transposed to
    [E, rows, cols]) with their biases, the harmony chat template."""
    return lambda w, cfg, sd, put: _gpt_oss_tensors(w, cfg, sd, put, fused)


def _gpt_oss_tensors(w, cfg, sd, put, fused):
    w.add_sliding_window(cfg.sliding_window)
    w.add_expert_feed_forward_length(cfg.intermediate_size)
    w.add_chat_template(TEMPLATE)
    done = []
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        put(f"blk.{i}.attn_sinks.weight", sd[p + "self_attn.sinks"], p + "self_attn.sinks")
        gate_up = sd[p + "mlp.experts.gate_up_proj"].transpose(0, 2, 1)  # [E, 2I, H]
        bias = sd[p + "mlp.experts.gate_up_proj_bias"]
        if fused:  # the converter's fused form: gate rows, then up rows
            both = np.concatenate([gate_up[:, 0::2], gate_up[:, 1::2]], axis=1)
            put(f"blk.{i}.ffn_gate_up_exps.weight", both, f"gate_up{i}", Q.MXFP4)
            put(f"blk.{i}.ffn_gate_up_exps.bias", np.concatenate([bias[:, 0::2], bias[:, 1::2]], 1),
                f"gate_up_b{i}")  # fmt: skip
        else:
            put(f"blk.{i}.ffn_gate_exps.weight", gate_up[:, 0::2], f"gate{i}", Q.MXFP4)
            put(f"blk.{i}.ffn_up_exps.weight", gate_up[:, 1::2], f"up{i}", Q.MXFP4)
            put(f"blk.{i}.ffn_gate_exps.bias", bias[:, 0::2], f"gate_b{i}")
            put(f"blk.{i}.ffn_up_exps.bias", bias[:, 1::2], f"up_b{i}")
        down = sd[p + "mlp.experts.down_proj"].transpose(0, 2, 1)  # [E, H, I]
        put(f"blk.{i}.ffn_down_exps.weight", down, p + "mlp.experts.down_proj", Q.MXFP4)
        put(f"blk.{i}.ffn_down_exps.bias", sd[p + "mlp.experts.down_proj_bias"],
            p + "mlp.experts.down_proj_bias")  # fmt: skip
        put(f"blk.{i}.ffn_gate_inp.weight", sd[p + "mlp.router.weight"], p + "mlp.router.weight",
            Q.F32)  # fmt: skip
        put(f"blk.{i}.ffn_gate_inp.bias", sd[p + "mlp.router.bias"], p + "mlp.router.bias")
        done += [p + s for s in ("self_attn.sinks", "mlp.experts.gate_up_proj",
                                 "mlp.experts.gate_up_proj_bias", "mlp.experts.down_proj",
                                 "mlp.experts.down_proj_bias", "mlp.router.weight",
                                 "mlp.router.bias")]  # fmt: skip
    return done


GPT_OSS = dict(head_dim=32, num_local_experts=4, num_experts_per_tok=2, intermediate_size=64,
               sliding_window=9, num_hidden_layers=3, layer_types=[SLIDING, FULL, SLIDING],
               rope_parameters={"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0,
                                "beta_slow": 1.0, "truncate": False,
                                "original_max_position_embeddings": 64,
                                "rope_theta": 150000.0})  # fmt: skip


def _generate(path, prompts, n=6):
    llm = LLM(str(path), dtype="float32", kv_cache_memory=8 << 20, max_num_batched_tokens=16,
              max_num_seqs=4)  # fmt: skip
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))  # fmt: skip
    return [o.outputs[0].token_ids for o in outs]


PROMPTS = [[(7 * i + 3) % 250 + 5 for i in range(n)] for n in (3, 29)]


@pytest.fixture(scope="module", params=["apart", "fused"])
def gpt_oss_gguf(tmp_path_factory, request):
    """(the gpt-oss GGUF, transformers' model of its dequantized weights): the experts' gate
    and up apart, as llama.cpp's converter writes them by default, or fused."""
    tmp_path = tmp_path_factory.mktemp("gpt-oss-gguf")
    model = make_tiny_model(tmp_path / "hf", "GptOss", **GPT_OSS)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():  # sinks of a few units (transformers draws them near 0)
        for layer in model.model.layers:
            layer.self_attn.sinks.copy_(3 * torch.randn(model.config.num_attention_heads,
                                                        generator=g))  # fmt: skip
    model.save_pretrained(tmp_path / "hf")
    path = tmp_path / "gpt-oss.gguf"
    fused = request.param == "fused"
    expected = convert(path, tmp_path / "hf", "gpt-oss", pre="gpt-4o",
                       extra=_gpt_oss_extra(fused), tokens_extra=HARMONY)  # fmt: skip
    for i in range(model.config.num_hidden_layers):  # the experts back in the HF layout
        p = f"model.layers.{i}.mlp.experts."
        if fused:
            expected[f"gate{i}"], expected[f"up{i}"] = expected.pop(f"gate_up{i}").chunk(2, 1)
            expected[f"gate_b{i}"], expected[f"up_b{i}"] = expected.pop(f"gate_up_b{i}").chunk(2, 1)
        gate, up = expected.pop(f"gate{i}"), expected.pop(f"up{i}")
        gate_up = torch.empty(gate.shape[0], 2 * gate.shape[1], gate.shape[2])
        gate_up[:, 0::2], gate_up[:, 1::2] = gate, up
        expected[p + "gate_up_proj"] = gate_up.transpose(1, 2).contiguous()
        bias = torch.empty(gate.shape[0], 2 * gate.shape[1])
        bias[:, 0::2], bias[:, 1::2] = expected.pop(f"gate_b{i}"), expected.pop(f"up_b{i}")
        expected[p + "gate_up_proj_bias"] = bias
        expected[p + "down_proj"] = expected[p + "down_proj"].transpose(1, 2).contiguous()
    return path, _oracle(tmp_path, expected)


def test_gpt_oss_gguf_matches_transformers_on_its_dequantized_weights(gpt_oss_gguf):
    path, oracle = gpt_oss_gguf
    config, _, tokenizer, _ = load_gguf(path)
    f = config.family
    assert config.architecture == "gpt_oss" and config.attention_bias and config.head_dim == 32
    assert f.attention_sinks and f.window_layers == (True, False, True) and f.sliding_window == 9
    assert (f.num_experts, f.num_experts_per_tok, f.moe_intermediate_size) == (4, 2, 64)
    assert (f.swiglu_alpha, f.swiglu_limit) == (1.702, 7.0)
    assert config.rope_scaling["truncate"] is False and config.rope_scaling["factor"] == 8.0
    vocab = tokenizer.encode("<|return|><|call|><|end|>", add_special_tokens=False)
    assert set(vocab[:2]) <= set(config.eos_token_ids) and vocab[2] not in config.eos_token_ids
    assert tokenizer.chat_template == TEMPLATE
    want = [hf_greedy_plain(oracle, p, 6)[0] for p in PROMPTS]
    assert _generate(path, PROMPTS) == want


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_gpt_oss_gguf_weight_estimate_is_what_the_engine_holds(gpt_oss_gguf, dtype):
    """`server/weights.py` from the file's tensor table against a built model: the MXFP4
    experts as the dense gate/up and down `Linear`s the engine makes of them."""
    _check_estimate(gpt_oss_gguf[0], dtype)


def test_gguf_mxfp4_blocks_hold_the_checkpoints_values():
    """The converter's repacking of HF's MXFP4 (`transform_nibble_layout`: HF's byte k holds
    values 2k and 2k + 1, ggml's byte j values j and j + 16; the scale byte first) read by the
    engine's GGUF dequantization gives `mxfp4.dequantize`'s values of the HF blocks."""
    from pagoda.runtime.model.gguf_dequant import dequantize

    x = torch.randn(3, 5, 64) * torch.exp2(torch.randint(-8, 8, (3, 5, 1)).float())
    blocks, scales = mxfp4.quantize(x)  # HF: [3, 5, 2, 16], [3, 5, 2]
    values = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).flatten(-2)  # [.., 32] in order
    ggml = values[..., :16] | (values[..., 16:] << 4)  # byte j: value j low, j + 16 high
    raw = torch.cat([scales.unsqueeze(-1), ggml.to(torch.uint8)], dim=-1).reshape(3, 5, 2 * 17)
    got = dequantize(raw.numpy(), "MXFP4", (3, 5, 64))
    assert torch.equal(got, mxfp4.dequantize(blocks, scales, torch.float32))


def _phi3_extra(w, cfg, sd, put):
    """Phi-3's converter: the original context, the rotating dims (of hidden / heads), the
    window (0: none), and longrope's factors as tensors with its attention factor."""
    import math

    rope = cfg.rope_parameters
    original = cfg.original_max_position_embeddings
    partial = rope.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", 1.0))
    dims = int(partial * cfg.hidden_size) // cfg.num_attention_heads
    w.add_rope_scaling_orig_ctx_len(original)
    w.add_rope_dimension_count(dims)
    w.add_sliding_window(cfg.sliding_window or 0)
    if rope.get("long_factor"):
        scale = cfg.max_position_embeddings / original
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)))
        for kind in ("long", "short"):
            w.add_tensor(f"rope_factors_{kind}.weight",
                         np.array(rope[f"{kind}_factor"], dtype=np.float32))  # fmt: skip
    return []


def _exaone4_extra(w, cfg, sd, put):
    w.add_vocab_size(cfg.vocab_size)
    if cfg.sliding_window is not None:
        w.add_sliding_window(cfg.sliding_window)
        w.add_sliding_window_pattern([t == SLIDING for t in cfg.layer_types])
    return []


def _llama_extra(w, cfg, sd, put):
    """LlamaModel's converter (Arcee, Apertus, Mistral 3): the vocabulary size, the rotating
    dims, llama3's divisors as `rope_freqs`, Ministral 3's yarn multiplier and q scale beta,
    Apertus' xIELU parameters as metadata."""
    from test_gguf_families import _llama3_rope_freqs

    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_vocab_size(cfg.vocab_size)
    w.add_rope_dimension_count(head_dim)
    rope = cfg.rope_parameters
    if rope.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", _llama3_rope_freqs(rope, head_dim))
    if "llama_4_scaling_beta" in rope:
        w.add_rope_scaling_yarn_log_mul(rope["mscale_all_dim"])
        w.add_attn_temperature_scale(rope["llama_4_scaling_beta"])
    done = []
    if cfg.model_type == "apertus":
        for p in ("alpha_p", "alpha_n", "beta", "eps"):
            names = [f"model.layers.{i}.mlp.act_fn.{p}" for i in range(cfg.num_hidden_layers)]
            getattr(w, f"add_xielu_{p}")([float(sd[n].reshape(-1)[0]) for n in names])
            done += names
    return done


LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0,
            "short_factor": [1.0 + 0.2 * i for i in range(6)],
            "long_factor": [1.5 + 1.5 * i for i in range(6)]}  # fmt: skip
# case: (transformers config prefix, overrides, llama.cpp arch, converter extra, engine arch)
CASES = {
    # longrope past an original context of 32 (the long prompt rotates long), 0.75 rotating
    "phi3-longrope": ("Phi3", dict(max_position_embeddings=128, original_max_position_embeddings=32,
                                   rope_parameters=LONGROPE, partial_rotary_factor=0.75),
                      "phi3", _phi3_extra, "phi3"),
    "phi3-window": ("Phi3", dict(sliding_window=11, num_hidden_layers=3), "phi3", _phi3_extra,
                    "phi3"),
    "exaone4-window": ("Exaone4", dict(num_hidden_layers=4, sliding_window=10,
                                       sliding_window_pattern=2), "exaone4", _exaone4_extra,
                       "exaone4"),
    "seed_oss": ("SeedOss", dict(head_dim=16, attention_out_bias=True), "seed_oss", None,
                 "seed_oss"),
    "ernie4_5": ("Ernie4_5", dict(head_dim=16, use_bias=True), "ernie4_5", None, "ernie4_5"),
    "starcoder2": ("Starcoder2", dict(), "starcoder2", None, "starcoder2"),
    "arcee": ("Arcee", dict(num_key_value_heads=1), "arcee", _llama_extra, "arcee"),
    "apertus": ("Apertus", dict(rope_parameters=LLAMA3), "apertus", _llama_extra, "apertus"),
    "ministral3": ("Ministral3", dict(head_dim=16, rope_parameters=MINISTRAL3_YARN), "mistral3",
                   _llama_extra, "ministral3"),
    "mistral3-text": ("Mistral", dict(head_dim=16, sliding_window=None), "mistral3",
                      _llama_extra, "mistral"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_arch_matches_transformers_on_its_dequantized_weights(tmp_path, case):
    hf_arch, overrides, arch, extra, engine = CASES[case]
    make_tiny_model(tmp_path / "hf", hf_arch, **overrides)
    path = tmp_path / f"{case}.gguf"
    expected = convert(path, tmp_path / "hf", arch, extra=extra)
    oracle = _oracle(tmp_path, expected)
    config, weights, _, _ = load_gguf(path)
    assert config.architecture == engine
    for name, want in expected.items():
        if name in weights:
            torch.testing.assert_close(weights[name], want, rtol=0, atol=1e-6, msg=name)
    prompts = PROMPTS
    if case == "phi3-longrope":  # one within the original context, one past it
        assert config.rope_scaling["factor"] == 4.0
        prompts = [PROMPTS[1], [(5 * i + 1) % 290 + 5 for i in range(41)]]
    want = [hf_greedy_plain(oracle, p, 6)[0] for p in prompts]
    assert _generate(path, prompts) == want, case
    _check_estimate(path, "bfloat16")  # (Phi-3's fused qkv counted too)


def _check_estimate(path, dtype: str, rel: float = 1e-3) -> None:
    """`server/weights.py` from the file's tensor table is what a built model holds."""
    from model_bytes import build, held_bytes
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.server import weights

    held = held_bytes(build(path, getattr(torch, dtype)))
    cfg = EngineConfig.create(str(path), device="cpu", dtype=dtype)
    got = weights.estimate(read_model_config(str(path)), cfg, path)
    assert got.bytes == pytest.approx(held, rel=rel, abs=0), (got, held)


OLMO3_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
              "original_max_position_embeddings": 16, "attention_factor": 4.0}  # fmt: skip


@pytest.mark.parametrize("newer", [False, True])
def test_olmo3_gguf_yarn_attention_factor_is_transformers_attention_factor(tmp_path, newer):
    """OLMo 3's yarn on its global layers with an `attention_factor` (OLMo-3's own equals
    yarn's default; 4 here, so that it matters): the older converter wrote it as
    `rope.scaling.attn_factor`, the newer as `rope.scaling.yarn_attn_factor` with the betas."""
    from test_gguf_families import write_gguf

    rope = {"full_attention": OLMO3_YARN,
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}  # fmt: skip
    make_tiny_model(tmp_path / "hf", "Olmo3", vocab_size=300, num_hidden_layers=4,
                    sliding_window=7, rope_parameters=rope)  # fmt: skip

    def extra(w):
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(OLMO3_YARN["factor"])
        w.add_rope_scaling_orig_ctx_len(OLMO3_YARN["original_max_position_embeddings"])
        if newer:
            w.add_rope_scaling_yarn_attn_factor(OLMO3_YARN["attention_factor"])
            w.add_rope_scaling_yarn_beta_fast(32.0)
            w.add_rope_scaling_yarn_beta_slow(1.0)
        else:
            w.add_rope_scaling_attn_factors(OLMO3_YARN["attention_factor"])

    path = tmp_path / "olmo3.gguf"
    oracle = _oracle(tmp_path, write_gguf(path, tmp_path / "hf", "olmo2", 7, extra))
    config, _, _, _ = load_gguf(path)
    assert config.rope_scaling["attention_factor"] == 4.0
    assert config.family.local_rope_theta == 10000.0  # the window layers: unscaled
    want = [hf_greedy_plain(oracle, p, 6)[0] for p in PROMPTS]
    assert _generate(path, PROMPTS) == want


def _one_factor(w, cfg, sd, put):  # a longrope file missing its short factors
    w.add_tensor("rope_factors_long.weight", np.ones(8, dtype=np.float32))
    return _phi3_extra(w, cfg, sd, put)


def _short_factors(w, cfg, sd, put):  # 5 factors each where the 12 rotating dims need 6
    for kind in ("long", "short"):
        w.add_tensor(f"rope_factors_{kind}.weight", np.ones(5, dtype=np.float32))
    w.add_rope_scaling_orig_ctx_len(32)
    w.add_rope_dimension_count(12)
    return []


def _no_xielu(w, cfg, sd, put):  # Apertus without its xIELU arrays
    return [n for n in sd if ".act_fn." in n]


def _attn_factors(*values):
    def extra(w, cfg, sd, put):
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(2.0)
        w.add_rope_scaling_attn_factors(values[0])
        if len(values) > 1:
            w.add_rope_scaling_yarn_attn_factor(values[1])
        return []

    return extra


@pytest.mark.parametrize(
    ("hf_arch", "overrides", "arch", "extra", "words"),
    [
        ("Phi3", dict(num_hidden_layers=1), "phi3", _one_factor, "rope_factors_short"),
        ("Phi3", dict(num_hidden_layers=1), "phi3", _short_factors, "need 6 values"),
        ("Apertus", dict(num_hidden_layers=1), "apertus", _no_xielu, "xielu.alpha_p"),
        ("Arcee", dict(num_hidden_layers=1), "arcee", _attn_factors(2.0), "attn_factor"),
    ],
)  # fmt: skip
def test_gguf_variants_of_these_archs_the_engine_does_not_run_are_refused(
    tmp_path, hf_arch, overrides, arch, extra, words
):
    make_tiny_model(tmp_path / "hf", hf_arch, **overrides)
    convert(tmp_path / "m.gguf", tmp_path / "hf", arch, extra=extra)
    with pytest.raises(ValueError, match=words):  # from the metadata: before a server binds
        read_model_config(str(tmp_path / "m.gguf"))


@pytest.mark.parametrize("case", ["phi3-window", "ernie4_5"])
def test_sentencepiece_vocabulary_tokenizes_as_transformers_reads_the_file(tmp_path, case):
    """Phi-3's and ERNIE 4.5's GGUFs carry a SentencePiece vocabulary (`tokenizer.ggml.model`
    llama, scores, no merges): the engine's tokenizer gives transformers' ids for the same file
    (Phi-3: a prefix space before each text between special tokens, as its normalizer; the
    others: before the first, as LlamaTokenizer), decodes them back, and adds BOS."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        convert_gguf_tokenizer,
        get_gguf_tokenizer,
    )

    hf_arch, overrides, arch, extra, _ = CASES[case]
    make_tiny_model(tmp_path / "hf", hf_arch, **{**overrides, "num_hidden_layers": 1})
    path = tmp_path / "m.gguf"
    convert(path, tmp_path / "hf", arch, extra=extra, spm=True)
    config, _, ours, _ = load_gguf(path)
    end = ours.encode("<|end|>", add_special_tokens=False)
    assert len(end) == 1 and {2, end[0]} <= set(config.eos_token_ids)  # </s>, and by its text
    theirs, _ = convert_gguf_tokenizer(*get_gguf_tokenizer(str(path))[:2])
    texts = ["the cat and the hat", "  two  spaces   and\ttabs", "that hat, \u00e9clair \U0001f642",
             "<|user|>\nthe cat<|end|>\n<|assistant|>", "andandand the", " the"]  # fmt: skip
    for text in texts:
        want = theirs.encode(text, add_special_tokens=False).ids
        assert ours.encode(text, add_special_tokens=False) == want, text
        assert ours.decode(want, skip_special_tokens=False) == theirs.decode(
            want, skip_special_tokens=False
        ), text
    assert ours.encode("the cat")[:1] == [1]  # <s>, as llama.cpp adds it


def test_exaone4_gguf_with_an_mtp_block_runs_its_decoder(tmp_path):
    """EXAONE 4.5's text model as its converter writes it: `block_count` counts the MTP block
    after the decoder's (`nextn_predict_layers`), which the engine neither builds nor reads."""
    make_tiny_model(tmp_path / "hf", "Exaone4", sliding_window=None, layer_types=[FULL, FULL])
    path = tmp_path / "m.gguf"
    oracle = _oracle(tmp_path, convert(path, tmp_path / "hf", "exaone4", mtp=1))
    assert load_gguf(path)[0].num_layers == 2
    want = [hf_greedy_plain(oracle, p, 6)[0] for p in PROMPTS]
    assert _generate(path, PROMPTS) == want


GLM45 = dict(use_qk_norm=True, attention_bias=True, head_dim=32, n_routed_experts=8,
             num_experts_per_tok=2, n_group=4, topk_group=2, routed_scaling_factor=2.5,
             norm_topk_prob=True, n_shared_experts=1, moe_intermediate_size=32,
             first_k_dense_replace=1, num_hidden_layers=3)  # fmt: skip


def _glm4moe_extra(stacked: dict[str, list[str]]):
    """GLM-4.5's converter: the rotating dims, the router (sigmoid, groups, scale, norm), the
    shared experts' count, the dense layers; the experts stacked (each stack's experts' names
    in `stacked`), the correction bias as `exp_probs_b`."""

    def extra(w, cfg, sd, put):
        partial = cfg.rope_parameters["partial_rotary_factor"]
        w.add_rope_dimension_count(int(cfg.head_dim * partial))
        w.add_expert_count(cfg.n_routed_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_group_count(cfg.n_group)
        w.add_expert_group_used_count(cfg.topk_group)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        w.add_expert_shared_count(cfg.n_shared_experts)
        w.add_leading_dense_block_count(cfg.first_k_dense_replace)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_expert_weights_scale(cfg.routed_scaling_factor)
        w.add_expert_weights_norm(cfg.norm_topk_prob)
        done = []
        for i in range(cfg.first_k_dense_replace, cfg.num_hidden_layers):
            p = f"model.layers.{i}.mlp."
            for part in ("gate", "up", "down"):
                names = [f"{p}experts.{e}.{part}_proj.weight" for e in range(cfg.n_routed_experts)]
                put(f"blk.{i}.ffn_{part}_exps.weight", np.stack([sd[n] for n in names]),
                    f"{part}{i}")  # fmt: skip
                stacked[f"{part}{i}"] = names
                done += names
            put(f"blk.{i}.exp_probs_b.bias", sd[p + "gate.e_score_correction_bias"],
                p + "gate.e_score_correction_bias")  # fmt: skip
            put(f"blk.{i}.ffn_gate_inp.weight", sd[p + "gate.weight"], p + "gate.weight", Q.F32)
            done += [p + "gate.e_score_correction_bias", p + "gate.weight"]
        return done

    return extra


def test_glm4moe_gguf_matches_transformers_on_its_dequantized_weights(tmp_path):
    """GLM-4.5 (`glm4moe`): per-head q/k norms, q/k/v biases, half of each head rotating
    (rotate-half), a dense first layer, V3's grouped sigmoid router with its correction bias,
    a shared expert; the converter's MTP block after the decoder's (not read)."""
    from arch_cases import scramble_correction_biases

    model = make_tiny_model(tmp_path / "hf", "Glm4Moe", **GLM45)
    scramble_correction_biases(model, tmp_path / "hf", GLM45["first_k_dense_replace"])
    path, stacked = tmp_path / "glm45.gguf", {}
    expected = convert(path, tmp_path / "hf", "glm4moe", pre="glm4",
                       extra=_glm4moe_extra(stacked), mtp=1)  # fmt: skip
    for key, names in stacked.items():  # the file's experts under their own names
        experts = expected.pop(key)
        expected.update({n: experts[e] for e, n in enumerate(names)})
    oracle = _oracle(tmp_path, expected)
    config = load_gguf(path)[0]
    f = config.family
    assert config.architecture == "glm4_moe" and config.num_layers == 3 and f.qk_norm
    assert f.moe_layers == (False, True, True) and f.shared_expert_intermediate_size == 32
    assert (f.routing.n_group, f.routing.topk_group, f.routing.routed_scaling_factor) == (4, 2, 2.5)
    want = [hf_greedy_plain(oracle, p, 6)[0] for p in PROMPTS]
    assert _generate(path, PROMPTS) == want
    _check_estimate(path, "bfloat16")
