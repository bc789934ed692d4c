"""GGUF loading: every supported tensor type dequantizes, Q/K un-permute to the HF layout, the
tokenizer matches transformers' reading of the same file, and a tiny model matches transformers."""

from __future__ import annotations

import os

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from hf_oracle import hf_greedy, share_gguf_reader
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model import gguf_loader
from pagoda.runtime.model.gguf_loader import load_gguf

transformers = pytest.importorskip("transformers")
H, FFN, HEADS, KV = 64, 128, 4, 2
TYPES = {  # HF suffix → (GGUF name, storage type)
    "self_attn.q_proj.weight": ("attn_q", Q.Q4_0),
    "self_attn.k_proj.weight": ("attn_k", Q.Q4_1),
    "self_attn.v_proj.weight": ("attn_v", Q.F16),
    "self_attn.o_proj.weight": ("attn_output", Q.BF16),
    "mlp.gate_proj.weight": ("ffn_gate", Q.Q8_0),
    "mlp.up_proj.weight": ("ffn_up", Q.F32),
    "mlp.down_proj.weight": ("ffn_down", Q.Q8_0),
    "input_layernorm.weight": ("attn_norm", Q.F32),
    "post_attention_layernorm.weight": ("ffn_norm", Q.F32),
}


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert-time permutation of Q/K rows."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def roundtrip(w: np.ndarray, qtype) -> tuple[np.ndarray, np.ndarray]:
    data = gguf.quants.quantize(w, qtype)
    return data, gguf.quants.dequantize(data, qtype).reshape(w.shape)


# kinds gguf-py cannot quantize: random blocks (`probe_weight`) with moderate scales
RANDOM_KINDS = (Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q3_K, Q.IQ4_XS, Q.IQ4_NL)
F16_BYTES = {e: np.frombuffer(np.float16(2.0**e).tobytes(), np.uint8) for e in (-9, -14)}


