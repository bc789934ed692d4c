"""Models without rotary against transformers, token for token, on tiny random checkpoints
transformers writes itself (tests/runtime/hf_oracle.py): float32, prompts chunked into 16-token
steps, three prompts sharing steps, a warm prefix cache on the second pass, a KV pool so small
that requests are preempted; logits within 1e-3 of transformers' plain greedy loop.

Learned absolute positions (`model/positions.py`):

- GPT-2 (`GPT2LMHeadModel`): Conv1D matrices stored [in, out], the fused `c_attn`, gelu_new,
  a tied head; once with the hub's names (gpt2's files have no `transformer.` prefix), once
  with `scale_attn_by_inverse_layer_idx` (BioMedLM's: layer i's scores / (i + 1));
- GPTBigCode (`GPTBigCodeForCausalLM`: StarCoder 1, SantaCoder): multi-query (one KV head) and
  multi-head (q/k/v per head in `c_attn`);
- GPT-Neo (`GPTNeoForCausalLM`): `attention_types` local (a window of `window_size`) and
  global layers, scores not scaled by 1/sqrt(d), q/k/v apart (no biases) and out_proj's bias;
- OPT (`OPTForCausalLM`): positions offset by 2, biases (or none: `enable_bias` false), ReLU,
  pre-norm with a final norm; opt-350m's post-norm layers with `word_embed_proj_dim` narrower than hidden
  (`project_in` / `project_out`), the hub's `decoder.` names;
- XGLM (`XGLMForCausalLM`): OPT's pre-norm layer with a sinusoidal table computed (none
  stored), offset by 2, the embeddings scaled by sqrt(hidden), exact GELU;
- OpenAI GPT (`OpenAIGPTLMHeadModel`): GPT-2's Conv1D matrices and fused `c_attn` under
  OPT's post-norm layers, no final norm;
- BioGPT (`BioGptForCausalLM`): OPT's stored table offset by 2 under XGLM's pre-norm layer,
  the embeddings scaled by sqrt(hidden);
- CTRL (`CTRLLMHeadModel`): XGLM's model with CTRL's own sinusoidal table (no offset), a ReLU
  MLP and the LM head's bias.

ALiBi (`model/alibi.py`, `model/bloom.py`; every attention path adds the bias: the CPU C++
kernel by default here, the torch path and the Triton kernels below):

- BLOOM (`BloomForCausalLM`): the embeddings' LayerNorm, q/k/v per head, six heads (the slopes
  of a head count that is not a power of two);
- MPT (`MptForCausalLM`): LayerNorms without biases, `clip_qkv`, six heads (MPT's slopes).

Also: over two tensor-parallel ranks (gloo: each rank its heads' slopes, GPT-2's transposed
matrices cut by rows of the transpose), what a sparse config.json reads as against
transformers' config classes, the refusals (one line), ALiBi in the Triton kernels
(interpreted on CPU; on CUDA with graphs, marked gpu) and OPT's vocab.json + merges.txt
tokenizer against transformers'.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from arch_cases import (
    built_fixture,
    case_fixture,
    check_chunked_cached_batched,
    check_two_ranks,
    gpu_test,
    greedy_test,
)
from hf_oracle import check_config_refused, make_tiny_model
from pagoda.runtime.model.loader import read_model_config

transformers = pytest.importorskip("transformers")
# name: (config class prefix, config overrides, the hub's tensor names: the prefix to drop)
CASES = {
    "gpt2": ("GPT2", dict(num_key_value_heads=None), None),
    "gpt2-hub-names": ("GPT2", dict(num_key_value_heads=None, scale_attn_weights=False),
                       "transformer."),
    "gpt2-inverse-layer-scale": ("GPT2", dict(num_key_value_heads=None, scale=8.0,
                                 scale_attn_by_inverse_layer_idx=True,
                                 reorder_and_upcast_attn=True), None),
    "gpt_bigcode-mqa": ("GPTBigCode", dict(multi_query=True), None),
    "gpt_bigcode-mha": ("GPTBigCode", dict(multi_query=False, activation_function="gelu"), None),
    # GPT-Neo: a global layer, then a local one (a window of 8: the prompts pass it), unscaled
    # scores, q/k/v apart without biases beside out_proj's
    "gpt_neo-local": ("GPTNeo", dict(num_key_value_heads=None, window_size=8,
                                     attention_types=[[["global", "local"], 1]]), None),
    "opt-pre-norm": ("OPT", dict(ffn_dim=128, enable_bias=True), None),
    "opt-no-bias": ("OPT", dict(ffn_dim=128, enable_bias=False), None),
    "opt-post-norm-proj": ("OPT", dict(ffn_dim=128, do_layer_norm_before=False,
                                       word_embed_proj_dim=32), "model."),
    # XGLM: a computed sinusoidal table offset by 2, embeddings x sqrt(hidden), OPT's pre-norm
    "xglm-sinusoidal": ("XGLM", dict(num_key_value_heads=None, ffn_dim=128), None),
    # OpenAI GPT: GPT-2's Conv1D matrices and c_attn, OPT's post-norm layers, no final norm
    # (the hub's names: openai-gpt's files have no `transformer.` prefix)
    "openai_gpt-post-norm": ("OpenAIGPT", dict(num_key_value_heads=None), "transformer."),
    # BioGPT: OPT's table offset by 2, embeddings x sqrt(hidden), XGLM's pre-norm layer
    "biogpt-scaled": ("BioGpt", dict(num_key_value_heads=None), None),
    # CTRL: its sinusoidal table computed, embeddings x sqrt(hidden), a ReLU MLP, a head bias
    "ctrl-sinusoidal": ("CTRL", dict(num_key_value_heads=None, dff=128), None),
    "bloom-6-heads": ("Bloom", dict(hidden_size=96, num_attention_heads=6), None),
    "mpt-clip-6-heads": ("Mpt", dict(hidden_size=96, num_attention_heads=6,
                                     attn_config={"clip_qkv": 0.5}), None),
}  # fmt: skip


def _hub_names(path, prefix: str) -> None:
    """The checkpoint's tensors renamed as the hub's files name them: `prefix` dropped; GPT-2's
    with the causal-mask buffers older transformers saved (`h.N.attn.bias`, `masked_bias`)."""
    from safetensors.torch import load_file, save_file

    f = path / "model.safetensors"
    tensors = {k.removeprefix(prefix): v for k, v in load_file(f).items()}
    if "wte.weight" in tensors or "tokens_embed.weight" in tensors:
        for i in range(2):
            tensors[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 512, 512))
            tensors[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    save_file(tensors, f, {"format": "pt"})


# bloom-6-heads in one layer: the Triton test's model (the kernels run each layer alike; two
# layers took twice as long in the interpreter)
ONE_LAYER = {
    "bloom-6-heads-1": ("Bloom", dict(CASES["bloom-6-heads"][1], num_hidden_layers=1), None)
}


def _make(name: str, path):
    arch, overrides, prefix = {**CASES, **ONE_LAYER}[name]
    model = make_tiny_model(path, arch, **overrides)
    if prefix is not None:
        _hub_names(path, prefix)
    return model


built = built_fixture(_make)
case = case_fixture(CASES)


test_greedy_matches_transformers_chunked_cached_batched_and_preempted = greedy_test()


@pytest.mark.parametrize("name", ["bloom-6-heads", "mpt-clip-6-heads"])
def test_alibi_on_both_cpu_paths_matches_transformers(built, name, monkeypatch):
    """ALiBi in the C++ kernel (the default, above: it adds the bias before each row's
    softmax) and in the torch path (`PAGODA_CPU_ATTENTION=torch`): transformers' tokens and
    logits either way."""
    from pagoda.runtime.cpu import attention as cpu_attention

    _, _, loaded, reference = built(name)
    kernel = check_chunked_cached_batched(loaded, reference, name)
    assert kernel.engine.runner.backend.kernel is not None
    monkeypatch.setenv(cpu_attention.ENV_SWITCH, "torch")
    torch_path = check_chunked_cached_batched(loaded, reference, name + " (torch path)")
    assert torch_path.engine.runner.backend.kernel is None


@pytest.mark.slow  # a second process (gloo): ~10 s on 2 busy cores
@pytest.mark.parametrize(("name", "kv_heads"), [
    ("gpt2", 2), ("gpt_bigcode-mqa", 1), ("opt-post-norm-proj", 2), ("bloom-6-heads", 3),
    ("ctrl-sinusoidal", 2),
])  # fmt: skip
def test_two_ranks_match_transformers(built, name, kv_heads):
    """Tensor parallelism over gloo, two ranks, the small pool then a warm cache: GPT-2's
    transposed c_attn cut by heads, StarCoder 1's one KV head on both ranks, OPT's projections
    and position table whole on each rank, BLOOM's slopes three a rank, CTRL's LM head bias
    (whole on every rank) added after the vocabulary gather."""
    path, _, loaded, reference = built(name)
    check_two_ranks(path, loaded, reference, name, kv_heads=kv_heads)


@pytest.mark.parametrize(("name", "tp"), [("gpt2-hub-names", 2), ("gpt_bigcode-mqa", 1),
                                        ("gpt_neo-local", 1), ("xglm-sinusoidal", 2),
                                        ("openai_gpt-post-norm", 2), ("biogpt-scaled", 2),
                                        ("ctrl-sinusoidal", 1), ("ctrl-sinusoidal", 2),
                                        ("opt-post-norm-proj", 2), ("bloom-6-heads", 2)])  # fmt: skip
def test_the_weights_estimate_is_what_the_model_holds(built, name, tp):
    """`server/weights.py` against the built model, bf16 from float32 files: the position
    table (whole on every rank), GPT-2's Conv1D matrices read transposed (cut by heads as the
    loader cuts them), OPT's projections, BLOOM's embedding norm."""
    from model_bytes import check_estimate

    path, _, _, _ = built(name)
    check_estimate(path, tp)


def test_the_config_reads_as_transformers_reads_it(built):
    """Positions, heads, widths, eps and tying as transformers' configs say."""
    expect = {"gpt2": ("learned", 4, 256), "gpt_bigcode-mqa": ("learned", 1, 256),
              "opt-post-norm-proj": ("learned", 4, 128), "bloom-6-heads": ("alibi", 6, 384),
              "mpt-clip-6-heads": ("alibi", 6, 384), "xglm-sinusoidal": ("sinusoidal", 4, 128),
              "biogpt-scaled": ("learned", 4, 128), "ctrl-sinusoidal": ("sinusoidal", 4, 128)}  # fmt: skip
    for name, (positions, kv_heads, width) in expect.items():
        path, model, _, _ = built(name)
        c = read_model_config(str(path))
        assert (c.family.positions, c.num_kv_heads, c.intermediate_size) == (
            positions, kv_heads, width), name  # fmt: skip
        assert c.tie_word_embeddings == (
            model.get_output_embeddings().weight is model.get_input_embeddings().weight
        )
    c = read_model_config(str(built("opt-post-norm-proj")[0]))
    assert (c.family.position_offset, c.family.post_norm, c.family.embed_proj_dim) == (2, True, 32)
    c = read_model_config(str(built("mpt-clip-6-heads")[0]))
    assert (c.family.clip_qkv, c.family.alibi_slopes, c.max_position_embeddings) == (
        0.5,
        "mpt",
        2048,
    )


