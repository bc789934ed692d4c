"""Gemma 3n's text model (`model/gemma3n.py`) against transformers: a tiny random checkpoint
with AltUp's four streams, Laurel, per-layer inputs from a table shorter than the vocabulary,
MLP widths by layer, activation sparsity on the first two layers and the last two layers
reading the first two's KV caches; the engine's greedy tokens and logits equal transformers'
in a batch of unequal prompts, chunked, on a warm prefix cache, preempted; the multimodal
wrapper read text-only; the published configs read as transformers reads them; what is
refused."""

from __future__ import annotations

import json
import math

import pytest
import torch
from arch_cases import (
    built_fixture,
    check_chunked_cached_batched,
    check_preempted,
    check_two_ranks,
    generate,
    prompts,
)
from hf_oracle import hf_greedy_plain, randomize, save_tiny
from pagoda.runtime import LLM
from pagoda.runtime.model.loader import load_model, read_model_config

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Gemma3nTextConfig"):
    pytest.skip("transformers without Gemma 3n", allow_module_level=True)

S, F = "sliding_attention", "full_attention"
# ids 256..299 of the prompts read the per-layer table's row 0 (as the published 262144-row
# table under a 262400-token vocabulary)
TEXT = dict(vocab_size=300, vocab_size_per_layer_input=256, hidden_size=64,
            intermediate_size=[96, 80, 96, 112], num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, layer_types=[S, F, S, F], sliding_window=9,
            max_position_embeddings=512, hidden_size_per_layer_input=8, laurel_rank=8,
            num_kv_shared_layers=2, activation_sparsity_pattern=[0.95, 0.95, 0.0, 0.0],
            final_logit_softcapping=6.0, eos_token_id=2, bos_token_id=1,
            pad_token_id=0)  # fmt: skip


def write(name: str, path):
    torch.manual_seed(0)
    model = transformers.Gemma3nForCausalLM(transformers.Gemma3nTextConfig(**TEXT)).eval()
    return save_tiny(randomize(model), path)


built = built_fixture(write)


def test_gemma3n_matches_transformers_chunked_batched_cached_and_preempted(built):
    """The KV-shared layers keep no pages (the pool holds layers 0 and 1); transformers' tokens
    and logits chunked, batched, warm and preempted."""
    _, _, loaded, reference = built("text")
    llm = check_chunked_cached_batched(loaded, reference, "gemma3n")
    runner = llm.engine.runner
    assert len(runner.model.kv_backends) == 2
    assert runner.kv_caches[2] is runner.kv_caches[0] and runner.kv_caches[3] is runner.kv_caches[1]
    check_preempted(loaded, reference, "gemma3n")


@pytest.mark.slow  # a second process (gloo): ~10 s on 2 busy cores
def test_two_ranks_match_transformers(built):
    """Tensor parallelism over gloo, two ranks, the small pool (chunked, preempted) then a warm
    cache: each rank one of the two KV heads (the shared layers reading their rank's rows), the
    MLP widths by layer split, the sparse layers' gate statistics summed over the ranks, AltUp
    and Laurel replicated."""
    path, _, loaded, reference = built("text")
    check_two_ranks(path, loaded, reference, "gemma3n two ranks", kv_heads=1)


def test_the_checked_tensors_are_the_checkpoints_and_sized_from_the_config(built):
    """`expected_shapes` names every tensor transformers saved (the KV-shared layers' k/v
    projections and norms aside: transformers never reads them), with its shape; the weights
    estimate from config.json alone is their bytes, and the estimate from the checkpoint's
    metadata is what the built model holds in bf16, on one rank and on rank 0 of two."""
    from model_bytes import check_estimate
    from pagoda.runtime.model.checkpoint_shapes import expected_shapes
    from pagoda.runtime.server.weights import from_shapes
    from safetensors import safe_open

    path, _, loaded, _ = built("text")
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        stored = {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()}  # noqa: SIM118
    unread = {n for n in stored if n.startswith(("model.layers.2.self_attn.k", "model.layers.2."
              "self_attn.v", "model.layers.3.self_attn.k", "model.layers.3.self_attn.v"))}  # fmt: skip
    assert expected_shapes(loaded.config) == {n: s for n, s in stored.items() if n not in unread}
    size = sum(math.prod(s) for n, s in stored.items() if n not in unread)
    assert from_shapes(loaded.config, torch.float32, False) == 4 * size
    check_estimate(path, rel=1e-3)
    check_estimate(path, 2, rel=1e-3)


