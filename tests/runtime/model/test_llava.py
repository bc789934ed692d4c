"""LLaVA 1.5 (`model/llava.py`, `model/clip_vision.py`, `worker/mm_encoder.py`): a tiny random
LlavaForConditionalGeneration written by transformers with its processor
(tests/runtime/llava_testlib.py); the engine's greedy tokens are transformers' `generate` on the
processor's expanded ids and pixels, for prompts with one and two images batched with a
text-only one, with chunked prefill splitting an image across steps, with requests preempted and
recomputed, and on a warm prefix cache (the same image after the same prefix hits; another image
never shares the blocks of its placeholders)."""

from __future__ import annotations

import base64
import json

import pytest
from llava_testlib import (
    IMAGE_ID,
    TOKENS_PER_IMAGE,
    hf_generate,
    image,
    make_tiny_llava,
    png_bytes,
)
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model.loader import load_model

transformers = pytest.importorskip("transformers")
NEW = 6
GREEDY = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
PREFIX = [1] + [10 + i for i in range(20)]  # 21 text tokens before the image: past a block


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("llava")
    model, processor = make_tiny_llava(path)
    return path, model, processor, load_model(str(path))


def _cases():
    """(prompt dict, the images, the expanded ids transformers reads) of the three requests:
    one image, two images, text only."""
    one = [1, 5, IMAGE_ID, 7, 8]
    two = [1, IMAGE_ID, 6, 9, IMAGE_ID, 11]
    text = [1, 12, 13, 14]
    ims = [image(0), image(1, (64, 30)), image(2, (30, 30))]
    return [
        ({"prompt_token_ids": one, "multi_modal_data": {"image": ims[0]}}, ims[:1]),
        ({"prompt_token_ids": two, "multi_modal_data": {"image": ims[1:]}}, ims[1:]),
        ({"prompt_token_ids": text}, []),
    ]


def _expanded(ids: list[int]) -> list[int]:
    return [t for i in ids for t in ([i] * TOKENS_PER_IMAGE if i == IMAGE_ID else [i])]


@pytest.fixture(scope="module")
def reference(tiny):
    _, model, processor, _ = tiny
    return [hf_generate(model, processor, _expanded(p["prompt_token_ids"]), ims, NEW)
            for p, ims in _cases()]  # fmt: skip


def _run(llm: LLM, prompts) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


def _count_encodes(llm: LLM) -> list[int]:
    """The images each `encode_images` call of `llm`'s model encodes, appended as it runs."""
    model, calls = llm.engine.runner.model, []
    encode = model.encode_images
    model.encode_images = lambda px: calls.append(px.shape[0]) or encode(px)
    return calls


def test_one_and_two_images_batched_with_text_are_transformers(tiny, reference):
    llm = LLM(loaded=tiny[3], dtype="float32", kv_cache_memory=8 << 20)
    calls = _count_encodes(llm)
    prompts = [p for p, _ in _cases()]
    out = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in out] == reference
    assert calls == [3]  # the step's three new images in one batch, each encoded once
    assert out[1].prompt_token_ids == _expanded(prompts[1]["prompt_token_ids"])


def test_chunked_prefill_splits_an_image_across_steps(tiny, reference):
    """4-token steps: each image's 9 placeholder rows arrive over three or four steps (one
    encode per image, its rows read in pieces)."""
    llm = LLM(loaded=tiny[3], dtype="float32", max_num_batched_tokens=4, block_size=8,
              kv_cache_memory=8 << 20, max_num_seqs=3)  # fmt: skip
    calls = _count_encodes(llm)
    assert _run(llm, [p for p, _ in _cases()]) == reference
    assert sum(calls) == 3


def test_preempted_requests_recompute_their_images(tiny, reference):
    """A pool of 6 blocks for the three requests' 9: some are preempted and recomputed."""
    llm = LLM(loaded=tiny[3], dtype="float32", max_num_batched_tokens=16, block_size=8,
              num_blocks_override=6, max_num_seqs=3, max_model_len=40)  # fmt: skip
    assert _run(llm, [p for p, _ in _cases()]) == reference
    assert llm.engine.scheduler.num_preemptions > 0
    llm.engine.check_integrity()


