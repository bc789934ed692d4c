"""LLaVA-NeXT and LLaVA-OneVision (`model/llava_next.py`, `multimodal/anyres_*.py`,
`multimodal/llava_next_inputs.py`): tiny random checkpoints written by transformers
(tests/runtime/llava_next_testlib.py); the engine's greedy tokens are transformers' `generate`
on the processor's expanded ids, crops and image sizes, for one image and two images of other
aspects batched with a text-only request, with chunked prefill splitting an image, and on a
warm prefix cache; every crop of a step's new images goes through the tower in one batch."""

from __future__ import annotations

import json

import pytest
from llava_next_testlib import (
    IMAGE_ID,
    expanded,
    hf_generate,
    make_tiny_llava_next,
    make_tiny_llava_onevision,
    picture,
)
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model.loader import load_model, read_model_config
from pagoda.runtime.multimodal.anyres_processing import layout, num_crops, num_tokens

transformers = pytest.importorskip("transformers")
NEW = 6
GREEDY = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
PREFIX = [1] + [10 + i for i in range(20)]  # 21 text tokens before the image: past a block
# landscape, portrait (a 1x3 or 3x1 grid), small (padded up), a long strip
IMAGES = [picture(0, (40, 52)), picture(1, (64, 30)), picture(2, (30, 30)), picture(3, (100, 20))]


@pytest.fixture(scope="module", params=["llava_next", "llava_onevision"])
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    make = make_tiny_llava_next if request.param == "llava_next" else make_tiny_llava_onevision
    model, processor = make(path)
    return path, model, processor, load_model(str(path))


def _cases():
    one = [1, 5, IMAGE_ID, 7, 8]
    two = [1, IMAGE_ID, 6, 9, IMAGE_ID, 11]
    text = [1, 12, 13, 14]
    return [
        ({"prompt_token_ids": one, "multi_modal_data": {"image": IMAGES[0]}}, IMAGES[:1]),
        ({"prompt_token_ids": two, "multi_modal_data": {"image": IMAGES[1:3]}}, IMAGES[1:3]),
        ({"prompt_token_ids": text}, []),
    ]


@pytest.fixture(scope="module")
def reference(tiny):
    _, model, processor, _ = tiny
    return [hf_generate(model, processor, expanded(processor, p["prompt_token_ids"], ims), ims,
                        NEW) for p, ims in _cases()]  # fmt: skip


def _run(llm: LLM, prompts) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


def _count_encodes(llm: LLM) -> list[int]:
    """The crops each `encode_image_list` call of `llm`'s model encodes, as it runs."""
    model, calls = llm.engine.runner.model, []
    encode = model.encode_image_list
    model.encode_image_list = lambda px, sizes: (
        calls.append(sum(len(p) for p in px)) or encode(px, sizes)
    )
    return calls


def test_one_and_two_images_batched_with_text_are_transformers(tiny, reference):
    _, _, processor, loaded = tiny
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20)
    calls = _count_encodes(llm)
    prompts = [p for p, _ in _cases()]
    out = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in out] == reference
    vision = loaded.config.vision
    crops = sum(num_crops(im.height, im.width, vision) for im in IMAGES[:3])
    assert calls == [crops]  # every crop of the step's three images in one batch
    assert out[1].prompt_token_ids == expanded(processor, prompts[1]["prompt_token_ids"],
                                               IMAGES[1:3])  # fmt: skip
    assert len(set(map(len, (out[0].prompt_token_ids, out[1].prompt_token_ids)))) == 2


def test_the_images_steer_the_tokens(tiny):
    """Another image (the same placeholders' count) gives other tokens, as transformers'."""
    _, model, processor, loaded = tiny
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20)
    ids = [1, 5, IMAGE_ID, 7, 8]
    got = [_run(llm, [{"prompt_token_ids": ids, "multi_modal_data": {"image": im}}])[0]
           for im in (picture(7, (100, 20)), picture(8, (100, 20)))]  # fmt: skip
    want = [hf_generate(model, processor, expanded(processor, ids, [im]), [im], NEW)
            for im in (picture(7, (100, 20)), picture(8, (100, 20)))]  # fmt: skip
    assert got == want and got[0] != got[1]


def test_chunked_prefill_splits_an_image_across_steps(tiny, reference):
    """8-token steps: each image's run arrives over several steps (one encode per image, its
    rows read in pieces)."""
    llm = LLM(loaded=tiny[3], dtype="float32", max_num_batched_tokens=8, block_size=8,
              kv_cache_memory=8 << 20, max_num_seqs=3)  # fmt: skip
    calls = _count_encodes(llm)
    assert _run(llm, [p for p, _ in _cases()]) == reference
    assert len(calls) >= 2


