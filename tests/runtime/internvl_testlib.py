"""Tiny random-weight InternVL checkpoints written by transformers
(`InternVLForConditionalGeneration`): an InternViT tower over 32 px tiles of 4 px patches
(8 x 8 patches, pixel-shuffled by 0.5: 16 rows a tile), the MLP projector, and a 2-layer Qwen2
text model (a LayerNorm tower, as InternVL3-1B's to 14B's) or Qwen3 one (an RMSNorm tower with
q/k norms and a final LayerNorm, the larger towers' options); saved with transformers'
`InternVLProcessor`: the GotOcr2 image processor (tiles of 32 px, 1 to 4 tiles and a
thumbnail) and a byte-level BPE tokenizer whose `<img>`, `</img>`, `<IMG_CONTEXT>`, `<video>`
and `<|im_end|>` are added tokens, with a ChatML template that writes `<IMG_CONTEXT>` and a
newline for an image part (InternVL3-hf's). Imported by tests (not a conftest)."""

from __future__ import annotations

import re

import torch
from hf_oracle import TINY, randomize
from idefics3_testlib import (
    byte_tokenizer,
    count_encodes,
    hf_generate,
    image,
    image_part,
    image_prompt,
    logprob_ids,
)

__all__ = ["count_encodes", "hf_generate", "image", "image_part", "image_prompt", "logprob_ids"]

TILE, MAX_PATCHES = 32, 4
TOKENS_PER_TILE = 16
SPECIAL = ["<img>", "</img>", "<IMG_CONTEXT>", "<video>", "<|im_start|>", "<|im_end|>"]
START, END, CONTEXT = 257, 258, 259  # (after the 256 bytes and "\n\n")
TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "{{ '<IMG_CONTEXT>\n' }}{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
EXTRA = {"start_image_token": "<img>", "end_image_token": "</img>",
         "context_image_token": "<IMG_CONTEXT>", "video_token": "<video>"}  # fmt: skip
# text model_type -> the tower's options
TOWERS = {
    "qwen2": {"norm_type": "layer_norm", "use_qk_norm": False, "use_mean_pooling": True},
    "qwen3": {"norm_type": "rms_norm", "use_qk_norm": True, "use_mean_pooling": False,
              "attention_bias": True},
    "qwen3_moe": {"norm_type": "layer_norm", "use_qk_norm": False, "use_mean_pooling": True},
}  # fmt: skip


def _tokenizer():
    return byte_tokenizer(SPECIAL, "<|im_end|>", TEMPLATE, extra_special_tokens=EXTRA)


def image_processor(**kw):
    """transformers' PIL GotOcr2 image processor over the tiny tiles."""
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import (
        GotOcr2ImageProcessorPil,
    )

    kw = {"size": {"height": TILE, "width": TILE}, "max_patches": MAX_PATCHES,
          "crop_to_patches": False, "image_mean": [0.485, 0.456, 0.406],
          "image_std": [0.229, 0.224, 0.225], **kw}  # fmt: skip
    return GotOcr2ImageProcessorPil(**kw)


def make_processor(**kw):
    """transformers' `InternVLProcessor` over the tiny image processor and tokenizer, its
    `__init__`'s fields set by hand: that checks its video processor's class, which needs
    torchvision (absent here); `__call__` is the processor's own."""
    import transformers

    tokenizer = _tokenizer()
    processor = object.__new__(transformers.InternVLProcessor)
    processor.__dict__.update(
        image_processor=image_processor(**kw), tokenizer=tokenizer, video_processor=None,
        chat_template=TEMPLATE, image_seq_length=TOKENS_PER_TILE,
        start_image_token="<img>", end_image_token="</img>", image_token="<IMG_CONTEXT>",
        video_token="<video>", start_image_token_id=START, end_image_token_id=END,
        image_token_id=CONTEXT,
        multimodal_pattern=re.compile("(?P<image><IMG_CONTEXT>)|(?P<video><video>)"),
    )  # fmt: skip
    return processor


def make_tiny(path, text: str = "qwen2", **processor_kw):
    """The model (float32, eval) saved to `path` with its processor; (model, processor)."""
    import transformers

    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, image_size=TILE, patch_size=4, **TOWERS[text])  # fmt: skip
    cfg = {**TINY, "rope_theta": 10000.0, "model_type": text, "tie_word_embeddings": False}
    if text in ("qwen3", "qwen3_moe"):
        cfg["head_dim"] = 16
    if text == "qwen3_moe":
        cfg.update(
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True
        )
    config = transformers.InternVLConfig(vision_config=vision, text_config=cfg,
                                         image_token_id=CONTEXT,
                                         image_seq_length=TOKENS_PER_TILE,
                                         tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.InternVLForConditionalGeneration(config).eval()
    randomize(model.model.language_model, scale=4.0, seed=1)
    randomize(model.lm_head, scale=4.0, seed=1)
    randomize(model.model.vision_tower, scale=1.0, seed=2)
    randomize(model.model.multi_modal_projector, scale=4.0, seed=3)
    model.save_pretrained(path)
    processor = make_processor(**processor_kw)
    processor.image_processor.save_pretrained(path)
    processor.tokenizer.save_pretrained(path)
    return model, processor


def hf_inputs(processor, text: str, images: list, **kw) -> dict:
    """The processor's input_ids and pixels of `text` with `images`."""
    return processor(text=text, images=images or None, return_tensors="pt", **kw)
