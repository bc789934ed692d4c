"""Multimodal checkpoints read text-only where their text model is served: Aria's
(`AriaForConditionalGeneration`), Cohere Compass' (`CohereCompassForConditionalGeneration`),
MiniMax-M3's (`MiniMaxM3SparseForConditionalGeneration`) and Apertus 1.5's
(`Apertus1p5ForConditionalGeneration`). transformers writes each wrapper around a tiny text
model (the text models' own cases: test_aria_text / test_moe_families, test_glm_cohere,
test_minimax_m3, test_apertus1p5) and tiny towers; the engine reads the text tensors under the
wrapper's prefix (`language_model.model.`, `model.language_model.`), skips the towers, and its
greedy tokens and logits are transformers' conditional model's on text prompts: chunked into
16-token steps, the three unequal prompts in one batch, again on a warm prefix cache (the
families' own tests cover preemption). Saved with the word-level tokenizer alone (no
processor, no multimodal tokenizer). MiniMax-M3's is saved by transformers in its published
layout (per-expert `block_sparse_moe.experts.E.w1/w3/w2`, split `gate_proj` / `up_proj`,
`index_{q,k}_{proj,norm}`): read as the text model's fused and stacked tensors."""

from __future__ import annotations

import pytest
import torch
from arch_cases import LLAMA3, NEW, generate, prompts
from hf_oracle import TINY, hf_greedy_plain, randomize, save_word_tokenizer
from pagoda.runtime import LLM
from pagoda.runtime.model.loader import load_model

transformers = pytest.importorskip("transformers")
SLIDING, FULL, SPARSE = "sliding_attention", "full_attention", "minimax_m3_sparse"
TOWER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
KEPT = 260  # Apertus 1.5's head rows of the 300 ids
PER_EXPERT = "language_model.model.layers.1.block_sparse_moe.experts.0.w1.weight"  # (MiniMax-M3's)


def _aria():
    text = dict(moe_num_experts=8, moe_topk=2, moe_num_shared_experts=2, intermediate_size=32,
                num_hidden_layers=3)  # fmt: skip
    vision = dict(TOWER, image_size=28, patch_size=14)
    return transformers.AriaConfig(text_config=dict(TINY, pad_token_id=0, **text),
                                   vision_config=vision, projector_patch_to_query_dict={4: 2})  # fmt: skip


def _compass():
    rope = {SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
            FULL: {"rope_type": "default", "rope_theta": 500.0}}  # fmt: skip
    text = dict(TINY, pad_token_id=0, num_hidden_layers=3, sliding_window=10, logit_scale=0.5,
                layer_types=[SLIDING, FULL, SLIDING], rope_parameters=rope)  # fmt: skip
    return transformers.CohereCompassConfig(
        text_config=text, vision_config=TOWER, image_token_id=290, video_token_id=291,
        vision_start_token_id=292, vision_end_token_id=293)  # fmt: skip


def _minimax_m3():
    text = dict(
        TINY,
        pad_token_id=0,
        head_dim=16,
        intermediate_size=24,
        num_local_experts=6,
        num_experts_per_tok=2,
        dense_intermediate_size=48,
        shared_intermediate_size=32,
        index_n_heads=2,
        index_head_dim=8,
        index_block_size=8,
        index_topk_blocks=12,
        num_hidden_layers=3,
        mlp_layer_types=["dense", "sparse", "sparse"],
        layer_types=[FULL, SPARSE, FULL],
        routed_scaling_factor=1.5,
        swiglu_limit=1.0,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
    )
    return transformers.MiniMaxM3VLConfig(text_config=text, vision_config=TOWER,
                                          image_token_index=290, video_token_index=291,
                                          projector_hidden_size=64)  # fmt: skip