def test_prefix_cache_keys_blocks_by_the_image(tiny):
    """The same image after the same prefix hits the cache (not encoded again); another image
    of the same size does not reuse the blocks holding its placeholders; a hit that ends
    inside the image (the text after it differs) encodes it and reads its last rows."""
    _, model, processor, loaded = tiny
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20, block_size=8,
              enable_prefix_caching=True)  # fmt: skip
    calls = _count_encodes(llm)
    ids = [*PREFIX, IMAGE_ID, *range(40, 52)]  # 12 tokens after: the image in full blocks
    after = [*PREFIX, IMAGE_ID, 60, *range(41, 52)]  # differs right after the image
    a, b = picture(5), picture(6)
    run_len = len(expanded(processor, ids, [a]))
    image_end = run_len - 12

    def run(prompt, im):
        out = llm.generate({"prompt_token_ids": prompt, "multi_modal_data": {"image": im}},
                           GREEDY, use_tqdm=False)[0]  # fmt: skip
        want = hf_generate(model, processor, expanded(processor, prompt, [im]), [im], NEW)
        assert out.outputs[0].token_ids == want
        return out.num_cached_tokens, len(calls)

    assert run(ids, a) == (0, 1)
    assert run(ids, a) == ((run_len - 1) // 8 * 8, 1)  # every full block hits: no encode
    assert run(ids, b) == (16, 2)  # the text blocks only
    assert image_end % 8  # (the image ends inside a block)
    # up to the block inside the image; the image read from the encoder cache, not encoded
    assert run(after, a) == (image_end // 8 * 8, 2)


def test_preempted_requests_recompute_their_images(tiny, reference):
    """A pool of 14 blocks of 8 for the three requests' 17 (LLaVA-NeXT) or 23 (OneVision):
    some are preempted and recomputed."""
    llm = LLM(loaded=tiny[3], dtype="float32", max_num_batched_tokens=32, block_size=8,
              num_blocks_override=14, max_num_seqs=3, max_model_len=128)  # fmt: skip
    assert _run(llm, [p for p, _ in _cases()]) == reference
    assert llm.engine.scheduler.num_preemptions > 0
    llm.engine.check_integrity()


def test_a_mistral_text_model_reads_as_transformers(tmp_path):
    model, processor = make_tiny_llava_next(tmp_path, text="mistral")
    llm = LLM(str(tmp_path), dtype="float32", kv_cache_memory=8 << 20)
    assert llm.engine.model_config.architecture == "llava_next_mistral"
    ids = [1, IMAGE_ID, 7]
    got = _run(llm, [{"prompt_token_ids": ids, "multi_modal_data": {"image": IMAGES[3]}}])
    assert got == [hf_generate(model, processor, expanded(processor, ids, IMAGES[3:]),
                               IMAGES[3:], NEW)]  # fmt: skip


def test_onevision_downsamples_a_grid_past_its_cap(tiny):
    """anyres_max_2: a kept grid of over 2.2 crops' worth of rows is resized (the batch's three
    images': 6 x 8 rows to 4 x 6), the strip's 12 x 2 is not; LLaVA-NeXT resizes none."""
    vision = tiny[3].config.vision
    if vision.kind != "llava_onevision":
        assert vision.max_crops == 0 and not layout(40, 52, vision).resized
        return
    assert vision.max_crops == 2 and not layout(100, 20, vision).resized
    assert all(layout(im.height, im.width, vision).resized for im in IMAGES[:3])
    assert layout(40, 52, vision).out == (4, 6)


def test_chat_renders_image_parts_as_the_processor_does(tmp_path):
    import base64

    from llava_testlib import png_bytes

    model, processor = make_tiny_llava_next(tmp_path)
    llm = LLM(str(tmp_path), dtype="float32", kv_cache_memory=8 << 20)
    url = "data:image/png;base64," + base64.b64encode(png_bytes(IMAGES[1])).decode()
    ours = [{"role": "user", "content": [{"type": "text", "text": "w7"},
                                         {"type": "image_url", "image_url": {"url": url}}]}]  # fmt: skip
    theirs = [{"role": "user", "content": [{"type": "text", "text": "w7"}, {"type": "image"}]}]
    text = processor.apply_chat_template(theirs, add_generation_prompt=True)
    ids = processor(text=text, images=[IMAGES[1]])["input_ids"][0]
    (out,) = llm.chat(ours, GREEDY, use_tqdm=False)
    assert out.prompt == text and out.prompt_token_ids == list(ids)
    assert out.outputs[0].token_ids == hf_generate(model, processor, list(ids), IMAGES[1:2], NEW)


def test_bad_image_input_is_refused_before_anything_runs(tiny):
    llm = LLM(loaded=tiny[3], dtype="float32", kv_cache_memory=8 << 20)
    with pytest.raises(ValueError, match="1 image token"):
        llm.generate({"prompt_token_ids": [1, IMAGE_ID], "multi_modal_data": {"image": []}}, GREEDY)
    with pytest.raises(ValueError, match="PIL"):
        llm.generate({"prompt_token_ids": [1, IMAGE_ID], "multi_modal_data": {"image": "x.png"}},
                     GREEDY)  # fmt: skip
    assert not llm.engine.has_unfinished_requests()


def test_the_weights_estimate_counts_what_the_tower_holds(tiny):
    """`num_params` (what `server/weights.py` adds): transformers' tower less the layers after
    the feature layer and the post-norm, the projector and the newline."""
    _, model, _, loaded = tiny
    vision = loaded.config.vision
    unread = ("post_layernorm", f"layers.{vision.tower.layers_run}.")
    tower = sum(p.numel() for n, p in model.model.vision_tower.named_parameters()
                if not any(u in n for u in unread))  # fmt: skip
    projector = sum(p.numel() for p in model.model.multi_modal_projector.parameters())
    assert vision.num_params(64) == tower + projector + 64


# llava-hf's published configs (their text_config sparse where the class defaults fill it)
_CLIP_336 = {"hidden_size": 1024, "image_size": 336, "intermediate_size": 4096,
             "model_type": "clip_vision_model", "num_attention_heads": 16,
             "num_hidden_layers": 24, "patch_size": 14, "projection_dim": 768}  # fmt: skip
_NEXT = {"architectures": ["LlavaNextForConditionalGeneration"], "image_token_index": 32000,
         "model_type": "llava_next", "projector_hidden_act": "gelu", "tie_word_embeddings": False,
         "image_grid_pinpoints": [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]],
         "vision_config": _CLIP_336, "vision_feature_layer": -2,
         "vision_feature_select_strategy": "default"}  # fmt: skip
_NEXT_PROCESSOR = {"crop_size": {"height": 336, "width": 336}, "do_center_crop": True,
                   "image_processor_type": "LlavaNextImageProcessor", "resample": 3,
                   "image_grid_pinpoints": _NEXT["image_grid_pinpoints"],
                   "size": {"shortest_edge": 336}}  # fmt: skip


def _read(tmp_path, top, processor):
    (tmp_path / "config.json").write_text(json.dumps(top))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(processor))
    return read_model_config(str(tmp_path))


