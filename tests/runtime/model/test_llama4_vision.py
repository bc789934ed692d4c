"""Llama 4 reading images (`model/llama4_vision.py`, `multimodal/llama4_inputs.py`): a tiny
random `Llama4ForConditionalGeneration` written by transformers with its processor files
(tests/runtime/llama4_vision_testlib.py: 2 experts top-1, chunked attention of 8 tokens on the
rotary layer, temperature-tuned NoPE on the other); the prompt ids are `Llama4Processor`'s
`input_ids` and the engine's greedy tokens are transformers' `generate`, for prompts with one
image and two (a column of 3 tiles and a global one; a small RGBA one of a single tile) batched
beside a text-only one, with chunked prefill splitting tiles across steps, on a warm prefix
cache, and with `max_patches` set by the engine's flag and by a request."""

from __future__ import annotations

import base64

import pytest
from idefics3_testlib import count_encodes, image_prompt
from llama4_vision_testlib import (
    IMAGE,
    TOKENS_PER_TILE,
    hf_generate,
    hf_inputs,
    image,
    make_processor,
    make_tiny,
    png_bytes,
)
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model.loader import load_model
from pagoda.runtime.multimodal import inputs

transformers = pytest.importorskip("transformers")
NEW = 6
GREEDY = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
ONE = "User:<|image|>What is it?<|eot|>Assistant:"
TWO = "User:<|image|>and<|image|>differ?<|eot|>Assistant:"
TEXT = "User: no image here<|eot|>Assistant:"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama4_vision")
    model, processor = make_tiny(path)
    return path, model, processor, load_model(str(path))


def _cases():
    """(prompt text, its images): one image of 2 x 2 tiles + global (5), a column of 3 + global
    and a small RGBA one (4 + 1), text only."""
    ims = [image(0, (100, 130)), image(1, (150, 60)), image(2, (20, 25), "RGBA")]
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
    assert llm.engine.model_config.architecture == "llama4_vision"
    calls = count_encodes(llm)
    out = _run(llm, [image_prompt(t, ims) for t, ims in _cases()])
    ids, tokens = reference
    assert [o.prompt_token_ids for o in out] == ids  # Llama4Processor's input_ids
    assert [o.outputs[0].token_ids for o in out] == tokens
    assert calls == [5 + 4 + 1]  # the step's new tiles in one batch, each encoded once


def test_the_image_steers_the_tokens(tiny):
    llm = LLM(loaded=tiny[3], dtype="float32", kv_cache_memory=8 << 20)
    a, b = (_run(llm, [image_prompt(ONE, [image(s, (100, 130))])])[0].outputs[0].token_ids
            for s in (0, 3))  # fmt: skip
    assert a != b


def test_chunked_prefill_splits_tiles_across_steps(tiny, reference):
    """6-token steps: each tile's 16 placeholder rows arrive over three or four steps (each
    tile encoded once, its rows read in pieces), across attention chunks of 8."""
    llm = LLM(loaded=tiny[3], dtype="float32", max_num_batched_tokens=6, block_size=8,
              kv_cache_memory=8 << 20, max_num_seqs=3)  # fmt: skip
    calls = count_encodes(llm)
    out = _run(llm, [image_prompt(t, ims) for t, ims in _cases()])
    assert [o.outputs[0].token_ids for o in out] == reference[1]
    assert sum(calls) == 10 and max(calls) < 10


def test_prefix_cache_keys_blocks_by_the_tiles(tiny):
    """The same image after the same text hits the cache (no tile encoded again); another
    image shares only the text blocks before it; a hit that ends inside the image (the text
    after it differs) encodes only the tiles past the hit. Each reads as transformers'."""
    _, model, processor, loaded = tiny
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20, block_size=8,
              enable_prefix_caching=True)  # fmt: skip
    calls = count_encodes(llm)
    text = "User: a long enough prefix!!!!<|image|>Then?<|eot|>Assistant:"
    after = text.replace("Then?", "Now??")

    def run(prompt, im):
        out = _run(llm, [image_prompt(prompt, [im])])[0]
        want = hf_inputs(processor, prompt, [im])
        assert out.prompt_token_ids == want["input_ids"][0].tolist()
        assert out.outputs[0].token_ids == hf_generate(model, want, NEW)
        return out.num_cached_tokens, sum(calls)

    # the image's text is positions [30, 117) of 133: <|image_start|>, two rows of two tiles'
    # runs with their separators, <|image|>, the global tile's run [100, 116), <|image_end|>
    a, b = image(5, (100, 130)), image(6, (100, 130))
    assert run(text, a) == (0, 5)
    assert run(text, a) == (128, 5)  # every block but the last token's hits: no encode
    assert run(text, b) == (24, 10)  # "User: a long enough pref" (its tiles differ)
    # a hit inside the global tile's run: the tile read from the encoder cache, not encoded
    assert run(after, a) == (112, 10)