@pytest.mark.parametrize(("arch", "model_type", "extra"), [
    ("GPT2LMHeadModel", "gpt2", {"n_layer": 2}),
    ("GPTBigCodeForCausalLM", "gpt_bigcode", {"n_layer": 2}),
    ("GPTNeoForCausalLM", "gpt_neo", {"num_layers": 2, "attention_types": [[["local"], 2]]}),
    ("OPTForCausalLM", "opt", {"num_hidden_layers": 2}),
    ("XGLMForCausalLM", "xglm", {"num_layers": 2}),
    ("OpenAIGPTLMHeadModel", "openai-gpt", {"n_layer": 2}),
    ("BioGptForCausalLM", "biogpt", {"num_hidden_layers": 2}),
    ("CTRLLMHeadModel", "ctrl", {"n_layer": 2}),
    ("BloomForCausalLM", "bloom", {"n_layer": 2}),
    ("MPTForCausalLM", "mpt", {"n_layers": 2, "d_model": 256, "n_heads": 8}),
])  # fmt: skip
def test_a_sparse_config_reads_with_transformers_defaults(tmp_path, arch, model_type, extra):
    """A config.json with a few keys: context, tying, BOS/EOS, KV heads and the MLP's width
    as transformers' config class fills them in."""
    config = {"architectures": [arch], "model_type": model_type, **extra}
    (tmp_path / "config.json").write_text(json.dumps(config))
    t, o = transformers.AutoConfig.from_pretrained(tmp_path), read_model_config(str(tmp_path))
    heads = t.num_attention_heads
    kv = 1 if getattr(t, "multi_query", False) else heads
    width = {"opt": "ffn_dim", "gpt2": "n_inner", "gpt_bigcode": "n_inner",
             "xglm": "ffn_dim", "ctrl": "dff", "biogpt": "intermediate_size"}.get(model_type)  # fmt: skip
    inner = getattr(t, width) if width else None
    if model_type == "mpt":
        inner = t.expansion_ratio * t.d_model
    assert (o.num_layers, o.num_heads, o.num_kv_heads, o.intermediate_size) == (
        t.num_hidden_layers, heads, kv, inner or 4 * t.hidden_size)  # fmt: skip
    assert o.tie_word_embeddings == t.tie_word_embeddings
    assert o.bos_token_id == t.bos_token_id
    if model_type == "xglm":  # sqrt(d_model) with scale_embedding (its default)
        assert o.family.embedding_multiplier == t.d_model**0.5 and t.scale_embedding
    if model_type == "biogpt":  # the same, over OPT's table offset by 2
        assert o.family.embedding_multiplier == t.hidden_size**0.5 and t.scale_embedding
        assert o.family.position_offset == 2
    if model_type == "ctrl":  # sqrt(n_embd), no offset, the head's bias
        assert o.family.embedding_multiplier == t.n_embd**0.5
        assert (o.family.position_offset, o.family.lm_head_bias) == (0, True)
    if model_type in (
        "gpt2",
        "gpt_bigcode",
        "opt",
        "gpt_neo",
        "xglm",
        "openai-gpt",
        "biogpt",
        "ctrl",
    ):
        assert o.max_position_embeddings == t.max_position_embeddings
    if model_type == "gpt_neo":  # its window on the local layers, as transformers' mask's
        assert [o.family.window(i) for i in range(2)] == [t.window_size] * 2
    eps = getattr(t, "layer_norm_epsilon", 1e-5)
    assert o.rms_norm_eps == eps


