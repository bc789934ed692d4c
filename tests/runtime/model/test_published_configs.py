"""Published config.json files of the Mistral 3 / Ministral checkpoints as they are on the hub
(sparse: what transformers' config classes fill in is left out), read as transformers reads
them, and the chat template rendered with what they imply."""

from __future__ import annotations

import json

import pytest
from hf_oracle import save_word_tokenizer
from pagoda.runtime.model.hf_loader import read_tokenizer
from pagoda.runtime.model.loader import read_model_config

transformers = pytest.importorskip("transformers")

# mistralai/Mistral-Small-3.1-24B-Instruct-2503's config.json (3.2-2506's and Magistral-Small-
# 2509's alike), shrunk: its text_config names no BOS nor EOS id
PIXTRAL = {"model_type": "pixtral", "hidden_size": 32, "intermediate_size": 64, "head_dim": 16,
           "num_attention_heads": 2, "num_hidden_layers": 1, "image_size": 28, "patch_size": 14}  # fmt: skip
MISTRAL_SMALL_3_1 = {
    "architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
    "image_token_index": 10, "multimodal_projector_bias": False, "projector_hidden_act": "gelu",
    "spatial_merge_size": 2, "vision_feature_layer": -1, "vision_config": PIXTRAL,
    "text_config": {"model_type": "mistral", "head_dim": 16, "hidden_act": "silu",
                    "hidden_size": 64, "intermediate_size": 128, "max_position_embeddings": 131072,
                    "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
                    "rms_norm_eps": 1e-05, "rope_theta": 1000000000.0, "sliding_window": None,
                    "vocab_size": 300},
}  # fmt: skip
# the processor's chat template opens with `bos_token` (chat_template.json)
TEMPLATE = ("{{- bos_token }} {% for m in messages %}{{ 'w3 ' + m['content'] + ' w4 ' }}"
            "{% endfor %}")  # fmt: skip


@pytest.mark.parametrize("text_type", ["mistral", "ministral"])
def test_a_mistral3_text_config_without_ids_reads_transformers_bos_and_eos(tmp_path, text_type):
    """Mistral-Small-3.1's text_config has no bos_token_id / eos_token_id (nor a
    generation_config.json here): MistralConfig's (and MinistralConfig's) 1 and 2, so that the
    template's `bos_token` is <s>'s and the prompt starts with BOS, as transformers renders it."""
    cfg = json.loads(json.dumps(MISTRAL_SMALL_3_1))
    cfg["text_config"]["model_type"] = text_type
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    theirs = transformers.AutoConfig.from_pretrained(tmp_path).get_text_config()
    ours = read_model_config(str(tmp_path))
    assert (ours.bos_token_id, list(ours.eos_token_ids)) == (1, [2])
    assert (ours.bos_token_id, ours.eos_token_ids[0]) == (theirs.bos_token_id, theirs.eos_token_id)
    save_word_tokenizer(tmp_path, 300)
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    tok = read_tokenizer(tmp_path, ours)
    text = tok.apply_chat_template([{"role": "user", "content": "w9"}])
    assert tok.encode(text, add_special_tokens=False) == [1, 3, 9, 4]


@pytest.mark.parametrize("wrapped", [False, True])
@pytest.mark.parametrize("model_type", ["mistral", "ministral", "ministral3"])
def test_a_sparse_mistral_family_config_reads_with_transformers_defaults(
    tmp_path, model_type, wrapped
):
    """The core shapes alone, as a causal LM's config.json or as Mistral 3's text_config: the
    norm's eps, rotary, context, window (every layer), KV heads, head size and ids that
    transformers' MistralConfig / MinistralConfig (eps 1e-6) / Ministral3Config fill in."""
    core = dict(vocab_size=300, hidden_size=256, intermediate_size=128, num_hidden_layers=4,
                num_attention_heads=32)  # fmt: skip
    arch = {"mistral": "Mistral", "ministral": "Ministral", "ministral3": "Ministral3"}
    config = {"architectures": [f"{arch[model_type]}ForCausalLM"], "model_type": model_type}
    if wrapped:
        config = {"architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
                  "text_config": {"model_type": model_type, **core}}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps({**config, **({} if wrapped else core)}))
    t = transformers.AutoConfig.from_pretrained(tmp_path).get_text_config()
    o = read_model_config(str(tmp_path))
    rope = t.rope_parameters
    assert (o.rms_norm_eps, o.rope_theta, o.max_position_embeddings) == (
        t.rms_norm_eps, rope["rope_theta"], t.max_position_embeddings)  # fmt: skip
    assert (o.rope_scaling or {}).get("rope_type", "default") == rope["rope_type"]
    assert (o.num_kv_heads, o.head_dim) == (t.num_key_value_heads, t.head_dim or 8)
    assert (o.bos_token_id, list(o.eos_token_ids)) == (t.bos_token_id, [t.eos_token_id])
    assert o.family.sliding_window == t.sliding_window
    kinds = getattr(t, "layer_types", None) or []
    assert all(k == "sliding_attention" for k in kinds) and not o.family.window_layers


