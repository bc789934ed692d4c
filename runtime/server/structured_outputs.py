"""Structured outputs on the server side: request fields → a spec, its grammar compiled off the
event loop, and the metrics.

`response_format` (OpenAI: `json_object`, `json_schema`) and `structured_outputs` (vLLM's extra:
`json`, `regex`, `choice`, `grammar`, `json_object`, `structural_tag`) become one
`StructuredOutputsParams`; giving both is a 400. The grammar is compiled by the tokenizer's
`GrammarCompiler` on its own threads before the request reaches the engine, so an invalid spec
is a 400 naming the field and a slow one holds up neither the event loop nor other requests.

Metrics: `pagoda:structured_output_requests_total{type}` (requests by constraint: json,
json_object, regex, choice, grammar, structural_tag, tool_calls) and
`pagoda:grammar_compile_seconds{type}` (every compile that ran, cache hits excluded).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from pagoda.runtime.engine.info import EngineInfo
from pagoda.runtime.options import METRIC_GRAMMAR_COMPILE, METRIC_STRUCTURED_REQUESTS
from pagoda.runtime.sampling.params import ParamError
from pagoda.runtime.server.protocol import APIError
from pagoda.runtime.structured.params import StructuredOutputsParams
from prometheus_client import CollectorRegistry, Counter, Histogram

log = logging.getLogger("pagoda.server")
COMPILE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
JSON_KINDS = ("json", "json_object")  # the constraints free whitespace applies to
TYPES = ("json", "json_object", "regex", "choice", "grammar", "structural_tag", "tool_calls")


def spec_from_request(req: Any) -> StructuredOutputsParams | None:
    """The request's own output constraint (None: free text); APIError 400 for a bad one."""
    rf, so = getattr(req, "response_format", None), getattr(req, "structured_outputs", None)
    if rf is not None and rf.type != "text" and so is not None:
        raise APIError(400, "give response_format or structured_outputs, not both",
                       param="structured_outputs", code="invalid_value")  # fmt: skip
    try:
        if rf is not None and rf.type == "json_object":
            return StructuredOutputsParams(json_object=True, field="response_format")
        if rf is not None and rf.type == "json_schema":
            js = rf.json_schema
            if js is None or js.schema_ is None:
                missing = "response_format.json_schema" + (".schema" if js else "")
                raise APIError(400, f"'{missing}' is a required property", param=missing,
                               code="missing_required_parameter")  # fmt: skip
            return StructuredOutputsParams(
                json=js.schema_, field="response_format.json_schema.schema"
            )
        if so is None:
            return None
        kw = {
            "json": so.json_,
            "regex": so.regex,
            "choice": so.choice,
            "grammar": so.grammar,
            "json_object": bool(so.json_object),
            "structural_tag": so.structural_tag,
        }
        if so.disable_any_whitespace is not None:
            kw["disable_any_whitespace"] = so.disable_any_whitespace
        given = [  # `"json": false` is a (refused) schema, `"json_object": false` nothing
            k
            for k, v in kw.items()
            if k != "disable_any_whitespace"
            and (v not in (None, False) or (k == "json" and v is False))
        ]
        where = f"structured_outputs.{given[0]}" if len(given) == 1 else "structured_outputs"
        if so.disable_any_whitespace is False and given and given[0] not in JSON_KINDS:
            raise APIError(400, "structured_outputs.disable_any_whitespace applies to json and "
                           f"json_object only, not {given[0]}",
                           param="structured_outputs.disable_any_whitespace",
                           code="invalid_value")  # fmt: skip
        return StructuredOutputsParams(**kw, field=where)
    except ParamError as e:
        raise APIError(400, e.message, param=e.field, code="invalid_value") from e


class StructuredOutputs:
    """Compiles specs for one engine's tokenizer and counts what is asked."""

    def __init__(
        self,
        model_name: str,
        registry: CollectorRegistry,
        *,
        cache_bytes: int | None = None,
        timeout_s: float | None = None,
        engine_here: bool = True,
    ) -> None:
        """`engine_here`: the engine runs in this process (its thread) and shares this
        process's compiler, whose engine-side tables are then built ahead (`_make`)."""
        self.engine_here = engine_here
        lab = ["model_name", "type"]
        self.requests = Counter(METRIC_STRUCTURED_REQUESTS,
                                "Requests with constrained output, by constraint type.", lab,
                                registry=registry)  # fmt: skip
        self.compile_seconds = Histogram(
            METRIC_GRAMMAR_COMPILE, "Grammar compile time (cache misses), by constraint type.",
            lab, registry=registry, buckets=COMPILE_BUCKETS,
        )  # fmt: skip
        self.model_name = model_name
        self.cache_bytes, self.timeout_s = cache_bytes, timeout_s
        self._compiler = None
        self._lock = asyncio.Lock()

    async def compiler(self, info: EngineInfo):
        """The tokenizer's compiler, made off the event loop on first use (imports xgrammar and
        reads the vocabulary: a few seconds, once)."""
        if self._compiler is None:
            async with self._lock:
                if self._compiler is None:
                    self._compiler = await asyncio.get_running_loop().run_in_executor(
                        None, self._make, info
                    )
        return self._compiler

    def _make(self, info: EngineInfo):
        from pagoda.runtime.structured.compiler import compiler_for

        comp = compiler_for(info.tokenizer, info.vocab_size)
        comp.configure(cache_bytes=self.cache_bytes, timeout_s=self.timeout_s)
        if self.engine_here:  # the engine's tables (torch), here rather than in its first
            comp.prepare()  # constrained step; the engine process builds its own
        name, hist = self.model_name, self.compile_seconds
        comp.observer = lambda spec, seconds: hist.labels(name, _label(spec)).observe(seconds)
        return comp

    async def compile(
        self, info: EngineInfo, spec: StructuredOutputsParams
    ) -> StructuredOutputsParams:
        """The spec with its grammar compiled (ParamError for an invalid or too slow one)."""
        comp = await self.compiler(info)
        return await comp.compile_async(spec)

    def count(self, spec: StructuredOutputsParams) -> None:
        self.requests.labels(self.model_name, _label(spec)).inc()


def _label(spec: StructuredOutputsParams) -> str:
    """The client's constraint (a reasoning model's answer grammar is labelled by what it
    wraps, not `structural_tag`)."""
    return "tool_calls" if spec.field == "tools" else spec.asked or spec.kind
