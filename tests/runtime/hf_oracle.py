"""Hugging Face transformers as the correctness oracle (imported by tests; not a conftest)."""

from __future__ import annotations

import torch


def hf_greedy(model, prompt: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy decoding with an explicit KV-cache loop (no EOS handling): tokens and logits."""
    tokens, logits = [], []
    with torch.no_grad():
        out = model(torch.tensor([prompt]), use_cache=True)
        for _ in range(n):
            step = out.logits[0, -1].float()
            logits.append(step)
            tok = int(step.argmax())
            tokens.append(tok)
            out = model(torch.tensor([[tok]]), past_key_values=out.past_key_values, use_cache=True)
    return tokens, logits