@pytest.mark.parametrize(("arch", "edit", "words"), [
    ("Bloom", {"apply_residual_connection_post_layernorm": True}, "post_layernorm"),
    ("Mpt", {"attn_config": {"qk_ln": True}}, "qk_ln"),
    ("Mpt", {"attn_config": {"alibi": False}}, "MPT without attn_config.alibi"),
    ("Mpt", {"logit_scale": "inv_sqrt_d_model"}, "logit_scale 'inv_sqrt_d_model'"),
    ("OPT", {"layer_norm_elementwise_affine": False}, "layer_norm_elementwise_affine"),
    ("XGLM", {"pad_token_id": 5}, r"XGLM with pad_token_id 5 \(its position table's row 5"),
    ("BioGpt", {"hidden_act": "silu"}, "hidden activation 'silu' in an ungated MLP"),
    ("CTRL", {"layer_norm_epsilon": 1e-5}, r"CTRL with layer_norm_epsilon 1e-05 is not supported"),
    ("OpenAIGPT", {"afn": "silu"}, r"OpenAI GPT with afn 'silu' is not supported \(gelu, relu\)"),
])  # fmt: skip
def test_config_values_the_engine_does_not_run_are_refused_in_one_line(tmp_path, arch, edit, words):
    check_config_refused(tmp_path, arch, edit, words)


