"""Video input of Qwen2-VL and Qwen2.5-VL (`multimodal/qwen2_vl_video.py`, the video runs of
`multimodal/qwen2_vl_inputs.py`): tiny random checkpoints written by transformers
(tests/runtime/qwen2_vl_testlib.py); the engine's greedy tokens are transformers' `generate`
with `pixel_values_videos` and `video_grid_thw` for a prompt holding a short video beside an
image, batched with an image-only and a text-only prompt, with chunked prefill splitting the
video, on a warm prefix cache, and (Qwen2.5-VL) with the video's temporal positions spaced by
its frame rate."""

from __future__ import annotations

import pytest
import torch
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model.loader import load_model
from pagoda.runtime.multimodal.inputs import from_data
from pagoda.runtime.multimodal.qwen2_vl_processing import QwenImageProcessing, placeholders
from pagoda.runtime.multimodal.qwen2_vl_video import preprocess_video
from PIL import Image
from qwen2_vl_testlib import END, IMAGE_ID, PROCESSOR, START, expanded, image, make_tiny_qwen2_vl
from qwen2_vl_video_testlib import VIDEO_ID, frames, hf_generate_mm, hf_video

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # two checkpoints written and run by transformers; nothing timed
NEW = 6
GREEDY = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
IMAGE = image(0, (40, 56))
VIDEO = frames(1, 5, (20, 36))  # 5 frames: 3 temporal patches, the last frame repeated
MIXED = [1, 5, START, VIDEO_ID, END, 7, START, IMAGE_ID, END, 8]
ONE_IMAGE = [1, START, IMAGE_ID, END, 9, 10]
TEXT = [1, 12, 13, 14]


def _video_expanded(ids: list[int], video) -> list[int]:
    grid = preprocess_video(video, QwenImageProcessing.from_json(PROCESSOR)).grid
    run = placeholders(grid, 2)
    return [t for i in ids for t in ([i] * run if i == VIDEO_ID else [i])]


def _prompts(video=VIDEO) -> list[dict]:
    return [
        {"prompt_token_ids": MIXED, "multi_modal_data": {"image": IMAGE, "video": video}},
        {"prompt_token_ids": ONE_IMAGE, "multi_modal_data": {"image": [IMAGE]}},
        {"prompt_token_ids": TEXT},
    ]


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    model = make_tiny_qwen2_vl(path, request.param)
    mixed = expanded(_video_expanded(MIXED, VIDEO), [IMAGE])
    reference = [
        hf_generate_mm(model, mixed, [IMAGE], [VIDEO], NEW),
        hf_generate_mm(model, expanded(ONE_IMAGE, [IMAGE]), [IMAGE], [], NEW),
        hf_generate_mm(model, TEXT, [], [], NEW),
    ]
    return request.param, model, load_model(str(path)), reference


def _run(llm: LLM, prompts) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


def test_a_video_beside_an_image_batched_with_an_image_and_text_is_transformers(tiny):
    _, _, loaded, reference = tiny
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20)
    assert _run(llm, _prompts()) == reference
    pil = [Image.fromarray(f) for f in VIDEO]  # a list of PIL frames
    assert _run(llm, _prompts(pil)[:1]) == reference[:1]


def test_chunked_prefill_splitting_a_video_and_a_prefix_hit_are_transformers(tiny):
    _, _, loaded, reference = tiny
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20, block_size=8,
              max_num_batched_tokens=8, max_num_seqs=4, enable_prefix_caching=True)  # fmt: skip
    assert _run(llm, _prompts()) == reference
    assert _run(llm, _prompts()[:1]) == reference[:1]  # the same video again: cache hits


def test_a_videos_frame_rate_spaces_its_temporal_positions(tiny):
    """(frames, {"fps": 0.5}): Qwen2.5-VL's temporal positions 4 tokens/s x 4 s apart, the
    M-RoPE positions and tokens transformers' `second_per_grid_ts` of 4 gives (Qwen2-VL's: 1
    apart whatever the rate)."""
    kind, model, loaded, _ = tiny
    mixed = expanded(_video_expanded(MIXED, VIDEO), [IMAGE])
    spacing = [4.0] if kind == "qwen2_5_vl" else None  # (Qwen2-VL's generate takes none)
    want = hf_generate_mm(model, mixed, [IMAGE], [VIDEO], NEW, seconds_per_grid=spacing)
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20)
    assert _run(llm, _prompts((VIDEO, {"fps": 0.5}))[:1]) == [want]
    ids, mm = from_data(
        MIXED, {"image": IMAGE, "video": (VIDEO, {"fps": 0.5})}, loaded.config.vision
    )
    t = torch.tensor([ids])
    _, grid = hf_video(VIDEO)
    extra = {"second_per_grid_ts": torch.tensor(spacing)} if spacing else {}
    pos, delta = model.model.get_rope_index(
        t, (t == IMAGE_ID).int() + 2 * (t == VIDEO_ID).int(), image_grid_thw=_image_grid(),
        video_grid_thw=torch.tensor([grid]), **extra)  # fmt: skip
    assert ids == mixed and (mm.mrope == pos[:, 0].numpy()).all() and mm.mrope_delta == delta
    if kind == "qwen2_5_vl":  # the spacing moves the positions: the check can fail
        assert mm.mrope[0].max() > from_data(MIXED, {"image": IMAGE, "video": VIDEO},
                                             loaded.config.vision)[1].mrope[0].max()  # fmt: skip


def _image_grid():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    return Qwen2VLImageProcessorPil(**PROCESSOR)([IMAGE], return_tensors="pt")["image_grid_thw"]


def test_a_prompt_over_the_video_limit_is_refused(tiny):
    _, _, loaded, _ = tiny
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20,
              limit_mm_per_prompt={"image": 2, "video": 0})  # fmt: skip
    with pytest.raises(ValueError, match=r"at most 0 video\(s\) per prompt"):
        llm.generate(_prompts()[0], GREEDY, use_tqdm=False)


def test_llm_chat_reads_a_video_url_as_the_server_does(tiny):
    """`LLM.chat` with an mp4 (10 frames at 10 a second, PyAV-encoded) as a base64 video_url,
    sampled to `media_io_kwargs`' 4 frames: 0, 3, 6 and 9 at 4 a second (Qwen2.5-VL's temporal
    patches 0.5 s apart)."""
    import base64

    from qwen2_vl_video_testlib import decoded, encode

    kind, model, loaded, _ = tiny
    mp4 = encode(frames(3, 10, (32, 48)))
    seen = decoded(mp4)[[0, 3, 6, 9]]
    url = "data:video/mp4;base64," + base64.b64encode(mp4).decode()
    ids = [3, START] + [VIDEO_ID] * 12 + [END, 7, 8, 5]  # 2 temporal patches of 2 x 3 merged
    spacing = [0.5] if kind == "qwen2_5_vl" else None
    want = hf_generate_mm(model, ids, [], [seen], NEW, seconds_per_grid=spacing)
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20,
              media_io_kwargs={"video": {"num_frames": 4}})  # fmt: skip
    parts = [{"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": "w7 w8"}]
    out = llm.chat([{"role": "user", "content": parts}], GREEDY, use_tqdm=False)[0]
    assert out.prompt_token_ids == ids and out.outputs[0].token_ids == want
