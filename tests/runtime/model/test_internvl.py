"""InternVL 3 / 3.5 (`model/internvl.py`, `model/internvl_vision.py`,
`multimodal/internvl_inputs.py`): tiny random checkpoints written by transformers with a Qwen2
and a Qwen3 text model (tests/runtime/internvl_testlib.py); the prompt ids are
`InternVLProcessor`'s `input_ids` and the engine's greedy tokens are transformers' `generate`
on the processor's pixels, for prompts with one and two images (landscape, portrait, small)
batched beside a text-only one, with chunked prefill splitting tiles across steps, on a warm
prefix cache, with other min/max_patches, and without tiling (one tile an image)."""

from __future__ import annotations

import pytest
import torch
from internvl_testlib import (
    CONTEXT,
    TOKENS_PER_TILE,
    count_encodes,
    hf_generate,
    hf_inputs,
    image,
    image_part,
    image_prompt,
    make_tiny,
)
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model.loader import load_model
from pagoda.runtime.multimodal import inputs

transformers = pytest.importorskip("transformers")
NEW = 6
GREEDY = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
ONE = "<|im_start|>user\n<IMG_CONTEXT>\nWhat is it?<|im_end|>\n<|im_start|>assistant\n"
TWO = (
    "<|im_start|>user\n<IMG_CONTEXT>\nand<IMG_CONTEXT>\ndiffer?<|im_end|>\n<|im_start|>assistant\n"
)
TEXT = "<|im_start|>user\nno image here<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module", params=["qwen2", "qwen3"])
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"internvl_{request.param}")
    model, processor = make_tiny(path, request.param)
    return path, model, processor, load_model(str(path))


def _cases():
    """(prompt text, its images): one landscape image (2 x 2 tiles + thumbnail: 5), a portrait
    (a column of 2 + thumbnail: 3) and a small one (1 x 1: one tile), text only."""
    ims = [image(0, (40, 52)), image(1, (70, 30)), image(2, (20, 25), "RGBA")]
    return [(ONE, ims[:1]), (TWO, ims[1:]), (TEXT, [])]


@pytest.fixture(scope="module")
def reference(tiny):
    _, model, processor, _ = tiny
    cases = [hf_inputs(processor, text, ims) for text, ims in _cases()]
    return [c["input_ids"][0].tolist() for c in cases], [hf_generate(model, c, NEW) for c in cases]


def _run(llm: LLM, prompts) -> list:
    return llm.generate(prompts, GREEDY, use_tqdm=False)


def test_one_and_two_images_batched_with_text_are_transformers(tiny, reference):
    llm = LLM(loaded=tiny[3], dtype="float32", kv_cache_memory=8 << 20)
    calls = count_encodes(llm)
    out = _run(llm, [image_prompt(t, ims) for t, ims in _cases()])
    ids, tokens = reference
    assert [o.prompt_token_ids for o in out] == ids  # the processor's input_ids
    assert [o.outputs[0].token_ids for o in out] == tokens
    assert calls == [5 + 3 + 1]  # the step's new tiles in one batch, each encoded once


def test_tile_features_are_get_image_features(tiny):
    """The tower, pixel shuffle and projector: each tile's rows are transformers'
    `get_image_features` (the tokens alone may not tell a small error)."""
    _, model, processor, _ = tiny
    llm = LLM(loaded=tiny[3], dtype="float32", kv_cache_memory=8 << 20)
    pixels = hf_inputs(processor, ONE, [image(0, (40, 52))])["pixel_values"]
    with torch.no_grad():
        want = model.model.get_image_features(pixel_values=pixels).pooler_output
    got = llm.engine.runner.model.encode_images(pixels)
    assert got.shape == want.shape == (5, TOKENS_PER_TILE, 64)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_chunked_prefill_splits_tiles_across_steps(tiny, reference):
    """6-token steps: each tile's 16 placeholder rows arrive over three or four steps (each
    tile encoded once, its rows read in pieces)."""
    llm = LLM(loaded=tiny[3], dtype="float32", max_num_batched_tokens=6, block_size=8,
              kv_cache_memory=8 << 20, max_num_seqs=3)  # fmt: skip
    calls = count_encodes(llm)
    out = _run(llm, [image_prompt(t, ims) for t, ims in _cases()])
    assert [o.outputs[0].token_ids for o in out] == reference[1]
    assert sum(calls) == 9 and max(calls) < 9


