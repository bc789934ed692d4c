"""The operator ↔ runtime contract: every container command line the operator renders is one the
real `pagoda serve` parser (`pagoda.runtime.server.cli.build_parser`) accepts, with the values meant.

Rendered for every example in examples/ and for a spread of CRD field combinations (every enum
value, both booleans, optional integers at their CRD bounds, each kind of model reference,
extraArgs). A flag renamed or a choice dropped on either side fails here, not as a crash-looping
pod.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re
import shlex
from typing import Any

import pytest
import yaml
from operator_harness import ROOT
from pagoda.operator.autoscaling import prometheus, rules
from pagoda.operator.children import serve_args
from pagoda.operator.children.build import build_children
from pagoda.operator.children.config_map import build_config_map, config_hash
from pagoda.operator.children.owner import Owner
from pagoda.operator.spec.inference_service import (
    ATTENTION_BACKENDS,
    BLOCK_SIZES,
    DTYPES,
    InferenceServiceSpec,
)
from pagoda.runtime import options
from pagoda.runtime.multimodal.config import DEFAULT_IMAGE_LIMIT, parse_limits
from pagoda.runtime.option_rules import camel, parse_processor_kwargs, parse_speculative
from pagoda.runtime.pooler_config import PoolerConfig
from pagoda.runtime.server.cli import build_parser, server_config
from pagoda.runtime.spec.config import SpeculativeConfig

OWNER = Owner(name="chat", namespace="team-a", uid="u-1")
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def _examples() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in EXAMPLES:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "InferenceService":
                out.append((f"{path.name}:{doc['metadata']['name']}", doc))
    return out


def _parse(args: list[str]) -> argparse.Namespace:
    try:
        return build_parser().parse_args(args)
    except SystemExit as e:  # argparse reports the bad flag on stderr and exits 2
        raise AssertionError(f"pagoda serve rejects the operator's args: {shlex.join(args)}") from e


def check_rendered(spec: InferenceServiceSpec) -> argparse.Namespace:
    """Build the workload (its leader for a multi-node one) and ConfigMap, parse their command line, compare the values."""
    if spec.adapters and "enable_lora" not in options.SERVE_FLAGS:  # test_adapters.py's too
        pytest.skip("pagoda serve has no LoRA flags yet (the runtime's branch lora adds them)")
    children = build_children(OWNER, spec)
    workload = children.workload  # a Deployment, or a multi-node service's LeaderWorkerSet
    if workload["kind"] == "LeaderWorkerSet":
        template = workload["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    else:
        template = workload["spec"]["template"]
    container = template["spec"]["containers"][0]
    assert container["command"] == ["pagoda", "serve"]
    args = container["args"]
    serve_line = children.get("ConfigMap")["data"]["serve-args"]
    assert shlex.split(serve_line) == ["pagoda", "serve", *args]  # what the ConfigMap records
    parsed = _parse(args)
    expected = {k: v for k, v in serve_args.serve_values(spec).items() if v is not None}
    for dest, value in expected.items():
        got = getattr(parsed, dest)
        assert got == value or (isinstance(got, float) and got == float(value)), (dest, got, value)
    assert parsed.port == container["ports"][0]["containerPort"] == options.DEFAULT_PORT
    server_config(parsed)  # the runtime's own validation of the server flags accepts them
    return parsed


@pytest.mark.parametrize(("name", "doc"), _examples(), ids=[n for n, _ in _examples()])
def test_every_example_renders_args_pagoda_serve_accepts(name: str, doc: dict[str, Any]) -> None:
    spec = InferenceServiceSpec.from_dict(
        doc["spec"], name=doc["metadata"]["name"], default_image="img:1"
    )
    check_rendered(spec)


def _engine_spread() -> list[dict[str, Any]]:
    """Every enum value and boolean at least once, integers at their CRD bounds, extraArgs."""
    combos = [
        {"dtype": d, "attentionBackend": a, "blockSize": b,
         "enablePrefixCaching": p, "enableChunkedPrefill": c}
        for d, a, b, p, c in itertools.product(
            DTYPES, ATTENTION_BACKENDS, BLOCK_SIZES, (True, False), (True, False)
        )
    ]  # fmt: skip
    rng = random.Random(11)
    pooling = random.Random(13)  # its own draws: the other fields' stay as they were
    images = random.Random(17)  # likewise
    processor = random.Random(19)  # likewise
    bounds = {
        "maxNumSeqs": (1, 4096),
        "maxModelLen": (2, 1 << 20),  # the CRD's range (a prompt token and one out)
        "maxQueueLen": (1, 1 << 20),
    }
    for engine in combos:
        for key, (lo, hi) in bounds.items():
            engine[key] = rng.choice((None, lo, hi, rng.randint(lo, hi)))
        if engine["maxNumSeqs"] is not None and rng.random() < 0.7:
            engine["maxNumBatchedTokens"] = rng.choice((engine["maxNumSeqs"], 1 << 20))
        if engine["enableChunkedPrefill"] and rng.random() < 0.5:  # 0: off
            engine["longPrefillTokenThreshold"] = rng.choice((0, 256, 1 << 20))
        if engine["attentionBackend"] != "triton" and rng.random() < 0.5:
            engine["kvCacheDtype"] = rng.choice(("auto", "int8"))
        elif engine["attentionBackend"] != "torch" and rng.random() < 0.5:  # GPU pods
            engine["kvCacheDtype"] = rng.choice(("auto", "fp8"))
            engine["quantization"] = rng.choice((None, "fp8"))
        if rng.random() < 0.3:  # vLLM's JSON; bounds at the runtime's (spec/config.py)
            engine["speculative"] = rng.choice(
                (
                    {"numSpeculativeTokens": 1},
                    {"numSpeculativeTokens": 32, "promptLookupMax": 64, "promptLookupMin": 1},
                    {"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMin": 2},
                )
            )
        if rng.random() < 0.3:
            engine["extraArgs"] = rng.choice(
                (
                    ["--seed", "7"],
                    ["--kv-cache-memory", "1G"],
                    ["--log-level", "debug"],
                    ["--reasoning-parser", "qwen3", "--tool-call-parser", "hermes"],
                )
            )
        if pooling.random() < 0.3:  # the pooling runner's, vLLM's JSON (camelCase here)
            engine["runner"] = pooling.choice(("pooling", "auto", None))
            engine["poolerConfig"] = pooling.choice(
                (
                    {},
                    {"poolingType": "MEAN"},
                    {"poolingType": "CLS", "normalize": False},
                    {"poolingType": "LAST", "normalize": True, "dimensions": 1 << 20},
                )
            )
            if "speculative" in engine and engine["runner"] == "pooling":
                engine["runner"] = "auto"  # speculative decoding with the pooling runner: refused
        if images.random() < 0.3:  # a vision model's cap, vLLM's JSON ({}: the runtime's default)
            engine["limitMMPerPrompt"] = images.choice(({}, {"image": 0}, {"image": 1 << 20}))
        if processor.random() < 0.3:  # the image processor's settings ({}: the checkpoint's)
            engine["mmProcessorKwargs"] = processor.choice(
                ({}, {"max_pixels": 1 << 30}, {"min_pixels": 1, "max_pixels": 1003520})
            )
    return [{k: v for k, v in e.items() if v is not None} for e in combos]


MODELS = (
    {"model": "smollm2-135m"},
    {"model": "smollm2-135m", "servedModelName": "org/chat:v1.2"},
    {"model": "pvc://models/llama-3.1-8b/hf", "servedModelName": "llama"},
    {"model": "pvc://models"},
    {"model": "file:///opt/models/m.gguf"},
    {"model": "/opt/models/hf-dir"},
)


def test_crd_field_combinations_render_args_pagoda_serve_accepts() -> None:
    spreads = _engine_spread()
    assert len(spreads) == len(DTYPES) * len(ATTENTION_BACKENDS) * len(BLOCK_SIZES) * 4
    seen: set[tuple[str, Any]] = set()
    for i, engine in enumerate(spreads):
        spec = {
            **MODELS[i % len(MODELS)],
            "engine": engine,
            "drainTimeoutSeconds": (0, 30, 3600)[i % 3],
        }
        if "fp8" in (engine.get("kvCacheDtype"), engine.get("quantization")):
            spec["resources"] = {"gpus": 1}  # FP8 runs on GPU pods only
        if engine.get("quantization") == "fp8" and spec["model"] in (
            "smollm2-135m",
            "file:///opt/models/m.gguf",
        ):
            spec["model"] = "/opt/models/hf-dir"  # a GGUF keeps its own quantization
        parsed = check_rendered(
            InferenceServiceSpec.from_dict(spec, name="chat", default_image="img:1")
        )
        seen |= {("dtype", parsed.dtype), ("backend", parsed.attention_backend)}
        seen |= {("prefix", parsed.enable_prefix_caching), ("block", parsed.block_size)}
        seen |= {("kv", parsed.kv_cache_dtype), ("quantization", parsed.quantization)}
        want = spec["engine"].get("speculative")
        got = parse_speculative(parsed.speculative_config)  # as `pagoda serve` reads it
        assert (got is None) == (want is None), (want, parsed.speculative_config)
        if got is not None:
            assert (got.num_speculative_tokens, got.prompt_lookup_min) == (
                want["numSpeculativeTokens"],
                want.get("promptLookupMin", want.get("promptLookupMax", 5)),
            )
        seen.add(("speculative", got is not None))
        want = spec["engine"].get("poolerConfig")
        pooler = PoolerConfig.parse(parsed.pooler_config)  # as `pagoda serve` reads it
        assert (pooler is None) == (want is None), (want, parsed.pooler_config)
        if pooler is not None:
            assert {camel(k): v for k, v in pooler.user_keys().items()} == want
        seen.add(("pooler", pooler is not None))
        want = spec["engine"].get("limitMMPerPrompt", {}).get("image", DEFAULT_IMAGE_LIMIT)
        assert parse_limits(parsed.limit_mm_per_prompt)["image"] == want  # the runtime's reader
        seen.add(("images", want))
        want = spec["engine"].get("mmProcessorKwargs") or None
        assert parse_processor_kwargs(parsed.mm_processor_kwargs) == want  # the runtime's reader
        seen.add(("processor", want is not None))
    assert {v for k, v in seen if k == "dtype"} == set(DTYPES)
    assert {v for k, v in seen if k == "block"} == set(BLOCK_SIZES)
    assert {v for k, v in seen if k == "prefix"} == {True, False}
    assert {v for k, v in seen if k == "kv"} == set(options.KV_CACHE_DTYPES)
    assert {v for k, v in seen if k == "quantization"} == {None, *options.QUANTIZATIONS}
    assert {v for k, v in seen if k == "speculative"} == {True, False}
    assert {v for k, v in seen if k == "pooler"} == {True, False}
    assert {v for k, v in seen if k == "images"} == {0, DEFAULT_IMAGE_LIMIT, 1 << 20}
    assert {v for k, v in seen if k == "processor"} == {True, False}


def test_runtime_defaults_are_the_operators() -> None:
    """A spec that sets no engine field renders the runtime's own defaults (or leaves them)."""
    spec = InferenceServiceSpec.from_dict({"model": "smollm2-135m"}, name="a", default_image="i")
    parsed = check_rendered(spec)
    defaults = build_parser().parse_args([])
    for dest in ("dtype", "block_size", "attention_backend", "enable_prefix_caching",
                 "enable_chunked_prefill", "max_num_seqs", "max_queue_len", "max_model_len"):  # fmt: skip
        assert getattr(parsed, dest) == getattr(defaults, dest), dest
    assert parsed.model in options.BUILTIN_MODELS