def test_mistral_small_3_1s_own_head_is_kept_and_counted(tmp_path):
    """Mistral-Small-3.1's config.json leaves tie_word_embeddings out (Mistral3Config: true)
    while its checkpoint holds a distinct `language_model.lm_head.weight`: transformers 5 keeps
    that head, and so does the model; the config read says untied, so that the weights
    estimate on CUDA (where a tied head is the table itself) counts the head's bytes too."""
    import torch
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.server import weights

    cfg = json.loads(json.dumps(MISTRAL_SMALL_3_1))
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}))
    torch.manual_seed(0)
    hf = transformers.Mistral3ForConditionalGeneration(
        transformers.AutoConfig.from_pretrained(tmp_path)
    )
    hf.save_pretrained(tmp_path)
    engine = EngineConfig.create(str(tmp_path), device="cpu", dtype="bfloat16")
    cuda = torch.device("cuda")
    explicit = weights.estimate(read_model_config(str(tmp_path)), engine, tmp_path, device=cuda)
    (tmp_path / "config.json").write_text(json.dumps(cfg))  # as published
    assert transformers.AutoConfig.from_pretrained(tmp_path).tie_word_embeddings  # the default
    loaded = transformers.Mistral3ForConditionalGeneration.from_pretrained(tmp_path)
    assert not torch.equal(loaded.lm_head.weight, loaded.get_input_embeddings().weight)
    ours = read_model_config(str(tmp_path))
    assert not ours.tie_word_embeddings
    got = weights.estimate(ours, engine, tmp_path, device=cuda)
    assert got.bytes == explicit.bytes


# microsoft/bitnet-b1.58-2B-4T's config.json (its auto_map to remote code left out: transformers
# runs its own BitNet); the -bf16 master weights' says quantization_mode online
BITNET_2B_4T = {
    "architectures": ["BitNetForCausalLM"], "model_type": "bitnet", "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 128000, "eos_token_id": 128001,
    "hidden_act": "relu2", "hidden_size": 2560, "initializer_range": 0.02,
    "intermediate_size": 6912, "max_position_embeddings": 4096, "num_attention_heads": 20,
    "num_hidden_layers": 30, "num_key_value_heads": 5, "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "use_cache": True, "vocab_size": 128256,
    "quantization_config": {"quant_method": "bitnet", "linear_class": "autobitlinear",
                            "quantization_mode": "offline"},
}  # fmt: skip


@pytest.mark.parametrize("mode", ["offline", "online"])
def test_bitnet_b1_58_2b_4t_reads_as_transformers_reads_it(tmp_path, mode):
    """BitNet b1.58 2B4T (packed) and its -bf16 twin: transformers' shapes, rotary, ids and
    tied head; 2.41 B parameters (transformers' count of the bf16 model: the sub-norms
    included, the weight_scale buffers not); TP and FP8 refused for it."""
    import torch
    from pagoda.runtime.distributed.layout import check

    cfg = {**BITNET_2B_4T, "quantization_config": {**BITNET_2B_4T["quantization_config"],
                                                   "quantization_mode": mode}}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    t = transformers.AutoConfig.from_pretrained(tmp_path)
    o = read_model_config(str(tmp_path))
    assert o.architecture == "bitnet" and o.family.bitnet == mode
    assert (o.hidden_size, o.intermediate_size, o.num_layers) == (2560, 6912, 30)
    assert (o.num_heads, o.num_kv_heads, o.head_dim) == (20, 5, 128)
    assert o.rope_theta == t.rope_parameters["rope_theta"] == 500000.0
    assert o.family.hidden_act == "relu2" and o.tie_word_embeddings == t.tie_word_embeddings
    assert (o.bos_token_id, list(o.eos_token_ids)) == (t.bos_token_id, [t.eos_token_id])
    assert (o.rms_norm_eps, o.max_position_embeddings) == (t.rms_norm_eps, 4096)
    with torch.device("meta"):  # transformers' own count (the weight_scale buffers aside)
        hf = transformers.BitNetForCausalLM(t)
    assert o.num_params == sum(p.numel() for p in hf.parameters()) == 2_412_820_480
    # (split as Llama's, but its 5 KV heads and 6,912-wide MLP divide by no size up to 10)
    with pytest.raises(ValueError, match="5 KV heads can neither be split over 2 ranks"):
        check(o, 2)
    with pytest.raises(ValueError, match=r"does not divide the model's MLP width \(6912\)"):
        check(o, 10)


