"""Mllama's text model (`MllamaForCausalLM`, and `MllamaForConditionalGeneration` read
text-only: Llama 3.2 Vision) as transformers runs it on text prompts, with its config.json read
as transformers' MllamaTextConfig reads it.

transformers' `MllamaTextModel.forward` skips a cross-attention layer (attention, MLP and its
tanh gates: the whole layer) while it has no image states and none cached, which a text-only
request never has: the model is Llama's over the self-attention layers alone. So the
`cross_attention_layers` are not read (their tensors listed apart, `rename_tensors`), the
self-attention layers are numbered 0.. in order (`num_hidden_layers` less the cross layers),
and each keeps a KV cache. The embedding table has 8 rows past the vocabulary (the image
token's among them), the head `vocab_size`. Kept apart from the model so that reading a config
imports no layer code.
"""

from __future__ import annotations

import re
from typing import Any

ARCHITECTURES = {"MllamaForCausalLM": "mllama", "MllamaForConditionalGeneration": "mllama"}
MODEL_CLASSES = {"mllama": ("llama", "LlamaModel")}
EXTRA_EMBEDDINGS = 8  # the embedding rows past vocab_size (transformers' vocab_size + 8)
CROSS_LAYERS = [3, 8, 13, 18, 23, 28, 33, 38]  # MllamaTextConfig's default
# transformers' MllamaTextConfig defaults, where config.json leaves one out
DEFAULTS: dict[str, dict[str, Any]] = {
    "mllama": {"vocab_size": 128_256, "hidden_size": 4096, "num_hidden_layers": 40,
               "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14_336,
               "rms_norm_eps": 1e-5, "max_position_embeddings": 131_072,
               "rope_theta": 500_000.0, "tie_word_embeddings": False, "bos_token_id": 128_000,
               "eos_token_id": 128_001, "pad_token_id": 128_004},
}  # fmt: skip
_CROSS = re.compile(r"^model\.layers\.(\d+)\.cross_attn")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def overrides(cfg: dict[str, Any]) -> dict[str, Any]:
    """The self-attention layers' count as `num_hidden_layers` (the cross layers' kept as
    `mllama_cross_layers`: those within the layers, as transformers reads them)."""
    n = int(cfg["num_hidden_layers"])
    cross = cfg.get("cross_attention_layers")
    cross = CROSS_LAYERS if cross is None else cross
    cross = sorted({int(i) for i in cross if 0 <= int(i) < n})  # (transformers': the others none)
    if len(cross) == n:
        raise ValueError("mllama with only cross-attention layers has no text model to run")
    return {"num_hidden_layers": n - len(cross), "mllama_cross_layers": cross}


def family_fields(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """None beyond Llama's; ValueError, one line, for what it does not run."""
    if cfg.get("tie_word_embeddings"):
        raise ValueError("mllama with tie_word_embeddings is not supported (its embedding has "
                         f"{EXTRA_EMBEDDINGS} rows past the head's)")  # fmt: skip
    return {}


def rename_tensors(weights) -> None:
    """The cross-attention layers' tensors listed apart (`mllama_cross_layers.{i}.`), the
    self-attention layers' renumbered 0.. in order (module docstring)."""
    names = list(weights)
    cross = sorted({int(m.group(1)) for n in names if (m := _CROSS.match(n))})
    if not cross:  # (a checkpoint without cross layers, or one listed already)
        return
    for name in names:
        m = _LAYER.match(name)
        if m is not None and int(m.group(1)) in cross:
            weights.rename(name, f"mllama_cross_layers.{name[len('model.layers.') :]}")
    by_layer: dict[int, list[str]] = {}
    for name in weights:
        m = _LAYER.match(name)
        if m is not None:
            by_layer.setdefault(int(m.group(1)), []).append(name)
    for new, old in enumerate(sorted(by_layer)):
        for name in by_layer[old] if new != old else ():
            weights.rename(name, f"model.layers.{new}.{name[len(f'model.layers.{old}.') :]}")


def checkpoint_shapes(c, out: dict[str, tuple[int, ...]]) -> None:
    """Its embedding's rows past the vocabulary (`EXTRA_EMBEDDINGS`) in
    `checkpoint_shapes.expected_shapes`' tensors."""
    out["model.embed_tokens.weight"] = (c.vocab_size + EXTRA_EMBEDDINGS, c.hidden_size)