def test_max_patches_from_the_flag_and_a_request(tiny, tmp_path):
    """`--mm-processor-kwargs '{"max_patches": 1}'`: every image one tile (and `/tokenize`'s
    expansion is the processor's); a request's own kwargs over it (2 tiles: a row of 2 and
    the global tile). Each is transformers' at those settings."""
    path, model, _, _ = tiny
    llm = LLM(str(path), dtype="float32", kv_cache_memory=8 << 20,
              mm_processor_kwargs={"max_patches": 1})  # fmt: skip
    calls = count_encodes(llm)
    ims = [image(1, (150, 60)), image(2, (20, 25))]
    one = make_processor(max_patches=1)
    out = _run(llm, [image_prompt(TWO, ims)])[0]
    want = hf_inputs(one, TWO, ims)
    assert out.prompt_token_ids == want["input_ids"][0].tolist()
    assert out.outputs[0].token_ids == hf_generate(model, want, NEW)
    vision = llm.engine.model_config.vision
    ids = llm.get_tokenizer().encode(TWO, add_special_tokens=False)
    assert inputs.expand(ids, 2, vision)[0] == out.prompt_token_ids
    wide = image(4, (60, 150))
    out = _run(llm, [{**image_prompt(ONE, [wide]), "mm_processor_kwargs": {"max_patches": 2}}])[0]
    want = hf_inputs(make_processor(max_patches=2), ONE, [wide])
    assert out.outputs[0].token_ids == hf_generate(model, want, NEW)
    assert calls == [2, 3]


def test_images_are_counted_not_tiles_and_bad_input_is_refused(tiny):
    llm = LLM(loaded=tiny[3], dtype="float32", kv_cache_memory=8 << 20,
              limit_mm_per_prompt={"image": 1})  # fmt: skip
    assert (
        len(_run(llm, [image_prompt(ONE, [image(0, (100, 130))])])[0].outputs[0].token_ids) == NEW
    )
    with pytest.raises(ValueError, match="at most 1 image"):
        _run(llm, [image_prompt(TWO, [image(0), image(1)])])
    with pytest.raises(ValueError, match="1 image token"):
        _run(llm, [image_prompt(ONE, [image(0), image(1)])])
    with pytest.raises(ValueError, match="PIL"):
        _run(llm, [image_prompt(ONE, ["x.png"])])
    with pytest.raises(ValueError, match="max_patches must be a positive integer"):
        _run(llm, [{**image_prompt(ONE, [image(0)]), "mm_processor_kwargs": {"max_patches": 0}}])
    with pytest.raises(ValueError, match="depend on its size"):
        inputs.expand([1, IMAGE], 1, llm.engine.model_config.vision)
    assert not llm.engine.has_unfinished_requests()


def test_chat_renders_image_parts_as_the_processor_does(tiny):
    _, model, processor, loaded = tiny
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20)
    im = image(4, (100, 130))
    url = "data:image/png;base64," + base64.b64encode(png_bytes(im)).decode()
    ours = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": "Hi"}]}]  # fmt: skip
    theirs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]
    text = processor.apply_chat_template(theirs, add_generation_prompt=True)
    want = hf_inputs(processor, text, [im])
    (out,) = llm.chat(ours, GREEDY, use_tqdm=False)
    assert out.prompt == text and out.prompt_token_ids == want["input_ids"][0].tolist()
    assert out.outputs[0].token_ids == hf_generate(model, want, NEW)


def test_the_weights_estimate_counts_the_tower_adapter_and_projector(tiny):
    """`num_params` is transformers' count; `pagoda serve`'s estimate from the files is what
    the built model holds (within 1%: the tower's rotary table is not a weight)."""
    import torch
    from model_bytes import build, held_bytes
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.server import weights

    path, model, _, loaded = tiny
    vision = loaded.config.vision
    held = sum(p.numel() for p in model.vision_model.parameters())
    held += sum(p.numel() for p in model.multi_modal_projector.parameters())
    assert vision.num_params(64) == held and vision.tokens_per_image == TOKENS_PER_TILE
    cfg = EngineConfig.create(str(path), device="cpu", dtype="bfloat16")
    estimate = weights.estimate(loaded.config, cfg, path).bytes
    assert estimate == pytest.approx(held_bytes(build(path, torch.bfloat16)), rel=0.01)


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