@pytest.mark.parametrize(("arch", "edit", "words"), [
    ("GPT2", {"n_positions": 1024}, r"transformer.wpe.weight is \[512, 64\], config.json "
                                    r".* needs \[1024, 64\]"),
    ("OPT", {"word_embed_proj_dim": 32}, r"model.decoder.embed_tokens.weight is \[300, 64\]"),
])  # fmt: skip
def test_a_checkpoint_that_does_not_match_its_config_is_refused_in_one_line(
    tmp_path, arch, edit, words
):
    """The position table's rows and OPT's embedding width checked from the headers when the
    config is read (before the server binds: exit 2)."""
    extra = {"ffn_dim": 128} if arch == "OPT" else {}
    make_tiny_model(tmp_path, arch, num_hidden_layers=1, **extra)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, **edit}))
    with pytest.raises(ValueError, match=words) as e:
        read_model_config(str(tmp_path))
    assert "\n" not in str(e.value)


def test_max_model_len_past_the_position_table_is_refused(built):
    """The learned table has max_position_embeddings rows (512 here): more is refused in one
    line, as vLLM does; ALiBi's context is config.json's too."""
    from pagoda.runtime import LLM

    for name in ("gpt2", "bloom-6-heads"):
        _, _, loaded, _ = built(name)
        with pytest.raises(
            ValueError, match=r"max_model_len 600 is more than the model's context"
        ) as e:
            LLM(loaded=loaded, dtype="float32", max_model_len=600, kv_cache_memory=16 << 20)
        assert "\n" not in str(e.value)