@pytest.mark.parametrize(("arch", "model_type", "params"), [
    ("GraniteSWAForCausalLM", "granite_swa", 2_144_463_840),  # granite-swash-2b's shape
    ("GraniteMoeSWAForCausalLM", "granitemoe_swa", None),
])  # fmt: skip
def test_a_sparse_granite_swa_config_reads_with_transformers_defaults(
    tmp_path, arch, model_type, params
):
    """GraniteSWA's config class defaults are granite-swash-2b's shape: a config.json naming
    the architecture alone reads as transformers fills it in (shapes, ids, tying, the window,
    the layer pattern, a rotary base per layer), and the parameter count is transformers' own
    (the sinks included); two tensor-parallel ranks split it (each rank's heads' sinks)."""
    import torch
    from pagoda.runtime.distributed.layout import check

    (tmp_path / "config.json").write_text(json.dumps({"architectures": [arch],
                                                      "model_type": model_type}))  # fmt: skip
    t = transformers.AutoConfig.from_pretrained(tmp_path)
    o = read_model_config(str(tmp_path))
    assert o.architecture == model_type
    assert (o.vocab_size, o.hidden_size, o.num_layers, o.num_heads, o.num_kv_heads) == (
        t.vocab_size, t.hidden_size, t.num_hidden_layers, t.num_attention_heads,
        t.num_key_value_heads)  # fmt: skip
    assert (o.rms_norm_eps, o.max_position_embeddings, o.tie_word_embeddings) == (
        t.rms_norm_eps, t.max_position_embeddings, t.tie_word_embeddings)  # fmt: skip
    assert (o.bos_token_id, list(o.eos_token_ids)) == (t.bos_token_id, [t.eos_token_id])
    assert o.family.sliding_window == t.sliding_window == 128
    assert list(o.family.window_layers) == [k == "sliding_attention" for k in t.layer_types]
    assert list(o.family.rope_thetas) == t.layer_rope_theta and o.family.attention_sinks
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(t)
    assert o.num_params == sum(p.numel() for p in hf.parameters())
    assert params is None or o.num_params == params
    check(o, 2)  # (raises where the ranks cannot split it)


def test_kolibri_1s_config_reads_with_transformers_defaults(tmp_path):
    """Kolibri1Config's defaults are Kolibri-1's shape (78.1 B parameters by transformers' own
    count on the meta device): a config.json naming the architecture alone reads as
    transformers fills it in (heads, the window and its layers, NoPE full layers, experts), the
    parameter count transformers' (its correction biases are buffers); two ranks split it."""
    import torch
    from pagoda.runtime.distributed.layout import check

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Kolibri1ForCausalLM"],
                                                      "model_type": "kolibri1"}))  # fmt: skip
    t = transformers.AutoConfig.from_pretrained(tmp_path)
    o = read_model_config(str(tmp_path))
    assert (o.hidden_size, o.num_layers, o.num_heads, o.num_kv_heads, o.head_dim) == (
        t.hidden_size, t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads,
        t.head_dim)  # fmt: skip
    assert (o.rms_norm_eps, o.max_position_embeddings, o.tie_word_embeddings) == (
        t.rms_norm_eps, t.max_position_embeddings, t.tie_word_embeddings)  # fmt: skip
    sliding = tuple(k == "sliding_attention" for k in t.layer_types)
    assert o.family.window_layers == o.family.rope_layers == sliding and not sliding[4]
    assert o.family.sliding_window == t.sliding_window == 513
    f = o.family
    assert (f.num_experts, f.num_experts_per_tok, f.moe_intermediate_size) == (384, 6, 512)
    assert (f.shared_expert_intermediate_size, f.norm_topk_prob) == (512, False)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(t)
    assert o.num_params == sum(p.numel() for p in hf.parameters()) == 78_103_055_360
    check(o, 2)  # its shape splits over two ranks (tested on two: test_moe_families.py)


