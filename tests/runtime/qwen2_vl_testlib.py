"""Tiny random-weight Qwen2-VL and Qwen2.5-VL written by transformers (towers 32 wide, 8 px
patches merged 2x2; Qwen2.5-VL's windows 32 px with block 1 full; a 2-layer Qwen2 text model
of 300 tokens with M-RoPE sections (2, 3, 3)), saved with a Qwen2VLImageProcessor of 8 px
patches and 256 to 16384 pixels and a word-level tokenizer whose id 290 is `<|image_pad|>`
(293 `<|video_pad|>`).
Imported by tests (not a conftest)."""

from __future__ import annotations

import torch
from hf_oracle import TINY, randomize

IMAGE_ID = 290
START, END = 291, 292  # <|vision_start|>, <|vision_end|>
VIDEO_ID = 293  # <|video_pad|>
PROCESSOR = {"min_pixels": 256, "max_pixels": 16384, "patch_size": 8}
# Qwen2-VL's template's shape in the vocabulary's words: an image part renders
# <|vision_start|><|image_pad|><|vision_end|>, a video part <|vision_start|><|video_pad|><|vision_end|>
TEMPLATE = (
    "{% for message in messages %}{{ 'w3 ' }}{% if message['content'] is string %}"
    "{{ message['content'] + ' ' }}{% else %}{% for c in message['content'] %}"
    "{% if c['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|> ' }}"
    "{% elif c['type'] == 'video' %}{{ '<|vision_start|><|video_pad|><|vision_end|> ' }}"
    "{% else %}{{ c['text'] + ' ' }}{% endif %}{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'w5' }}{% endif %}"
)


def make_tiny_qwen2_vl(path, kind: str = "qwen2_vl"):
    """The model (float32, eval) saved to `path` with its image processor and a tokenizer;
    returns the model."""
    import transformers

    text = {**TINY, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                        "mrope_section": [2, 3, 3]}}  # fmt: skip
    ids = dict(image_token_id=IMAGE_ID, vision_start_token_id=START, vision_end_token_id=END,
               video_token_id=VIDEO_ID, tie_word_embeddings=False)  # fmt: skip
    if kind == "qwen2_vl":
        vision = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=8)
        config = transformers.Qwen2VLConfig(text_config=text, vision_config=vision, **ids)
        cls = transformers.Qwen2VLForConditionalGeneration
    else:
        vision = dict(depth=3, hidden_size=32, intermediate_size=48, out_hidden_size=64,
                      num_heads=2, patch_size=8, window_size=32, fullatt_block_indexes=[1])  # fmt: skip
        config = transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision, **ids)
        cls = transformers.Qwen2_5_VLForConditionalGeneration
    model = random_model(cls, config)
    save_all(model, path, PROCESSOR)
    return model


def random_model(cls, config):
    """`cls(config)` (eval) with its text side's matrices scaled 4x, its tower's noised."""
    torch.manual_seed(0)
    model = cls(config).eval()
    randomize(model.model.language_model, scale=4.0, seed=1)
    randomize(model.lm_head, scale=4.0, seed=1)
    randomize(model.model.visual, scale=1.0, seed=2)
    return model


def save_all(model, path, processor: dict) -> None:
    """The model, a Qwen2VLImageProcessor of `processor`'s fields and the tokenizer."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    model.save_pretrained(path)
    Qwen2VLImageProcessorPil(**processor).save_pretrained(path)
    save_tokenizer(path)


def save_tokenizer(path) -> None:
    """A word-level tokenizer (w0..w299, the vision specials) with `TEMPLATE`, to `path`."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    special = {"<|image_pad|>": IMAGE_ID, "<|vision_start|>": START, "<|vision_end|>": END,
               "<|video_pad|>": VIDEO_ID}  # fmt: skip
    vocab = {f"w{i}": i for i in range(TINY["vocab_size"]) if i not in special.values()}
    tok = Tokenizer(models.WordLevel(vocab | special, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(list(special))
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="w1",
        eos_token="w2",
        unk_token="w0",
        chat_template=TEMPLATE,
    ).save_pretrained(path)


def image(seed: int, size: tuple[int, int]):
    """A random RGB PIL image of `size` (height, width)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8))


def cases(images: list) -> list[tuple[dict, list]]:
    """(engine prompt, its images): one image, two of `images[1:]`, and a text-only prompt."""
    one = [1, 5, START, IMAGE_ID, END, 7, 8]
    two = [1, START, IMAGE_ID, END, 6, 9, START, IMAGE_ID, END, 11]
    text = [1, 12, 13, 14]
    return [
        ({"prompt_token_ids": one, "multi_modal_data": {"image": images[0]}}, images[:1]),
        ({"prompt_token_ids": two, "multi_modal_data": {"image": images[1:]}}, images[1:]),
        ({"prompt_token_ids": text}, []),
    ]


def expanded(ids: list[int], images: list, processor=PROCESSOR) -> list[int]:
    """`ids` with each image token repeated to its image's run (transformers' prompt)."""
    from pagoda.runtime.multimodal.qwen2_vl_processing import (
        QwenImageProcessing,
        placeholders,
        smart_resize,
    )

    p = QwenImageProcessing.from_json(processor)
    it = iter(images)

    def runs(im) -> int:
        h, w = smart_resize(im.height, im.width, p.factor, p.min_pixels, p.max_pixels)
        return placeholders((1, h // p.patch_size, w // p.patch_size), p.merge_size)

    return [t for i in ids for t in ([i] * runs(next(it)) if i == IMAGE_ID else [i])]


def hf_generate(model, ids: list[int], images: list, n: int, processor=PROCESSOR,
                **overrides) -> list[int]:  # fmt: skip
    """transformers' greedy tokens after the expanded prompt `ids` with `images` (the image
    processor's settings: `processor`, `overrides` over them)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    t = torch.tensor([ids])
    kwargs = {}
    if images:
        out = Qwen2VLImageProcessorPil(**{**processor, **overrides})(images, return_tensors="pt")
        kwargs = {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"],
                  "mm_token_type_ids": (t == IMAGE_ID).int()}  # fmt: skip
    with torch.no_grad():
        out = model.generate(input_ids=t, attention_mask=torch.ones_like(t), max_new_tokens=n,
                             do_sample=False, **kwargs)  # fmt: skip
    return out[0, len(ids) :].tolist()
