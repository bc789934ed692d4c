"""BitNet b1.58 (`BitNetForCausalLM`) against transformers, on tiny random checkpoints that
transformers writes and loads itself (`AutoBitLinear`):

- bitnet-offline: packed as microsoft/bitnet-b1.58-2B-4T is (`quantization_mode` offline:
  each projection ternary, packed four a byte by transformers' own `pack_weights`, with a
  one-element bf16 `weight_scale` = mean|W|; the head tied);
- bitnet-online: master weights as microsoft/bitnet-b1.58-2B-4T-bf16 (quantized on the fly).

Token for token and logits within 1e-3 in float32 (prompts chunked into 16-token steps, three
prompts in one batch, again on a warm prefix cache), tokens in bfloat16; the layer's pieces bit
for bit against transformers' (`unpack_weights`, `ActQuant`, `WeightQuant`); the refusals
(a tensor-parallel size that does not divide the heads, --quantization fp8, the layer kinds
not served, a matrix not packed); the weights estimate; two tensor-parallel ranks. transformers' BitLinear code is decorated with torch.compile: it runs
eagerly here (dynamo off), its own semantics without minutes of CPU compilation.
"""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import torch
from arch_cases import built_fixture, check_chunked_cached_batched, generate, prompts
from hf_oracle import hf_greedy_plain, save_word_tokenizer
from pagoda.runtime import LLM
from pagoda.runtime.model.loader import load_model, read_model_config

transformers = pytest.importorskip("transformers")
bitnet_hf = pytest.importorskip("transformers.integrations.bitnet")
MATRIX = re.compile(r"_proj\.weight$")
ONLINE = {"quant_method": "bitnet", "linear_class": "autobitlinear", "quantization_mode": "online"}
OFFLINE = {**ONLINE, "quantization_mode": "offline"}
CASES = ("bitnet-offline", "bitnet-online")


@pytest.fixture(scope="module", autouse=True)
def eager_transformers():
    """transformers' BitLinear code without torch.compile (its eager semantics)."""
    with torch._dynamo.config.patch(disable=True):
        yield


def write_bitnet(path, mode: str, **overrides):
    """A tiny BitNet saved to `path` in `mode` ("offline": packed, "online": master weights);
    returns it as transformers loads it (float32, eval)."""
    from safetensors.torch import load_file, save_file

    cfg = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
               eos_token_id=2, bos_token_id=1, pad_token_id=0, **overrides)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.BitNetForCausalLM(transformers.BitNetConfig(**cfg)).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # matrices scaled (greedy picks apart), noisy norms
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(3.0)
            else:
                p.add_(0.2 * torch.randn(p.shape, generator=g))
    model.save_pretrained(path)
    tensors = load_file(path / "model.safetensors")
    if mode == "offline":  # as the published checkpoint: ternary, packed, one scale a matrix
        for name in [n for n in tensors if MATRIX.search(n)]:
            w = tensors[name].float()
            scale = w.abs().mean().clamp(min=1e-5)
            tensors[name] = bitnet_hf.pack_weights((w / scale).round().clamp(-1, 1))
            scale = scale.reshape(1).to(torch.bfloat16)  # (bf16, as published)
            tensors[name.removesuffix("weight") + "weight_scale"] = scale
        save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = OFFLINE if mode == "offline" else ONLINE
    (path / "config.json").write_text(json.dumps(config))
    save_word_tokenizer(path, cfg["vocab_size"])
    return load_hf(path, torch.float32)