def test_kolibri_1_1s_config_reads_with_transformers_defaults(tmp_path):
    """Kolibri1_1Config's defaults are Kolibri-1.1's shape: a config.json naming the
    architecture alone reads as transformers fills it in (window and indexed layers, the
    KV-shared layers' sources, the dense MLPs and their width), the parameter count
    transformers' on the meta device; the indexer's selection past 2184 tokens (2048 best, 8
    sinks, 128 local, by 12 heads) from a pool of blocks of 16 past 16384 (picked by the
    default index_layers), the whole context, two ranks' split."""
    import torch
    from pagoda.runtime.distributed.layout import check
    from pagoda.runtime.engine.start_checks import check_max_model_len

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Kolibri1_1ForCausalLM"],
                                                      "model_type": "kolibri1_1"}))  # fmt: skip
    t = transformers.AutoConfig.from_pretrained(tmp_path)
    o = read_model_config(str(tmp_path))
    f = o.family
    assert f.window_layers == tuple(k == "sliding_attention" for k in t.layer_types)
    assert f.kolibri11.kv_source == tuple(t.kv_source_layers)
    assert f.moe_layers == tuple(i not in t.mlp_only_layers for i in range(t.num_hidden_layers))
    assert o.intermediate_size == t.mlp_only_intermediate_size == 3584
    assert o.num_kv_layers == sum(s == i for i, s in enumerate(t.kv_source_layers)) == 44
    k = f.kolibri11
    assert (k.topk, k.sinks, k.local, k.index_heads, k.budget) == (2048, 8, 128, 12, 2184)
    assert (k.pool_size, k.compression) == (t.index_pool_size, t.index_compression) == (16384, 16)
    assert k.pool_layers == tuple(i in t.index_layers for i in range(t.num_hidden_layers))
    assert o.context_length == check_max_model_len(None, o) == t.max_position_embeddings
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(t)
    assert o.num_params == sum(p.numel() for p in hf.parameters()) == 75_112_646_912
    check(o, 2)  # its shapes split over two ranks (rank 0 holds the indexer's 12 heads)


def test_axk1s_config_reads_with_transformers_defaults(tmp_path):
    """AXK1Config's defaults are A.X-K1's shape (519 B parameters by transformers' own count on
    the meta device): a config.json naming the architecture alone reads as transformers fills
    it in (latent attention with the q bottleneck, the first layer dense, V3's router over 8
    groups), the parameter count transformers' (the experts' output norms included); two
    ranks split it."""
    import torch
    from pagoda.runtime.distributed.layout import check

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["AXK1ForCausalLM"],
                                                      "model_type": "axk1"}))  # fmt: skip
    t = transformers.AutoConfig.from_pretrained(tmp_path)
    o = read_model_config(str(tmp_path))
    assert (o.hidden_size, o.num_layers, o.num_heads, o.vocab_size) == (
        t.hidden_size, t.num_hidden_layers, t.num_attention_heads, t.vocab_size)  # fmt: skip
    assert (o.bos_token_id, list(o.eos_token_ids)) == (t.bos_token_id, [t.eos_token_id])
    assert o.family.moe_layers == tuple(k == "sparse" for k in t.mlp_layer_types)
    assert o.family.mla.q_lora_rank == t.q_lora_rank and o.family.mla.rope_interleave
    r = o.family.routing
    assert (r.n_group, r.topk_group, r.routed_scaling_factor) == (8, 4, 2.5) and r.bias_optional
    with torch.device("meta"):
        hf = transformers.AXK1ForCausalLM(t)
    assert o.num_params == sum(p.numel() for p in hf.parameters()) == 518_983_052_288
    check(o, 2)  # its shape splits over two ranks (tested on two: test_moe_families.py)