def test_metric_names_in_queries_and_rules_are_the_runtimes() -> None:
    """The autoscaler's PromQL and the alert rules only name metrics `pagoda serve` exports."""
    exported = {
        v
        for k, v in vars(options).items()
        if k.startswith("METRIC_") and str(v).startswith("pagoda:")
    }
    text = " ".join(prometheus.queries("ns", "chat").values())
    text += json.dumps(rules.rules_document())
    used = set(re.findall(r"pagoda:[A-Za-z0-9_]+", text))
    assert used
    used.discard(rules.THRESHOLD_METRIC)  # recorded by the operator's own per-service rule
    for name in used:
        base = re.sub(r"_(bucket|sum|count|total)$", "", name)
        assert name in exported or base in exported, f"{name} is not a metric of pagoda serve"


@pytest.mark.parametrize(("field", "flag", "value", "gpus"), [
    ("kvCacheDtype", "--kv-cache-dtype", "int8", 0),
    ("kvCacheDtype", "--kv-cache-dtype", "fp8", 1),
    ("quantization", "--quantization", "fp8", 1),
    ("longPrefillTokenThreshold", "--long-prefill-token-threshold", 512, 0),
    ("runner", "--runner", "pooling", 0),  # an embedding model (/v1/embeddings)
])  # fmt: skip
def test_new_engine_fields_render_only_when_set(field, flag, value, gpus) -> None:
    """Flags added after the first release: the default leaves every existing service's command
    line and config hash as they were (an operator upgrade does not roll its pods); a value set
    shows, and the real `pagoda serve` parser reads it back."""
    from pagoda.runtime.server.cli import build_parser

    model = "/opt/models/hf-dir"  # not a GGUF: --quantization fp8 refuses one
    for doc, want in (
        ({"model": model, "resources": {"gpus": gpus}}, None),
        ({"model": model, "resources": {"gpus": gpus}, "engine": {field: value}}, value),
    ):
        spec = InferenceServiceSpec.from_dict(doc, name=OWNER.name, default_image="img:1")
        args = build_children(OWNER, spec).get("Deployment")["spec"]["template"]["spec"][
            "containers"
        ][0]["args"]
        got = args[args.index(flag) + 1] if flag in args else None
        assert got == (None if want is None else str(want))
        engine = json.loads(build_config_map(OWNER, spec)["data"]["engine.json"])
        assert engine.get(field) == want
        dest = flag.removeprefix("--").replace("-", "_")
        parsed = vars(build_parser().parse_args(args))[dest]
        assert parsed == (want or options.SERVE_FLAGS[dest].default)