def load_hf(path, dtype):
    """transformers' model of `path`, its weights in `dtype` (with a quantizer, from_pretrained
    leaves the tensors it does not convert in the checkpoint's dtype; the rotary's float32
    inv_freq is left as it is)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith(("weight", "weight_scale")):
                t.data = t.data.to(dtype)
    assert isinstance(model.model.layers[0].mlp.down_proj, bitnet_hf.AutoBitLinear)
    return model


def write_case(name: str, path):
    """bitnet-offline tied as the published checkpoint is; bitnet-online with a head of its own."""
    mode = name.removeprefix("bitnet-")
    return write_bitnet(path, mode, tie_word_embeddings=mode == "offline")


built = built_fixture(write_case)


@pytest.mark.parametrize("name", CASES)
def test_greedy_matches_transformers_chunked_cached_batched(built, name):
    _, _, loaded, reference = built(name)
    assert loaded.config.family.bitnet == name.removeprefix("bitnet-")
    check_chunked_cached_batched(loaded, reference, name)


@pytest.mark.parametrize("name", CASES)
def test_bfloat16_tokens_match_transformers_in_bfloat16(built, name):
    """transformers loads the checkpoint in bf16 (the weights, scales and rounding in bf16):
    the engine's bf16 greedy tokens are its, chunked and batched."""
    path, _, loaded, _ = built(name)
    hf = load_hf(path, torch.bfloat16)
    want = [hf_greedy_plain(hf, p, 6)[0] for p in prompts()]
    llm = LLM(loaded=loaded, dtype="bfloat16", kv_cache_memory=16 << 20, block_size=16,
              max_num_batched_tokens=16, max_num_seqs=4)  # fmt: skip
    assert [tokens for tokens, _ in generate(llm, prompts())] == want


def test_the_layer_is_transformers_bit_for_bit():
    """Unpacking (transformers' `unpack_weights` of its `pack_weights`), the activations'
    int8 rounding (`ActQuant`) and the online weights (`WeightQuant`), in float32 and bf16."""
    from pagoda.runtime.model.bitlinear import (
        quantize_activations,
        quantize_weight,
        unpack_ternary,
    )

    g = torch.Generator().manual_seed(0)
    ternary = torch.randint(-1, 2, (48, 40), generator=g)
    packed = bitnet_hf.pack_weights(ternary.clone())
    assert packed.dtype == torch.uint8 and packed.shape == (12, 40)
    for dtype in (torch.float32, torch.bfloat16):
        assert torch.equal(unpack_ternary(packed, dtype), bitnet_hf.unpack_weights(packed, dtype))
        assert torch.equal(unpack_ternary(packed, dtype), ternary.to(dtype))
        x = torch.randn(9, 200, generator=g).mul(5).to(dtype)
        x[3] = 0  # an all-zero row: the 1e-5 floor
        assert torch.equal(quantize_activations(x), bitnet_hf.ActQuant.apply(x))
        w = torch.randn(32, 64, generator=g).to(dtype)
        assert torch.equal(quantize_weight(w), bitnet_hf.WeightQuant.apply(w))


def test_a_size_that_does_not_divide_and_fp8_are_refused_in_one_line(built):
    from pagoda.runtime.distributed.layout import check
    from pagoda.runtime.engine.start_checks import check_dtype

    config = built("bitnet-offline")[2].config
    with pytest.raises(ValueError, match=r"^--tensor-parallel-size 3 does not divide the "
                                         r"model's 4 attention heads$"):  # fmt: skip
        check(config, 3)
    fp8 = SimpleNamespace(quantization="fp8", torch_dtype=lambda: torch.bfloat16,
                          cache=SimpleNamespace(kv_cache_dtype="auto"))  # fmt: skip
    with pytest.raises(ValueError, match=r"^--quantization fp8 is not supported for a bitnet "):
        check_dtype(fp8, config)


@pytest.mark.parametrize(("change", "error"), [
    ({"linear_class": "bitlinear"}, "BitNet linear_class 'bitlinear' is not supported"),
    ({"use_rms_norm": True}, "BitNet with use_rms_norm"),
    ({"quantization_mode": "qat"}, "BitNet quantization_mode 'qat'"),
    ({"modules_to_not_convert": ["lm_head", "model.layers.0.mlp.down_proj"]},
     "BitNet modules_to_not_convert"),
])  # fmt: skip
def test_the_bitnet_configs_not_served_are_refused_in_one_line(built, tmp_path, change, error):
    path = built("bitnet-offline")[0]
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {**OFFLINE, **change}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=re.escape(error)):
        read_model_config(str(tmp_path))