def test_a_conditional_generation_checkpoint_reads_its_text_model_and_token_embedders(
    tmp_path, monkeypatch
):
    """Gemma3nForConditionalGeneration (its vision tower, a timm model, stubbed: timm is not
    installed here; its audio tower one small conformer layer): the text model under
    `model.language_model.`, the towers not read; the ids of its image range (256..277) and
    audio range (278..299), which transformers embeds through `embed_vision` / `embed_audio`
    even without images or audio, through those embedders: transformers' tokens and logits."""
    from arch_cases import check
    from model_bytes import check_estimate
    from transformers.models.gemma3n import modeling_gemma3n

    real = modeling_gemma3n.AutoModel.from_config
    monkeypatch.setattr(modeling_gemma3n.AutoModel, "from_config", lambda c, *a, **k: (
        torch.nn.Module() if c.model_type == "gemma3n_vision" else real(c, *a, **k)))  # fmt: skip
    torch.manual_seed(0)
    vision = transformers.Gemma3nVisionConfig(hidden_size=16, vocab_size=22, vocab_offset=256)
    audio = transformers.Gemma3nAudioConfig(hidden_size=24, vocab_size=22, vocab_offset=278,
                                            conf_num_hidden_layers=1, conf_num_attention_heads=2,
                                            input_feat_size=8, sscp_conv_channel_size=[4, 4])  # fmt: skip
    cfg = transformers.Gemma3nConfig(text_config=transformers.Gemma3nTextConfig(**TEXT),
                                     vision_config=vision, audio_config=audio)  # fmt: skip
    model = save_tiny(randomize(transformers.Gemma3nForConditionalGeneration(cfg).eval()), tmp_path)
    reference = [hf_greedy_plain(model, p, 6) for p in prompts()]
    loaded = load_model(str(tmp_path))
    assert loaded.config.architecture == "gemma3n"
    assert [e[:3] for e in loaded.config.family.gemma4.gemma3n.embedders] == [
        ("vision", 256, 22), ("audio", 278, 22)]  # fmt: skip
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, max_num_seqs=4,
              max_num_batched_tokens=16)  # fmt: skip
    for i, (got, want) in enumerate(zip(generate(llm, prompts()), reference)):
        check(got, want, f"gemma3n wrapper: prompt {i}")
    check_estimate(tmp_path, rel=1e-3)  # (the towers not counted, the embedders counted)


