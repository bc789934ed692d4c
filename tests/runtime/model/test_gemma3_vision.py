"""Gemma 3 with images (`model/gemma3_mm.py`, `model/siglip_vision.py`,
`multimodal/gemma3.py`): a tiny random Gemma3ForConditionalGeneration written by transformers
with its processor (tests/runtime/gemma3_vision_testlib.py); the engine's greedy tokens are
transformers' `generate` (its token_type_ids mask: an image's tokens attend both ways) for one
and two images batched with a text-only prompt, with prefill chunks that end before an image
rather than inside it, on a prefix-cache hit over the image, for a chat whose ids are the
processor's (its newlines merged around <start_of_image>), and on the Triton backend (its
prefill kernel's image spans, under TRITON_INTERPRET=1 here)."""

from __future__ import annotations

import base64
import os

import pytest
import torch
from gemma3_vision_testlib import (
    BOI,
    IMAGE_ID,
    TOKENS_PER_IMAGE,
    expanded,
    hf_generate,
    make_tiny_gemma3,
)
from llava_testlib import image, png_bytes
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.attention import get_attention_backend
from pagoda.runtime.model.loader import load_model
from pagoda.runtime.multimodal.inputs import MultiModalInputs, whole_images

transformers = pytest.importorskip("transformers")
NEW = 6
GREEDY = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
PREFIX = [1] + [10 + i for i in range(14)]  # 15 text tokens, then "\n\n<boi>": image at 17


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma3v")
    model, processor = make_tiny_gemma3(path)
    return path, model, processor, load_model(str(path))


def _cases():
    """(prompt dict, the images) of three requests: one image, two images, text only; the
    sliding-window layer's 12 keys reach past the images' rows."""
    one = [1, 5, BOI, 7, 8, *range(20, 30)]
    two = [1, BOI, 6, 9, BOI, 11, 12, 13, 14]
    text = [1, 12, 13, 14]
    ims = [image(0), image(1, (64, 30)), image(2, (30, 30))]
    return [
        ({"prompt_token_ids": one, "multi_modal_data": {"image": ims[0]}}, ims[:1]),
        ({"prompt_token_ids": two, "multi_modal_data": {"image": ims[1:]}}, ims[1:]),
        ({"prompt_token_ids": text}, []),
    ]


@pytest.fixture(scope="module")
def reference(tiny):
    _, model, processor, _ = tiny
    return [hf_generate(model, processor, expanded(p["prompt_token_ids"]), ims, NEW)
            for p, ims in _cases()]  # fmt: skip


def _run(llm: LLM, prompts) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


def test_the_bidirectional_mask_matters(tiny, reference):
    """transformers' tokens without the token_type_ids mask (causal images) differ: the
    oracle tells a causal image apart."""
    _, model, processor, _ = tiny
    p, ims = _cases()[0]
    ids = expanded(p["prompt_token_ids"])
    pixels = processor.image_processor(ims, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([ids]), pixel_values=pixels,
                             max_new_tokens=NEW, do_sample=False)  # fmt: skip
    assert out[0, len(ids) :].tolist() != reference[0]


def test_one_and_two_images_batched_with_text_are_transformers(tiny, reference):
    llm = LLM(loaded=tiny[3], dtype="float32", kv_cache_memory=8 << 20)
    out = llm.generate([p for p, _ in _cases()], GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in out] == reference
    assert out[1].prompt_token_ids == expanded(_cases()[1][0]["prompt_token_ids"])


def test_prefill_chunks_end_before_an_image(tiny, reference):
    """10-token steps: a chunk that would end inside an image's 9 rows ends before it, and
    the next takes the image whole (the scheduler's rule; each step's chunks are recorded)."""
    llm = LLM(loaded=tiny[3], dtype="float32", max_num_batched_tokens=10, block_size=8,
              kv_cache_memory=8 << 20, max_num_seqs=3)  # fmt: skip
    sched, chunks = llm.engine.scheduler, []
    schedule = sched.schedule

    def recording():
        out = schedule()
        chunks.extend((s.request, s.request.num_computed_tokens, s.num_new_tokens)
                      for s in out.scheduled)  # fmt: skip
        return out

    sched.schedule = recording
    assert _run(llm, [p for p, _ in _cases()]) == reference
    split = [(st, n) for r, st, n in chunks if r.params.multi_modal is not None
             for im in r.params.multi_modal.images if im.offset < st + n < im.end]  # fmt: skip
    assert not split and any(n < 10 for _, _, n in chunks[:6])


