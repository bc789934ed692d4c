"""Idefics3's and SmolVLM's image side (`Idefics3ForConditionalGeneration`,
`SmolVLMForConditionalGeneration`), read once from config.json, the processor and the tokenizer
beside the checkpoint (plain data, torch-free: the API process reads it too).

The tower is SigLIP's (`vision_config`: every layer and its post-norm run) over square tiles
of `image_size` pixels; the connector shuffles each `scale_factor` x `scale_factor` block of
patches into one row and projects it (`modality_projection`) to the text model's width: a tile
is (image_size / patch_size)² / scale_factor² rows. The processor (`Idefics3ImageProcessor` /
`SmolVLMImageProcessor`: `idefics3_processing.py`) cuts an image into a grid of tiles and a
global image; the prompt holds the tokens its `Idefics3Processor` writes around them
(`<fake_token_around_image>`, `<row_r_col_c>`, `<global-img>`, "\\n"), read from tokenizer.json.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagoda.runtime.multimodal.config import processor_json
from pagoda.runtime.multimodal.idefics3_processing import MAX_IMAGE_SIZE, TileProcessing

log = logging.getLogger(__name__)
FAKE, GLOBAL = "<fake_token_around_image>", "<global-img>"
ROW_COL = "<row_{}_col_{}>"


@dataclass(frozen=True)
class Idefics3VisionConfig:
    """The tower's shape (SigLIP's fields: `siglip_vision.SiglipVisionTower` reads them), the
    connector's `scale_factor`, the processor, and the ids of the prompt's image text."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int  # a tile's side (the processor's max_image_size)
    patch_size: int
    scale_factor: int
    image_token_index: int  # <image>
    fake_token: int  # <fake_token_around_image>
    global_token: int  # <global-img>
    # row_col[r - 1][c - 1]: <row_r_col_c>'s id, for the grid the tokenizer has tokens for
    row_col: tuple[tuple[int, ...], ...]
    newline: tuple[int, ...]  # "\n" tokenized (between rows)
    newlines2: tuple[int, ...]  # "\n\n" tokenized (after the last row)
    processing: TileProcessing
    kind: str = "idefics3"  # its image inputs (`inputs.FAMILIES`)
    layer_norm_eps: float = 1e-6
    hidden_act: str = "gelu_tanh"
    bidirectional: bool = False  # (causal image tokens: prefill chunks may split a tile)

    def __post_init__(self) -> None:
        grid = self.image_size // self.patch_size
        if self.image_size % self.patch_size or grid % self.scale_factor:
            raise ValueError(f"vision_config: a {self.image_size} px tile of {self.patch_size} "
                             f"px patches is not a grid scale_factor {self.scale_factor} "
                             "divides")  # fmt: skip
        if self.processing.tile != self.image_size:
            raise ValueError(f"the image processor's max_image_size {self.processing.tile} is "
                             f"not the tower's image_size {self.image_size}")  # fmt: skip

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def tokens_per_image(self) -> int:
        """The placeholder tokens of one tile (its features' rows)."""
        return self.num_patches // self.scale_factor**2

    def num_params(self, text_hidden: int) -> int:
        """The tower's parameters (every layer, its post-norm) and the connector's matrix."""
        d, i = self.hidden_size, self.intermediate_size
        layer = 4 * d * d + 4 * d + 2 * d * i + i + d + 4 * d
        embeddings = d * 3 * self.patch_size**2 + d + self.num_patches * d
        return self.num_layers * layer + embeddings + 2 * d + d * self.scale_factor**2 * text_hidden


def _token_ids(model_dir: Path, rows: int) -> dict[str, Any] | None:
    """The ids of the prompt's image text in tokenizer.json (None where it has no
    <fake_token_around_image> / <global-img>: images refused)."""
    from tokenizers import Tokenizer

    path = model_dir / "tokenizer.json"
    if not path.is_file():
        return None
    tok = Tokenizer.from_file(str(path))
    fake, glob = tok.token_to_id(FAKE), tok.token_to_id(GLOBAL)
    if fake is None or glob is None:
        return None
    grid = []
    for r in range(1, rows + 1):
        row = [tok.token_to_id(ROW_COL.format(r, c)) for c in range(1, rows + 1)]
        if None in row:
            break
        grid.append(tuple(row))
    encode = lambda s: tuple(tok.encode(s, add_special_tokens=False).ids)  # noqa: E731
    return {"fake_token": fake, "global_token": glob, "row_col": tuple(grid),
            "newline": encode("\n"), "newlines2": encode("\n\n")}  # fmt: skip


def read_idefics3(top: dict[str, Any], model_dir: Path | None) -> Idefics3VisionConfig | None:
    """An Idefics3 / SmolVLM config.json's image side; ValueError, one line, for what is not
    their shape; None (text only, logged) without a tokenizer.json holding the image tokens."""
    v = top.get("vision_config") or {}
    # (older configs name the vision config by the top's model_type)
    kinds = ("idefics3_vision", "smolvlm_vision", "idefics3", "smolvlm")
    if v.get("model_type", kinds[0]) not in kinds:
        raise ValueError(f"a vision_config of model_type {v.get('model_type')!r} is not "
                         f"supported ({', '.join(kinds)})")  # fmt: skip
    act = v.get("hidden_act", "gelu_pytorch_tanh")
    if act != "gelu_pytorch_tanh":
        raise ValueError(f"vision_config.hidden_act {act!r} is not supported (gelu_pytorch_tanh)")
    size, patch = int(v.get("image_size", 224)), int(v.get("patch_size", 32))
    cfg = (processor_json(model_dir) if model_dir is not None else None) or {}
    processing = TileProcessing.from_json(cfg, size)
    scale = int(top.get("scale_factor", 2))
    seq = _processor_seq_len(model_dir)
    want = (size // patch) ** 2 // scale**2
    if seq is not None and seq != want:
        raise ValueError(f"the processor's image_seq_len {seq} is not the {want} rows a tile "
                         f"gives ((image_size / patch_size)² / scale_factor²)")  # fmt: skip
    longest = processing.longest_edge if processing.do_resize else MAX_IMAGE_SIZE
    ids = None if model_dir is None else _token_ids(model_dir, math.ceil(longest / size))
    if ids is None:
        log.warning("no tokenizer.json with <fake_token_around_image> and <global-img> beside "
                    "the checkpoint: it is read text-only (images refused)")  # fmt: skip
        return None
    return Idefics3VisionConfig(
        hidden_size=int(v.get("hidden_size", 1152)),  # (Idefics3VisionConfig's defaults)
        intermediate_size=int(v.get("intermediate_size", 3072)),
        num_layers=int(v.get("num_hidden_layers", 12)),
        num_heads=int(v.get("num_attention_heads", 16)),
        image_size=size,
        patch_size=patch,
        scale_factor=scale,
        image_token_index=int(top.get("image_token_id", top.get("image_token_index", 128_257))),
        processing=processing,
        layer_norm_eps=float(v.get("layer_norm_eps", 1e-6)),
        **ids,
    )


def _processor_seq_len(model_dir: Path | None) -> int | None:
    """processor_config.json's `image_seq_len` (None where it is not there)."""
    import json

    path = None if model_dir is None else model_dir / "processor_config.json"
    if path is None or not path.is_file():
        return None
    try:
        cfg = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"processor_config.json is not valid JSON ({e})") from None
    seq = cfg.get("image_seq_len") if isinstance(cfg, dict) else None
    return None if seq is None else int(seq)