# published config.json files (their keys and values as on the hub; transformers_version,
# torch_dtype, use_cache, dropouts and initializer_range left out) -> transformers' parameter
# count of the model they describe (on the meta device)
PUBLISHED = {
    # adept/persimmon-8b-base's (-chat's alike): rope_theta 25,000 (transformers 5's default
    # is 10,000), BOS = EOS 71013
    "persimmon-8b-base": ({
        "architectures": ["PersimmonForCausalLM"], "model_type": "persimmon",
        "bos_token_id": 71013, "eos_token_id": 71013, "hidden_act": "relu2", "hidden_size": 4096,
        "intermediate_size": 16384, "layer_norm_eps": 1e-05, "max_position_embeddings": 16384,
        "num_attention_heads": 64, "num_hidden_layers": 36, "partial_rotary_factor": 0.5,
        "qk_layernorm": True, "rope_scaling": None, "rope_theta": 25000.0,
        "tie_word_embeddings": False, "vocab_size": 262144}, 9_397_175_296),
    # facebook/xglm-564M's: XGLMConfig's defaults under their own keys (d_model, ffn_dim, ...)
    "xglm-564M": ({
        "architectures": ["XGLMForCausalLM"], "model_type": "xglm", "activation_function": "gelu",
        "attention_heads": 16, "bos_token_id": 0, "d_model": 1024, "decoder_start_token_id": 2,
        "eos_token_id": 2, "ffn_dim": 4096, "layerdrop": 0.0, "max_position_embeddings": 2048,
        "num_layers": 24, "pad_token_id": 1, "scale_embedding": True, "vocab_size": 256008},
        564_463_616),
    # openai-community/openai-gpt's (GPT-1): no BOS nor EOS id, no final norm
    "openai-gpt": ({
        "afn": "gelu", "architectures": ["OpenAIGPTLMHeadModel"], "attn_pdrop": 0.1,
        "embd_pdrop": 0.1, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05,
        "model_type": "openai-gpt", "n_ctx": 512, "n_embd": 768, "n_head": 12, "n_layer": 12,
        "n_positions": 512, "n_special": 0, "predict_special_tokens": True, "resid_pdrop": 0.1,
        "summary_activation": None, "summary_first_dropout": 0.1, "summary_proj_to_labels": True,
        "summary_type": "cls_index", "summary_use_proj": True, "vocab_size": 40478},
        116_534_784),
    # microsoft/biogpt's: its layer_norm_eps (1e-12) unread (nn.LayerNorm's 1e-5 run)
    "biogpt": ({
        "activation_dropout": 0.0, "architectures": ["BioGptForCausalLM"],
        "attention_probs_dropout_prob": 0.1, "bos_token_id": 0, "eos_token_id": 2,
        "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 1024,
        "initializer_range": 0.02, "intermediate_size": 4096, "layer_norm_eps": 1e-12,
        "layerdrop": 0.0, "max_position_embeddings": 1024, "model_type": "biogpt",
        "num_attention_heads": 16, "num_hidden_layers": 24, "pad_token_id": 1,
        "scale_embedding": True, "use_cache": True, "vocab_size": 42384}, 346_763_264),
    # Salesforce/ctrl's: a 50000-row computed table, the head's bias counted
    "ctrl": ({
        "architectures": ["CTRLLMHeadModel"], "attn_pdrop": 0.1, "dff": 8192, "embd_pdrop": 0.1,
        "from_tf": False, "initializer_range": 0.02, "layer_norm_epsilon": 1e-06,
        "model_type": "ctrl", "n_ctx": 512, "n_embd": 1280, "n_head": 16, "n_layer": 48,
        "n_positions": 50000, "resid_pdrop": 0.1, "summary_activation": None,
        "summary_first_dropout": 0.1, "summary_proj_to_labels": True, "summary_type": "cls_index",
        "summary_use_proj": True, "use_cache": True, "vocab_size": 246534}, 1_637_964_550),
    # abeja/gpt-neox-japanese-2.7b's: the older rotary keys, the MLP a multiple of hidden
    "gpt-neox-japanese-2.7b": ({
        "architectures": ["GPTNeoXJapaneseForCausalLM"], "attention_dropout": 0.1,
        "bos_token_id": 31996, "eos_token_id": 31999, "hidden_act": "gelu", "hidden_dropout": 0.0,
        "hidden_size": 2560, "initializer_range": 0.02, "intermediate_multiple_size": 4,
        "layer_norm_eps": 1e-05, "max_position_embeddings": 2048,
        "model_type": "gpt_neox_japanese", "num_attention_heads": 32, "num_hidden_layers": 32,
        "rotary_emb_base": 10000, "rotary_pct": 1.0, "use_cache": True, "vocab_size": 32000},
        2_598_837_760),
    # Emu3-Chat-hf's shape: Emu3Config's text_config defaults (its VQ-VAE's not counted: not read)
    "emu3-chat": ({"architectures": ["Emu3ForConditionalGeneration"], "model_type": "emu3"},
                  8_492_011_520),
}  # fmt: skip
# text configs transformers' Auto classes map to no causal LM
_CAUSAL_LM = {"emu3_text_model": "Emu3ForCausalLM"}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_a_published_config_reads_as_transformers_reads_it(tmp_path, name):
    """A published checkpoint's config.json: the shapes, rotary, eps, ids and tying as
    transformers' config class reads them, and the parameter count transformers' own."""
    import torch

    cfg, params = PUBLISHED[name]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    t = transformers.AutoConfig.from_pretrained(tmp_path).get_text_config()
    o = read_model_config(str(tmp_path))
    heads = t.num_attention_heads
    kv = getattr(t, "num_key_value_heads", None) or heads
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // heads
    assert (o.vocab_size, o.hidden_size, o.num_layers, o.num_heads, o.num_kv_heads) == (
        t.vocab_size, t.hidden_size, t.num_hidden_layers, heads, kv)  # fmt: skip
    assert (o.head_dim, o.max_position_embeddings, o.tie_word_embeddings) == (
        head_dim, t.max_position_embeddings, t.tie_word_embeddings)  # fmt: skip
    eos = t.eos_token_id if isinstance(t.eos_token_id, list) else [t.eos_token_id]
    eos = [] if eos == [None] else eos  # (openai-gpt names none)
    assert (o.bos_token_id, list(o.eos_token_ids)) == (t.bos_token_id, eos)
    rope = getattr(t, "rope_parameters", None) or {}
    if rope:
        assert o.rope_theta == rope["rope_theta"]
        assert (o.rope_scaling or {}).get("partial_rotary_factor", 1.0) == rope.get(
            "partial_rotary_factor", 1.0)  # fmt: skip
    names = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon")
    eps = next((getattr(t, k) for k in names if hasattr(t, k)), 1e-5)  # (else nn.LayerNorm's)
    eps = 1e-5 if t.model_type == "biogpt" else eps  # (its modeling runs nn.LayerNorm's)
    assert o.rms_norm_eps == eps
    with torch.device("meta"):
        if t.model_type in _CAUSAL_LM:
            hf = getattr(transformers, _CAUSAL_LM[t.model_type])(t)
        else:
            hf = transformers.AutoModelForCausalLM.from_config(t)
    assert o.num_params == sum(p.numel() for p in hf.parameters()) == params


