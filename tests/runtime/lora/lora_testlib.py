"""Tiny checkpoints with PEFT LoRA adapters written by peft itself (the oracle)."""

from __future__ import annotations

import copy

import torch

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# (name, r, alpha, targets, rslora): two adapters that differ in rank, targets and scaling
ADAPTERS = [
    ("a1", 8, 16, ALL, False),
    ("a2", 4, 8, ["q_proj", "v_proj", "o_proj", "down_proj"], True),
]


def make_base(path, arch: str = "Llama"):
    """A tiny random `arch` checkpoint at `path` (float32 transformers model returned)."""
    from hf_oracle import make_tiny_llama, make_tiny_model

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


# a Llama checkpoint written without transformers (the server test: no peft oracle there)
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 300,
          "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
          "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
          "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}  # fmt: skip


def write_llama(path) -> None:
    """A tiny random Llama (safetensors, config.json, word-level tokenizer) at `path`."""
    import json

    from hf_oracle import save_word_tokenizer
    from safetensors.torch import save_file

    c, g = CONFIG, torch.Generator().manual_seed(0)
    h, i = c["hidden_size"], c["intermediate_size"]
    kv = c["num_key_value_heads"] * (h // c["num_attention_heads"])

    def mat(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, generator=g) * (4.0 / cols**0.5)

    t = {"model.embed_tokens.weight": mat(c["vocab_size"], h), "lm_head.weight": mat(300, h),
         "model.norm.weight": torch.ones(h)}  # fmt: skip
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        t |= {p + "self_attn.q_proj.weight": mat(h, h), p + "self_attn.k_proj.weight": mat(kv, h),
              p + "self_attn.v_proj.weight": mat(kv, h), p + "self_attn.o_proj.weight": mat(h, h),
              p + "mlp.gate_proj.weight": mat(i, h), p + "mlp.up_proj.weight": mat(i, h),
              p + "mlp.down_proj.weight": mat(h, i), p + "input_layernorm.weight": torch.ones(h),
              p + "post_attention_layernorm.weight": torch.ones(h)}  # fmt: skip
    path.mkdir(parents=True, exist_ok=True)
    save_file(t, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(c))
    save_word_tokenizer(path, c["vocab_size"])


def write_adapter(path, r: int, alpha: int, targets, seed: int, num_layers: int = 2) -> None:
    """A PEFT adapter directory (peft's file names and keys) over `write_llama`'s model."""
    import json

    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(100 + seed)
    h, i, kv = 64, 128, 32
    shapes = {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h),
              "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}  # fmt: skip
    t = {}
    for n in range(num_layers):
        for m in targets:
            block = "mlp" if m in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            name = f"base_model.model.model.layers.{n}.{block}.{m}"
            fin, fout = shapes[m]
            t[f"{name}.lora_A.weight"] = torch.randn(r, fin, generator=g) / fin**0.5
            t[f"{name}.lora_B.weight"] = torch.randn(fout, r, generator=g)
    path.mkdir(parents=True, exist_ok=True)
    save_file(t, str(path / "adapter_model.safetensors"))
    cfg = {"peft_type": "LORA", "r": r, "lora_alpha": alpha, "target_modules": list(targets)}
    (path / "adapter_config.json").write_text(json.dumps(cfg))