@pytest.mark.slow  # Triton's interpreter: 40 s at a load of 7 on 2 cores with two layers
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter")
def test_alibi_on_the_triton_backend_matches_transformers(built):
    """The Triton kernels' ALiBi path (``HAS_ALIBI``) in the engine, chunked (chunks on cached
    context) and batched (every row in the prefill kernel: the default, batch-invariant mode;
    each kernel path against the reference in tests/kernels/test_kernel_attention.py)."""
    from arch_cases import check, generate, prompts
    from pagoda.runtime import LLM

    name = "bloom-6-heads-1"
    _, _, loaded, reference = built(name)
    llm = LLM(loaded=loaded, attention_backend="triton", dtype="float32",
              kv_cache_memory=8 << 20, max_num_batched_tokens=16, max_num_seqs=4)  # fmt: skip
    assert llm.engine.runner.backend.alibi_slopes is not None
    for i, (got, want) in enumerate(zip(generate(llm, prompts()), reference)):
        check(got, want, f"{name}: prompt {i}, Triton")


# On CUDA in float32 with the defaults (the Triton ops and attention, ALiBi's kernel path,
# CUDA graphs)
test_gpu_matches_transformers_with_graphs = gpu_test()


def test_slopes_are_transformers_own():
    """BLOOM's and MPT's slopes for head counts that are powers of two and not."""
    from pagoda.runtime.model.alibi import bloom_slopes, mpt_slopes
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    for n in (1, 4, 6, 12, 16, 40, 112):
        ones = torch.ones(1, 2)  # position 1's bias is the slope itself
        assert torch.equal(build_alibi_tensor(ones, n, torch.float32)[:, 0, 1], bloom_slopes(n))
        assert torch.equal(-build_mpt_alibi_tensor(n, 2)[:, 0, 0], mpt_slopes(n))


@pytest.mark.parametrize("tcfg", [{}, {"model_max_length": 1024}, {"eos_token": None}])
def test_vocab_and_merges_without_named_tokens_keep_endoftext_whole(tmp_path, tcfg):
    """GPT-2's files with a tokenizer_config.json that names no special token (or none):
    GPT2Tokenizer's default `<|endoftext|>` is special, one id, as transformers' (a token named
    null is not)."""
    from pagoda.runtime.model.bpe_files import read_bpe_dir
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(["a b c <|endoftext|>"], vocab_size=270,
                            special_tokens=["<|endoftext|>"])  # fmt: skip
    bpe.save_model(str(tmp_path))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tcfg))
    ref = transformers.GPT2TokenizerFast.from_pretrained(tmp_path)
    tok = read_bpe_dir(tmp_path, tcfg)
    for s in ["x<|endoftext|>y", " <|endoftext|> \n"]:
        assert tok.encode(s).ids == ref(s)["input_ids"], s
    assert len(tok.encode("<|endoftext|>").ids) == 1


