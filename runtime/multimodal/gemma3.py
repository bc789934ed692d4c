"""Gemma 3's image side (`Gemma3ForConditionalGeneration`), read once from config.json, the
tokenizer and the processor beside it: a SigLIP tower (`vision_config`, every layer and its
post-norm run), its patch grid average-pooled to `mm_tokens_per_image` rows, and the prompt
as transformers' `Gemma3Processor` writes it: each `<start_of_image>` (the marker a chat
template renders per image) becomes "\\n\\n<start_of_image>" + `<image_soft_token>` x
`mm_tokens_per_image` + "<end_of_image>\\n\\n", the newlines merged with the prompt's own where
the tokenizer has one token for the longer run (as tokenizing the processor's text does). The
image's tokens attend to each other both ways (transformers' `token_type_ids` mask).
Torch-free: the API process reads it too.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pagoda.runtime.multimodal.config import (
    ImageProcessing,
    VisionConfig,
    read_processing,
    tokenizer_vocab,
    tower_shape,
)

log = logging.getLogger(__name__)
MAX_NEWLINES = 31  # "\n" * k tokens looked up (Gemma's vocabulary has k = 1 .. 31)


def newline_ids(model_dir: Path | None) -> tuple[int, ...] | None:
    """The ids of "\n" * k, k = 1, 2, ... while the tokenizer has one token for it; None
    without a tokenizer.json that has "\n\n" (the checkpoint is then read text-only)."""
    vocab = tokenizer_vocab(model_dir)
    if vocab is None:
        return None
    ids = []
    for k in range(1, MAX_NEWLINES + 1):
        if "\n" * k not in vocab:
            break
        ids.append(int(vocab["\n" * k]))
    return tuple(ids) if len(ids) >= 2 else None


def read_gemma3(top: dict[str, Any], model_dir: Path | None) -> VisionConfig | None:
    """A Gemma3ForConditionalGeneration config.json's image side; ValueError, one line, for
    what is not Gemma 3's shape; None (text only, logged) without the tokenizer.json whose
    newline tokens the image marker's text needs."""
    nl = newline_ids(model_dir)
    if nl is None:
        log.warning("no tokenizer.json with a '\\n\\n' token beside the checkpoint: Gemma 3 "
                    "is read text-only (images refused)")  # fmt: skip
        return None
    v = top.get("vision_config") or {}
    if v.get("model_type", "siglip_vision_model") != "siglip_vision_model":
        raise ValueError(f"Gemma3ForConditionalGeneration with a vision_config of model_type "
                         f"{v.get('model_type')!r} is not supported (siglip_vision_model)")  # fmt: skip
    act = v.get("hidden_act", "gelu_pytorch_tanh")
    if act != "gelu_pytorch_tanh":
        raise ValueError(f"vision_config.hidden_act {act!r} is not supported "
                         "(gelu_pytorch_tanh)")  # fmt: skip
    size, patch = int(v.get("image_size", 224)), int(v.get("patch_size", 16))
    tokens = int(top.get("mm_tokens_per_image", 256))
    side = round(tokens**0.5)
    grid = size // patch
    if side * side != tokens or grid % side:
        raise ValueError(f"mm_tokens_per_image {tokens}: a {grid}x{grid} patch grid does not "
                         "pool to a square of that many tokens")  # fmt: skip
    text = top.get("text_config") or {}
    window = text.get("sliding_window")
    if window is not None and int(window) < tokens:
        raise ValueError(f"text_config.sliding_window {window} is shorter than an image's "
                         f"{tokens} tokens (mm_tokens_per_image): not supported")  # fmt: skip
    processing = ImageProcessing(shortest_edge=size, crop=(size, size), resample=2, mean=(0.5,) * 3,
                                 std=(0.5,) * 3, do_center_crop=False, exact_resize=True)  # fmt: skip
    if model_dir is not None:
        processing = read_processing(model_dir, size, processing)
    boi = int(top.get("boi_token_index", top.get("boi_token_id", 255_999)))
    eoi = int(top.get("eoi_token_index", top.get("eoi_token_id", 256_000)))
    return VisionConfig(
        **tower_shape(v),
        image_size=size,
        patch_size=patch,
        image_token_index=int(top.get("image_token_index", top.get("image_token_id", 262_144))),
        kind="gemma3",
        layer_norm_eps=float(v.get("layer_norm_eps", 1e-6)),
        hidden_act="gelu_tanh",
        feature_layer=int(v.get("num_hidden_layers", 12)),
        processing=processing,
        pooled_tokens=tokens,
        marker=boi,
        prefix=(nl[1], boi),
        suffix=(eoi, nl[1]),
        newlines=nl,
        bidirectional=True,
    )
