"""Mistral 3 (its text model), Ministral and Ministral 3 against transformers, token for token,
on tiny random checkpoints transformers writes itself (tests/runtime/hf_oracle.py): float32,
prompts chunked into 16-token steps, three prompts sharing steps, a warm prefix cache on the
second pass, and a KV pool so small that requests are preempted; logits within 1e-3 of
transformers' plain greedy loop at every step.

- Mistral 3 (`Mistral3ForConditionalGeneration`: Mistral-Small-3.1/3.2, Devstral, Magistral):
  the text model under `language_model.`, the vision tower and projector not read, the
  processor's chat template;
- Ministral (`MinistralForCausalLM`): window and global layers by `layer_types`;
- Ministral 3 (`Ministral3ForCausalLM`, or Mistral 3's wrapper around a `ministral3` text
  model): yarn, and q scaled by position (Llama 4's `llama_4_scaling_beta`);
- EXAONE 4: OLMo 2's norms after the sublayers, per-head q/k norms, window layers rotated and
  global ones NoPE (or no window: all global, rotated);
- Seed-OSS (biases on q/k/v and o), ERNIE 4.5 (the interleaved rotary in float32, biases);
- the ungated MLPs: Arcee's ReLU², StarCoder2's GELU (with its LayerNorms' biases and a
  window), Apertus' xIELU (with q/k norms and llama3 rotary).

Also: some of them over two tensor-parallel ranks (gloo), the weights estimate against what the
built model holds, the processor's chat template, and the config values and tensors the engine
refuses in one line at config time.
"""

from __future__ import annotations

import json

import pytest
import torch
from arch_cases import (
    FULL,
    LLAMA3,
    MINISTRAL3_YARN,
    SLIDING,
    built_fixture,
    case_fixture,
    check_rotary_float32,
    check_two_ranks,
    gpu_test,
    greedy_test,
)
from hf_oracle import TINY, make_tiny_model, make_tiny_wrapped
from pagoda.runtime.model.loader import load_model, read_model_config

transformers = pytest.importorskip("transformers")
# name: (transformers config class prefix, config overrides); "Mistral3:<text>" is
# Mistral3ForConditionalGeneration around a <text> model
CASES = {
    "mistral3-untied": ("Mistral3:Mistral", dict(head_dim=16, sliding_window=None)),
    "mistral3-ministral3-tied": (
        "Mistral3:Ministral3", dict(head_dim=16, rope_parameters=MINISTRAL3_YARN),
    ),
    "ministral-layer-types": (
        "Ministral", dict(head_dim=16, num_hidden_layers=3, sliding_window=10,
                         layer_types=[SLIDING, FULL, SLIDING]),
    ),
    "ministral3": ("Ministral3", dict(head_dim=16, rope_parameters=MINISTRAL3_YARN)),
    # norms after the sublayers, per-head q/k norms; window layers rotated, global ones NoPE
    "exaone4-window-nope": (
        "Exaone4", dict(num_hidden_layers=4, sliding_window=10, sliding_window_pattern=2),
    ),
    "exaone4-global": (  # no window: every layer global, and rotated
        "Exaone4", dict(sliding_window=None, layer_types=[FULL, FULL]),
    ),
    # Llama's with q/k/v biases (default) and o's (attention_out_bias)
    "seed-oss-biases": ("SeedOss", dict(head_dim=16, attention_out_bias=True)),
    # the interleaved rotary in float32, biases everywhere (use_bias), a tied head
    "ernie4_5-biases-tied": ("Ernie4_5", dict(head_dim=16, use_bias=True)),
    "arcee-relu2": ("Arcee", dict(num_key_value_heads=1)),  # down(relu(up(x))²)
    # LayerNorm with biases, c_proj(gelu(c_fc(x))) with biases, q/k/v/o biases, a window
    "starcoder2-window": ("Starcoder2", dict(sliding_window=10)),
    # xIELU (its parameters per layer), per-head q/k norms, renamed norms, llama3 rotary
    "apertus-xielu": ("Apertus", dict(rope_parameters=LLAMA3)),
    # Granite's scalars, window layers (default pattern: layer 0 full), a sink per head, a
    # rotary base per layer (0: NoPE)
    "granite_swa-sinks-thetas-tied": ("GraniteSWA", dict(
        num_hidden_layers=4, sliding_window=10, embedding_multiplier=2.0,
        residual_multiplier=0.7, attention_multiplier=0.1, logits_scaling=1.5,
        layer_rope_theta=[0, 10000.0, 500.0, 10000.0])),
}  # fmt: skip


