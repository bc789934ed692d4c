"""A tiny random-weight Llama 4 with images written by transformers (`Llama4ForConditional
Generation`: a 2-layer vision tower over 56 px tiles of 7 px patches, shuffled by 2 to 16 rows
a tile; a 2-layer Llama 4 text model of 300 tokens, 2 experts top-1, chunked attention of 8 on
the rotary layer, NoPE with temperature tuning on the other), saved with its processor files:
the image processor (max_patches 4: at most 4 tiles and the global tile) and a byte-level BPE
tokenizer whose Llama 4 tokens (`<|image|>`, `<|patch|>`, ...) and reserved ones up to the
300th id are added tokens, with the processor's chat template.

The prompt ids are transformers' `Llama4Processor`'s. Its image processor
(`Llama4ImageProcessor`) runs on torchvision, which this project does not install; where it is
missing the processor here reads pagoda's preprocessing (`pagoda_tiles`), which
tests/runtime/multimodal/test_llama4_processing.py holds equal to transformers' (its recorded
outputs, and the class itself where torchvision is installed). Imported by tests (not a
conftest)."""

from __future__ import annotations

import numpy as np
import torch
from hf_oracle import TINY, randomize
from idefics3_testlib import byte_chars, image, png_bytes  # noqa: F401 (re-exported)

TILE, PATCH, MAX_PATCHES = 56, 7, 4
TOKENS_PER_TILE = 16  # (56 / 7)² / 2²
SPECIAL = ["<|begin_of_text|>", "<|eot|>", "<|header_start|>", "<|header_end|>",
           "<|image_start|>", "<|image_end|>", "<|image|>", "<|patch|>",
           "<|tile_x_separator|>", "<|tile_y_separator|>"]  # fmt: skip
SPECIAL += [f"<|reserved_special_token_{k}|>" for k in range(300 - 256 - len(SPECIAL))]
IDS = {tok: 256 + i for i, tok in enumerate(SPECIAL)}  # (every id of the vocabulary a token)
IMAGE, PATCH_ID = IDS["<|image|>"], IDS["<|patch|>"]
TEXT = dict(TINY, num_hidden_layers=2, num_local_experts=2, num_experts_per_tok=1,
            intermediate_size=32, intermediate_size_mlp=96, head_dim=16,
            no_rope_layer_interval=2, interleave_moe_layer_step=1, use_qk_norm=True,
            attn_temperature_tuning=True, floor_scale=8, attn_scale=0.5,
            attention_chunk_size=8, rope_theta=10000.0, eos_token_id=IDS["<|eot|>"],
            bos_token_id=IDS["<|begin_of_text|>"], pad_token_id=0)  # fmt: skip
VISION = dict(hidden_size=32, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              image_size=TILE, patch_size=PATCH, vision_output_dim=48, projector_input_dim=48,
              projector_output_dim=48, pixel_shuffle_ratio=0.5)  # fmt: skip


def _tokenizer():
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers.models.llama4.processing_llama4 import chat_template

    tok = Tokenizer(models.BPE({ch: i for i, ch in enumerate(byte_chars())}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot|>",
        chat_template=chat_template,
    )  # fmt: skip


def image_processor(**kw):
    """transformers' `Llama4ImageProcessor` at the tiny tile (needs torchvision)."""
    from transformers.models.llama4.image_processing_llama4 import Llama4ImageProcessor

    return Llama4ImageProcessor(**{"size": {"height": TILE, "width": TILE},
                                   "max_patches": MAX_PATCHES, **kw})  # fmt: skip


def pagoda_tiles(**kw):
    """An image processor whose outputs are pagoda's (`llama4_processing.preprocess`):
    `Llama4Processor` reads them where torchvision is missing."""
    from pagoda.runtime.multimodal.llama4_processing import Llama4Processing
    from transformers.image_processing_base import ImageProcessingMixin

    class PagodaTiles(ImageProcessingMixin):
        p = Llama4Processing(tile=TILE, **{"max_patches": MAX_PATCHES, **kw})
        __call__ = _tiles

    return PagodaTiles()


def _tiles(self, images, **_):
    from pagoda.runtime.multimodal.llama4_processing import preprocess
    from transformers import BatchFeature

    ims = images if isinstance(images, list) else [images]
    out = [preprocess(im, self.p) for im in ims]
    pixels = torch.from_numpy(np.concatenate([t for t, _, _ in out]))
    ratios = torch.tensor([[r, c] for _, r, c in out])
    return BatchFeature({"pixel_values": pixels, "aspect_ratios": ratios})


def has_torchvision() -> bool:
    try:
        import torchvision  # noqa: F401
    except ImportError:
        return False
    return True


def make_processor(**kw):
    """transformers' `Llama4Processor` over the tiny tokenizer and the image processor."""
    import transformers

    images = image_processor(**kw) if has_torchvision() else pagoda_tiles(**kw)
    return transformers.Llama4Processor(image_processor=images, tokenizer=_tokenizer(),
                                        patch_size=PATCH, pixel_shuffle_ratio=0.5)  # fmt: skip


def write_processor_files(path, **kw) -> None:
    """The files a checkpoint's processor leaves (the tokenizer's, processor_config.json,
    preprocessor_config.json), written without torchvision."""
    import json

    _tokenizer().save_pretrained(path)
    pre = {"image_processor_type": "Llama4ImageProcessor", "size": {"height": TILE, "width": TILE},
           "max_patches": MAX_PATCHES, "resize_to_max_canvas": False, "resample": 2,
           "image_mean": [0.5] * 3, "image_std": [0.5] * 3, "rescale_factor": 1 / 255,
           "do_resize": True, "do_rescale": True, "do_normalize": True, **kw}  # fmt: skip
    (path / "preprocessor_config.json").write_text(json.dumps(pre))
    proc = {"processor_class": "Llama4Processor", "patch_size": PATCH, "pixel_shuffle_ratio": 0.5}
    (path / "processor_config.json").write_text(json.dumps(proc))


def make_tiny(path, **processor_kw):
    """The model (float32, eval) saved to `path` with its processor files; (model,
    processor)."""
    import transformers

    config = transformers.Llama4Config(vision_config=VISION, text_config=TEXT,
                                       image_token_index=PATCH_ID)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Llama4ForConditionalGeneration(config).eval()
    randomize(model.language_model, scale=4.0, seed=1)
    randomize(model.vision_model, scale=1.0, seed=2)
    randomize(model.multi_modal_projector, scale=4.0, seed=3)
    model.save_pretrained(path)
    write_processor_files(path, **processor_kw)
    return model, make_processor(**processor_kw)


def hf_inputs(processor, text: str, images: list) -> dict:
    """The processor's input_ids and pixels of `text` with `images`."""
    return processor(text=text, images=images or None, return_tensors="pt")


def hf_generate(model, inputs: dict, n: int) -> list[int]:
    """transformers' greedy tokens after the processor's `inputs` (its pixels in float32)."""
    ids = inputs["input_ids"]
    kw = {"pixel_values": inputs["pixel_values"].float()} if "pixel_values" in inputs else {}
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             max_new_tokens=n, do_sample=False, **kw)  # fmt: skip
    return out[0, ids.shape[1] :].tolist()