def test_speculative_renders_vllms_json_only_when_set() -> None:
    """spec.engine.speculative → `--speculative-config` JSON the runtime reads back into the same
    config; unset, no flag and no ConfigMap key (existing services' config hashes stay); set, the
    ConfigMap records it, so a change rolls the pods."""
    model = {"model": "pvc://models/llama/hf", "resources": {"gpus": 1}}
    plain = InferenceServiceSpec.from_dict(model, name=OWNER.name, default_image="img:1")
    assert plain.engine.speculative is None
    assert "--speculative-config" not in serve_args.server_args(plain)
    assert "speculative" not in serve_args.engine_config(plain)
    hashes = set()
    for k in (4, 8):
        body = {**model, "engine": {"speculative": {"numSpeculativeTokens": k, "promptLookupMax": 4,
                                                     "promptLookupMin": 2}}}  # fmt: skip
        spec = InferenceServiceSpec.from_dict(body, name=OWNER.name, default_image="img:1")
        parsed = check_rendered(spec)
        assert parse_speculative(parsed.speculative_config) == SpeculativeConfig(
            num_speculative_tokens=k, method="ngram", prompt_lookup_max=4, prompt_lookup_min=2
        )
        config_map = build_config_map(OWNER, spec)
        assert json.loads(config_map["data"]["engine.json"])["speculative"] == {
            "method": "ngram", "numSpeculativeTokens": k, "promptLookupMax": 4, "promptLookupMin": 2
        }  # fmt: skip
        hashes.add(config_hash(config_map))  # the pod template's annotation: a change rolls pods
    assert len(hashes) == 2
    # one bound given: the other is the same, as the runtime fills it (recorded filled in)
    one = {**model, "engine": {"speculative": {"numSpeculativeTokens": 3, "promptLookupMax": 7}}}
    spec = InferenceServiceSpec.from_dict(one, name=OWNER.name, default_image="img:1")
    got = parse_speculative(check_rendered(spec).speculative_config)
    assert (got.prompt_lookup_max, got.prompt_lookup_min) == (7, 7)


