"""Mllama's text model (`MllamaForCausalLM`, and `MllamaForConditionalGeneration` read
text-only; model/mllama_config.py) against transformers' plain greedy loop on text prompts,
token for token and logits within 1e-3 (float32), on tiny random checkpoints transformers
writes itself: its cross-attention layers (gates drawn away from zero) skipped as transformers
skips them without image states, the self-attention layers renumbered, llama3's rotary;
chunked into 16-token steps, three prompts sharing steps, a warm prefix cache, a pool small
enough to preempt; on two tensor-parallel ranks too. Also the conditional checkpoint's text
model, the checkpoint check, the weights estimate, the published config's defaults and what is
refused."""

from __future__ import annotations

import json

import pytest
import torch
from arch_cases import (
    LLAMA3,
    built_fixture,
    case_fixture,
    check_two_ranks,
    generate,
    greedy_test,
    prompts,
)
from hf_oracle import hf_greedy_plain, make_tiny_model, make_tiny_wrapped
from pagoda.runtime import LLM
from pagoda.runtime.model.loader import load_model, read_model_config

transformers = pytest.importorskip("transformers")
CASES = {"mllama": dict(num_hidden_layers=4, cross_attention_layers=[1, 3],
                        rope_parameters=LLAMA3)}  # fmt: skip


def write(name: str, path):
    return make_tiny_model(path, "MllamaText", **CASES[name])


built = built_fixture(write)
case = case_fixture(CASES)

test_greedy_matches_transformers_chunked_cached_batched_and_preempted = greedy_test()


def test_layers_checkpoint_check_estimate_and_refusals(built):
    """Two self-attention layers read (stored as 0 and 2), the embedding's 8 extra rows, the
    checkpoint check naming a renumbered layer's tensor, the weights estimate (the cross layers
    not counted: not read; rank 0's of two: the embedding's 308 rows split as 154, the head's
    300 as 150)."""
    from hybrid_cases import check_missing_refused
    from model_bytes import check_estimate

    path, model, loaded, _ = built("mllama")
    mc = loaded.config
    assert mc.num_layers == 2 and mc.vocab_size == 300
    stored = model.model.layers[2].self_attn.q_proj.weight
    assert torch.equal(loaded.weights["model.layers.1.self_attn.q_proj.weight"], stored)
    assert tuple(loaded.weights["model.embed_tokens.weight"].shape) == (308, 64)
    check_estimate(path, rel=1e-6)
    check_estimate(path, 2, rel=1e-6)
    check_missing_refused(loaded, ["model.layers.1.mlp.down_proj.weight"])


@pytest.mark.slow  # a second process (gloo)
def test_two_ranks_match_transformers(built):
    """Two ranks (gloo), the small pool then a warm cache: the embedding's rows, 8 past the
    vocabulary, split over the ranks apart from the head's (each padded to a multiple of 2)."""
    path, _, loaded, reference = built("mllama")
    check_two_ranks(path, loaded, reference, "mllama", kv_heads=1)


def test_the_conditional_checkpoint_reads_its_text_model(tmp_path):
    """MllamaForConditionalGeneration (a tiny vision tower beside): text prompts give the
    conditional model's own tokens (its vision tower not read)."""
    text = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, cross_attention_layers=[1],
                eos_token_id=2, bos_token_id=1, pad_token_id=0)  # fmt: skip
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_global_layers=1, vision_output_dim=64, image_size=28, patch_size=14,
                  intermediate_layers_indices=[0], max_num_tiles=4)  # fmt: skip
    cfg = transformers.MllamaConfig(text_config=text, vision_config=vision, image_token_index=299)
    model = make_tiny_wrapped(tmp_path, "MllamaForConditionalGeneration", cfg)
    short = [p[:20] for p in prompts()[:2]]
    reference = [hf_greedy_plain(model, p, 4)[0] for p in short]
    loaded = load_model(str(tmp_path))
    assert loaded.config.architecture == "mllama" and loaded.config.num_layers == 2
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20, block_size=16,
              max_num_batched_tokens=16, max_num_seqs=4)  # fmt: skip
    assert [g[0] for g in generate(llm, short, 4)] == reference


def test_a_sparse_config_reads_with_transformers_defaults(tmp_path):
    """MllamaTextConfig's defaults (Llama 3.2 11B Vision's text model): shapes, ids, the
    rotary base, the 32 self-attention layers; the parameter count transformers' own on the
    meta device less its 8 cross-attention layers' (not read)."""
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["MllamaForCausalLM"],
                                                      "model_type": "mllama_text_model"}))  # fmt: skip
    t = transformers.AutoConfig.from_pretrained(tmp_path)
    o = read_model_config(str(tmp_path))
    assert o.num_layers == t.num_hidden_layers - len(t.cross_attention_layers) == 32
    assert (o.hidden_size, o.num_heads, o.num_kv_heads, o.vocab_size, o.rope_theta) == (
        t.hidden_size, t.num_attention_heads, t.num_key_value_heads, t.vocab_size,
        t.rope_parameters["rope_theta"])  # fmt: skip
    assert (o.bos_token_id, list(o.eos_token_ids)) == (t.bos_token_id, [t.eos_token_id])
    with torch.device("meta"):
        hf = transformers.MllamaForCausalLM(t)
    cross = {f"model.layers.{i}." for i in t.cross_attention_layers}
    skipped = sum(p.numel() for n, p in hf.named_parameters() if n.startswith(tuple(cross)))
    assert o.num_params == sum(p.numel() for p in hf.parameters()) - skipped
    cfg = {"architectures": ["MllamaForCausalLM"], "num_hidden_layers": 4}  # (layers 5.. none)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert read_model_config(str(tmp_path)).num_layers == 4 - 1  # (default: 3, 8, ...)


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        ({"cross_attention_layers": [0, 1, 2, 3]}, "only cross-attention layers"),
        (
            {"tie_word_embeddings": True, "cross_attention_layers": [1]},
            "mllama with tie_word_embeddings is not supported",
        ),
    ],
)
def test_what_it_does_not_run_is_refused_in_one_line(tmp_path, edit, words):
    cfg = {"architectures": ["MllamaForCausalLM"], "model_type": "mllama_text_model",
           "num_hidden_layers": 4, **edit}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=words) as e:
        read_model_config(str(tmp_path))
    assert "\n" not in str(e.value)
