"""A config.json's sliding window and which layers slide, family by family (`hf_loader._family`:
`FamilyConfig.sliding_window`, `window_layers`), as transformers reads them: `layer_types` where
a config has them, else the family's own pattern (`PATTERNS`); a window only for the families
that run one (`WINDOWED`), some only when told to (`use_sliding_window`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def _every(pattern: int) -> Callable[[int], tuple[bool, ...]]:
    """Every `pattern`-th layer global, the others sliding."""
    return lambda n: tuple(bool((i + 1) % pattern) for i in range(n))


def _by_config_pattern(default: int) -> Callable[[Mapping[str, Any], int], tuple[bool, ...]]:
    """Every `sliding_window_pattern`-th layer global (the older configs' key)."""
    return lambda cfg, n: _every(int(cfg.get("sliding_window_pattern") or default))(n)


def _exaone4(cfg: Mapping[str, Any], n: int) -> tuple[bool, ...]:
    """Every `sliding_window_pattern`-th layer global: an integer, as transformers reads it."""
    pattern = cfg.get("sliding_window_pattern")
    if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
        raise ValueError(f"EXAONE 4's sliding_window_pattern {pattern!r} without layer_types "
                         "is not supported (transformers reads an integer)")  # fmt: skip
    return _every(pattern)(n)


def _qwen(cfg: Mapping[str, Any], n: int) -> tuple[bool, ...]:
    """Qwen2's and Qwen3's: the layers from max_window_layers on slide."""
    first = int(cfg.get("max_window_layers", 0))
    return tuple(i >= first for i in range(n))


def _qwen2moe(cfg: Mapping[str, Any], n: int) -> tuple[bool, ...]:
    """transformers 5's Qwen2-MoE: every other layer below max_window_layers."""
    last = int(cfg.get("max_window_layers", 28))
    return tuple(bool((i + 1) % 2) and i < last for i in range(n))


# architecture -> which of its n layers slide, without `layer_types` (none listed: every layer,
# Mistral's, Mixtral's, Qwen3-MoE's whatever max_window_layers says)
PATTERNS: dict[str, Callable[[Mapping[str, Any], int], tuple[bool, ...]]] = {
    **dict.fromkeys(("gemma2", "vaultgemma", "gpt_oss"), lambda cfg, n: _every(2)(n)),  # even
    "cohere2": _by_config_pattern(4),
    "exaone4": _exaone4,
    "cwm": lambda cfg, n: tuple(i % 4 != 0 for i in range(n)),  # every fourth global, from 0
    "olmo3": lambda cfg, n: _every(4)(n),  # transformers' default: every fourth layer global
    # (transformers reads no other key: the `_sliding_window_pattern` it writes goes with
    # `layer_types`)
    "gemma3": _by_config_pattern(6),
    **dict.fromkeys(("qwen2", "qwen3", "llava_onevision", "internvl", "internvl_qwen3"), _qwen),
    "qwen2moe": _qwen2moe,
}
# the families whose config's `sliding_window` is read (Phi-3, Gemma 2, gpt-oss: every layer
# or some; the others by `layer_types` or their pattern)
WINDOWED = ("mistral", "llava_next_mistral", "llava_onevision", "internvl", "internvl_qwen3", "internvl_qwen3_moe", "mixtral", "gemma3", "gemma4", "qwen2", "qwen3", "qwen3moe", "olmo3",
            "gemma3n", "cohere2", "ministral", "ministral3", "exaone4", "starcoder2", "cwm",
            "lara_mini", "gpt_neo", "gemma4_unified", "phi3", "gemma2", "vaultgemma",
            "gpt_oss")  # fmt: skip


def window_layers(cfg: Mapping[str, Any], arch: str, n: int, window: int | None):
    """Which of the `n` layers slide (() with no window, or where every layer does)."""
    if window is None:
        return ()
    types = cfg.get("layer_types")
    if types:
        if len(types) != n:
            raise ValueError(f"layer_types names {len(types)} layers, the model has {n}")
        return tuple(t == "sliding_attention" for t in types)
    pattern = PATTERNS.get(arch)
    return () if pattern is None else pattern(cfg, n)


def sliding_window(cfg: Mapping[str, Any], arch: str) -> int | None:
    """The window in tokens of `arch`'s sliding layers; None: no window."""
    window = cfg.get("sliding_window")
    if arch == "smollm3":
        return _smollm3_window(cfg)
    if arch == "qwen2moe":  # as the other Qwens: a window only with use_sliding_window
        return int(window) if window and cfg.get("use_sliding_window", False) else None
    # (OneVision's text model: Qwen2's; InternVL's: Qwen2's, Qwen3's)
    qwens = ("qwen2", "qwen3", "qwen3moe", "llava_onevision", "internvl", "internvl_qwen3",
             "internvl_qwen3_moe")  # fmt: skip
    if arch in qwens and not cfg.get("use_sliding_window", False):
        return None  # Qwen configs carry a window they do not use unless told to
    if arch == "cohere2" and not window:  # its global layers are told apart by having none
        raise ValueError("Cohere 2 without a sliding_window is not supported")
    if arch not in WINDOWED:
        return None
    return int(window) if window else None


def _smollm3_window(cfg: Mapping[str, Any]) -> int | None:
    """SmolLM3's window: on the `layer_types` layers that say sliding_attention (by default the
    NoPE layers, with use_sliding_window and a sliding_window); transformers' masks slide by
    layer_types, its flash path only with use_sliding_window too, so a config where the two
    disagree is refused."""
    types, window = cfg.get("layer_types"), cfg.get("sliding_window")
    if not cfg.get("use_sliding_window", False):
        if types and "sliding_attention" in types:
            raise ValueError("SmolLM3 layer_types names sliding_attention layers but "
                             "use_sliding_window is false (transformers' attention paths "
                             "disagree on such a config)")  # fmt: skip
        return None
    if not window:
        if types and "sliding_attention" in types:
            raise ValueError("SmolLM3 layer_types names sliding_attention layers without a "
                             "sliding_window")  # fmt: skip
        return None
    return int(window)