def random_blocks(arr: np.ndarray, qtype) -> tuple[np.ndarray, np.ndarray]:
    """Random blocks of a `RANDOM_KINDS` type of arr's shape with moderate scales, and what
    they dequantize to."""
    from pagoda.runtime.cpu.qgemm import probe_weight

    rows, cols = arr.shape
    blocks = probe_weight(qtype.name, rows, cols, seed=rows + cols).blocks.numpy().copy()
    b = blocks.reshape(rows, cols // gguf.GGML_QUANT_SIZES[qtype][0], -1)
    if qtype == Q.Q6_K:  # int8 scales in [-3, 3], d = 2^-9
        b[..., 192:208] = np.random.default_rng(rows).integers(-3, 4, b[..., 192:208].shape)
        b[..., 208:210] = F16_BYTES[-9]
    elif qtype == Q.Q3_K:  # 6-bit scales - 32, q in [-4, 3]: |w| <= 2^-9 * 32 * 4
        b[..., 108:110] = F16_BYTES[-9]
    elif qtype == Q.IQ4_XS:  # 6-bit scales - 32, table values up to 127
        b[..., 0:2] = F16_BYTES[-14]
    elif qtype == Q.IQ4_NL:
        b[..., 0:2] = F16_BYTES[-9]
    else:  # 6-bit scales and mins at most 7
        b[..., 4:16] &= 0x07
    return blocks, gguf.quants.dequantize(blocks, qtype).reshape(arr.shape)


def write_tiny_gguf(path, smol_reader, hidden: int, ffn: int, types: dict, head_type):
    """A 2-layer Llama GGUF with the tensor storage types `types` (HF suffix → (GGUF name,
    type)) and the embedded model's tokenizer (read from `smol_reader`); returns (HF model
    holding exactly the dequantized weights, those weights)."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=49152,
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=KV,
        max_position_embeddings=512,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    sd = {k: (v * 4 if v.dim() > 1 else v).float().numpy() for k, v in model.state_dict().items()}
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_context_length(512)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    f = smol_reader.fields
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(f["tokenizer.ggml.tokens"].contents())
    w.add_token_merges(f["tokenizer.ggml.merges"].contents())
    w.add_token_types(f["tokenizer.ggml.token_type"].contents())
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(f["tokenizer.chat_template"].contents())
    expected = {}

    def put(gname, hfname, qtype, perm_heads=None):
        arr = sd[hfname]
        stored = permute(arr, perm_heads) if perm_heads else arr
        if qtype in RANDOM_KINDS:
            data, deq = random_blocks(stored, qtype)
        else:
            data, deq = roundtrip(stored, qtype)
        w.add_tensor(gname, data, raw_shape=data.shape, raw_dtype=qtype)
        expected[hfname] = permute_back(deq, perm_heads) if perm_heads else deq
        if qtype not in RANDOM_KINDS:
            # independent of the permutation formulas: the original matrix back, up to rounding
            err = np.abs(expected[hfname] - arr).mean()
            assert err < 0.2 * np.abs(arr).mean() + 1e-6, (hfname, err)

    def permute_back(arr, n):
        return (
            arr.reshape(n, arr.shape[0] // n // 2, 2, *arr.shape[1:])
            .swapaxes(1, 2)
            .reshape(arr.shape)
        )

    put("token_embd.weight", "model.embed_tokens.weight", Q.Q8_0)
    put("output.weight", "lm_head.weight", head_type)
    put("output_norm.weight", "model.norm.weight", Q.F32)
    for layer in range(2):
        for suffix, (gname, qtype) in types.items():
            heads = HEADS if gname == "attn_q" else KV if gname == "attn_k" else None
            put(f"blk.{layer}.{gname}.weight", f"model.layers.{layer}.{suffix}", qtype, heads)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    # the oracle runs on exactly the dequantized weights
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in expected.items()})
    return model, expected


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory, smol_reader):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return path, *write_tiny_gguf(path, smol_reader, H, FFN, TYPES, Q.Q8_0)


def linear_types(*qtypes) -> dict:
    """TYPES with the seven matrices of a layer (q, k, v, o, gate, up, down) stored as `qtypes`."""
    names = [n for n in TYPES if n.endswith("proj.weight")]
    return {**TYPES, **{n: (TYPES[n][0], q) for n, q in zip(names, qtypes, strict=True)}}


# as llama.cpp's Q4_K_M mixes them (v and down in Q6_K; o as in Q5_K_M)
K_TYPES = linear_types(Q.Q4_K, Q.Q4_K, Q.Q6_K, Q.Q5_K, Q.Q4_K, Q.Q4_K, Q.Q6_K)
# the other kinds qgemm reads (Q5_0/1 quantized by gguf-py, the rest random blocks)
OTHER_TYPES = linear_types(Q.Q5_0, Q.Q5_1, Q.IQ4_NL, Q.Q3_K, Q.IQ4_XS, Q.Q3_K, Q.IQ4_XS)


def _gguf_fixture(name: str, types: dict, head_type):
    @pytest.fixture(scope="module")
    def written(tmp_path_factory, smol_reader):
        path = tmp_path_factory.mktemp("gguf") / f"{name}.gguf"
        return path, *write_tiny_gguf(path, smol_reader, 256, 512, types, head_type)

    return written


k_quant_gguf = _gguf_fixture("k_quants", K_TYPES, Q.Q6_K)
other_quant_gguf = _gguf_fixture("other_quants", OTHER_TYPES, Q.Q5_1)


def test_every_tensor_type_dequantizes_and_unpermutes(tiny_gguf):
    path, _, expected = tiny_gguf
    config, weights, _, quantized = load_gguf(path)
    assert (config.num_layers, config.num_heads, config.num_kv_heads, config.head_dim) == (
        2,
        HEADS,
        KV,
        H // HEADS,
    )
    assert not config.tie_word_embeddings and config.eos_token_ids == (2,)
    assert set(weights) == set(expected)
    for name, arr in expected.items():
        np.testing.assert_array_equal(weights[name].numpy(), arr, err_msg=name)
    # the raw blocks kept for qgemm: rows un-permuted like the floats, the same values
    stored = {"Q4_0", "Q4_1", "Q8_0", "F16", "BF16"}
    want = {n for n in expected if n.endswith("weight") and expected[n].ndim == 2}
    want = {n for n in want if TYPES.get(n.split(".", 3)[-1], ("", Q.Q8_0))[1].name in stored}
    assert set(quantized) == want and "model.layers.0.self_attn.q_proj.weight" in want
    for name, blocks in quantized.items():
        np.testing.assert_array_equal(blocks.dequantize().numpy(), expected[name], err_msg=name)


def test_weights_are_dequantized_when_read_one_at_a_time(tiny_gguf, monkeypatch):
    """Loading dequantizes and copies nothing: a model build reads each tensor once, so no
    float32 copy of the whole model exists beside the one being built."""
    path, _, expected = tiny_gguf
    calls = []
    real = gguf_loader.dequantize
    monkeypatch.setattr(gguf_loader, "dequantize", lambda *a: calls.append(1) or real(*a))
    _, weights, _, quantized = load_gguf(path)
    assert calls == [] and quantized
    name = "model.layers.1.self_attn.k_proj.weight"  # Q4_1 and un-permuted
    assert name in weights and "rope_freqs.weight" not in weights and len(weights) == len(expected)
    first, second = weights[name], weights[name]
    assert len(calls) == 2 and first.data_ptr() != second.data_ptr()  # fresh, owned, each read
    np.testing.assert_array_equal(first.numpy(), expected[name])
    assert first.dtype == torch.float32 and first.is_contiguous()
    a, b = quantized[name], quantized[name]  # blocks too are copied out of the file when read
    assert a.blocks.data_ptr() != b.blocks.data_ptr() and torch.equal(a.blocks, b.blocks)
    assert "model.norm.weight" not in quantized and len(quantized) == len(list(quantized))


@pytest.mark.parametrize("fixture", ["tiny_gguf", "k_quant_gguf", "other_quant_gguf"])
def test_weights_read_in_the_models_dtype_and_device(request, fixture):
    """`read(name, device, dtype)` (what the model builder calls) gives the float32 values cast,
    rows un-permuted alike; on another device the same shapes, dequantized there."""
    path, _, expected = request.getfixturevalue(fixture)
    _, weights, _, _ = load_gguf(path)
    for name in expected:
        want = weights[name].to(torch.bfloat16)
        got = weights.read(name, "cpu", torch.bfloat16)
        assert got.is_contiguous() and torch.equal(got.view(torch.int16), want.view(torch.int16))
        meta = weights.read(name, torch.device("meta"), torch.float16)
        assert meta.device.type == "meta" and meta.shape == want.shape, name


def test_tiny_gguf_greedy_matches_transformers(tiny_gguf):
    path, model, _ = tiny_gguf
    llm = LLM(str(path), dtype="float32", kv_cache_memory=8 << 20)
    prompt = llm.tokenizer.encode("The river carries sediment to the sea, and")
    (out,) = llm.generate(
        {"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    )
    assert out.outputs[0].token_ids == hf_greedy(model, prompt, 8)[0]


@pytest.mark.parametrize(
    ("fixture", "kinds", "qkv", "down"),
    [
        ("k_quant_gguf", {"Q4_K", "Q5_K", "Q6_K", "Q8_0"}, ("Q4_K", "Q6_K"), ("Q6_K",)),
        (
            "other_quant_gguf",
            {"Q5_0", "Q5_1", "IQ4_NL", "Q3_K", "IQ4_XS", "Q8_0"},
            ("Q5_0", "Q5_1", "IQ4_NL"),
            ("IQ4_XS",),
        ),
    ],
)
@pytest.mark.slow
def test_quantized_gguf_runs_on_its_blocks_and_matches_transformers(
    request, fixture, kinds, qkv, down
):
    from pagoda.runtime.cpu import qgemm

    path, model, expected = request.getfixturevalue(fixture)
    _, _, _, quantized = load_gguf(path)
    assert {b.kind for b in quantized.values()} == kinds
    for name, blocks in quantized.items():
        np.testing.assert_array_equal(blocks.dequantize().numpy(), expected[name], err_msg=name)
    llm = LLM(str(path), dtype="float32", kv_cache_memory=8 << 20)
    if qgemm.load() is not None:
        layer = llm.engine.runner.model.layers[0]
        assert layer.qkv.fast.kinds == qkv and layer.mlp.down.fast.kinds == down
    prompt = llm.tokenizer.encode("The river carries sediment to the sea, and")
    (out,) = llm.generate(
        {"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    )
    assert out.outputs[0].token_ids == hf_greedy(model, prompt, 8)[0]


def test_tokenizer_and_template_match_transformers(smol, smol_reader, monkeypatch):
    share_gguf_reader(monkeypatch, smol_reader, smol.path)  # its vocabulary parsed once
    hf_tok = transformers.AutoTokenizer.from_pretrained(
        os.path.dirname(smol.path), gguf_file=os.path.basename(smol.path)
    )
    texts = [
        "Hello world!",
        "  leading spaces, tabs\tand\n\nnewlines  ",
        "naïve café 日本語 emoji 🙂",
        "<|im_start|>user\nHi<|im_end|>\n",
        "def f(x):\n    return x ** 2  # code",
    ]
    for t in texts:
        assert smol.tokenizer.encode(t) == hf_tok.encode(t, add_special_tokens=False), t
        assert smol.tokenizer.decode(smol.tokenizer.encode(t), skip_special_tokens=False) == t
    msgs = [{"role": "user", "content": "Hi"}]
    ours = smol.tokenizer.apply_chat_template(msgs)
    assert ours == hf_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert smol.tokenizer.encode("2024") == [34, 32, 34, 36]  # digits split one by one (smollm)


def test_fast_reader_reads_what_the_stock_reader_reads(smol, smol_reader):
    """`_reader` gives the stock GGUFReader's fields and tensors on the embedded model: the
    same values (`contents()`, whole and by index) and types for every field, the same parts
    where it does not hold an array whole, the same tensors bit for bit. A gguf release that
    changed its parsing would show here. The tests' shared reader (`stock_gguf_reader`, the
    stock parsing over plain slices) gives them too, every field's parts included."""
    from pagoda.runtime.model.gguf_loader import _reader

    stock, fast = gguf.GGUFReader(smol.path), _reader(smol.path)
    for other, whole_arrays in ((fast, True), (smol_reader, False)):
        assert stock.fields.keys() == other.fields.keys()
        whole = 0
        for key, a in stock.fields.items():
            b = other.fields[key]
            assert (a.types, a.offset, a.name) == (b.types, b.offset, b.name), key
            assert a.contents() == b.contents(), key
            if a.types[0] == gguf.GGUFValueType.ARRAY:
                whole += 1
                assert [a.contents(i) for i in (0, -1)] == [b.contents(i) for i in (0, -1)], key
                assert a.contents(slice(3, 7)) == b.contents(slice(3, 7)), key
                if whole_arrays:
                    continue
            assert a.data == b.data and len(a.parts) == len(b.parts), key
            assert all(
                x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a.parts, b.parts)
            ), key
        assert whole >= 3  # tokens, merges, token types: the arrays read whole
        assert [t.name for t in stock.tensors] == [t.name for t in other.tensors]
        for a, b in zip(stock.tensors, other.tensors):
            assert a.tensor_type == b.tensor_type and np.array_equal(a.data, b.data), a.name
            assert a.data_offset == b.data_offset and a.shape.tolist() == b.shape.tolist()


