"""Pagoda's inference runtime: paged KV cache, continuous batching, OpenAI-compatible server."""

from pagoda.runtime.engine.llm import LLM
from pagoda.runtime.engine.outputs import CompletionOutput, RequestOutput
from pagoda.runtime.sampling import SamplingParams

__all__ = ["LLM", "CompletionOutput", "RequestOutput", "SamplingParams"]