def test_a_checkpoint_that_does_not_hold_the_packed_form_is_refused(built, tmp_path):
    """config.json says offline: master weights (bf16 matrices of the unpacked shape), a
    matrix of the packed shape stored as bf16, or a missing weight_scale are refused at config
    time, naming the tensor."""
    import shutil

    online = built("bitnet-online")[0]
    for f in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(online / f, tmp_path / f)
    config = json.loads((online / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "quantization_config": OFFLINE}))
    with pytest.raises(ValueError, match=r"q_proj\.weight is \[64, 64\], config\.json .* needs "
                                         r"\[16, 64\]"):  # fmt: skip
        read_model_config(str(tmp_path))
    from safetensors.torch import load_file, save_file

    packed = load_file(built("bitnet-offline")[0] / "model.safetensors")
    (tmp_path / "config.json").write_text((built("bitnet-offline")[0] / "config.json").read_text())
    q = "model.layers.1.self_attn.q_proj."
    for edit, words in [
        ({q + "weight": packed[q + "weight"].to(torch.bfloat16)},
         f"{q}weight is BF16; a packed BitNet matrix"),
        ({q + "weight_scale": None}, f"missing tensor '{q}weight_scale'"),
    ]:  # fmt: skip
        tensors = {**packed, **edit}
        save_file(
            {k: v for k, v in tensors.items() if v is not None}, tmp_path / "model.safetensors"
        )
        with pytest.raises(ValueError, match=re.escape(words)):
            read_model_config(str(tmp_path))


def test_without_a_quantization_config_the_projections_are_dense(tmp_path):
    """A BitNetForCausalLM without quantization_config: transformers runs plain Linears (the
    sub-norms and relu² stay), and so does the engine."""
    model = transformers.BitNetForCausalLM(transformers.BitNetConfig(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, eos_token_id=2, bos_token_id=1,
        pad_token_id=0)).eval()  # fmt: skip
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0 if p.dim() > 1 else 1.0)
    model.save_pretrained(tmp_path)
    save_word_tokenizer(tmp_path, 300)
    loaded = load_model(str(tmp_path))
    assert loaded.config.family.bitnet == "" and loaded.config.family.hidden_act == "relu2"
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20)
    prompt = prompts()[1]
    assert generate(llm, [prompt])[0][0] == hf_greedy_plain(model, prompt, 6)[0]


@pytest.mark.parametrize("name", CASES)
def test_the_weights_estimate_is_what_the_model_holds(built, name):
    """Packed matrices held unpacked (four times the rows, in the dtype), master weights held
    quantized: the start-up estimate within 2% of what the built model holds."""
    from model_bytes import check_estimate
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.server import weights

    path, _, loaded, _ = built(name)
    check_estimate(path, 1)
    # from the config's shapes alone as from the tensors, on CUDA (a CPU packs a tied head apart)
    engine = EngineConfig.create(str(path), device="cpu", dtype="bfloat16")
    cuda = weights.estimate(loaded.config, engine, path, device=torch.device("cuda"))
    got = weights.from_shapes(loaded.config, torch.bfloat16, False)
    assert got == pytest.approx(cuda.bytes, rel=0.001), (got, cuda.bytes)


@pytest.mark.slow  # a second process (gloo)
@pytest.mark.parametrize("name", CASES)
def test_two_ranks_match_transformers(built, name):
    """Two ranks (gloo), the small pool (preempted) then a warm cache: each rank its heads' rows
    of q/k/v and its rows of gate/up (each matrix unpacked or quantized whole, then cut), o_proj
    and down_proj by input columns with the activations rounded by the whole row's absmax, the
    sub-norms over their whole width; transformers' tokens and logits; rank 0's weights
    estimate."""
    from arch_cases import check_two_ranks
    from model_bytes import check_estimate
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.server import weights

    path, _, loaded, reference = built(name)
    check_two_ranks(path, loaded, reference, name, kv_heads=1)
    check_estimate(path, 2, rel=0)
    engine = EngineConfig.create(str(path), device="cpu", dtype="bfloat16", tensor_parallel_size=2)
    cuda = weights.estimate(loaded.config, engine, path, device=torch.device("cuda"))
    got = weights.from_shapes(loaded.config, torch.bfloat16, False, 2)  # (fit's plans)
    assert got == pytest.approx(cuda.bytes, rel=0.001), (got, cuda.bytes)


@pytest.mark.gpu
@pytest.mark.parametrize("name", CASES)
def test_gpu_matches_transformers_with_graphs(built, name):
    from arch_cases import check_on_cuda_with_graphs

    _, _, loaded, reference = built(name)
    check_on_cuda_with_graphs(loaded, reference, name)
