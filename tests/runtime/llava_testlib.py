"""A tiny random-weight LLaVA 1.5 written by transformers (CLIP tower 30 px, 10 px patches: 9
placeholder rows an image; a 2-layer Llama of 300 tokens), saved with its processor: a
CLIPImageProcessor and a word-level tokenizer whose id 299 is `<image>`, and a LLaVA-style chat
template over content parts. Imported by tests (not a conftest)."""

from __future__ import annotations

import io

import numpy as np
import torch
from hf_oracle import TINY, randomize

IMAGE_ID = 299
TOKENS_PER_IMAGE = 9  # (30 / 10)² patches, the class token dropped
# LLaVA 1.5's template's shape (images first, then text, per message) in the vocabulary's words
TEMPLATE = (
    "{% for message in messages %}{{ 'w3 ' if message['role'] == 'user' else 'w4 ' }}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image> ' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] + ' ' }}{% endfor %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'w5' }}{% endif %}"
)


def make_tiny_llava(path, strategy: str = "default"):
    """The model (float32, eval) saved to `path` with its processor; returns (model, processor)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    vision = transformers.CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        image_size=30, patch_size=10, projection_dim=32,
    )  # fmt: skip
    text = transformers.LlamaConfig(**TINY, rope_theta=10000.0)
    config = transformers.LlavaConfig(
        vision_config=vision, text_config=text, image_token_index=IMAGE_ID,
        vision_feature_select_strategy=strategy, vision_feature_layer=-2,
        image_seq_length=TOKENS_PER_IMAGE + (strategy == "full"),
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlavaForConditionalGeneration(config).eval()
    # the text model's matrices x4 (greedy picks apart; the images still steer them), the
    # tower's norms and biases with noise (the tokens tell a bias read wrongly)
    randomize(model.model.language_model, scale=4.0, seed=1)
    randomize(model.lm_head, scale=4.0, seed=1)
    randomize(model.model.vision_tower, scale=1.0, seed=2)
    model.save_pretrained(path)
    vocab = {f"w{i}": i for i in range(TINY["vocab_size"] - 1)} | {"<image>": IMAGE_ID}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<image>"])
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="w1", eos_token="w2", unk_token="w0"
    )
    images = transformers.CLIPImageProcessor(
        size={"shortest_edge": 30}, crop_size={"height": 30, "width": 30}
    )
    processor = transformers.LlavaProcessor(
        image_processor=images, tokenizer=fast, patch_size=10, chat_template=TEMPLATE,
        vision_feature_select_strategy=strategy, num_additional_image_tokens=1,
        image_token="<image>",
    )  # fmt: skip
    processor.save_pretrained(path)
    return model, processor


def image(seed: int, size: tuple[int, int] = (40, 52)):
    """A random RGB PIL image of (height, width) `size`."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8))


def png_bytes(im) -> bytes:
    out = io.BytesIO()
    im.save(out, format="PNG")
    return out.getvalue()


def hf_generate(model, processor, ids: list[int], images: list, n: int) -> list[int]:
    """transformers' greedy tokens after the expanded prompt `ids` with `images`' pixels."""
    kwargs = {}
    if images:
        kwargs["pixel_values"] = processor.image_processor(images, return_tensors="pt")[
            "pixel_values"
        ]
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                             **kwargs)  # fmt: skip
    return out[0, len(ids) :].tolist()
