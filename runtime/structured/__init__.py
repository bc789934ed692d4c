"""Structured outputs: grammar-constrained decoding with xgrammar.

params (what a request asks, torch-free) → schema (JSON Schemas checked and normalised) →
compiler (xgrammar compile, cached per spec and tokenizer, off the event loop, time-bounded) →
matcher (one request's grammar state, derived from its tokens; its way out before max_tokens) →
bitmask (the model runner's hook: fill and apply the step's masks before the sampler).
"""
