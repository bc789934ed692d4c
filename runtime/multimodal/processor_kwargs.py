"""vLLM's `--mm-processor-kwargs` (a JSON object overriding the image processor's settings,
e.g. Qwen2-VL's `{"min_pixels": 200704, "max_pixels": 1003520}`) and a chat request's own
`mm_processor_kwargs` (vLLM's extra), applied to the vision config the images are preprocessed
with (torch-free: the API process preprocesses).

A key is honoured where the family's processor reads it: its image-input module's
`PROCESSOR_KWARGS` (`inputs.FAMILIES`), applied by its `with_processor_kwargs`; Qwen2-VL's
`min_pixels` and `max_pixels` (the resized area, hence each image's placeholder run); Llama
4's `max_patches` and `resize_to_max_canvas` (each image's tiles); LLaVA
1.5's and Gemma 3's none (their runs are fixed by the tower). Any other key is refused: the
flag's when the server starts (one line, exit 2), a request's with a 400. A request's keys
apply over the flag's. (The flag's text is read by `option_rules.parse_processor_kwargs`.)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pagoda.runtime.multimodal import inputs


def apply(vision: Any, kwargs: dict[str, Any] | None, name: str = "--mm-processor-kwargs") -> Any:
    """`vision` (a family's vision config; None: text only) with `kwargs` applied to its image
    processor (itself where there are none); ValueError, one line naming `name`, for a model
    that reads no images, a key its family's processor does not read, or a bad value."""
    if kwargs is None:
        return vision
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ValueError(f"{name} must be a JSON object of the image processor's settings, "
                         f"got {kwargs!r}")  # fmt: skip
    if not kwargs:
        return vision
    if vision is None:
        raise ValueError(f"{name}: this model reads no images, so it has no image processor to "
                         f"set ({', '.join(sorted(kwargs))})")  # fmt: skip
    family = inputs.family(vision)
    known = family.PROCESSOR_KWARGS
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        reads = (f"it reads {', '.join(known)}" if known
                 else "it reads none: each image's run is fixed by the tower")  # fmt: skip
        raise ValueError(f"{name}: {unknown[0]!r} is not a setting of the {vision.kind} image "
                         f"processor ({reads})")  # fmt: skip
    try:
        return family.with_processor_kwargs(vision, kwargs)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


def served(model_config: Any, kwargs: dict[str, Any] | None) -> Any:
    """`model_config` (a `ModelConfig`) whose vision config has the flag's processor settings
    (itself without any): what the engine serves and the API process preprocesses with."""
    if not kwargs:
        return model_config
    return dataclasses.replace(model_config, vision=apply(model_config.vision, kwargs))