# SmallDoge's Doge-320M and Doge-120M-MoE model_config (their recipes' config_full.yaml): the
# dynamic rotary over the 2048-token context, tied, half the heads' KV heads
DOGE_320M = {"vocab_size": 32768, "hidden_size": 1024, "intermediate_size": 2048,
             "num_hidden_layers": 32, "tie_word_embeddings": True,
             "max_position_embeddings": 2048, "rope_theta": 10000.0,
             "rope_scaling": {"rope_type": "dynamic", "factor": 4.0,
                              "original_max_position_embeddings": 2048},
             "num_attention_heads": 8, "num_key_value_heads": 4}  # fmt: skip
DOGE_120M_MOE = {**DOGE_320M, "hidden_size": 512, "intermediate_size": 1024,
                 "num_hidden_layers": 16, "num_attention_heads": 4, "num_key_value_heads": 2,
                 "is_moe": True, "num_experts": 4096, "num_experts_per_tok": 32}  # fmt: skip


@pytest.mark.parametrize(("cfg", "params"), [(DOGE_320M, 335_750_272),
                                             (DOGE_120M_MOE, 122_728_992)])  # fmt: skip
def test_published_doge_configs_read_as_transformers_reads_them(tmp_path, cfg, params):
    """Doge-320M's and Doge-120M-MoE's config.json: shapes, tying, the context (the dynamic
    rotary's and keep_window_size's 2048), the experts' keys, and the parameter count
    transformers' own on the meta device (A, dt_proj, residual scales, router and tables)."""
    import torch

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["DogeForCausalLM"],
                                                      "model_type": "doge", **cfg}))  # fmt: skip
    t = transformers.AutoConfig.from_pretrained(tmp_path)
    o = read_model_config(str(tmp_path))
    assert (o.hidden_size, o.num_layers, o.num_heads, o.num_kv_heads, o.head_dim) == (
        t.hidden_size, t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads,
        t.hidden_size // t.num_attention_heads)  # fmt: skip
    assert o.tie_word_embeddings and o.context_length == 2048 and o.rope_theta == 10000.0
    g = o.family.doge
    assert (g.keep_window, g.num_experts, g.num_keys) == (
        (2048, 4096, 64) if t.is_moe else (2048, 0, 0)
    )
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(t)
    assert o.num_params == sum(p.numel() for p in hf.parameters()) == params


def test_minimax_m3s_text_config_reads_with_transformers_defaults(tmp_path):
    """MiniMaxM3VLTextConfig's defaults are MiniMax-M3's shape (447 B parameters by
    transformers' own count on the meta device): a config.json naming the architecture alone
    reads as transformers fills it in (every layer full attention and experts, the widths by
    kind, the clamped SwiGLU, the router's scale, a whole-head rotary), the count its own."""
    import torch

    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["MiniMaxM3VLForCausalLM"], "model_type": "minimax_m3_vl_text"}))  # fmt: skip
    t = transformers.AutoConfig.from_pretrained(tmp_path)
    o = read_model_config(str(tmp_path))
    f = o.family
    assert (o.hidden_size, o.num_layers, o.num_heads, o.num_kv_heads, o.head_dim) == (
        t.hidden_size, t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads,
        t.head_dim)  # fmt: skip
    assert (o.bos_token_id, list(o.eos_token_ids), o.rope_theta) == (
        t.bos_token_id, [t.eos_token_id], t.rope_parameters["rope_theta"])  # fmt: skip
    assert (o.intermediate_size, f.moe_intermediate_size, f.shared_expert_intermediate_size) == (
        t.dense_intermediate_size, t.intermediate_size, t.shared_intermediate_size)  # fmt: skip
    assert (f.num_experts, f.num_experts_per_tok, f.swiglu_alpha, f.swiglu_limit) == (
        t.num_local_experts, t.num_experts_per_tok, t.swiglu_alpha, t.swiglu_limit)  # fmt: skip
    assert f.routing.routed_scaling_factor == t.routed_scaling_factor and o.rope_scaling is None
    assert o.context_length == t.max_position_embeddings
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(t)
    assert o.num_params == sum(p.numel() for p in hf.parameters()) == 447_186_441_216