def _published(layers: int, width: int, shared: int) -> dict:
    """google/gemma-3n-E2B's / -E4B's text_config as published (older rotary keys, widths and
    sparsity by layer, 4 sliding : 1 full)."""
    return {"activation_sparsity_pattern": [0.95] * 10 + [0.0] * (layers - 10),
            "altup_active_idx": 0, "altup_coef_clip": 120.0, "altup_correct_scale": True,
            "altup_lr_multiplier": 1.0, "altup_num_inputs": 4, "attention_bias": False,
            "attention_dropout": 0.0, "final_logit_softcapping": 30.0, "head_dim": 256,
            "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2048,
            "hidden_size_per_layer_input": 256, "initializer_range": 0.02,
            "intermediate_size": [width] * layers, "laurel_rank": 64,
            "layer_types": ([S] * 4 + [F]) * (layers // 5), "max_position_embeddings": 32768,
            "model_type": "gemma3n_text", "num_attention_heads": 8, "num_hidden_layers": layers,
            "num_key_value_heads": 2, "num_kv_shared_layers": shared,
            "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0,
            "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": 512,
            "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 262400,
            "vocab_size_per_layer_input": 262144}  # fmt: skip


E2B, E4B = _published(30, 8192, 10), _published(35, 16384, 15)


@pytest.mark.parametrize(("text", "params"), [(E2B, 4_435_182_688), (E4B, 6_835_235_568)],
                         ids=["e2b", "e4b"])  # fmt: skip
def test_published_gemma3n_configs_read_as_transformers_reads_them(tmp_path, text, params):
    """The E2B / E4B checkpoints' config.json: shapes, KV sharing, window layers, rotary bases,
    sparsity, ids as transformers reads them; the parameter count transformers' own (on the
    meta device: the text model's, and its embedders of image and audio token ids)."""
    from transformers.models.gemma3n import modeling_gemma3n

    top = {"architectures": ["Gemma3nForConditionalGeneration"], "model_type": "gemma3n",
           "text_config": text, "eos_token_id": [1, 106]}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(top))
    theirs = transformers.AutoConfig.from_pretrained(tmp_path).get_text_config()
    ours = read_model_config(str(tmp_path))
    g, n = ours.family.gemma4, theirs.num_hidden_layers
    assert ours.architecture == "gemma3n" and ours.num_layers == n
    modes = theirs.kv_sharing_modes
    assert [g.shares_kv(i) for i in range(n)] == [m == "reuse" for m in modes]
    for i in range(n):  # a shared layer reads the last earlier layer of its kind that stores
        if g.shares_kv(i):
            src = g.kv_source[i]
            assert modes[src] == "store" and theirs.layer_types[src] == theirs.layer_types[i]
    assert [ours.family.window(i) is not None for i in range(n)] == [
        t == S for t in theirs.layer_types
    ]
    assert ours.family.sliding_window == theirs.sliding_window
    rope = theirs.rope_parameters
    assert (ours.rope_theta, g.global_rope_theta) == (rope[S]["rope_theta"], rope[F]["rope_theta"])
    assert list(g.mlp_widths) == theirs.intermediate_size
    assert list(g.gemma3n.sparsity) == theirs.activation_sparsity_pattern
    assert (g.per_layer_input, g.per_layer_vocab) == (256, theirs.vocab_size_per_layer_input)
    assert ours.family.final_logit_softcapping == theirs.final_logit_softcapping
    assert set(ours.eos_token_ids) == {1, 106}
    top = transformers.AutoConfig.from_pretrained(tmp_path)
    with torch.device("meta"):  # the text model, and the embedders of image and audio ids
        hf = transformers.Gemma3nForCausalLM(theirs)
        embedders = [modeling_gemma3n.Gemma3nMultimodalEmbedder(c, theirs)
                     for c in (top.vision_config, top.audio_config)]  # fmt: skip
    text = sum(p.numel() for p in hf.parameters())
    assert text == params
    # (their soft-token norms, for the towers' outputs, are not read)
    read = sum(p.numel() for e in embedders for n, p in e.named_parameters() if "soft" not in n)
    assert ours.num_params == text + read


@pytest.mark.parametrize(
    "change, message",
    [
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_type"),
        ({"intermediate_size": [96, 96]}, "intermediate_size"),
        ({"num_kv_shared_layers": 30}, "num_kv_shared_layers"),
    ],
)  # fmt: skip
def test_what_gemma3n_does_not_compute_is_refused_in_one_line(tmp_path, change, message):
    (tmp_path / "config.json").write_text(json.dumps({**E2B, **change,
                                                      "architectures": ["Gemma3nForCausalLM"]}))  # fmt: skip
    with pytest.raises(ValueError, match=message):
        read_model_config(str(tmp_path))


def test_gemma3n_widths_that_do_not_split_and_fp8_are_refused(tmp_path):
    """The published E2B splits over two ranks; a later layer's MLP width that does not is one
    line naming the layer; FP8 refused."""
    from types import SimpleNamespace

    from pagoda.runtime.distributed.layout import check
    from pagoda.runtime.engine.start_checks import check_dtype

    def config(text):
        (tmp_path / "config.json").write_text(json.dumps({**text,
                                                          "architectures": ["Gemma3nForCausalLM"]}))  # fmt: skip
        return read_model_config(str(tmp_path))

    mc = config(E2B)
    check(mc, 2)
    odd = {**E2B, "intermediate_size": [8192] * 3 + [8191] + [8192] * 26}
    with pytest.raises(ValueError, match="does not divide layer 3's MLP width \\(8191\\)"):
        check(config(odd), 2)
    with pytest.raises(ValueError, match="fp8 is not supported for a gemma3n"):
        check_dtype(SimpleNamespace(quantization="fp8", torch_dtype=lambda: torch.bfloat16), mc)