def test_prefix_cache_keys_blocks_by_the_tiles(tiny):
    """The same image after the same text hits the cache (no tile encoded again); another
    image shares only the text blocks before it; after a hit that ends inside the image (the
    text after it differs) only the tiles past the hit are encoded. Each reads as
    transformers'. The image's placeholders are prompt positions [29, 109) (its thumbnail's
    [93, 109)) of 128, blocks of 8."""
    _, model, processor, loaded = tiny
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20, block_size=8,
              enable_prefix_caching=True)  # fmt: skip
    calls = count_encodes(llm)
    text = "<|im_start|>user\nA long enough prefix: <IMG_CONTEXT>Then?<|im_end|>\n<|im_start|>assistant\n"
    after = text.replace("Then?", "Now??")

    def run(prompt, im):
        out = _run(llm, [image_prompt(prompt, [im])])[0]
        want = hf_inputs(processor, prompt, [im])
        assert out.outputs[0].token_ids == hf_generate(model, want, NEW)
        return out.num_cached_tokens, sum(calls)

    a, b = image(5), image(6)
    assert run(text, a) == (0, 5)
    assert run(text, a) == (120, 5)  # every block but the last token's hits: no encode
    assert run(text, b) == (24, 10)  # the text before the image (its tiles differ)
    # a hit inside the thumbnail: read from the encoder cache, not encoded again
    assert run(after, a) == (104, 10)


def test_mm_processor_kwargs_set_the_tiles_and_give_transformers_tokens(tiny):
    """`mm_processor_kwargs` (the engine's, vLLM's --mm-processor-kwargs; a prompt's own over
    it): with max_patches 2 the landscape image (aspect 1.3) is one tile, with min_patches 6
    a 3 x 2 grid and a thumbnail (the one tile's pixels: encoded once); the ids and tokens are
    the processor's and transformers' with the same kwargs."""
    _, model, processor, loaded = tiny
    small, large = {"max_patches": 2}, {"min_patches": 6, "max_patches": 6}
    im = image(0, (40, 52))
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20, mm_processor_kwargs=small)
    calls = count_encodes(llm)
    out = _run(
        llm, [image_prompt(ONE, [im]), {**image_prompt(ONE, [im]), "mm_processor_kwargs": large}]
    )
    for o, kw in zip(out, (small, large)):
        want = hf_inputs(processor, ONE, [im], **kw)
        assert o.prompt_token_ids == want["input_ids"][0].tolist()
        assert o.outputs[0].token_ids == hf_generate(model, want, NEW)
    assert calls == [1 + 6]
    with pytest.raises(ValueError, match="mm_processor_kwargs: 'size' is not a setting"):
        _run(llm, {**image_prompt(ONE, [im]), "mm_processor_kwargs": {"size": 1}})
    with pytest.raises(ValueError, match="min_patches 3 and max_patches 2"):
        _run(llm, {**image_prompt(ONE, [im]), "mm_processor_kwargs": {"min_patches": 3}})
    for bad, match in (({"max_patches": 0}, "positive integer"),
                       ({"crop_to_patches": 1}, "true or false")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            _run(llm, {**image_prompt(ONE, [im]), "mm_processor_kwargs": bad})


def test_without_tiling_an_image_is_one_tile(tiny):
    """crop_to_patches false: each image one tile, whose run `/tokenize` expands without
    reading the image."""
    _, model, processor, loaded = tiny
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20,
              mm_processor_kwargs={"crop_to_patches": False})  # fmt: skip
    calls = count_encodes(llm)
    ims = [image(1, (70, 30)), image(2, (20, 25))]
    (out,) = _run(llm, [image_prompt(TWO, ims)])
    want = hf_inputs(processor, TWO, ims, crop_to_patches=False)
    assert out.prompt_token_ids == want["input_ids"][0].tolist()
    assert out.outputs[0].token_ids == hf_generate(model, want, NEW)
    assert calls == [2]
    vision = llm.engine.model_config.vision
    ids = llm.get_tokenizer().encode(TWO, add_special_tokens=False)
    assert inputs.expand(ids, 2, vision)[0] == out.prompt_token_ids