def test_whole_images_rule():
    from pagoda.runtime.multimodal.inputs import ImageInput

    im = ImageInput(None, 10, 9, b"")
    mm = MultiModalInputs((im,), bidirectional=True)
    assert whole_images(mm, 0, 15, 15) == 10  # ends before the image
    assert whole_images(mm, 10, 5, 10) == 9  # takes it whole within the budget
    assert whole_images(mm, 12, 3, 5) == 0  # the rest (7) does not fit: not this step
    assert whole_images(mm, 0, 25, 25) == 25
    assert whole_images(MultiModalInputs((im,)), 0, 15, 15) == 15  # (LLaVA's: split freely)


def test_prefix_cache_hit_over_the_image(tiny):
    """The same image after the same prefix hits the cache over the image's blocks; another
    image does not share them; each reads as transformers'."""
    _, model, processor, loaded = tiny
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20, block_size=8,
              enable_prefix_caching=True)  # fmt: skip
    ids = [*PREFIX, BOI, 40, 41, 42, 43, 44, 45]
    a, b = image(5), image(6)

    def run(im):
        out = llm.generate({"prompt_token_ids": ids, "multi_modal_data": {"image": im}},
                           GREEDY, use_tqdm=False)[0]  # fmt: skip
        assert out.outputs[0].token_ids == hf_generate(model, processor, expanded(ids), [im], NEW)
        return out.num_cached_tokens

    assert run(a) == 0
    assert run(a) == 32  # (the image at [17, 26): blocks of 8 up to 32 of 33)
    assert run(b) == 16  # the text blocks only


def test_chat_ids_are_the_processors(tiny):
    """llm.chat with an image_url part: the processor's ids ("\\n" + "\\n\\n" merged into
    "\\n\\n\\n" before <start_of_image>) and transformers' tokens."""
    _, model, processor, loaded = tiny
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20)
    url = "data:image/png;base64," + base64.b64encode(png_bytes(image(4))).decode()
    ours = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": "w7"}]}]  # fmt: skip
    theirs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "w7"}]}]
    text = processor.apply_chat_template(theirs, add_generation_prompt=True)
    ids = list(processor(text=text, images=[image(4)])["input_ids"][0])
    assert 292 in ids  # (the merged newlines)
    (out,) = llm.chat(ours, GREEDY, use_tqdm=False)
    assert out.prompt_token_ids == ids
    assert out.outputs[0].token_ids == hf_generate(model, processor, ids, [image(4)], NEW)


def test_refusals(tiny):
    llm = LLM(loaded=tiny[3], dtype="float32", kv_cache_memory=8 << 20,
              max_num_batched_tokens=8, max_num_seqs=4)  # fmt: skip
    p = {"prompt_token_ids": [1, BOI, 7], "multi_modal_data": {"image": image(0)}}
    with pytest.raises(ValueError, match="one prefill chunk"):
        llm.generate(p, GREEDY, use_tqdm=False)
    assert TOKENS_PER_IMAGE == 9 and IMAGE_ID == 297


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="CPU runs of Triton kernels need TRITON_INTERPRET=1")  # fmt: skip
@pytest.mark.parametrize("invariant", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["fast", "invariant"])  # fmt: skip
def test_triton_backend_is_transformers(tiny, reference, invariant):
    """`--attention-backend triton`: the image rows' spans in the prefill kernel (the window
    layer's too), 10-token chunks on cached context beside the other requests' decodes,
    batch-invariant or not (SDPA then gives way to the prefill kernel): transformers' tokens."""
    pytest.importorskip("triton")
    llm = LLM(loaded=tiny[3], attention_backend="triton", dtype="float32", block_size=8,
              max_num_batched_tokens=10, max_num_seqs=3, kv_cache_memory=8 << 20,
              batch_invariant=invariant)  # fmt: skip
    backends = llm.engine.runner.model.attention_backends
    assert {b.name for b in backends} == {"triton"} and all(b.image_spans for b in backends)
    assert _run(llm, [p for p, _ in _cases()]) == reference


def test_auto_keeps_triton_for_image_spans():
    """On a GPU `auto` picks Triton for a model with image spans, as for any other."""
    pytest.importorskip("triton")
    be = get_attention_backend("auto", torch.device("cuda"), 4, 2, 16, 0.25, image_spans=True)
    assert be.name == "triton" and be.image_spans


