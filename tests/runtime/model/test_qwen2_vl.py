"""Qwen2-VL and Qwen2.5-VL (`model/qwen2_vl.py`, `model/qwen2_vl_vision.py`,
`multimodal/qwen2_vl_inputs.py`, `worker/mrope_rows.py`): tiny random checkpoints written by
transformers (tests/runtime/qwen2_vl_testlib.py); the engine's greedy tokens are transformers'
`generate` for prompts with one image and two images of different sizes batched with a
text-only one, with chunked prefill splitting an image, and on a warm prefix cache."""

from __future__ import annotations

import pytest
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model.loader import load_model
from qwen2_vl_testlib import cases, expanded, hf_generate, image, make_tiny_qwen2_vl

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # two checkpoints written and run by transformers; nothing timed
NEW = 6
GREEDY = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
IMAGES = [image(0, (70, 90)), image(1, (130, 40)), image(2, (40, 40))]


def _cases():
    return cases(IMAGES)


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