def test_prefix_cache_keys_blocks_by_the_image(tiny):
    """The same image after the same prefix hits the cache (not encoded again); another image
    with the same placeholders does not reuse the blocks holding them; a hit that ends inside
    the image (the text after it differs) reads its last rows from the encoder cache (not
    encoded again either). Each reads as transformers'. The image sits at positions [21, 30),
    blocks of 8."""
    _, model, processor, loaded = tiny
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20, block_size=8,
              enable_prefix_caching=True)  # fmt: skip
    calls = _count_encodes(llm)
    ids = [*PREFIX, IMAGE_ID, 40, 41, 42, 43, 44, 45]
    after = [*PREFIX, IMAGE_ID, 50, 41, 42, 43, 44, 45]  # differs at position 30
    a, b = image(5), image(6)

    def run(prompt, im):
        out = llm.generate({"prompt_token_ids": prompt, "multi_modal_data": {"image": im}},
                           GREEDY, use_tqdm=False)[0]  # fmt: skip
        want = hf_generate(model, processor, _expanded(prompt), [im], NEW)
        assert out.outputs[0].token_ids == want
        return out.num_cached_tokens, len(calls)

    assert run(ids, a) == (0, 1)
    assert run(ids, a) == (32, 1)  # the image's blocks hit: no encode
    assert run(ids, b) == (16, 2)  # the text blocks only
    assert run(after, a) == (24, 2)  # up to the block inside the image; the encoder cache's
    assert (llm.engine.runner.encoder_cache.queries, llm.engine.runner.encoder_cache.hits) == (3, 1)


def test_requests_holding_one_image_encode_it_once(tiny):
    """Three requests holding the same image (one of them twice) batched together, then one
    more after they finish: the tower encodes it once (the encoder cache shares it by content
    hash, `worker/encoder_cache.py`), and each request reads transformers' tokens."""
    _, model, processor, loaded = tiny
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20)
    calls = _count_encodes(llm)
    im = image(7)
    prompts = [[1, 5, IMAGE_ID, 7], [1, 6, IMAGE_ID, 8, 9], [1, IMAGE_ID, 4, IMAGE_ID, 3]]
    want = [hf_generate(model, processor, _expanded(p), [im] * p.count(IMAGE_ID), NEW)
            for p in prompts]  # fmt: skip
    batch = [{"prompt_token_ids": p, "multi_modal_data": {"image": [im] * p.count(IMAGE_ID)}}
             for p in prompts]  # fmt: skip
    assert _run(llm, batch) == want and calls == [1]
    assert _run(llm, batch[:1]) == want[:1] and calls == [1]  # still cached: no encode
    cache = llm.engine.runner.encoder_cache
    assert (cache.queries, cache.hits, cache.rows) == (5, 4, TOKENS_PER_IMAGE)
    assert llm.engine.stats().mm_encoder_cache_hits == 4


def test_full_feature_select_keeps_the_class_token(tmp_path):
    model, processor = make_tiny_llava(tmp_path, strategy="full")
    llm = LLM(str(tmp_path), dtype="float32", kv_cache_memory=8 << 20)
    ids = [1, IMAGE_ID, 7]
    got = _run(llm, [{"prompt_token_ids": ids, "multi_modal_data": {"image": image(3)}}])
    full = [1] + [IMAGE_ID] * (TOKENS_PER_IMAGE + 1) + [7]
    assert got == [hf_generate(model, processor, full, [image(3)], NEW)]


def test_bad_image_input_is_refused_before_anything_runs(tiny):
    llm = LLM(
        loaded=tiny[3], dtype="float32", kv_cache_memory=8 << 20, limit_mm_per_prompt={"image": 1}
    )
    two = {
        "prompt_token_ids": [1, IMAGE_ID, IMAGE_ID],
        "multi_modal_data": {"image": [image(0)] * 2},
    }
    with pytest.raises(ValueError, match="at most 1 image"):
        llm.generate(two, GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="1 image token"):
        llm.generate({"prompt_token_ids": [1, IMAGE_ID], "multi_modal_data": {"image": []}}, GREEDY)
    with pytest.raises(ValueError, match="reads no videos"):
        llm.generate({"prompt_token_ids": [1], "multi_modal_data": {"video": image(0)}}, GREEDY)
    with pytest.raises(ValueError, match="PIL"):
        llm.generate({"prompt_token_ids": [1, IMAGE_ID], "multi_modal_data": {"image": "x.png"}},
                     GREEDY)  # fmt: skip
    assert not llm.engine.has_unfinished_requests()
    empty = {"prompt_token_ids": [1, 12, 13, 14], "multi_modal_data": {"image": []}}
    assert _run(llm, [empty]) == _run(llm, [{"prompt_token_ids": [1, 12, 13, 14]}])