def make_mistral3(path, text: str, tie: bool, **overrides):
    """Mistral3ForConditionalGeneration around a tiny `text` model (a transformers config class
    prefix) and a one-layer Pixtral tower, scaled as `make_tiny_model`'s, with its tokenizer."""
    text_cfg = dict(TINY, pad_token_id=0) | overrides
    vision = transformers.PixtralVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        head_dim=16, image_size=28, patch_size=14,
    )  # fmt: skip
    cfg = transformers.Mistral3Config(
        text_config=getattr(transformers, f"{text}Config")(**text_cfg), vision_config=vision,
        tie_word_embeddings=tie,
    )  # fmt: skip
    return make_tiny_wrapped(path, "Mistral3ForConditionalGeneration", cfg)


def _make(name: str, path):
    arch, overrides = CASES[name]
    if arch.startswith("Mistral3:"):
        return make_mistral3(path, arch.split(":")[1], tie=name.endswith("-tied"), **overrides)
    return make_tiny_model(path, arch, **overrides)


built = built_fixture(_make)
case = case_fixture(CASES)


test_greedy_matches_transformers_chunked_cached_batched_and_preempted = greedy_test()


def test_the_config_reads_as_transformers(case):
    name, path, model, _, _ = case
    c = read_model_config(str(path))
    text = model.config.get_text_config()
    assert c.architecture == {"Mistral": "mistral", "Ministral3": "ministral3",
                              "Ministral": "ministral", "Exaone4": "exaone4",
                              "SeedOss": "seed_oss", "Ernie4_5": "ernie4_5", "Arcee": "arcee",
                              "Starcoder2": "starcoder2", "Apertus": "apertus",
                              "GraniteSWA": "granite_swa"}[
        type(text).__name__[:-6]]  # fmt: skip
    assert c.family.gated_mlp == (name.split("-")[0] not in ("arcee", "starcoder2", "apertus"))
    assert c.tie_word_embeddings == name.endswith("-tied") or name.startswith("starcoder2")
    types = getattr(text, "layer_types", None)
    if name.startswith("ministral-"):
        assert list(c.family.window_layers) == [t == SLIDING for t in types]
    if "ministral3" in name:
        assert (c.family.query_scale_beta, c.family.query_scale_context) == (0.5, 16)
    if name == "exaone4-window-nope":
        assert c.family.window_layers == c.family.rope_layers == (True, False, True, False)
    if name == "exaone4-global":
        assert c.family.sliding_window is None and c.family.rope_layers == ()
    if name.startswith("granite_swa"):  # tied by default; transformers' layer pattern
        assert c.family.window_layers == (False, True, True, True) and c.family.attention_sinks
        assert c.family.rope_thetas == tuple(text.layer_rope_theta)
        assert c.family.rope_layers == (False, True, True, True)


@pytest.mark.slow  # a second process (gloo): ~5 s on 2 busy cores
@pytest.mark.parametrize("name", ["mistral3-ministral3-tied", "granite_swa-sinks-thetas-tied"])
def test_two_ranks_match_transformers(built, name):
    """Tensor parallelism over gloo, two ranks, the small pool (chunked, preempted) then a warm
    cache: Ministral 3 from Mistral 3's wrapper (the text model's tensors under
    `language_model.`, each rank its heads, its scaled q; tied embeddings); GraniteSWA's sinks,
    each rank its heads' (gpt-oss's `read_sinks`). The other families
    here split as layouts tested on two ranks elsewhere: EXAONE 4's per-head q/k norms (Qwen3's
    layer: GLM-4.5's, test_glm4_moe.py) with norms after the sublayers (whole on each rank);
    StarCoder2's and Apertus' ungated MLP (`UngatedMLP`: up's rows and bias cut, down's bias
    added once: Nemotron's, test_dense_archs.py), LayerNorm biases (Phi's, Falcon's),
    xIELU's parameters (whole on each rank)."""
    path, _, loaded, reference = built(name)
    check_two_ranks(path, loaded, reference, name)