def test_text_only_serving_keeps_the_fast_attention_path(tiny, reference):
    """`limit_mm_per_prompt={"image": 0}`: no image spans, so the torch backend keeps its CPU
    kernel (a GPU's Triton kernels run without spans either way); text answers as before,
    images are refused."""
    llm = LLM(loaded=tiny[3], dtype="float32", kv_cache_memory=8 << 20,
              limit_mm_per_prompt={"image": 0})  # fmt: skip
    assert not any(b.image_spans for b in llm.engine.runner.model.attention_backends)
    assert _run(llm, [_cases()[2][0]]) == reference[2:]
    with pytest.raises(ValueError, match="at most 0 image"):
        llm.generate(_cases()[0][0], GREEDY, use_tqdm=False)


def test_gemma_3_4b_its_published_config(tmp_path):
    """google/gemma-3-4b-it's config.json and processor shape: 256 rows an image (a 64x64
    grid pooled by 4), 896 px bilinear, "\\n\\n" from tokenizer.json; pan-and-scan refused."""
    import json

    from pagoda.runtime.model.loader import read_model_config

    vision = {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
              "model_type": "siglip_vision_model", "num_attention_heads": 16,
              "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": False}  # fmt: skip
    text = {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
            "num_hidden_layers": 34, "sliding_window": 1024, "rope_scaling":
            {"factor": 8.0, "rope_type": "linear"}}  # fmt: skip
    top = {"architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
           "eoi_token_index": 256000, "image_token_index": 262144, "mm_tokens_per_image": 256,
           "model_type": "gemma3", "text_config": text, "vision_config": vision}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(top))
    vocab = {"\n": 107, "\n\n": 108, "\n\n\n": 109}
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}}))
    pre = {"image_processor_type": "Gemma3ImageProcessor", "size": {"height": 896, "width": 896},
           "do_pan_and_scan": None, "resample": 2, "image_mean": [0.5] * 3}  # fmt: skip
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(pre))
    v = read_model_config(str(tmp_path)).vision
    assert (v.tokens_per_image, v.image_size // v.patch_size, v.layers_run) == (256, 64, 27)
    assert (v.prefix, v.suffix, v.marker) == ((108, 255999), (256000, 108), 255999)
    assert v.processing.crop == (896, 896) and v.processing.exact_resize and v.bidirectional
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({**pre, "do_pan_and_scan": True}))
    with pytest.raises(ValueError, match="do_pan_and_scan true is not supported"):
        read_model_config(str(tmp_path))


@pytest.mark.slow
def test_two_ranks_read_the_images_rank_0_encodes(tiny, reference):
    """Tensor parallelism over gloo, two ranks, 10-token chunks: rank 0 alone holds the tower;
    every rank masks the images' spans from the step's image rows; transformers' tokens."""
    path, _, _, loaded = tiny
    with LLM(str(path), loaded=loaded, tensor_parallel_size=2, dtype="float32",
             max_num_batched_tokens=10, max_num_seqs=3, block_size=8,
             kv_cache_memory=8 << 20) as two:  # fmt: skip
        assert _run(two, [p for p, _ in _cases()]) == reference
        assert two.engine.runner.model.tower is not None


def test_image_spans_split_at_a_sequence_start():
    """Two sequences' image rows that touch in the step (one chunk ends with an image, the next
    sequence's starts with one) are two spans, each bounded by its own positions."""
    import numpy as np
    from pagoda.runtime.worker.mm_encoder import spans

    positions = np.array([0, 1, 2, 10, 11, 12, 20, 21])
    _, lo, hi = spans(np.arange(3, 8), positions, np.array([0, 6, 8]))
    assert lo.tolist() == [10, 10, 10, 20, 20] and hi.tolist() == [12, 12, 12, 21, 21]


def test_preprocessing_equals_gemma3_image_processor(tiny):
    """Resize to 48x48 (bilinear), rescale, normalize 0.5 / 0.5: transformers' pixels."""
    import numpy as np
    from pagoda.runtime.multimodal.image_processing import preprocess

    _, _, processor, loaded = tiny
    for im in (image(7, (64, 30)), image(8, (20, 90))):
        want = processor.image_processor([im], return_tensors="np")["pixel_values"][0]
        np.testing.assert_allclose(preprocess(im, loaded.config.vision.processing), want,
                                   atol=1e-6)  # fmt: skip
