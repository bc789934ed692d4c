"""Tiny checkpoints with PEFT LoRA adapters written by peft itself (the oracle)."""

from __future__ import annotations

import copy

import torch
from hf_oracle import make_tiny_llama, make_tiny_model

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# (name, r, alpha, targets, rslora): two adapters that differ in rank, targets and scaling
ADAPTERS = [
    ("a1", 8, 16, ALL, False),
    ("a2", 4, 8, ["q_proj", "v_proj", "o_proj", "down_proj"], True),
]


def make_base(path, arch: str = "Llama"):
    """A tiny random `arch` checkpoint at `path` (float32 transformers model returned)."""
    if arch == "Llama":
        return make_tiny_llama(path)
    return make_tiny_model(path, arch)


def make_adapter(base, path, r: int, alpha: int, targets, rslora: bool = False, seed: int = 0,
                 scale: float = 2.0, **extra):  # fmt: skip
    """A peft adapter over a copy of `base`, random A and B (``init_lora_weights=False``)
    scaled by `scale` so greedy picks move, saved to `path`; returns the PeftModel (eval)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    cfg = LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets), use_rslora=rslora,
                     init_lora_weights=False, **extra)  # fmt: skip
    model = get_peft_model(copy.deepcopy(base), cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.mul_(scale)
    model.save_pretrained(path)
    return model.eval()