def test_llava_hf_1_6_configs_read_with_transformers_defaults(tmp_path):
    """llava-v1.6-mistral-7b-hf (a sparse Mistral text_config, no window), llama3-llava-next-8b
    (a Llama 3 text model) and llava-onevision-qwen2-0.5b-ov-hf: their sizes, and the
    placeholders of a 500 x 300 image as transformers' processors count them."""
    mistral = {"intermediate_size": 14336, "max_position_embeddings": 32768,
               "model_type": "mistral", "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
               "rope_theta": 1000000.0, "sliding_window": None, "vocab_size": 32064}  # fmt: skip
    mc = _read(tmp_path, {**_NEXT, "text_config": mistral}, _NEXT_PROCESSOR)
    assert (mc.architecture, mc.num_layers, mc.hidden_size, mc.num_kv_heads) == (
        "llava_next_mistral", 32, 4096, 8)  # fmt: skip
    assert mc.family.sliding_window is None and mc.tie_word_embeddings is False
    v = mc.vision
    # a 500 x 300 image: 672 x 336 (2 x 1 crops), its 48 x 24 rows unpadded to 40 x 24
    assert (v.kind, layout(500, 300, v).out) == ("llava_next", (40, 24))
    _counts_are_the_processors(v, transformers.LlavaNextProcessor, patch_size=14,
                               num_additional_image_tokens=1)  # fmt: skip
    llama3 = {"model_type": "llama", "vocab_size": 128320, "hidden_size": 4096,
              "intermediate_size": 14336, "num_key_value_heads": 8, "rope_theta": 500000.0,
              "max_position_embeddings": 8192}  # fmt: skip
    mc = _read(tmp_path, {**_NEXT, "text_config": llama3, "image_token_index": 128256},
               _NEXT_PROCESSOR)  # fmt: skip
    assert (mc.architecture, mc.vocab_size, mc.vision.image_token_index) == (
        "llava_next", 128320, 128256)  # fmt: skip
    siglip = {"hidden_size": 1152, "image_size": 384, "intermediate_size": 4304,
              "model_type": "siglip_vision_model", "num_attention_heads": 16,
              "num_hidden_layers": 26, "patch_size": 14, "vision_use_head": False}  # fmt: skip
    qwen = {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
            "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
            "vocab_size": 152000, "rope_theta": 1000000.0, "tie_word_embeddings": True}  # fmt: skip
    ov = {"architectures": ["LlavaOnevisionForConditionalGeneration"], "model_type":
          "llava_onevision", "image_token_index": 151646, "text_config": qwen,
          "vision_config": siglip, "vision_aspect_ratio": "anyres_max_9",
          "vision_feature_layer": -1, "vision_feature_select_strategy": "full"}  # fmt: skip
    ov_processor = {"image_processor_type": "LlavaOnevisionImageProcessor",
                    "size": {"height": 384, "width": 384}, "image_mean": [0.5] * 3,
                    "image_std": [0.5] * 3}  # fmt: skip
    mc = _read(tmp_path, ov, ov_processor)
    assert (mc.architecture, mc.attention_bias, mc.tie_word_embeddings) == (
        "llava_onevision", True, False)  # fmt: skip
    v = mc.vision
    assert (v.side, v.tower.layers_run, v.max_crops, len(v.pinpoints)) == (27, 26, 9, 36)
    _counts_are_the_processors(v, transformers.LlavaOnevisionProcessor, num_image_tokens=729,
                               vision_aspect_ratio="anyres_max_9")  # fmt: skip


