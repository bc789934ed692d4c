"""Mistral 3 and LLaVA-Pixtral (`model/pixtral.py`, `model/pixtral_vision.py`,
`multimodal/pixtral_inputs.py`): tiny random checkpoints written by transformers
(tests/runtime/pixtral_testlib.py); the engine's greedy tokens are transformers' `generate` for
prompts with one image and two images of other sizes batched with a text-only one (the three
images encoded in one batch, the expanded ids PixtralProcessor's), with chunked prefill splitting
an image's run, on a warm prefix cache, and for a chat with an image part."""

from __future__ import annotations

import base64
import io

import pytest
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model.loader import load_model
from pixtral_testlib import (
    IMAGE_ID,
    hf_generate,
    image,
    make_tiny_pixtral,
    pixtral_processor,
    tokenizer,
)

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # two checkpoints written and run by transformers; nothing timed
NEW = 6
GREEDY = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
# landscape, portrait (larger than the longest edge: scaled down), small (rounded up)
IMAGES = [image(0, (50, 70)), image(1, (90, 30)), image(2, (9, 20))]
# text before the image: past a block of 8 (no word the tokenizer's w0, w1, w2 would split)
PREFIX = [1] + [40 + i for i in range(12)]


def _cases():
    """(prompt dict, its images, the same prompt as text for PixtralProcessor)."""
    return [
        ({"prompt_token_ids": [1, 5, IMAGE_ID, 7, 8], "multi_modal_data": {"image": IMAGES[0]}},
         IMAGES[:1], "w1 w5 [IMG] w7 w8"),
        ({"prompt_token_ids": [1, IMAGE_ID, 6, 9, IMAGE_ID, 51],
          "multi_modal_data": {"image": IMAGES[1:]}}, IMAGES[1:], "w1 [IMG] w6 w9 [IMG] w51"),
        ({"prompt_token_ids": [1, 12, 13, 14]}, [], None),
    ]  # fmt: skip


@pytest.fixture(scope="module", params=["mistral3", "llava"])
def tiny(request, tmp_path_factory):
    kind = request.param
    path = tmp_path_factory.mktemp(kind)
    model = make_tiny_pixtral(path, kind)
    proc = pixtral_processor(kind, tokenizer())
    expanded = [p["prompt_token_ids"] if text is None else
                proc(text=text, images=ims, return_tensors="pt")["input_ids"][0].tolist()
                for p, ims, text in _cases()]  # fmt: skip
    reference = [hf_generate(model, kind, ids, ims, NEW)
                 for ids, (_, ims, _) in zip(expanded, _cases())]  # fmt: skip
    return kind, model, load_model(str(path)), expanded, reference


def _count_encodes(llm: LLM) -> list[int]:
    """The images each `encode_image_list` call of `llm`'s model encodes, appended as it runs."""
    model, calls = llm.engine.runner.model, []
    encode = model.encode_image_list
    model.encode_image_list = lambda px, grids: calls.append(len(px)) or encode(px, grids)
    return calls


def test_one_and_two_images_batched_with_text_are_transformers(tiny):
    kind, _, loaded, expanded, reference = tiny
    assert loaded.config.architecture == {"mistral3": "mistral3", "llava": "llava"}[kind]
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20)
    calls = _count_encodes(llm)
    out = llm.generate([p for p, _, _ in _cases()], GREEDY, use_tqdm=False)
    assert [o.prompt_token_ids for o in out] == expanded  # PixtralProcessor's input_ids
    assert [o.outputs[0].token_ids for o in out] == reference
    assert calls == [3]  # the step's three images, of three sizes, in one batch


def test_chunked_prefill_splitting_an_image_and_a_prefix_hit_are_transformers(tiny):
    _, _, loaded, _, reference = tiny
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20, block_size=8,
              max_num_batched_tokens=8, max_num_seqs=4, enable_prefix_caching=True)  # fmt: skip
    calls = _count_encodes(llm)
    prompts = [p for p, _, _ in _cases()]
    assert [
        o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)
    ] == reference
    assert sum(calls) == 3  # each image once, its run read over several steps
    again = llm.generate(prompts[:1], GREEDY, use_tqdm=False)[0]  # the same image: a cache hit
    assert again.outputs[0].token_ids == reference[0] and again.num_cached_tokens >= 8


def test_a_prefix_hit_ends_inside_the_image_and_another_image_shares_no_blocks(tiny):
    kind, model, loaded, _, _ = tiny
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20, block_size=8,
              enable_prefix_caching=True)  # fmt: skip
    proc = pixtral_processor(kind, tokenizer())
    words = " ".join(f"w{t}" for t in PREFIX)

    def run(tail, im):
        prompt = {"prompt_token_ids": [*PREFIX, IMAGE_ID, *tail], "multi_modal_data": {"image": im}}
        out = llm.generate(prompt, GREEDY, use_tqdm=False)[0]
        text = words + " [IMG] " + " ".join(f"w{t}" for t in tail)
        ids = proc(text=text, images=[im], return_tensors="pt")["input_ids"][0].tolist()
        assert out.prompt_token_ids == ids
        assert out.outputs[0].token_ids == hf_generate(model, kind, ids, [im], NEW)
        return out.num_cached_tokens

    a, b = image(5, (40, 40)), image(6, (40, 40))
    assert run([60, 61], a) == 0
    assert run([70, 61], a) > len(PREFIX)  # the image's blocks hit, up to the text after it
    assert run([60, 61], b) == 8  # the same runs, another image: the text block only


def test_chat_renders_an_image_part_as_the_template_and_processor_do(tiny):
    kind, model, loaded, _, _ = tiny
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20)
    out = io.BytesIO()
    IMAGES[0].save(out, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()
    parts = [{"type": "text", "text": "w7"}, {"type": "image_url", "image_url": {"url": url}}]
    (got,) = llm.chat([{"role": "user", "content": parts}], GREEDY, use_tqdm=False)
    ids = pixtral_processor(kind, tokenizer())(text="w3 w7 [IMG] w5", images=IMAGES[:1],
                                               return_tensors="pt")["input_ids"][0].tolist()  # fmt: skip
    assert got.prompt_token_ids == ids
    assert got.outputs[0].token_ids == hf_generate(model, kind, ids, IMAGES[:1], NEW)


def test_the_weights_estimate_counts_what_the_tower_and_projector_hold(tiny):
    _, model, loaded, _, _ = tiny
    vision = loaded.config.vision
    unread = f"layers.{vision.layers_run}."
    tower = sum(
        p.numel() for n, p in model.model.vision_tower.named_parameters() if unread not in n
    )
    projector = sum(p.numel() for p in model.model.multi_modal_projector.parameters())
    assert vision.num_params(64) == tower + projector


def test_two_ranks_read_the_images_rank_0_encodes(tiny):
    """Tensor parallelism over gloo, two ranks, 8-token chunks (runs split across steps): rank 0
    alone holds the tower; each step's image rows and features are broadcast; transformers'
    tokens."""
    _, _, loaded, _, reference = tiny
    with LLM(loaded.path, loaded=loaded, tensor_parallel_size=2, dtype="float32",
             max_num_batched_tokens=8, max_num_seqs=3, block_size=8,
             kv_cache_memory=8 << 20) as two:  # fmt: skip
        out = two.generate([p for p, _, _ in _cases()], GREEDY, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in out] == reference
        assert two.engine.runner.model.tower is not None
        two.engine.check_integrity()