def test_chat_renders_image_parts_as_the_processor_does(tiny):
    _, model, processor, loaded = tiny
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20)
    url = "data:image/png;base64," + base64.b64encode(png_bytes(image(4))).decode()
    ours = [{"role": "user", "content": [{"type": "text", "text": "w7"},
                                         {"type": "image_url", "image_url": {"url": url}}]}]  # fmt: skip
    theirs = [{"role": "user", "content": [{"type": "text", "text": "w7"}, {"type": "image"}]}]
    text = processor.apply_chat_template(theirs, add_generation_prompt=True)
    ids = processor(text=text, images=[image(4)])["input_ids"][0]
    (out,) = llm.chat(ours, GREEDY, use_tqdm=False)
    assert out.prompt == text and out.prompt_token_ids == list(ids)
    assert out.outputs[0].token_ids == hf_generate(model, processor, list(ids), [image(4)], NEW)


def test_the_weights_estimate_counts_what_the_tower_holds(tiny):
    """`VisionConfig.num_params` (what `server/weights.py` adds for the tower): transformers'
    tower less the layers after the feature layer and the post-norm, and the projector."""
    _, model, _, loaded = tiny
    vision = loaded.config.vision
    unread = ("post_layernorm", f"layers.{vision.layers_run}.")
    tower = sum(p.numel() for n, p in model.model.vision_tower.named_parameters()
                if not any(u in n for u in unread))  # fmt: skip
    projector = sum(p.numel() for p in model.model.multi_modal_projector.parameters())
    assert vision.layers_run == 1 and vision.num_params(64) == tower + projector


def test_llava_hf_1_5_configs_read_with_transformers_defaults(tmp_path):
    """llava-hf/llava-1.5-7b-hf's config.json (its text_config sparse: LlamaConfig's defaults
    fill it) and preprocessor_config.json: a 7B Llama over 576 placeholders an image."""
    from pagoda.runtime.model.loader import read_model_config

    text = {"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 4096,
            "model_type": "llama", "rms_norm_eps": 1e-05, "vocab_size": 32064}  # fmt: skip
    vision = {"hidden_size": 1024, "image_size": 336, "intermediate_size": 4096,
              "model_type": "clip_vision_model", "num_attention_heads": 16,
              "num_hidden_layers": 24, "patch_size": 14, "projection_dim": 768}  # fmt: skip
    top = {"architectures": ["LlavaForConditionalGeneration"], "image_token_index": 32000,
           "model_type": "llava", "pad_token_id": 32001, "projector_hidden_act": "gelu",
           "text_config": text, "tie_word_embeddings": False, "vision_config": vision,
           "vision_feature_layer": -2, "vision_feature_select_strategy": "default",
           "vocab_size": 32064}  # fmt: skip
    processor = {"crop_size": {"height": 336, "width": 336}, "do_center_crop": True,
                 "image_processor_type": "CLIPImageProcessor", "resample": 3,
                 "size": {"shortest_edge": 336}}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(top))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(processor))
    mc = read_model_config(str(tmp_path))
    assert (mc.architecture, mc.num_layers, mc.hidden_size, mc.vocab_size) == (
        "llava",
        32,
        4096,
        32064,
    )
    assert (mc.num_kv_heads, mc.intermediate_size, mc.tie_word_embeddings) == (32, 11008, False)
    v = mc.vision
    assert (v.tokens_per_image, v.layers_run, v.image_token_index) == (576, 23, 32000)
    assert v.processing.crop == (336, 336) and v.processing.shortest_edge == 336
    text["model_type"] = "mistral"
    (tmp_path / "config.json").write_text(json.dumps(top))
    with pytest.raises(ValueError, match="model_type 'mistral' is not supported"):
        read_model_config(str(tmp_path))


@pytest.mark.slow
def test_two_ranks_read_the_images_rank_0_encodes(tiny, reference):
    """Tensor parallelism over gloo, two ranks, 4-token chunks (images split across steps): rank
    0 alone holds the tower; each step's image rows and features are broadcast; transformers'
    tokens."""
    path, _, _, loaded = tiny
    with LLM(str(path), loaded=loaded, tensor_parallel_size=2, dtype="float32",
             max_num_batched_tokens=4, max_num_seqs=3, block_size=8,
             kv_cache_memory=8 << 20) as two:  # fmt: skip
        assert _run(two, [p for p, _ in _cases()]) == reference
        assert two.engine.runner.model.tower is not None
        two.engine.check_integrity()