def _counts_are_the_processors(vision, cls, **fields):
    """`num_tokens` is `cls`'s count (its methods on a bare instance with `fields`: the
    processor's tokenizer and video processor are not needed) for sizes around the pinpoints."""
    proc = object.__new__(cls)
    pins = [list(p) for p in vision.pinpoints]
    proc.__dict__.update(image_processor=type("I", (), {"image_grid_pinpoints": pins}), **fields)
    s = vision.image_size
    for h, w in ((500, 300), (1000, 200), (2000, 3000), (20, 25), (336, 1000), (768, 1500)):
        want = proc._get_number_of_features(h, w, s, s) - (cls is transformers.LlavaNextProcessor)
        assert num_tokens(h, w, vision) == want, (h, w)


def test_configs_outside_the_anyres_shapes_are_refused(tmp_path):
    text = {"model_type": "llama"}
    with pytest.raises(ValueError, match="'full' is not supported"):
        _read(tmp_path, {**_NEXT, "text_config": text, "vision_feature_select_strategy": "full"},
              _NEXT_PROCESSOR)  # fmt: skip
    with pytest.raises(ValueError, match="model_type 'gemma' is not supported"):
        _read(tmp_path, {**_NEXT, "text_config": {"model_type": "gemma"}}, _NEXT_PROCESSOR)
    bare = {k: v for k, v in _NEXT_PROCESSOR.items() if k != "image_grid_pinpoints"}
    with pytest.raises(ValueError, match="multiples of the tower's image_size 336"):
        _read(tmp_path, {**_NEXT, "text_config": text, "image_grid_pinpoints": [[300, 600]]}, bare)
    with pytest.raises(ValueError, match="not the tower's 336x336 crops"):
        _read(tmp_path, {**_NEXT, "text_config": text}, {**bare, "size": {"shortest_edge": 224}})
    with pytest.raises(ValueError, match=r"not config\.json.s"):
        _read(tmp_path, {**_NEXT, "text_config": text},
              {**_NEXT_PROCESSOR, "image_grid_pinpoints": [[336, 336]]})  # fmt: skip
    ov = {**_NEXT, "architectures": ["LlavaOnevisionForConditionalGeneration"],
          "text_config": {"model_type": "qwen2"}, "vision_aspect_ratio": "pad"}  # fmt: skip
    with pytest.raises(ValueError, match="vision_aspect_ratio 'pad'"):
        _read(tmp_path, ov, {**_NEXT_PROCESSOR, "image_processor_type":
                             "LlavaOnevisionImageProcessor"})  # fmt: skip


@pytest.mark.slow
def test_two_ranks_read_the_images_rank_0_encodes(tiny, reference):
    """Tensor parallelism over gloo, two ranks, 8-token chunks: rank 0 alone holds the tower;
    each step's image rows and features are broadcast; transformers' tokens."""
    path, _, _, loaded = tiny
    with LLM(str(path), loaded=loaded, tensor_parallel_size=2, dtype="float32",
             max_num_batched_tokens=8, max_num_seqs=3, block_size=8,
             kv_cache_memory=8 << 20) as two:  # fmt: skip
        assert _run(two, [p for p, _ in _cases()]) == reference
        assert two.engine.runner.model.tower is not None
        two.engine.check_integrity()