def test_a_gguf_cut_inside_its_metadata_is_one_clear_error(tmp_path, smol):
    """A download cut short inside the vocabulary: one readable line naming the model."""
    from pagoda.runtime.model.loader import read_model_config

    cut = tmp_path / "cut.gguf"
    with open(smol.path, "rb") as f:
        cut.write_bytes(f.read(400_000))  # inside tokenizer.ggml.tokens
    with pytest.raises(ValueError, match=r"ends inside a metadata array \(\d+ of 49152 strings\)"):
        read_model_config(str(cut))


def test_fast_reader_reads_nested_and_big_endian_arrays(tmp_path):
    """Arrays the embedded model lacks: numbers of each width, booleans, an empty array, a
    nested array (left to the stock code), and all of it in a big-endian file."""
    from pagoda.runtime.model.gguf_loader import _reader

    for endian in (gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG):
        path = tmp_path / f"arrays-{endian.name}.gguf"
        w = gguf.GGUFWriter(str(path), "llama", endianess=endian)
        w.add_array("t.ints", [1, -2, 3])
        w.add_array("t.floats", [0.5, -1.25])
        w.add_array("t.bools", [True, False, True])
        w.add_array("t.strings", ["a", "", "日本語 🙂", "x y"])
        w.add_array("t.empty", [])
        w.add_array("t.nested", [[1, 2], [3]])
        w.add_uint64("t.big", 1 << 40)
        w.add_string("t.text", "after the arrays")
        w.add_tensor("w", np.arange(6, dtype=np.float32).reshape(2, 3))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        stock, fast = gguf.GGUFReader(path), _reader(path)
        assert stock.fields.keys() == fast.fields.keys()
        for key, a in stock.fields.items():
            b = fast.fields[key]
            assert a.types == b.types and a.contents() == b.contents(), (endian, key)
        assert fast.fields["t.strings"].contents() == ["a", "", "日本語 🙂", "x y"]
        assert fast.fields["t.text"].contents() == "after the arrays"
        assert np.array_equal(fast.tensors[0].data, stock.tensors[0].data)
