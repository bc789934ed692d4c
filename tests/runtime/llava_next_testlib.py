"""Tiny random-weight LLaVA-NeXT and LLaVA-OneVision written by transformers, saved with their
processors. LLaVA-NeXT: a CLIP tower of 30 px crops, 10 px patches (9 rows a crop), pinpoints
30x60 .. 90x30, a 2-layer Llama (or Mistral) of 300 tokens. OneVision: a SigLIP tower of 28 px
crops, 7 px patches (16 rows a crop) read at its last layer, pinpoints 28 .. 84 px with
`anyres_max_2` (a grid past two crops' worth is downsampled), a 2-layer Qwen2. Both: a
word-level tokenizer whose id 299 is `<image>` and a chat template over content parts.
Imported by tests (not a conftest)."""

from __future__ import annotations

import torch
from hf_oracle import TINY, randomize
from llava_testlib import TEMPLATE

IMAGE_ID = 299
NEXT_PINPOINTS = [[30, 60], [60, 30], [60, 60], [90, 30], [30, 90]]
OV_PINPOINTS = [[28, 28], [28, 56], [56, 28], [56, 56], [28, 84], [84, 28], [84, 84]]


def _tokenizer():
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(TINY["vocab_size"] - 1)} | {"<image>": IMAGE_ID}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<image>"])
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="w1", eos_token="w2", unk_token="w0"
    )


def _finish(model, tower, path):
    """`model` with its text model's and projector's matrices x4 and the tower's norms and
    biases noised (greedy picks apart, the images steer them; a bias read wrongly changes the
    tokens), saved to `path`."""
    randomize(model.model.language_model, scale=4.0, seed=1)
    randomize(model.lm_head, scale=4.0, seed=1)
    randomize(tower, scale=1.0, seed=2)
    randomize(model.model.multi_modal_projector, scale=4.0, seed=3)
    model.save_pretrained(path)
    return model


def make_tiny_llava_next(path, text: str = "llama"):
    """A LlavaNextForConditionalGeneration (float32, eval) over a `text` ("llama", "mistral")
    model, saved to `path` with its processor; returns (model, processor)."""
    import transformers
    from transformers.models.llava_next.image_processing_pil_llava_next import (
        LlavaNextImageProcessorPil,
    )

    vision = transformers.CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        image_size=30, patch_size=10, projection_dim=32,
    )  # fmt: skip
    cls = transformers.LlamaConfig if text == "llama" else transformers.MistralConfig
    config = transformers.LlavaNextConfig(
        vision_config=vision, text_config=cls(**TINY, rope_theta=10000.0),
        image_token_index=IMAGE_ID, image_grid_pinpoints=NEXT_PINPOINTS,
        vision_feature_select_strategy="default", vision_feature_layer=-2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlavaNextForConditionalGeneration(config).eval()
    _finish(model, model.model.vision_tower, path)
    images = LlavaNextImageProcessorPil(
        size={"shortest_edge": 30}, crop_size={"height": 30, "width": 30},
        image_grid_pinpoints=NEXT_PINPOINTS,
    )  # fmt: skip
    processor = transformers.LlavaNextProcessor(
        image_processor=images, tokenizer=_tokenizer(), patch_size=10, chat_template=TEMPLATE,
        vision_feature_select_strategy="default", num_additional_image_tokens=1,
        image_token="<image>",
    )  # fmt: skip
    processor.save_pretrained(path)
    return model, processor


def make_tiny_llava_onevision(path):
    """A LlavaOnevisionForConditionalGeneration (float32, eval) saved to `path` with its
    processor; returns (model, processor)."""
    import transformers
    from transformers.models.llava_onevision.image_processing_pil_llava_onevision import (
        LlavaOnevisionImageProcessorPil,
    )

    vision = transformers.SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        image_size=28, patch_size=7, vision_use_head=False,
    )  # fmt: skip
    text = transformers.Qwen2Config(**TINY, rope_theta=10000.0)
    config = transformers.LlavaOnevisionConfig(
        vision_config=vision, text_config=text, image_token_index=IMAGE_ID,
        image_grid_pinpoints=OV_PINPOINTS, vision_aspect_ratio="anyres_max_2",
        vision_feature_select_strategy="full", vision_feature_layer=-1,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlavaOnevisionForConditionalGeneration(config).eval()
    _finish(model, model.model.vision_tower, path)
    images = LlavaOnevisionImageProcessorPil(
        size={"height": 28, "width": 28}, image_grid_pinpoints=OV_PINPOINTS,
        image_mean=[0.5] * 3, image_std=[0.5] * 3,
    )  # fmt: skip
    images.save_pretrained(path)
    tokenizer = _tokenizer()
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(path)
    # the processor's counts without its video processor (torchvision's): its own methods
    processor = object.__new__(transformers.LlavaOnevisionProcessor)
    processor.__dict__.update(image_processor=images, tokenizer=tokenizer, num_image_tokens=16,
                              vision_feature_select_strategy="full",
                              vision_aspect_ratio="anyres_max_2")  # fmt: skip
    return model, processor


def picture(seed: int, size: tuple[int, int] = (40, 52)):
    """An RGB PIL image of (height, width) `size`: smooth colour ramps drawn from `seed` (the
    tiny towers tell such images apart where uniform noise reads alike)."""
    import numpy as np
    from PIL import Image

    a, b, c = np.random.default_rng(seed).uniform(0, 255, (3, 3))
    y = np.linspace(0, 1, size[0])[:, None, None]
    x = np.linspace(0, 1, size[1])[None, :, None]
    ramp = a * y + b * x + c * (1 - x) * (1 - y)
    return Image.fromarray(ramp.clip(0, 255).astype(np.uint8))


def hf_generate(model, processor, ids: list[int], images: list, n: int) -> list[int]:
    """transformers' greedy tokens after the expanded prompt `ids` with `images` (each patched:
    the processor's flat list of a prompt's images)."""
    kwargs = {}
    if images:
        out = processor.image_processor(images, return_tensors="pt")
        kwargs = {"pixel_values": out["pixel_values"], "image_sizes": out["image_sizes"]}
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                             **kwargs)  # fmt: skip
    return out[0, len(ids) :].tolist()


def count(processor, im, size: int) -> int:
    """The processor's placeholder count for image `im` (crops of `size` px)."""
    n = processor._get_number_of_features(im.height, im.width, size, size)
    return n - (processor.vision_feature_select_strategy == "default")


def expanded(processor, ids: list[int], images: list) -> list[int]:
    """`ids` with each image token repeated to the processor's count for its image."""
    size = processor.image_processor.size
    size = size.get("shortest_edge") or size["height"]
    counts = iter([count(processor, im, size) for im in images])
    return [t for i in ids for t in ([i] * next(counts) if i == IMAGE_ID else [i])]