def test_minimax_m3s_published_conditional_config_reads_its_text_model(tmp_path):
    """MiniMaxAI/MiniMax-M3's checkpoint is `MiniMaxM3SparseForConditionalGeneration` with its
    text model in `text_config`: its first 3 layers dense and full attention, the other 57
    expert layers attending through the indexer (the released `moe_layer_freq` and
    `sparse_attention_config` keys, as the model card's ports describe it); read text-only, its
    head untied (MiniMaxM3VLConfig's default), the count transformers' own for the text model
    on the meta device (426,174,565,632: the 426.175 B a published port counts for its language model)."""
    import torch

    dense = [0] * 3 + [1] * 57
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["MiniMaxM3SparseForConditionalGeneration"], "model_type": "minimax_m3_vl",
        "text_config": {"model_type": "minimax_m3_vl_text", "moe_layer_freq": dense,
                        "sparse_attention_config": {"sparse_attention_freq": dense}},
        "vision_config": {"model_type": "minimax_m3_vl_vision"}}))  # fmt: skip
    t = transformers.AutoConfig.from_pretrained(tmp_path)
    o = read_model_config(str(tmp_path))
    f, tt = o.family, t.text_config
    assert o.architecture == "minimax_m3" and not o.tie_word_embeddings
    assert (
        list(f.moe_layers)
        == [k == "sparse" for k in tt.mlp_layer_types]
        == [bool(x) for x in dense]
    )
    assert f.block_index.layers == tuple(k == "minimax_m3_sparse" for k in tt.layer_types)
    with torch.device("meta"):
        hf = transformers.MiniMaxM3SparseForConditionalGeneration(t)
    text = sum(p.numel() for n, p in hf.named_parameters()
               if n.startswith(("model.language_model.", "lm_head.")))  # fmt: skip
    assert o.num_params == text == 426_174_565_632
    # MiniMaxAI/MiniMax-M3-MXFP8's: FP8 weights, UE8M0 scales of 1x32 blocks
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                  "weight_block_size": [1, 32]}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="an FP8 minimax_m3 checkpoint is not supported") as e:
        read_model_config(str(tmp_path))
    assert "MiniMax-M3-MXFP8's per-expert" in str(e.value) and "\n" not in str(e.value)