def test_mistral3s_processor_chat_template_is_the_one_rendered(built):
    """Mistral-Small-3.1's repository: the processor's `chat_template.json` beside the
    tokenizer's template in tokenizer_config.json; the processor's wins (as vLLM, transformers)."""
    path, _, _, _ = built("mistral3-untied")
    template = "{% for m in messages %}w7 {{ m['content'] }} w8 {% endfor %}"
    (path / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    try:
        tok = load_model(str(path)).tokenizer
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "w9"}]))
    finally:
        (path / "chat_template.json").unlink()
    assert ids[-3:] == [7, 9, 8]


@pytest.mark.parametrize(("arch", "overrides", "tp"), [
    ("Mistral3:Mistral", dict(head_dim=16, sliding_window=None), 1),
    ("Mistral3:Ministral3",
     dict(head_dim=16, num_key_value_heads=1, rope_parameters=MINISTRAL3_YARN), 2),
    ("Exaone4", dict(num_hidden_layers=4, sliding_window=10, sliding_window_pattern=2), 2),
    ("Starcoder2", dict(sliding_window=10), 2),
    ("Apertus", dict(rope_parameters=LLAMA3), 1),
    ("Arcee", dict(num_key_value_heads=1), 2),
])  # fmt: skip
def test_the_weights_estimate_is_what_the_model_holds(tmp_path, arch, overrides, tp):
    """`server/weights.py` against the built model, bf16 from float32 files: Mistral 3's text
    model under `language_model.` (the vision tower not counted); with two ranks rank 0's part
    (EXAONE 4's q/k norms whole on every rank); the ungated MLPs' two matrices (StarCoder2's
    c_fc / c_proj and their biases, its LayerNorms' biases)."""
    from model_bytes import check_estimate

    if arch.startswith("Mistral3:"):
        make_mistral3(tmp_path, arch.split(":")[1], tie=False, **overrides)
    else:
        make_tiny_model(tmp_path, arch, **overrides)
    check_estimate(tmp_path, tp)


# On CUDA in float32 with the defaults (the Triton ops and attention, whose rotary reads the
# cache by positions, CUDA graphs)
test_gpu_matches_transformers_with_graphs = gpu_test()


@pytest.mark.parametrize(("arch", "edit", "words"), [
    ("Ministral3", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
     "Ministral 3 needs rope_parameters with llama_4_scaling_beta"),
    ("Ministral", {"layer_types": [SLIDING, FULL]}, "layer_types names 2 layers, the model has 1"),
    ("Exaone4", {"layer_types": None, "sliding_window_pattern": "LLLG"},
     "EXAONE 4's sliding_window_pattern 'LLLG' without layer_types"),
    ("Arcee", {"hidden_act": "silu"}, "hidden activation 'silu' in an ungated MLP"),
    ("SeedOss", {"hidden_act": "relu"}, "hidden activation 'relu' in a gated MLP"),
])  # fmt: skip
def test_config_values_the_engine_does_not_run_are_refused_in_one_line(tmp_path, arch, edit, words):
    """Read with the config (before the server binds: exit 2), naming the value."""
    make_tiny_model(tmp_path, arch, num_hidden_layers=1, head_dim=16)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, **edit}))
    with pytest.raises(ValueError, match=words) as e:
        read_model_config(str(tmp_path))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("arch", "overrides", "tensor", "words"), [
    ("Apertus", dict(rope_parameters=LLAMA3), "model.layers.0.mlp.act_fn.alpha_n",
     "missing tensor 'model.layers.0.mlp.act_fn.alpha_n'"),
    ("Starcoder2", {}, "model.layers.0.input_layernorm.bias",
     "missing tensor 'model.layers.0.input_layernorm.bias'"),
    ("Exaone4", {}, "model.layers.0.post_feedforward_layernorm.weight",
     "missing tensor 'model.layers.0.post_feedforward_layernorm.weight'"),
])  # fmt: skip
def test_a_checkpoint_without_a_familys_tensor_is_refused_at_config_time(
    tmp_path, arch, overrides, tensor, words
):
    """xIELU's parameters, StarCoder2's norm biases and EXAONE 4's norms after the MLP are
    checked from the headers with config.json (one line, before the server binds)."""
    from safetensors.torch import load_file, save_file

    make_tiny_model(tmp_path, arch, num_hidden_layers=1, **overrides)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    del tensors[tensor]
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=words):
        read_model_config(str(tmp_path))