def test_pooler_config_renders_vllms_json_only_when_set() -> None:
    """spec.engine.poolerConfig → `--pooler-config` JSON (vLLM's snake_case keys) the runtime reads
    back into the same config; unset, no flag and no ConfigMap key (existing services' config
    hashes stay); set, the ConfigMap records it (camelCase), so a change rolls the pods."""
    model = {"model": "/opt/models/embed", "engine": {"runner": "pooling"}}
    plain = InferenceServiceSpec.from_dict(model, name=OWNER.name, default_image="img:1")
    assert "--pooler-config" not in serve_args.server_args(plain)
    assert "poolerConfig" not in serve_args.engine_config(plain)
    hashes = set()
    for value in (
        {"poolingType": "MEAN"},
        {"poolingType": "CLS", "normalize": False, "dimensions": 64},
    ):
        body = {**model, "engine": {"runner": "pooling", "poolerConfig": value}}
        spec = InferenceServiceSpec.from_dict(body, name=OWNER.name, default_image="img:1")
        parsed = check_rendered(spec)
        want = PoolerConfig(pooling_type=value["poolingType"], normalize=value.get("normalize"),
                            dimensions=value.get("dimensions"))  # fmt: skip
        assert PoolerConfig.parse(parsed.pooler_config) == want
        config_map = build_config_map(OWNER, spec)
        assert json.loads(config_map["data"]["engine.json"])["poolerConfig"] == value
        hashes.add(config_hash(config_map))
    assert len(hashes) == 2


