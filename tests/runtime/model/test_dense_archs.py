"""EXAONE 3 / 3.5, EXAONE 4.5 (its text model), Emu3 (its text model), Nemotron, InternLM3, Gemma (v1), Phi, OLMo,
MiniCPM3, Falcon, GPT-NeoX, StableLM, Persimmon, Jais 2, VaultGemma, HyperCLOVA X, Helium, CWM, HunYuan
and GPT-J against transformers, token for token, on tiny random checkpoints transformers writes itself
(tests/runtime/hf_oracle.py): float32, prompts chunked into 16-token steps, three prompts
sharing steps, a warm prefix cache on the second pass, and a KV pool so small that requests are
preempted; logits within 1e-3 of transformers' plain greedy loop at every step.

Each config.json is then rewritten as the published checkpoints write theirs (the older keys:
EXAONE's `num_layers` / `layer_norm_epsilon` / `activation_function`, InternLM3's `qkv_bias` /
`bias`, Gemma's legacy `hidden_act` "gelu", a top-level `rope_theta` / `rope_scaling` /
`partial_rotary_factor`, `architectures` naming the family's class), and transformers reloads
the directory for the reference: both read the published shape alike.

- EXAONE 3 / 3.5 (`ExaoneForCausalLM`): Llama's model under GPT-style tensor names
  (`transformer.h.N.attn.attention.q_proj`, `ln_1`, `c_fc_0`, ...), as transformers saves it;
  3.5's llama3 rotary and tied head;
- EXAONE 4.5 (`Exaone4_5_ForConditionalGeneration`): the EXAONE 4 text model under
  `model.language_model.`, the vision tower not read, the head untied by default;
- Nemotron (`NemotronForCausalLM`): LayerNorm1P (1 + w, with a bias), ReLU² ungated MLP, a
  partial rotary, head_dim apart from hidden / heads, biases;
- InternLM3 (`InternLM3ForCausalLM`): Llama's, biases by `qkv_bias` / `bias`, dynamic rotary;
- Gemma (`GemmaForCausalLM`): (1 + w) norms in float32, two a layer, GeGLU, the scaled
  embedding, one KV head, a tied head;
- Phi (`PhiForCausalLM`: phi-2): attention and the MLP side by side off one LayerNorm (with a
  bias), `fc2(gelu_new(fc1(x)))`, biases everywhere (the LM head's too), a partial rotary
  (0.4 of each head, as phi-2), `qk_layernorm` (a LayerNorm over each head of q and k);
- OLMo (`OlmoForCausalLM`, v1): LayerNorms without parameters (none in the checkpoint),
  `clip_qkv` small enough to clamp, a tied head (OLMo-1B's);
- MiniCPM3 (`MiniCPM3ForCausalLM`): DeepSeek's latent attention (rotate-half rotary, a v head
  narrower than q's, derived from hidden / heads), longrope past a short original context,
  muP's embedding, residual and pre-head scales;
- Falcon (`FalconForCausalLM`): its fused query_key_value in the three layouts (multi-query,
  grouped by KV head, per head), one norm or two (ln_attn, ln_mlp) in the parallel layer, or
  Llama's sequential one, exact GELU, biases, a tied head; the MLP's width left out (4 x hidden);
- GPT-NeoX (`GPTNeoXForCausalLM`: Pythia, GPT-NeoX-20B): Falcon's model with q/k/v per head,
  two norms in parallel or Llama's layer, the older `rotary_pct` / `rotary_emb_base`;
- GPT-NeoX-Japanese (`GPTNeoXJapaneseForCausalLM`): GPT-NeoX's sequential layer without biases
  but the last layer's attention output bias (`dense_bias`), the MLP a multiple of hidden;
- StableLM (`StableLmForCausalLM`): LayerNorms with biases, a partial rotary, q/k/v biases;
  StableLM 2 12B's parallel layer and per-head q/k LayerNorms (a weight per head) with GQA;
- Persimmon (`PersimmonForCausalLM`): GPT-NeoX's q/k/v per head in Llama's layer, a LayerNorm
  over each head of q and k (Phi's), half of each head rotated, a ReLU² ungated MLP, biases;
- Jais 2 (`Jais2ForCausalLM`): Llama's layer with LayerNorms (biases), a ReLU² ungated MLP;
- VaultGemma (`VaultGemmaForCausalLM`): Gemma 2's model, two norms a layer (the second named
  `pre_feedforward_layernorm`), window layers, attention and final soft caps;
- HyperCLOVA X (`HyperCLOVAXForCausalLM`): Granite's scalars with norms on attention's and the
  MLP's outputs (`use_post_norm`), the logits multiplied by `logits_scaling`, the softmax scale
  head_dim ** -0.5 unless `attention_multiplier` says;
- DiffLlama (`DiffLlamaForCausalLM`): Llama's with differential attention (two value reads
  per head, head pairs subtracted with the learned lambda, a weightless RMSNorm), GQA;
- Helium (`HeliumForCausalLM`): Llama's with the interleaved rotary, q/k/v biases;
- Emu3 (`Emu3ForCausalLM`, and `Emu3ForConditionalGeneration`'s text model, its VQ-VAE not
  read): Llama's, its rotary base 1e6 by default;
- Code World Model (`CwmForCausalLM`): Llama's with window layers (its default pattern when
  config.json names no layer_types) and its llama3 rotary by default;
- HunYuan dense (`HunYuanDenseV1ForCausalLM`): per-head q/k RMSNorms after rotary, its
  "dynamic" rotary with a fixed `alpha` (a static base);
- GPT-J (`GPTJForCausalLM`): Phi's model with the interleaved rotary over `rotary_dim`, its
  GPT-2-style keys (`n_embd`, `n_head`, `n_inner`, ...);
- CodeGen (`CodeGenForCausalLM`): GPT-J's, its q/v/k fused in one `qkv_proj` in 4 groups.

Also: some over two tensor-parallel ranks (gloo), the weights estimate against what the built
model holds, and what a sparse config.json reads as against transformers' config classes.
"""

