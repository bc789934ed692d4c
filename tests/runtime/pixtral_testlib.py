"""Tiny random-weight Pixtral models written by transformers: Mistral 3
(`Mistral3ForConditionalGeneration`: a Pixtral tower 32 wide of 8 px patches, SiLU MLP, merged
2x2; images to 64 px) and LLaVA-Pixtral (`LlavaForConditionalGeneration`, a `pixtral` tower of
GELU MLP, unmerged, `vision_feature_layer` -2; images to 40 px), each over a 2-layer Mistral of
300 tokens, saved with a PixtralImageProcessor and a word-level tokenizer whose ids 10, 12, 13
are `[IMG]`, `[IMG_BREAK]`, `[IMG_END]` (Mistral's), and a chat template rendering an image part
as `[IMG]`. Imported by tests (not a conftest)."""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
from hf_oracle import TINY, randomize

IMAGE_ID, BREAK, END = 10, 12, 13
MARKS = {"[IMG]": IMAGE_ID, "[IMG_BREAK]": BREAK, "[IMG_END]": END}
# kind: (spatial_merge_size, longest_edge of the processor)
KINDS = {"mistral3": (2, 64), "llava": (1, 40)}
PATCH = 8
TEMPLATE = (
    "{% for message in messages %}{{ 'w3 ' }}{% if message['content'] is string %}"
    "{{ message['content'] + ' ' }}{% else %}{% for c in message['content'] %}"
    "{% if c['type'] == 'image' %}{{ '[IMG] ' }}{% else %}{{ c['text'] + ' ' }}{% endif %}"
    "{% endfor %}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'w5' }}{% endif %}"
)


def image_processor(kind: str):
    """transformers' PIL PixtralImageProcessor as the checkpoint's processor runs it (its patch:
    the tower's x spatial_merge_size, as PixtralProcessor passes it)."""
    from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil

    merge, edge = KINDS[kind]
    p = PATCH * merge
    return PixtralImageProcessorPil(
        size={"longest_edge": edge}, patch_size={"height": p, "width": p}
    )


def pixtral_processor(kind: str, tokenizer):
    """transformers' PixtralProcessor over `image_processor(kind)`. Its module imports
    `get_resize_output_image_size` from the torchvision image processor's module (no torchvision
    here): the PIL module's function of that name, the same code, is put there first."""
    from transformers.models.pixtral import image_processing_pil_pixtral as pil

    sys.modules.setdefault("transformers.models.pixtral.image_processing_pixtral", pil)
    from transformers.models.pixtral.processing_pixtral import PixtralProcessor

    return PixtralProcessor(image_processor(kind), tokenizer, patch_size=PATCH,
                            spatial_merge_size=KINDS[kind][0])  # fmt: skip


def tokenizer(path=None):
    """The word-level tokenizer (saved to `path` if given)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(TINY["vocab_size"]) if i not in MARKS.values()} | MARKS
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(list(MARKS))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="w1",
                                                eos_token="w2", unk_token="w0",
                                                chat_template=TEMPLATE)  # fmt: skip
    if path is not None:
        fast.save_pretrained(path)
    return fast


def make_tiny_pixtral(path, kind: str = "mistral3"):
    """The model (float32, eval) saved to `path` with its processor files; returns it."""
    import transformers

    merge = KINDS[kind][0]
    text = {**TINY, "model_type": "mistral", "head_dim": 16, "sliding_window": None,
            "rope_theta": 10000.0, "tie_word_embeddings": False}  # fmt: skip
    vision = dict(model_type="pixtral", hidden_size=32, intermediate_size=48,
                  num_hidden_layers=2, num_attention_heads=2, patch_size=PATCH, image_size=64,
                  hidden_act="silu" if kind == "mistral3" else "gelu")  # fmt: skip
    if kind == "mistral3":
        config = transformers.Mistral3Config(text_config=text, vision_config=vision,
                                             image_token_index=IMAGE_ID, spatial_merge_size=merge,
                                             tie_word_embeddings=False)  # fmt: skip
        cls = transformers.Mistral3ForConditionalGeneration
    else:
        config = transformers.LlavaConfig(text_config=text, vision_config=vision,
                                          image_token_index=IMAGE_ID, vision_feature_layer=-2,
                                          vision_feature_select_strategy="full",
                                          projector_hidden_act="gelu")  # fmt: skip
        cls = transformers.LlavaForConditionalGeneration
    torch.manual_seed(0)
    model = cls(config).eval()
    randomize(model.model.language_model, scale=4.0, seed=1)
    randomize(model.lm_head, scale=4.0, seed=1)
    randomize(model.model.vision_tower, scale=1.0, seed=2)
    # (LLaVA's projector x4: its images then steer the tokens as Mistral 3's merger does)
    randomize(model.model.multi_modal_projector, scale=1.0 if kind == "mistral3" else 4.0, seed=3)
    model.save_pretrained(path)
    image_processor(kind).save_pretrained(path)  # (its patch_size: the processor's)
    processor = {"processor_class": "PixtralProcessor", "patch_size": PATCH,
                 "spatial_merge_size": merge, "image_token": "[IMG]",
                 "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]"}  # fmt: skip
    (path / "processor_config.json").write_text(json.dumps(processor))
    tokenizer(path)
    return model


def image(seed: int, size: tuple[int, int]):
    """A random RGB PIL image of (height, width) `size`."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8))


def hf_generate(model, kind: str, ids: list[int], images: list, n: int) -> list[int]:
    """transformers' greedy tokens after the expanded prompt `ids` with `images` (padded to one
    batch with their sizes, as the processor returns them)."""
    kwargs = {}
    if images:
        out = image_processor(kind)(images, return_tensors="pt")
        kwargs = {"pixel_values": out["pixel_values"], "image_sizes": out["image_sizes"]}
    t = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(input_ids=t, attention_mask=torch.ones_like(t), max_new_tokens=n,
                             do_sample=False, **kwargs)  # fmt: skip
    return out[0, len(ids) :].tolist()