def test_extra_args_cannot_override_what_the_operator_renders() -> None:
    """engine.extraArgs come last, so argparse would let them win over the spec's own fields
    (the ConfigMap then records one value and the pod runs another) or move the port the probes
    and the Service use. Every flag the operator renders is refused there, naming its field."""
    from pagoda.operator.children.serve_args import serve_values
    from pagoda.operator.spec.fields import SpecError
    from pagoda.operator.spec.pod_fields import OPERATOR_FLAGS

    group = InferenceServiceSpec.from_dict(
        {"model": "hf://org/m", "parallelism": {"nodes": 2}}, name="x", default_image="i"
    )
    assert set(serve_values(group, "worker")) <= set(OPERATOR_FLAGS)
    cases = {
        "--max-num-seqs": "spec.engine.maxNumSeqs",
        "--max-num-seqs=8": "spec.engine.maxNumSeqs",
        "--no-enable-prefix-caching": "spec.engine.enablePrefixCaching",
        "--por": "the operator",  # argparse takes an unambiguous prefix
        "--served-model-name": "spec.servedModelName",
        "--tensor-parallel-size": "spec.parallelism.tensorParallelSize",
        "--api-key": "spec.apiKeySecretRef",
        "--speculative-config": "spec.engine.speculative",
        "--pooler-config": "spec.engine.poolerConfig",
        "--limit-mm-per-prompt": "spec.engine.limitMMPerPrompt",
        "--mm-processor-kwargs": "spec.engine.mmProcessorKwargs",
    }
    for word, field in cases.items():
        spec = {"model": "smollm2-135m", "engine": {"extraArgs": ["--seed", "1", word, "8"]}}
        with pytest.raises(SpecError) as e:
            InferenceServiceSpec.from_dict(spec, name="x", default_image="i")
        assert e.value.reason == "InvalidSpec" and field in e.value.message, e.value
        assert word.split("=")[0] in e.value.message
    for fine in (["--seed", "7"], ["--kv-cache-memory", "1G"], ["--max-num-seqz", "8"]):
        InferenceServiceSpec.from_dict(
            {"model": "smollm2-135m", "engine": {"extraArgs": fine}}, name="x", default_image="i"
        )