def _apertus1p5():
    """The visual and audio codes' ranges in the ids past the head's (260..275, 276..291)."""
    text = dict(TINY, pad_token_id=0, output_vocab_size=KEPT, num_key_value_heads=1,
                rope_parameters=LLAMA3)  # fmt: skip
    vision = dict(
        codebook_size=16,
        embed_dim=8,
        latent_channels=32,
        base_channels=32,
        channel_multiplier=[1],
        num_res_blocks=1,
        attn_resolutions=[],
        resolution=16,
    )
    audio = dict(model_type="wavtokenizer_encoder", num_filters=4, upsampling_ratios=[2],
                 hidden_size=8, codebook_size=16, codebook_dim=8, num_lstm_layers=1)  # fmt: skip
    return transformers.Apertus1p5Config(
        text_config=text, vision_config=vision, audio_config=audio, image_token_id=257,
        audio_token_id=258, image_token_offset=KEPT, audio_token_offset=KEPT + 16)  # fmt: skip


# name -> (transformers' class, its config, the engine's architecture, a skipped tensor's prefix)
CASES = {
    "aria": ("AriaForConditionalGeneration", _aria, "aria_text", "vision_tower."),
    "cohere-compass": ("CohereCompassForConditionalGeneration", _compass, "cohere_compass",
                       "model.visual."),
    "apertus1p5": ("Apertus1p5ForConditionalGeneration", _apertus1p5, "apertus1p5",
                   "model.vision_tokenizer."),
    # (saved by transformers in the published layout: per-expert w1/w3/w2, split gate/up,
    # block_sparse_moe., index_*_proj: `minimax_m3_config.read_published`)
    "minimax_m3": ("MiniMaxM3SparseForConditionalGeneration", _minimax_m3, "minimax_m3",
                   "patch_merge_mlp."),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_the_text_model_matches_transformers_conditional_model(tmp_path, name):
    from safetensors import safe_open

    cls, config, arch, tower = CASES[name]
    if not hasattr(transformers, cls):
        pytest.skip(f"transformers without {cls}")
    torch.manual_seed(0)
    model = randomize(getattr(transformers, cls)(config()).eval(), 3.0)
    model.save_pretrained(tmp_path)
    save_word_tokenizer(tmp_path, 300)  # (the word-level one: no processor)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert any(n.startswith(tower) for n in f.keys()), name  # noqa: SIM118 (the towers saved)
        assert name != "minimax_m3" or PER_EXPERT in f.keys()  # noqa: SIM118 (published layout)
    reference = [hf_greedy_plain(model, p, NEW) for p in prompts()]
    loaded = load_model(str(tmp_path))
    assert loaded.config.architecture == arch
    assert not loaded.config.tie_word_embeddings
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, block_size=16,
              max_num_batched_tokens=16, max_num_seqs=4)  # fmt: skip
    cold = generate(llm, prompts())
    warm = generate(llm, prompts()[::-1])[::-1]
    assert llm.engine.kv.prefix_hits > 0
    for what, got in (("cold", cold), ("warm", warm)):
        for i, ((tokens, logits), (ref_tokens, ref_logits)) in enumerate(zip(got, reference)):
            assert tokens == ref_tokens, f"{name}, {what}: prompt {i}"
            for ours, theirs in zip(logits, ref_logits):  # (Apertus': -inf past the head's rows)
                assert torch.isneginf(ours[theirs.shape[0] :]).all()
                worst = float((ours[: theirs.shape[0]] - theirs).abs().max())
                assert worst < 1e-3, f"{name}, {what}: prompt {i}: logits differ by {worst}"


def test_minimax_m3s_published_layout_estimated_and_a_missing_expert_refused(tmp_path):
    """MiniMax-M3's published layout (as transformers saves its conditional model): the
    weights estimate exact on it (the per-expert tensors counted as the stacks the model
    holds), and a checkpoint without one expert's `w3` refused in one line naming the stored
    tensor."""
    from model_bytes import check_estimate
    from pagoda.runtime.model.hf_loader import check_weights, read_config
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    model = transformers.MiniMaxM3SparseForConditionalGeneration(_minimax_m3())
    model.save_pretrained(tmp_path)
    save_word_tokenizer(tmp_path, 300)
    check_estimate(tmp_path, rel=1e-6)
    gone = "language_model.model.layers.1.block_sparse_moe.experts.3.w3.weight"
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors[gone]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="is missing") as e:
        check_weights(tmp_path, read_config(tmp_path))
    assert gone in str(e.value) and "\n" not in str(e.value), str(e.value)