from __future__ import annotations

import json

import pytest
import torch
from arch_cases import (
    built_fixture,
    case_fixture,
    check_two_ranks,
    gpu_test,
    greedy_test,
)
from hf_oracle import TINY, check_config_refused, make_tiny_model, make_tiny_wrapped
from pagoda.runtime.model.loader import read_model_config
from pagoda.runtime.model.ops import rope_kind

transformers = pytest.importorskip("transformers")
LLAMA3 = {"rope_type": "llama3", "rope_theta": 1e6, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}  # fmt: skip
# MiniCPM3-4B's rotary, shrunk: longrope over an original context of 32 (the prompts pass it)
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 32,
            "short_factor": [1.0, 1.1, 1.5, 2.0], "long_factor": [1.2, 2.0, 4.0, 9.0]}  # fmt: skip
FALCON = dict(ffn_hidden_size=256, num_key_value_heads=None)  # (4 x hidden: left out, derived)
# name: (config class prefix, config overrides, the published config.json's renamed keys)
CASES = {
    "exaone3_5-llama3-tied": (
        "Exaone", dict(tie_word_embeddings=True, rope_parameters=LLAMA3),
        {"num_hidden_layers": "num_layers", "rms_norm_eps": "layer_norm_epsilon",
         "hidden_act": "activation_function"},
    ),
    "exaone4_5-window": (
        "Exaone4_5", dict(num_hidden_layers=4, sliding_window=10, sliding_window_pattern=2), {},
    ),
    "nemotron-partial-biases": (
        "Nemotron", dict(head_dim=32, attention_bias=True, mlp_bias=True,
                         rope_parameters={"rope_type": "default", "rope_theta": 20000.0,
                                          "partial_rotary_factor": 0.5}),
        {},
    ),
    "internlm3-biases-dynamic": (
        "InternLM3", dict(head_dim=32, attention_bias=True, mlp_bias=True,
                          rope_parameters={"rope_type": "dynamic", "factor": 6.0,
                                           "rope_theta": 5e7}),
        {"attention_bias": "qkv_bias", "mlp_bias": "bias"},
    ),
    "gemma-gelu-mqa": ("Gemma", dict(head_dim=32, num_key_value_heads=1), {}),
    "phi-partial": ("Phi", dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                 "partial_rotary_factor": 0.4}), {}),
    "phi-qk-layernorm": ("Phi", dict(qk_layernorm=True, num_key_value_heads=4), {}),
    "olmo-clip-tied": ("Olmo", dict(clip_qkv=0.5, tie_word_embeddings=True), {}),
    "minicpm3-longrope": ("MiniCPM3", dict(
        num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=32, qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=None, scale_emb=12, scale_depth=1.4, dim_model_base=16,
        tie_word_embeddings=False, rope_parameters=LONGROPE), {}),
    # falcon-7b: every head's q, one k and v head, one norm, parallel
    "falcon-multi-query": ("Falcon", dict(FALCON, multi_query=True), {}),
    # falcon-40b / 180b: q/k/v by KV head group, ln_attn and ln_mlp; with biases
    "falcon-grouped-two-norms": ("Falcon", dict(FALCON, new_decoder_architecture=True,
                                                num_kv_heads=2, bias=True), {}),
    # Falcon2-11B: grouped, one norm
    "falcon2-grouped-one-norm": ("Falcon", dict(FALCON, new_decoder_architecture=True,
                                                num_kv_heads=1, num_ln_in_parallel_attn=1), {}),
    # neither: q, k, v per head, Llama's sequential layer, biases (falcon-rw without ALiBi)
    "falcon-per-head-sequential": ("Falcon", dict(FALCON, multi_query=False, parallel_attn=False,
                                                  bias=True), {}),
    # Pythia: q/k/v per head, two norms in parallel, rotary_pct 0.25, biases, exact GELU
    "gpt_neox-parallel": ("GPTNeoX", dict(num_key_value_heads=None), {}),
    # GPT-NeoX's sequential layer (use_parallel_residual false), GPT-NeoX-20B's gelu_fast
    "gpt_neox-sequential": ("GPTNeoX", dict(num_key_value_heads=None, hidden_act="gelu_fast",
                                            use_parallel_residual=False), {}),
    # GPT-NeoX-Japanese: GPT-NeoX's q/k/v per head in Llama's layer, no biases but the last
    # layer's attention output bias, the MLP intermediate_multiple_size x hidden, half rotated
    "gpt_neox_japanese-tied-last-bias": ("GPTNeoXJapanese", dict(
        num_key_value_heads=None, intermediate_multiple_size=2, rope_parameters={
            "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}), {}),
    # StableLM 2 1.6B: LayerNorms with biases, a quarter of each head rotated, q/k/v biases
    "stablelm-qkv-bias": ("StableLm", dict(use_qkv_bias=True), {}),
    # StableLM 2 12B: one norm in parallel, per-head q/k LayerNorms, GQA
    "stablelm-parallel-qk-norms": ("StableLm", dict(use_parallel_residual=True,
                                                    qk_layernorm=True), {}),
    # Persimmon: GPT-NeoX's q/k/v per head, Phi's q/k LayerNorms, half rotated, ReLU² MLP
    "persimmon-qk-layernorm": ("Persimmon", dict(num_key_value_heads=None, rope_parameters={
        "rope_type": "default", "rope_theta": 25000.0, "partial_rotary_factor": 0.5}), {}),
    # Jais 2: LayerNorms with biases, ReLU² ungated MLP, biases everywhere
    "jais2-relu2": ("Jais2", dict(), {}),
    # VaultGemma: Gemma 2's model with two norms a layer; windows, both soft caps
    "vaultgemma-window-caps": ("VaultGemma", dict(
        head_dim=32, num_hidden_layers=3, sliding_window=10, query_pre_attn_scalar=48,
        attn_logit_softcapping=4.0, final_logit_softcapping=6.0), {}),
    # HyperCLOVA X: Granite's scalars, peri-norms, logits multiplied, head_dim ** -0.5 scale
    "hyperclovax-peri-norms": ("HyperCLOVAX", dict(
        embedding_multiplier=3.0, residual_multiplier=0.5, logits_scaling=2.5), {}),
    # and with its softmax scale given, without the peri-norms
    "hyperclovax-no-post-norm": ("HyperCLOVAX", dict(
        use_post_norm=False, attention_multiplier=0.05, residual_multiplier=0.7), {}),
    # DiffLlama: differential attention (GQA: 8 heads over 4 KV heads), lambdas drawn large
    "diffllama-gqa": ("DiffLlama", dict(num_attention_heads=8, num_key_value_heads=4,
                                        lambda_std_dev=0.5), {}),
    # Helium: the interleaved rotary, q/k/v biases, its float32-scaled RMSNorm
    "helium-biases": ("Helium", dict(head_dim=16, attention_bias=True), {}),
    # Emu3's text model: Llama's (dropout in training only), its rotary base 1e6 by default
    "emu3-text": ("Emu3Text", dict(rope_parameters=None), {}),
    # Emu3-Chat: the same text model in Emu3ForConditionalGeneration beside a tiny VQ-VAE
    "emu3-chat-text": ("Emu3", {}, {}),
    # Code World Model: window layers by its default pattern (every fourth global), llama3 rotary
    "cwm-window-layers": ("Cwm", dict(head_dim=16, num_hidden_layers=5, sliding_window=10,
                                      layer_types=None, rope_parameters=None), {}),
    # HunYuan dense: q/k norms after rotary; its NTK rotary with a fixed alpha (Hunyuan-7B's)
    "hunyuan-ntk-alpha": ("HunYuanDenseV1", dict(head_dim=16, rope_parameters={
        "rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 10000.0}), {}),
    # GPT-J: Phi's parallel layer with the interleaved rotary over rotary_dim, the head's bias
    "gptj-rotary-dim": ("GPTJ", dict(n_inner=128, rotary_dim=8, num_key_value_heads=None), {}),
    # CodeGen: GPT-J's, q/v/k fused in one qkv_proj over 4 shards (split at load)
    "codegen-rotary-dim": ("CodeGen", dict(n_inner=128, rotary_dim=8, num_key_value_heads=None),
                           {}),
}  # fmt: skip
# transformers writes LlamaForCausalLM for these two (it runs them as Llama): the hub's own names
_CLASSES = {"exaone": "ExaoneForCausalLM", "internlm3": "InternLM3ForCausalLM"}


def published(path, renames: dict[str, str]) -> None:
    """config.json as the hub's: `renames` (transformers' name -> the older key), the rotary
    at the top level (`rope_theta`, `rope_scaling`, `partial_rotary_factor`), `architectures`
    naming the family's own class, Gemma's legacy "gelu"; what transformers adds left out."""
    cfg = json.loads((path / "config.json").read_text())
    for new, old in renames.items():
        cfg[old] = cfg.pop(new)
    rope = cfg.pop("rope_parameters", None) or {}
    cfg["rope_theta"] = rope.pop("rope_theta", 10000.0)
    if "partial_rotary_factor" in rope:
        cfg["partial_rotary_factor"] = rope.pop("partial_rotary_factor")
    cfg["rope_scaling"] = rope if rope.get("rope_type", "default") != "default" else None
    cfg["architectures"] = [_CLASSES.get(cfg["model_type"], cfg["architectures"][0])]
    if cfg["model_type"] == "minicpm3":  # MiniCPM3-4B's: "type", v_head_dim left out
        cfg["rope_scaling"]["type"] = cfg["rope_scaling"].pop("rope_type")
        cfg.pop("v_head_dim")
    if cfg["model_type"] == "falcon":  # falcon-7b's: no derived fields, no context
        for key in ("num_key_value_heads", "ffn_hidden_size", "max_position_embeddings"):
            cfg.pop(key, None)
    if cfg["model_type"] in ("gpt_neox", "gpt_neox_japanese"):  # Pythia's: the older rotary keys
        cfg["rotary_pct"] = cfg.pop("partial_rotary_factor")
        cfg["rotary_emb_base"] = cfg.pop("rope_theta")
        for key in ("rope_scaling", "attention_bias", "num_key_value_heads"):
            cfg.pop(key, None)
    if cfg["model_type"] == "cwm":  # left to CwmConfig: its window pattern and llama3 rotary
        for key in ("layer_types", "rope_theta", "rope_scaling"):
            cfg.pop(key)
    if cfg["model_type"] in ("gptj", "codegen"):  # gpt-j-6b's, CodeGen's: GPT-2's keys only
        for key in ("intermediate_size", "num_key_value_heads", "rope_theta", "rope_scaling"):
            cfg.pop(key, None)
    if cfg["model_type"] == "gemma":
        cfg["hidden_act"] = "gelu"
        cfg.pop("tie_word_embeddings")  # gemma-2b's config.json has none (GemmaConfig: true)
    for key in ("transformers_version", "dtype", "use_cache", "initializer_range"):
        cfg.pop(key, None)
    (path / "config.json").write_text(json.dumps(cfg))


def make_exaone4_5(path, **overrides):
    """Exaone4_5_ForConditionalGeneration around a tiny EXAONE 4 text model and a one-block
    vision tower, scaled as `make_tiny_model`'s, with its tokenizer."""
    text = dict(TINY, pad_token_id=0) | overrides
    vision = transformers.Exaone4_5_VisionConfig(
        depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
        fullatt_block_indexes=[0], num_key_value_heads=2,
    )  # fmt: skip
    cfg = transformers.Exaone4_5_Config(
        text_config=transformers.Exaone4Config(**text), vision_config=vision
    )
    return make_tiny_wrapped(path, "Exaone4_5_ForConditionalGeneration", cfg)


def make_emu3(path, **overrides):
    """Emu3ForConditionalGeneration around a tiny Emu3 text model and a one-level VQ-VAE,
    saved as transformers saves it (`text_model.model.`, `text_model.lm_head`, `vqmodel.`)."""
    text = dict(TINY, pad_token_id=0) | overrides
    vq = dict(codebook_size=16, embed_dim=8, latent_channels=8, base_channels=32,
              channel_multiplier=[1], num_res_blocks=1, attn_resolutions=[], hidden_size=32,
              num_attention_heads=1)  # fmt: skip
    cfg = transformers.Emu3Config(text_config=text, vq_config=vq, vocabulary_map={"<image>": 299})
    return make_tiny_wrapped(path, "Emu3ForConditionalGeneration", cfg)


def _make(name: str, path):
    arch, overrides, renames = CASES[name]
    if arch == "Exaone4_5":
        return make_exaone4_5(path, **overrides)
    if arch == "Emu3":
        return make_emu3(path, **overrides)
    make_tiny_model(path, arch, **overrides)
    published(path, renames)
    # (transformers' Auto classes do not map Emu3's text config to Emu3ForCausalLM)
    lm = transformers.Emu3ForCausalLM if arch == "Emu3Text" else transformers.AutoModelForCausalLM
    return lm.from_pretrained(path, dtype=torch.float32).eval()


def _eps(t) -> float | None:
    """The norms' eps under the family's name for it (None: OLMo's, fixed at 1e-5)."""
    names = ("rms_norm_eps", "norm_eps", "layer_norm_eps")
    return next((getattr(t, k) for k in names if hasattr(t, k)), None)


def _rope(t) -> dict:
    """transformers' rotary of config `t` (GPT-J's, CodeGen's: a base of 10,000 over
    `rotary_dim`)."""
    if t.model_type in ("gptj", "codegen"):
        return {"rope_type": "default", "rope_theta": 10000.0,
                "partial_rotary_factor": t.rotary_dim / (t.n_embd // t.n_head)}  # fmt: skip
    return t.rope_parameters


def _kv_heads(t) -> int:
    """The KV heads transformers' attention runs (GPT-NeoX's config has no such field)."""
    return getattr(t, "num_key_value_heads", None) or t.num_attention_heads


built = built_fixture(_make)
case = case_fixture(CASES)


test_greedy_matches_transformers_chunked_cached_batched_and_preempted = greedy_test()


def test_the_published_config_reads_as_transformers_reads_it(case):
    """The architecture, the tying, the head size, the rotary (partial, scaled) and the eps as
    transformers' reloaded config says."""
    name, path, model, _, _ = case
    c, t = read_model_config(str(path)), model.config.get_text_config()
    family = {"exaone3_5": "exaone", "exaone4_5": "exaone4", "falcon2": "falcon",
              "hunyuan": "hunyuan_v1_dense"}  # fmt: skip
    if name.startswith(("gptj", "codegen")):  # GPT-2's keys (transformers' attribute_map)
        assert (c.hidden_size, c.intermediate_size, c.num_kv_heads) == (64, 128, 4)
        assert c.rope_scaling["partial_rotary_factor"] == 0.5 and c.family.rope_interleaved
    assert c.architecture == family.get(name.split("-")[0], name.split("-")[0])
    tied_by_default = ("gemma", "falcon", "vaultgemma")
    assert c.tie_word_embeddings == ("tied" in name or name.startswith(tied_by_default))
    head = model.get_output_embeddings().weight
    assert c.tie_word_embeddings == (head is model.get_input_embeddings().weight)
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    if name.startswith("minicpm3"):  # DeepSeek's latent cache: one row (latent, rotary key)
        head_dim = t.kv_lora_rank + t.qk_rope_head_dim
        assert (c.family.mla.v_head_dim, c.family.mla.qk_rope_head_dim) == (16, 8)
        assert (c.family.embedding_multiplier, c.family.logits_scaling) == (12, t.logits_scaling)
        assert c.family.residual_multiplier == pytest.approx(1.4 / 2**0.5)
    kv_heads = 1 if name.startswith("minicpm3") else _kv_heads(t)  # (a latent row a token)
    assert (c.num_layers, c.head_dim, c.num_kv_heads) == (t.num_hidden_layers, head_dim, kv_heads)
    rope = _rope(t)
    if name.startswith("hunyuan"):  # the fixed-alpha NTK rotary: a static base
        assert model.model.rotary_emb.rope_type == "ntk_alpha" and c.rope_scaling is None
        assert c.rope_theta == 10000.0 * 1000.0 ** (16 / 14)
        return
    assert c.rope_theta == rope["rope_theta"]
    assert rope_kind(c.rope_scaling) == rope["rope_type"]
    assert (c.rope_scaling or {}).get("partial_rotary_factor", 1.0) == rope.get(
        "partial_rotary_factor", 1.0)  # fmt: skip
    assert _eps(t) in (None, c.rms_norm_eps)
    ungated = ("nemotron", "phi", "falcon", "gpt_neox", "jais2", "gptj", "codegen", "persimmon",
               "gpt_neox_japanese")  # fmt: skip
    assert c.family.gated_mlp == (c.architecture not in ungated)
    if name.startswith("gemma"):
        assert t.hidden_act == "gelu_pytorch_tanh" and c.family.hidden_act == "gelu_tanh"
    if name.startswith("cwm"):
        assert list(c.family.window_layers) == [k == "sliding_attention" for k in t.layer_types]
        assert c.family.window_layers == (False, True, True, True, False)
    if name.startswith("internlm3"):
        assert c.attention_bias and t.attention_bias and t.mlp_bias


@pytest.mark.slow  # a second process (gloo): ~10 s on 2 busy cores
@pytest.mark.parametrize(
    "name",
    [
        "exaone3_5-llama3-tied",
        "nemotron-partial-biases",
        "phi-qk-layernorm",
        "minicpm3-longrope",
        "falcon-grouped-two-norms",
        "stablelm-parallel-qk-norms",
        "diffllama-gqa",
    ],
)
def test_two_ranks_match_transformers(built, name):
    """Tensor parallelism over gloo, two ranks, the small pool (chunked, preempted) then a warm
    cache: EXAONE's renamed tensors cut as Llama's; Nemotron's partial rotary on each rank's
    heads, its LayerNorm1P biases whole, up's rows and bias cut, down's bias added once; Phi's
    parallel layer, per-head q/k LayerNorms and the LM head's bias after the gather;
    MiniCPM3's latent attention by heads; Falcon's grouped q/k/v rows cut by heads; DiffLlama's
    head pairs by each half of the heads (8 over 4 KV heads: 2 + 2 query, 1 + 1 KV a half)."""
    path, _, loaded, reference = built(name)
    check_two_ranks(path, loaded, reference, name)


@pytest.mark.parametrize(("name", "tp"), [
    ("exaone3_5-llama3-tied", 2), ("exaone4_5-window", 1), ("nemotron-partial-biases", 2),
    ("internlm3-biases-dynamic", 1), ("gemma-gelu-mqa", 2), ("phi-partial", 2),
    ("olmo-clip-tied", 2), ("minicpm3-longrope", 2), ("falcon-grouped-two-norms", 2),
    ("falcon-per-head-sequential", 1), ("gpt_neox-parallel", 2),
    ("gpt_neox_japanese-tied-last-bias", 2),
    ("stablelm-parallel-qk-norms", 1), ("persimmon-qk-layernorm", 2), ("jais2-relu2", 2), ("vaultgemma-window-caps", 2),
    ("hyperclovax-peri-norms", 2), ("helium-biases", 2), ("diffllama-gqa", 1), ("diffllama-gqa", 2), ("emu3-chat-text", 2), ("gptj-rotary-dim", 2),
])  # fmt: skip
def test_the_weights_estimate_is_what_the_model_holds(built, name, tp):
    """`server/weights.py` against the built model, bf16 from float32 files: EXAONE's tensors
    by their Llama names, EXAONE 4.5's vision tower not counted, Nemotron's two MLP matrices and
    LayerNorm biases, Gemma's float32 (1 + w) norms; with two ranks rank 0's part."""
    from model_bytes import check_estimate

    path, _, _, _ = built(name)
    check_estimate(path, tp)


# On CUDA in float32 with the defaults (the Triton ops and attention, CUDA graphs)
test_gpu_matches_transformers_with_graphs = gpu_test()


@pytest.mark.parametrize(("arch", "model_type", "extra"), [
    ("Exaone", "exaone", {"num_layers": 4}),
    ("Nemotron", "nemotron", {"num_hidden_layers": 4}),
    ("InternLM3", "internlm3", {"num_hidden_layers": 4}),
    ("Gemma", "gemma", {"num_hidden_layers": 4}),
    ("Phi", "phi", {"num_hidden_layers": 4}),
    ("Olmo", "olmo", {"num_hidden_layers": 4}),
    ("MiniCPM3", "minicpm3", {"num_hidden_layers": 4}),
    ("Falcon", "falcon", {"num_hidden_layers": 4}),
    ("Falcon", "falcon", {"num_hidden_layers": 4, "new_decoder_architecture": True,
                          "num_kv_heads": 8}),
    ("GPTNeoX", "gpt_neox", {"num_hidden_layers": 4}),
    ("GPTNeoX", "gpt_neox", {"num_hidden_layers": 4, "rotary_pct": 0.5, "rotary_emb_base": 1e4}),
    ("GPTNeoXJapanese", "gpt_neox_japanese", {"num_hidden_layers": 4}),
    ("GPTNeoXJapanese", "gpt_neox_japanese", {"num_hidden_layers": 4, "rotary_pct": 0.5,
                                              "intermediate_multiple_size": 2}),
    ("StableLm", "stablelm", {"num_hidden_layers": 4}),
    ("Persimmon", "persimmon", {"num_hidden_layers": 4}),
    ("Jais2", "jais2", {"num_hidden_layers": 4}),
    ("VaultGemma", "vaultgemma", {"num_hidden_layers": 4}),
    ("HyperCLOVAX", "hyperclovax", {"num_hidden_layers": 4}),
    ("Helium", "helium", {"num_hidden_layers": 4, "num_key_value_heads": 8}),
    ("DiffLlama", "diffllama", {"num_hidden_layers": 4}),
    ("Cwm", "cwm", {"num_hidden_layers": 5}),
    ("HunYuanDenseV1", "hunyuan_v1_dense", {"num_hidden_layers": 4}),
    ("GPTJ", "gptj", {"n_layer": 4, "rotary_dim": 4}),
    ("CodeGen", "codegen", {"n_layer": 4, "rotary_dim": 4}),
])  # fmt: skip
def test_a_sparse_config_reads_with_transformers_defaults(tmp_path, arch, model_type, extra):
    # (Falcon's: its MLP 4 x hidden, one KV head unless grouped)
    """A config.json with the core shapes only: what the engine fills in (eps, rotary base,
    partial rotary, context, tying, BOS/EOS, KV heads, head size) is what transformers' config
    class fills in."""
    core = dict(vocab_size=300, hidden_size=256, intermediate_size=128, num_attention_heads=32)
    config = {"architectures": [f"{arch}ForCausalLM"], "model_type": model_type, **core, **extra}
    (tmp_path / "config.json").write_text(json.dumps(config))
    t, o = transformers.AutoConfig.from_pretrained(tmp_path), read_model_config(str(tmp_path))
    eos = t.eos_token_id if isinstance(t.eos_token_id, list) else [t.eos_token_id]
    assert _eps(t) in (None, o.rms_norm_eps)
    assert o.rope_theta == _rope(t)["rope_theta"]
    assert (o.rope_scaling or {}).get("partial_rotary_factor", 1.0) == _rope(t).get(
        "partial_rotary_factor", 1.0)  # fmt: skip
    assert (
        o.num_layers,
        o.max_position_embeddings,
        o.tie_word_embeddings,
        o.bos_token_id,
        list(o.eos_token_ids),
    ) == (t.num_hidden_layers, t.max_position_embeddings, t.tie_word_embeddings,
          t.bos_token_id, eos)  # fmt: skip
    if model_type == "gpt_neox_japanese":  # (no intermediate_size: a multiple of hidden)
        assert o.intermediate_size == t.hidden_size * t.intermediate_multiple_size
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    if model_type == "minicpm3":  # DeepSeek's latent cache: one row of latent and rotary key
        # (its class default of 40 KV heads is not read); v derived from hidden / heads
        assert o.family.mla.v_head_dim == t.v_head_dim == 8
        assert (o.num_kv_heads, o.head_dim) == (1, t.kv_lora_rank + t.qk_rope_head_dim)
        return
    # (NemotronConfig leaves num_key_value_heads None, which its attention cannot run: as MHA)
    assert (o.num_kv_heads, o.head_dim) == (_kv_heads(t), head_dim)


@pytest.mark.parametrize(("arch", "edit", "words"), [
    ("Falcon", {"alibi": True}, "Falcon with alibi"),
    ("Falcon", {"new_decoder_architecture": True, "num_ln_in_parallel_attn": 1,
                "parallel_attn": False}, "num_ln_in_parallel_attn 1 and parallel_attn false"),
    ("Olmo", {"clip_qkv": -1.0}, "clip_qkv must be positive"),
    ("GPTJ", {"rotary_dim": 32}, r"rotary_dim 32 must be even and at most the head size 16"),
    ("DiffLlama", {"num_key_value_heads": 1}, "DiffLlama with num_key_value_heads 1 is not"),
    # microsoft/phi-2's config.json before its port (read as Phi with phi-1.5's defaults: 2048
    # wide, 24 layers, where it says n_embd 2560, n_layer 32)
    ("Phi", {"model_type": "phi-msft", "n_embd": 2560, "n_layer": 32},
     r"PhiForCausalLM of model_type 'phi-msft' \(phi-2's .*\) is not supported"),
])  # fmt: skip
def test_config_values_the_engine_does_not_run_are_refused_in_one_line(tmp_path, arch, edit, words):
    """Read with the config (before the server binds: exit 2), naming the value."""
    check_config_refused(tmp_path, arch, edit, words)


def _edit_tensors(path, edit) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(path / "model.safetensors"))


def _pop(name: str):
    return lambda t: t.pop(name)


def _widen(name: str):
    return lambda t: t.__setitem__(name, torch.cat([t[name], t[name]]))


@pytest.mark.parametrize(("arch", "overrides", "edit", "match"), [
    # the fused query_key_value's rows against the layout config.json names: a grouped
    # (40b-style) checkpoint read as multi-query
    ("Falcon", dict(new_decoder_architecture=True, num_kv_heads=2, **FALCON),
     lambda t: None, r"transformer\.h\.0\.self_attention\.query_key_value\.weight has 128 rows"),
    ("Falcon", FALCON, _pop("transformer.h.1.self_attention.query_key_value.weight"),
     r"missing tensor 'transformer\.h\.1\.self_attention\.query_key_value\.weight'"),
    ("GPTNeoX", dict(num_key_value_heads=None),
     _pop("gpt_neox.layers.1.post_attention_layernorm.bias"),
     r"missing tensor 'gpt_neox\.layers\.1\.post_attention_layernorm\.bias'"),
    ("GPTNeoXJapanese", dict(num_key_value_heads=None),
     _pop("gpt_neox_japanese.layers.1.attention.dense.weight"),
     r"missing tensor 'gpt_neox_japanese\.layers\.1\.attention\.dense\.weight'"),
    ("GPTJ", dict(num_key_value_heads=None, rotary_dim=8), _pop("transformer.h.0.ln_1.bias"),
     r"missing tensor 'transformer\.h\.0\.ln_1\.bias'"),
    ("CodeGen", dict(num_key_value_heads=None, rotary_dim=8),
     _pop("transformer.h.1.attn.qkv_proj.weight"),
     r"missing tensor 'transformer\.h\.1\.attn\.qkv_proj\.weight'"),
    ("Exaone", {}, _widen("transformer.h.0.mlp.c_fc_1.weight"),
     r"transformer\.h\.0\.mlp\.c_fc_1\.weight is \[256, 64\]; with "
     r"transformer\.h\.0\.mlp\.c_fc_0\.weight \[128, 64\]"),
], ids=["falcon-qkv-height", "falcon-qkv-missing", "gpt_neox-norm-bias",
        "gpt_neox_japanese-dense-missing", "gptj-ln_1-bias",
        "codegen-qkv-missing", "exaone-c_fc_1-width"])  # fmt: skip
def test_a_checkpoint_refusal_names_the_tensors_as_the_files_do(
    tmp_path, arch, overrides, edit, match
):
    """Refused at config time in one line (`pagoda serve`: exit 2) naming the tensor as the
    checkpoint stores it (Falcon's, GPT-NeoX's, GPT-J's, EXAONE's names, what a user finds in
    the index), not as the engine renames it (`model.layers.N.self_attn.qkv_proj`, ...); a
    missing one as its layer's siblings are stored."""
    make_tiny_model(tmp_path, arch, **overrides)
    _edit_tensors(tmp_path, edit)
    if arch == "Falcon" and overrides.get("new_decoder_architecture"):
        cfg = json.loads((tmp_path / "config.json").read_text())
        (tmp_path / "config.json").write_text(
            json.dumps({**cfg, "new_decoder_architecture": False})
        )
    with pytest.raises(ValueError, match=match) as e:
        read_model_config(str(tmp_path))
    assert "\n" not in str(e.value) and "model.layers." not in str(e.value).split(";")[0]


def test_an_exaone_directory_transformers_saved_reads_as_llama(tmp_path):
    """transformers 5 saves an EXAONE 3 model as `LlamaForCausalLM` (model_type exaone) under
    EXAONE's own tensor names: read as Llama's, every tensor found under Llama's name."""
    make_tiny_model(tmp_path, "Exaone", num_hidden_layers=1)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "exaone"
    assert read_model_config(str(tmp_path)).architecture == "llama"