def test_a_gated_models_tuned_profile_does_not_fit_an_ungated_one(tmp_path):
    """The shape fingerprint tells an ungated MLP (up and down: Arcee's) from a gated one (a
    Llama) of the same dimensions, whose first MLP GEMM is twice as wide."""
    from pagoda.runtime.model.shape_fingerprint import model_fingerprint
    from pagoda.runtime.tuned_profile import fingerprint_mismatches

    shapes = {}
    for arch in ("Llama", "Arcee"):
        make_tiny_model(tmp_path / arch, arch, num_hidden_layers=1)
        shapes[arch] = model_fingerprint(str(tmp_path / arch), None)
    assert fingerprint_mismatches(shapes["Llama"], shapes["Arcee"]) == [
        "mlp_matrices 3 (profile) != 2 (this model)"
    ]


def test_a_mistral3_around_another_text_model_is_refused_in_one_line(built, tmp_path):
    """Mistral 3's wrapper names its text model's family in text_config.model_type: one the
    engine does not know as Mistral's is refused (not run as Mistral's)."""
    path, _, _, _ = built("mistral3-untied")
    cfg = json.loads((path / "config.json").read_text())
    cfg["text_config"]["model_type"] = "mistral4"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="text_config of model_type 'mistral4' is not supported"):
        read_model_config(str(tmp_path))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ernie4_5s_rotary_is_transformers_bit_for_bit(dtype):
    """ERNIE 4.5's rotary (`ernie4_5.rotary_float32`: interleaved) against transformers' own
    (`arch_cases.check_rotary_float32`)."""
    from pagoda.runtime.model.ernie4_5 import rotary_float32
    from transformers.models.ernie4_5 import modeling_ernie4_5 as hf

    check_rotary_float32(rotary_float32, hf, dtype, 10000.0, None)


@pytest.mark.parametrize("arch", ["Apertus", "Ministral3", "Ernie4_5"])
@pytest.mark.parametrize("rope", [{}, {"rope_theta": 5e5}, {"rope_scaling": {
    "rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 128,
    "llama_4_scaling_beta": 0.2}}])  # fmt: skip
def test_the_rotary_without_rope_parameters_reads_as_transformers_reads_it(tmp_path, arch, rope):
    """Apertus' and Ministral 3's config classes fill in their own rotary (llama3, yarn with
    Llama 4's q scale) when config.json has neither rope_parameters nor rope_scaling, a
    top-level rope_theta notwithstanding; an older config's rope_scaling is read as it is, with
    the class's default base (Apertus' and ERNIE 4.5's `default_theta`) where it names none."""
    make_tiny_model(tmp_path, arch, num_hidden_layers=1, head_dim=16)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.pop("rope_parameters")
    (tmp_path / "config.json").write_text(json.dumps({**cfg, **rope}))
    theirs = transformers.AutoConfig.from_pretrained(tmp_path).rope_parameters
    ours = read_model_config(str(tmp_path))
    assert ours.rope_theta == theirs["rope_theta"]
    if theirs["rope_type"] == "default":
        assert ours.rope_scaling is None
        return
    for key in ("rope_type", "factor", "original_max_position_embeddings"):
        assert ours.rope_scaling[key] == theirs[key], key
    if arch == "Ministral3":
        assert ours.family.query_scale_beta == theirs["llama_4_scaling_beta"]


