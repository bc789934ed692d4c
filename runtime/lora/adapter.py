"""Reading a PEFT LoRA adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``)
and checking it against the base model, once, before any request runs with it.

What is read: ``r``, ``lora_alpha``, ``use_rslora`` (scale alpha / sqrt(r) instead of
alpha / r) and ``target_modules`` among the attention and MLP projections (`TARGETS`); the
tensors ``base_model.model.model.layers.N.{self_attn,mlp}.P.lora_A.weight`` [r, in] and
``...lora_B.weight`` [out, r]. What is refused, one line naming it: a rank above
``--max-lora-rank``, a target the engine cannot apply (embeddings, the LM head, anything but the
seven projections), ``modules_to_save``, biases, DoRA, per-layer rank or alpha patterns, and
tensors whose shapes are not the base model's (an adapter made for another model).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass

import torch
from pagoda.runtime.lora_config import LoRARequest
from pagoda.runtime.model_config import ModelConfig

# the projections an adapter may target, and the block of the layer they are in
TARGETS = {
    "q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
    "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp",
}  # fmt: skip
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_NAME = re.compile(
    r"^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$"
)


def module_shapes(mc: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in, out) features of each target projection of the base model."""
    h, q, kv, i = (mc.hidden_size, mc.num_heads * mc.head_dim, mc.num_kv_heads * mc.head_dim,
                   mc.intermediate_size)  # fmt: skip
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}  # fmt: skip


@dataclass(frozen=True)
class LoRAAdapter:
    """An adapter read and checked: `weights[(layer, module)]` = (A [r, in], B [out, r] already
    multiplied by `scale`), float32 on the host."""

    request: LoRARequest
    rank: int
    scale: float
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values())


def read_config(path: str, max_rank: int) -> tuple[int, float, tuple[str, ...]]:
    """(rank, scale, target modules) of the adapter at `path`; ValueError naming the problem."""
    cfg_path = os.path.join(path, CONFIG_FILE)
    try:
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"{path}: not a LoRA adapter directory (no {CONFIG_FILE})") from None
    except (OSError, ValueError) as e:
        raise ValueError(f"{cfg_path}: cannot read it ({e})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{cfg_path}: expected a JSON object")
    if cfg.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{cfg_path}: peft_type {cfg.get('peft_type')!r} is not LORA")
    r, alpha = cfg.get("r"), cfg.get("lora_alpha", cfg.get("r"))
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise ValueError(f"{cfg_path}: r must be a positive integer, got {r!r}")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool):
        raise ValueError(f"{cfg_path}: lora_alpha must be a number, got {alpha!r}")
    for key, what in (("modules_to_save", "modules_to_save (whole modules trained beside the "
                       "adapter)"), ("rank_pattern", "rank_pattern"), ("alpha_pattern",
                       "alpha_pattern"), ("layers_to_transform", "layers_to_transform")):  # fmt: skip
        if cfg.get(key):
            raise ValueError(f"{path}: adapters with {what} are not supported")
    if cfg.get("use_dora"):
        raise ValueError(f"{path}: DoRA adapters (use_dora) are not supported")
    if cfg.get("bias", "none") != "none":
        raise ValueError(f"{path}: adapters that train biases (bias={cfg['bias']!r}) are not "
                         "supported")  # fmt: skip
    targets = cfg.get("target_modules")
    if isinstance(targets, str):
        raise ValueError(f"{path}: target_modules as a regular expression is not supported; "
                         f"list the projections ({', '.join(TARGETS)})")  # fmt: skip
    if not isinstance(targets, list) or not targets:
        raise ValueError(f"{cfg_path}: target_modules must be a list of module names")
    bad = sorted(str(t) for t in targets if t not in TARGETS)
    if bad:
        raise ValueError(f"{path}: target module(s) {', '.join(bad)} cannot take an adapter "
                         f"here (only {', '.join(TARGETS)})")  # fmt: skip
    if r > max_rank:
        raise ValueError(f"{path}: LoRA rank {r} is more than --max-lora-rank {max_rank}")
    scale = alpha / (math.sqrt(r) if cfg.get("use_rslora") else r)
    return r, float(scale), tuple(sorted(set(targets)))


def read_adapter(request: LoRARequest, mc: ModelConfig, max_rank: int) -> LoRAAdapter:
    """The adapter `request` names, read and checked against the base model `mc`."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = request.lora_path
    rank, scale, targets = read_config(path, max_rank)
    wpath = os.path.join(path, WEIGHTS_FILE)
    if not os.path.isfile(wpath):
        raise ValueError(f"{path}: no {WEIGHTS_FILE} (only safetensors adapters are read)")
    try:
        tensors = load_file(wpath)
    except (OSError, SafetensorError, ValueError) as e:
        raise ValueError(f"{wpath}: cannot read it ({e})") from None
    shapes, parts = module_shapes(mc), {}
    for name, t in tensors.items():
        m = _NAME.match(name)
        if m is None:
            raise ValueError(f"{path}: tensor {name!r} is not a LoRA weight of a decoder "
                             f"layer's projection ({', '.join(TARGETS)})")  # fmt: skip
        layer, block, module, ab = int(m[1]), m[2], m[3], m[4]
        if TARGETS.get(module) != block or module not in targets:
            raise ValueError(f"{path}: tensor {name!r} is not of a target module")
        if layer >= mc.num_layers:
            raise ValueError(f"{path}: tensor {name!r} is for layer {layer}; the base model has "
                             f"{mc.num_layers} layers")  # fmt: skip
        fin, fout = shapes[module]
        want = (rank, fin) if ab == "A" else (fout, rank)
        if tuple(t.shape) != want:
            raise ValueError(f"{path}: {name} is {list(t.shape)}, the base model needs "
                             f"{list(want)} (an adapter for another model?)")  # fmt: skip
        if not torch.isfinite(t).all():
            raise ValueError(f"{path}: {name} holds NaN or Inf")
        parts.setdefault((layer, module), {})[ab] = t.float()
    weights = {}
    for key, ab in parts.items():
        if set(ab) != {"A", "B"}:
            raise ValueError(f"{path}: layer {key[0]} {key[1]} has lora_{''.join(ab)} only")
        weights[key] = (ab["A"].contiguous(), (ab["B"] * scale).contiguous())
    if not weights:
        raise ValueError(f"{path}: {WEIGHTS_FILE} holds no LoRA weights")
    return LoRAAdapter(request, rank, scale, weights)


def check_adapters(config, mc: ModelConfig) -> None:
    """At start (`pagoda serve`'s preflight): the model takes adapters and every
    ``--lora-modules`` adapter reads and fits it; ValueError, one line, naming the first that
    does not."""
    from pagoda.runtime.lora_config import check_model

    check_model(mc)
    for module in config.lora_modules:
        try:
            read_adapter(module, mc, config.max_lora_rank)
        except ValueError as e:
            raise ValueError(f"--lora-modules {module.lora_name}: {e}") from None
