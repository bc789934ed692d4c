"""Idefics3 and SmolVLM (`model/idefics3.py`, `multimodal/idefics3_inputs.py`): tiny random
checkpoints written by transformers with their processors (tests/runtime/idefics3_testlib.py);
the prompt ids are the processor's `input_ids` and the engine's greedy tokens are transformers'
`generate` on the processor's pixels, for prompts with one and two images (landscape,
portrait, small) batched beside a text-only one, with chunked prefill splitting tiles across
steps, on a warm prefix cache, and without image splitting (one tile an image)."""

from __future__ import annotations

import pytest
from idefics3_testlib import (
    IMAGE_ID,
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
ONE = "User:<image>What is it?<end_of_utterance>\nAssistant:"
TWO = "User:<image>and<image>differ?<end_of_utterance>\nAssistant:"
TEXT = "User: no image here<end_of_utterance>\nAssistant:"


@pytest.fixture(scope="module", params=["idefics3", "smolvlm"])
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    model, processor = make_tiny(path, request.param)
    return path, model, processor, load_model(str(path))


def _cases():
    """(prompt text, its images): one landscape image (2 x 2 tiles + global: 5), a portrait
    and a small one (a column of 2 + global: 3; 5), text only."""
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
    assert calls == [5 + 3 + 5]  # the step's new tiles in one batch, each encoded once


def test_the_image_steers_the_tokens(tiny):
    """Two images in the same prompt answer differently (the features reach the text model)."""
    llm = LLM(loaded=tiny[3], dtype="float32", kv_cache_memory=8 << 20)
    a, b = (_run(llm, [image_prompt(ONE, [image(s)])])[0].outputs[0].token_ids for s in (0, 2))
    assert a != b


def test_chunked_prefill_splits_tiles_across_steps(tiny, reference):
    """6-token steps: each tile's 16 placeholder rows arrive over three or four steps (each
    tile encoded once, its rows read in pieces)."""
    llm = LLM(loaded=tiny[3], dtype="float32", max_num_batched_tokens=6, block_size=8,
              kv_cache_memory=8 << 20, max_num_seqs=3)  # fmt: skip
    calls = count_encodes(llm)
    out = _run(llm, [image_prompt(t, ims) for t, ims in _cases()])
    assert [o.outputs[0].token_ids for o in out] == reference[1]
    assert sum(calls) == 13 and max(calls) < 13


def test_prefix_cache_keys_blocks_by_the_tiles(tiny):
    """The same image after the same text hits the cache (no tile encoded again); another
    image shares only the text blocks before it; after a hit that ends inside the image (the
    text after it differs) only the tiles past the hit are encoded. Each reads as
    transformers'. The image's text is prompt positions [26, 119) (its global tile's run
    [102, 118)) of 136, blocks of 8."""
    _, model, processor, loaded = tiny
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20, block_size=8,
              enable_prefix_caching=True)  # fmt: skip
    calls = count_encodes(llm)
    text = "User: a long enough prefix<image>Then?<end_of_utterance>\nAssistant:"
    after = text.replace("Then?", "Now??")

    def run(prompt, im):
        out = _run(llm, [image_prompt(prompt, [im])])[0]
        want = hf_inputs(processor, prompt, [im])
        assert out.outputs[0].token_ids == hf_generate(model, want, NEW)
        return out.num_cached_tokens, sum(calls)

    a, b = image(5), image(6)
    assert run(text, a) == (0, 5)
    assert run(text, a) == (128, 5)  # every block but the last token's hits: no encode
    assert run(text, b) == (24, 10)  # "User: a long enough pref" (its tiles differ)
    # a hit inside the global tile: the tile read from the encoder cache, not encoded again
    assert run(after, a) == (112, 10)


def test_without_splitting_an_image_is_one_tile(tmp_path):
    model, processor = make_tiny(tmp_path, "smolvlm", splitting=False)
    llm = LLM(str(tmp_path), dtype="float32", kv_cache_memory=8 << 20)
    calls = count_encodes(llm)
    texts, ims = [ONE, TWO], [[image(0)], [image(1, (70, 30)), image(2, (20, 25))]]
    out = _run(llm, [image_prompt(t, i) for t, i in zip(texts, ims)])
    for o, t, i in zip(out, texts, ims):
        want = hf_inputs(processor, t, i)
        assert o.prompt_token_ids == want["input_ids"][0].tolist()
        assert o.outputs[0].token_ids == hf_generate(model, want, NEW)
    assert calls == [3]
    vision = llm.engine.model_config.vision
    # /tokenize's expansion (no image read) is the processor's
    ids = llm.get_tokenizer().encode(TWO, add_special_tokens=False)
    assert inputs.expand(ids, 2, vision)[0] == out[1].prompt_token_ids


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
    vision = llm.engine.model_config.vision
    with pytest.raises(ValueError, match="depend on its size"):
        inputs.expand([1, IMAGE_ID], 1, vision)
    assert not llm.engine.has_unfinished_requests()


def test_chat_renders_image_parts_as_the_processor_does(tiny):
    _, model, processor, loaded = tiny
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20)
    ours = [{"role": "user", "content": [image_part(image(4)), {"type": "text", "text": "Hi"}]}]
    theirs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]
    text = processor.apply_chat_template(theirs, add_generation_prompt=True)
    want = hf_inputs(processor, text, [image(4)])
    (out,) = llm.chat(ours, GREEDY, use_tqdm=False)
    assert out.prompt == text and out.prompt_token_ids == want["input_ids"][0].tolist()
    assert out.outputs[0].token_ids == hf_generate(model, want, NEW)


def test_the_weights_estimate_counts_the_tower_and_connector(tiny):
    _, model, _, loaded = tiny
    vision = loaded.config.vision
    held = sum(p.numel() for p in model.model.vision_model.parameters())
    held += sum(p.numel() for p in model.model.connector.parameters())
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


@pytest.mark.parametrize("side", [8, 19, 25, 27, 32])
def test_tile_positions_are_idefics3_vision_embeddings(side):
    """A full tile's patch positions as `Idefics3VisionEmbeddings` buckets them (float32
    fractions: 19 and 25 are not the identity), read off its output with a zero patch
    embedding and a position table holding each row's index."""
    import torch
    from pagoda.runtime.model.idefics3 import _position_ids
    from transformers.models.idefics3.modeling_idefics3 import Idefics3VisionEmbeddings

    config = transformers.Idefics3VisionConfig(hidden_size=1, image_size=side * 2, patch_size=2)
    emb = Idefics3VisionEmbeddings(config)
    with torch.no_grad():
        emb.patch_embedding.weight.zero_()
        emb.patch_embedding.bias.zero_()
        emb.position_embedding.weight.copy_(torch.arange(side * side, dtype=torch.float32)[:, None])
        mask = torch.ones(1, side, side, dtype=torch.bool)
        want = emb(torch.zeros(1, 3, side * 2, side * 2), mask)[0, :, 0].long()
    assert _position_ids(side).tolist() == want.tolist()