def test_mpt_alibi_bias_max_is_read(tmp_path):
    """attn_config.alibi_bias_max other than 8 (MPT's own code and vLLM read it; transformers'
    MPT runs 8): the slopes are MPT's formula with it, not silently 8's."""
    from pagoda.runtime.model.alibi import slopes
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    make_tiny_model(tmp_path, "Mpt", num_hidden_layers=1, hidden_size=96, num_attention_heads=6)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["attn_config"] = {**cfg["attn_config"], "alibi_bias_max": 16}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    want = -build_mpt_alibi_tensor(6, 2, alibi_bias_max=16)[:, 0, 0]
    assert torch.equal(slopes(read_model_config(str(tmp_path))), want)


def test_vocab_and_merges_tokenize_as_transformers(built, tmp_path):
    """OPT's tokenizer files (vocab.json and merges.txt, no tokenizer.json): the engine's
    tokenizer encodes and decodes as transformers' GPT2Tokenizer over the same files, its
    special tokens whole; a completion runs on an OPT model over them."""
    from pagoda.runtime import LLM, SamplingParams
    from pagoda.runtime.model.loader import load_model
    from tokenizers import ByteLevelBPETokenizer

    path = tmp_path / "opt"
    path.mkdir()
    make_tiny_model(path, "OPT", ffn_dim=128, vocab_size=400, bos_token_id=2, eos_token_id=2)
    (path / "tokenizer.json").unlink()
    bpe = ByteLevelBPETokenizer()
    text = ["Hello world, the quick brown fox jumps over the lazy dog. " * 3, "éa ünï 123 ok"]
    bpe.train_from_iterator(text, vocab_size=300, special_tokens=["<s>", "<pad>", "</s>"])
    bpe.save_model(str(path))
    # OPT's layout: the special tokens named in special_tokens_map.json
    tcfg = {"tokenizer_class": "GPT2Tokenizer", "add_bos_token": True, "add_prefix_space": False}
    (path / "tokenizer_config.json").write_text(json.dumps(tcfg))
    names = {"bos_token": "</s>", "eos_token": "</s>", "unk_token": "</s>", "pad_token": "<pad>"}
    (path / "special_tokens_map.json").write_text(json.dumps(names))
    ref = transformers.AutoTokenizer.from_pretrained(path)
    loaded = load_model(str(path))
    tok = loaded.tokenizer
    for s in ["Hello world", " the lazy fox</s>ok", "éa ünï 123", ""]:
        ids = ref(s)["input_ids"]
        assert tok.encode(s) == ids, s
        assert tok.decode(ids, skip_special_tokens=True) == ref.decode(
            ids, skip_special_tokens=True
        )
    assert ref("a")["input_ids"][0] == 2  # OPT's </s> first
    assert tok.encode("x</s>y", add_special_tokens=False) == ref("x</s>y", add_special_tokens=False)[
        "input_ids"] and 2 in tok.encode("x</s>y")  # fmt: skip
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20)
    out = llm.generate(
        ["Hello world"], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    )
    assert len(out[0].outputs[0].token_ids) == 4
    with pytest.raises(ValueError, match="no chat template; use completions"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_gpt_neo_layers_and_refusals(built, tmp_path):
    """GPT-Neo's `attention_types` read per layer (global: no window; local: `window_size`),
    scores unscaled; another kind of layer, or a count that is not num_layers, refused in one
    line."""
    c = built("gpt_neo-local")[2].config
    assert [c.family.window(i) for i in range(2)] == [None, 8]
    assert c.family.attention_multiplier == 1.0
    for types, words in (
        ([[["global", "sparse"], 1]], r"attention_types \['sparse'\]"),
        ([[["global"], 3]], "attention_types name 3 layers, the model has 2"),
    ):
        cfg = {"architectures": ["GPTNeoForCausalLM"], "model_type": "gpt_neo", "num_layers": 2,
               "attention_types": types}  # fmt: skip
        (tmp_path / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(ValueError, match=words) as e:
            read_model_config(str(tmp_path))
        assert "\n" not in str(e.value)