@pytest.mark.parametrize(("arch", "model_type"), [
    ("SeedOss", "seed_oss"), ("Ernie4_5", "ernie4_5"), ("Arcee", "arcee"),
    ("Starcoder2", "starcoder2"), ("Apertus", "apertus"), ("Exaone4", "exaone4"),
])  # fmt: skip
def test_a_sparse_config_reads_with_transformers_defaults(tmp_path, arch, model_type):
    """A config.json with the core shapes only: what the engine fills in (eps, rotary base and
    scaling, context, tying, BOS/EOS, window, KV heads, head size) is what transformers' config
    class fills in."""
    core = dict(vocab_size=300, hidden_size=256, intermediate_size=128, num_hidden_layers=4,
                num_attention_heads=32)  # fmt: skip
    config = {"architectures": [f"{arch}ForCausalLM"], "model_type": model_type, **core}
    (tmp_path / "config.json").write_text(json.dumps(config))
    t, o = transformers.AutoConfig.from_pretrained(tmp_path), read_model_config(str(tmp_path))
    eos = t.eos_token_id if isinstance(t.eos_token_id, list) else [t.eos_token_id]
    assert o.rms_norm_eps == getattr(t, "rms_norm_eps", getattr(t, "norm_epsilon", None))
    assert o.rope_theta == t.rope_parameters["rope_theta"]
    assert (o.rope_scaling or {}).get("rope_type", "default") == t.rope_parameters["rope_type"]
    assert (
        o.max_position_embeddings,
        o.tie_word_embeddings,
        o.bos_token_id,
        list(o.eos_token_ids),
    ) == (t.max_position_embeddings, t.tie_word_embeddings, t.bos_token_id, eos)
    assert o.family.sliding_window == getattr(t, "sliding_window", None)
    assert (o.num_kv_heads, o.head_dim) == (
        t.num_key_value_heads,
        getattr(t, "head_dim", None) or 8,
    )


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("names", [("up_proj", "down_proj"), ("c_fc", "c_proj")])
def test_an_ungated_mlp_from_shapes_as_from_its_tensors(tp, fp8, names):
    """On CUDA (no packing): an ungated MLP's two matrices (Arcee's up/down, StarCoder2's
    c_fc/c_proj: up split by rows, down by columns, FP8 with the projections) from the
    checkpoint's table as from the shapes alone (`from_shapes`, the plans `fit` suggests)."""
    from pagoda.runtime.config import FamilyConfig, ModelConfig
    from pagoda.runtime.quantization.fp8 import ONLINE_SCHEME
    from pagoda.runtime.server import weights
    from pagoda.runtime.server.placement import Placement
    from pagoda.runtime.server.stored import Checkpoint, Stored

    family = FamilyConfig(gated_mlp=False, hidden_act="relu2")
    mc = ModelConfig(vocab_size=32000, hidden_size=2560, intermediate_size=18432, num_layers=2,
                     num_heads=20, num_kv_heads=4, head_dim=128, family=family)  # fmt: skip
    h, i, q, kv = 2560, 18432, 20 * 128, 4 * 128
    shapes = {"model.embed_tokens.weight": (32000, h), "lm_head.weight": (32000, h),
              "model.norm.weight": (h,)}  # fmt: skip
    for n in range(2):
        p = f"model.layers.{n}."
        shapes |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                   p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                   p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
                   p + f"mlp.{names[0]}.weight": (i, h), p + f"mlp.{names[1]}.weight": (h, i)}  # fmt: skip
    table = {k: Stored(k, "BF16", v, 2 * torch.Size(v).numel()) for k, v in shapes.items()}
    place = Placement(torch.bfloat16, "cuda", tp, ONLINE_SCHEME if fp8 else None)
    got, _ = weights.resident(Checkpoint("safetensors", table, 0), mc, place)
    assert got == pytest.approx(weights.from_shapes(mc, torch.bfloat16, fp8, tp), rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_xielu_is_transformers_bit_for_bit(dtype):
    """`ungated_mlp.xielu` from the stored parameters against transformers' own
    XIELUActivation (its Python path) in the model's dtype."""
    from pagoda.runtime.model.ungated_mlp import XIELU_PARAMS, xielu
    from transformers.activations import ACT2CLS

    theirs = ACT2CLS["xielu"](alpha_p_init=0.6, alpha_n_init=0.9, beta=0.4, dtype=dtype)
    stored = {p: getattr(theirs, p).detach() for p in XIELU_PARAMS}
    x = torch.randn(33, 257, generator=torch.Generator().manual_seed(0)).mul(4).to(dtype)
    with torch.no_grad():
        assert torch.equal(xielu(stored)(x.clone()), theirs._xielu_python(x))