def test_images_are_counted_not_tiles_and_bad_input_is_refused(tiny):
    llm = LLM(loaded=tiny[3], dtype="float32", kv_cache_memory=8 << 20,
              limit_mm_per_prompt={"image": 1})  # fmt: skip
    assert len(_run(llm, [image_prompt(ONE, [image(0)])])[0].outputs[0].token_ids) == NEW  # 5 tiles
    with pytest.raises(ValueError, match="at most 1 image"):
        _run(llm, [image_prompt(TWO, [image(0), image(1)])])
    with pytest.raises(ValueError, match="1 image token"):
        _run(llm, [image_prompt(ONE, [image(0), image(1)])])
    with pytest.raises(ValueError, match="PIL"):
        _run(llm, [image_prompt(ONE, ["x.png"])])
    with pytest.raises(ValueError, match="depend on its size"):
        inputs.expand([1, CONTEXT], 1, llm.engine.model_config.vision)
    assert not llm.engine.has_unfinished_requests()


def test_chat_renders_image_parts_as_the_processor_does(tiny):
    _, model, processor, loaded = tiny
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20)
    ours = [{"role": "user", "content": [image_part(image(4)), {"type": "text", "text": "Hi"}]}]
    theirs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]
    text = processor.tokenizer.apply_chat_template(theirs, add_generation_prompt=True,
                                                   tokenize=False)  # fmt: skip
    want = hf_inputs(processor, text, [image(4)])
    (out,) = llm.chat(ours, GREEDY, use_tqdm=False)
    assert out.prompt == text and out.prompt_token_ids == want["input_ids"][0].tolist()
    assert out.outputs[0].token_ids == hf_generate(model, want, NEW)


def test_the_weights_estimate_counts_the_tower_and_projector(tiny):
    _, model, _, loaded = tiny
    vision = loaded.config.vision
    held = sum(p.numel() for p in model.model.vision_tower.parameters())
    held += sum(p.numel() for p in model.model.multi_modal_projector.parameters())
    assert vision.num_params(64) == held and vision.tokens_per_image == TOKENS_PER_TILE


@pytest.mark.slow
def test_two_ranks_read_the_tiles_rank_0_encodes(tiny, reference):
    """Tensor parallelism over gloo, two ranks, 6-token chunks (tiles split across steps):
    rank 0 alone holds the tower; each step's image rows and features are broadcast;
    transformers' tokens."""
    path, _, _, loaded = tiny
    with LLM(str(path), loaded=loaded, tensor_parallel_size=2, dtype="float32",
             max_num_batched_tokens=6, max_num_seqs=3, block_size=8,
             kv_cache_memory=8 << 20) as two:  # fmt: skip
        out = _run(two, [image_prompt(t, ims) for t, ims in _cases()])
        assert [o.outputs[0].token_ids for o in out] == reference[1]
        assert two.engine.runner.model.tower is not None
        two.engine.check_integrity()


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """A tiny InternVL with a Qwen3-MoE text model (4 experts, 2 a token: InternVL3.5-MoE's)."""
    path = tmp_path_factory.mktemp("internvl_qwen3_moe")
    model, processor = make_tiny(path, "qwen3_moe")
    cases = [hf_inputs(processor, text, ims) for text, ims in _cases()]
    return path, load_model(str(path)), [hf_generate(model, c, NEW) for c in cases]


def test_a_qwen3_moe_text_model_is_transformers(moe):
    llm = LLM(loaded=moe[1], dtype="float32", kv_cache_memory=8 << 20, max_num_batched_tokens=6,
              block_size=8, max_num_seqs=3)  # fmt: skip
    out = _run(llm, [image_prompt(t, ims) for t, ims in _cases()])
    assert [o.outputs[0].token_ids for o in out] == moe[2]


@pytest.mark.slow
def test_two_ranks_run_the_qwen3_moe_text_model(moe):
    path, loaded, want = moe
    with LLM(str(path), loaded=loaded, tensor_parallel_size=2, dtype="float32",
             max_num_batched_tokens=6, max_num_seqs=3, block_size=8,
             kv_cache_memory=8 << 20) as two:  # fmt: skip
        out = _run(two, [image_prompt(t, ims) for t, ims in _cases()])
        assert [o.outputs[0].token_ids for o in out] == want
        two.engine.check_integrity()
