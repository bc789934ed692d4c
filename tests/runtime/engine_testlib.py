"""Helpers shared by engine tests that compare two engines' outputs."""

from __future__ import annotations


def summary(outputs) -> list:
    """Everything a client sees of `LLM.generate` outputs, per prompt and sample."""
    return [
        [(c.text, c.token_ids, c.finish_reason, c.stop_reason, c.logprobs) for c in o.outputs]
        for o in outputs
    ]
