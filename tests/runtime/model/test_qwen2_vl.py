"""Qwen2-VL and Qwen2.5-VL (`model/qwen2_vl.py`, `model/qwen2_vl_vision.py`,
`multimodal/qwen2_vl_inputs.py`, `worker/mrope_rows.py`): tiny random checkpoints written by
transformers (tests/runtime/qwen2_vl_testlib.py); the engine's greedy tokens are transformers'
`generate` for prompts with one image and two images of different sizes batched with a
text-only one, with chunked prefill splitting an image, and on a warm prefix cache."""

from __future__ import annotations

import pytest
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model.loader import load_model
from pagoda.runtime.multimodal.qwen2_vl_processing import (
    QwenImageProcessing,
    placeholders,
    smart_resize,
)
from qwen2_vl_testlib import (
    END,
    IMAGE_ID,
    PROCESSOR,
    START,
    cases,
    expanded,
    hf_generate,
    image,
    make_tiny_qwen2_vl,
)

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # two checkpoints written and run by transformers; nothing timed
NEW = 6
GREEDY = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
IMAGES = [image(0, (70, 90)), image(1, (130, 40)), image(2, (40, 40))]


def _cases():
    return cases(IMAGES)


def _runs(im, **processor) -> int:
    p = QwenImageProcessing(**{**PROCESSOR, **processor})
    h, w = smart_resize(im.height, im.width, p.factor, p.min_pixels, p.max_pixels)
    return placeholders((1, h // 8, w // 8), 2)


def _expanded(ids, ims, **processor) -> list[int]:
    it = iter(ims)
    return [t for i in ids
            for t in ([i] * _runs(next(it), **processor) if i == IMAGE_ID else [i])]  # fmt: skip


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    model = make_tiny_qwen2_vl(path, request.param)
    reference = [hf_generate(model, expanded(p["prompt_token_ids"], ims), ims, NEW)
                 for p, ims in _cases()]  # fmt: skip
    return path, load_model(str(path)), reference


def _run(llm: LLM, prompts) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


def test_one_and_two_images_batched_with_text_are_transformers(tiny):
    _, loaded, reference = tiny
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20)
    assert _run(llm, [p for p, _ in _cases()]) == reference


def test_chunked_prefill_splitting_an_image_and_a_prefix_hit_are_transformers(tiny):
    _, loaded, reference = tiny
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20, block_size=8,
              max_num_batched_tokens=16, max_num_seqs=4, enable_prefix_caching=True)  # fmt: skip
    prompts = [p for p, _ in _cases()]
    assert _run(llm, prompts) == reference
    assert _run(llm, prompts[:2]) == reference[:2]  # the same images again: cache hits


def test_two_ranks_read_the_images_and_m_rope_positions_rank_0_sends(tiny):
    """Tensor parallelism over gloo, two ranks, 8-token chunks (an image split across steps):
    rank 0 alone holds the tower; each step's image features and [3, T] M-RoPE positions are
    broadcast; transformers' tokens."""
    path, loaded, reference = tiny
    with LLM(str(path), loaded=loaded, tensor_parallel_size=2, dtype="float32",
             max_num_batched_tokens=8, max_num_seqs=3, block_size=8,
             kv_cache_memory=8 << 20) as two:  # fmt: skip
        assert _run(two, [p for p, _ in _cases()]) == reference
        assert two.engine.runner.model.tower is not None
        two.engine.check_integrity()


def test_mm_processor_kwargs_change_the_runs_and_give_transformers_tokens(tiny):
    """`mm_processor_kwargs` (the engine's, vLLM's --mm-processor-kwargs; a prompt's own over
    it): other min/max_pixels give each image another run, and the tokens are transformers'
    with the same kwargs given to its processor."""
    path, loaded, _ = tiny
    model = transformers.AutoModelForImageTextToText.from_pretrained(path).eval()
    small, large = {"max_pixels": 2048}, {"min_pixels": 8192, "max_pixels": 16384}
    (prompt, ims), (two, two_ims) = _cases()[:2]
    want = [hf_generate(model, _expanded(prompt["prompt_token_ids"], ims, **small), ims, NEW,
                        **small),
            hf_generate(model, _expanded(two["prompt_token_ids"], two_ims, **large), two_ims,
                        NEW, **large)]  # fmt: skip
    assert _runs(ims[0], **small) < _runs(ims[0]) < _runs(ims[0], **large)
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20, mm_processor_kwargs=small)
    out = llm.generate([prompt, {**two, "mm_processor_kwargs": large}], GREEDY, use_tqdm=False)
    assert [len(o.prompt_token_ids) for o in out] == [
        len(_expanded(prompt["prompt_token_ids"], ims, **small)),
        len(_expanded(two["prompt_token_ids"], two_ims, **large)),
    ]
    assert [o.outputs[0].token_ids for o in out] == want
    with pytest.raises(ValueError, match="mm_processor_kwargs: 'size' is not a setting"):
        llm.generate({**prompt, "mm_processor_kwargs": {"size": 1}}, GREEDY, use_tqdm=False)


def test_requests_holding_one_image_encode_it_once(tiny):
    """Two requests holding the same image, batched in 8-token chunks (the image's rows over
    several steps for each): the tower encodes it once (the encoder cache); transformers'
    tokens."""
    path, loaded, _ = tiny
    model = transformers.AutoModelForImageTextToText.from_pretrained(path).eval()
    im = IMAGES[0]
    prompts = [[1, 5, START, IMAGE_ID, END, 7, 8], [1, START, IMAGE_ID, END, 9]]
    want = [hf_generate(model, _expanded(p, [im]), [im], NEW) for p in prompts]
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20, block_size=8,
              max_num_batched_tokens=8, max_num_seqs=2)  # fmt: skip
    runner, calls = llm.engine.runner, []
    encode = runner.model.encode_image_list
    runner.model.encode_image_list = lambda px, grids: calls.append(len(px)) or encode(px, grids)
    batch = [{"prompt_token_ids": p, "multi_modal_data": {"image": im}} for p in prompts]
    assert _run(llm, batch) == want and calls == [1]
    assert (runner.encoder_cache.queries, runner.encoder_cache.hits) == (2, 1)
