"""Spec parsing: defaults, model references, and the errors that become `Degraded` reasons."""

from __future__ import annotations

from typing import Any

import pytest
from pagoda.operator.spec.config import OperatorConfig
from pagoda.operator.spec.fields import SpecError
from pagoda.operator.spec.inference_service import InferenceServiceSpec
from pagoda.operator.spec.model_ref import ModelRef


def parse(spec: dict[str, Any], name: str = "demo") -> InferenceServiceSpec:
    return InferenceServiceSpec.from_dict(spec, name=name, default_image="img:1")


@pytest.mark.parametrize(
    ("uri", "source", "server_arg", "claim"),
    [
        ("smollm2-135m", "builtin", "smollm2-135m", None),
        ("pvc://models/llama/model.gguf", "pvc", "/mnt/models/llama/model.gguf", "models"),
        ("pvc://models", "pvc", "/mnt/models", "models"),
        ("pvc://models//a/./b/", "pvc", "/mnt/models/a/b", "models"),
        ("/opt/weights/qwen", "image", "/opt/weights/qwen", None),
        ("file:///opt/w.gguf", "image", "/opt/w.gguf", None),
    ],
)
def test_model_references(uri: str, source: str, server_arg: str, claim: str | None) -> None:
    ref = ModelRef.parse(uri)
    assert (ref.source, ref.server_arg, ref.claim) == (source, server_arg, claim)


@pytest.mark.parametrize(
    ("uri", "reason", "words"),
    [
        (
            "llama-70b",
            "UnknownModel",
            "unknown built-in model 'llama-70b' (built-in: smollm2-135m)",
        ),
        ("gs://bucket/model", "UnsupportedModelURI", "scheme gs:// is not supported"),
        ("hf://meta-llama", "InvalidModel", "expected hf://ORG/NAME[@REVISION]"),
        ("hf://org/m@bad..rev", "InvalidModel", "invalid revision"),
        ("s3://B/model", "InvalidModel", "valid bucket name"),
        ("pvc://Bad_Claim/x", "InvalidModel", "valid claim name"),
        ("pvc:///x", "InvalidModel", "valid claim name"),
        ("pvc://models/../etc", "InvalidModel", "'..' is not allowed"),
        ("file://relative", "InvalidModel", "file:///ABSOLUTE/PATH"),
    ],
)
def test_bad_model_references(uri: str, reason: str, words: str) -> None:
    with pytest.raises(SpecError) as e:
        ModelRef.parse(uri)
    assert e.value.reason == reason and words in e.value.message


def test_defaults() -> None:
    s = parse({"model": "/w"})
    assert s.image == "img:1" and s.replicas == 1 and s.served_model_name == "demo"
    assert (s.resources.gpus, s.resources.cpu, s.resources.memory) == (0, "1", "2Gi")
    assert s.engine.dtype == "auto" and s.engine.block_size == 16 and s.engine.enable_prefix_caching
    assert s.autoscaling is None and s.api_key_secret is None
    assert s.desired_replicas(5) == 1


@pytest.mark.parametrize(
    ("spec", "reason", "words"),
    [
        (
            {
                "model": "smollm2-135m",
                "autoscaling": {"minReplicas": 5, "maxReplicas": 2, "targetQueueDepth": 1},
            },
            "InvalidSpec",
            "minReplicas (5) must be <= maxReplicas (2)",
        ),
        (
            {"model": "smollm2-135m", "autoscaling": {"maxReplicas": 2}},
            "InvalidSpec",
            "targetTTFTSeconds or targetQueueDepth",
        ),
        (
            {"model": "smollm2-135m", "resources": {"gpus": -1}},
            "InvalidSpec",
            "spec.resources.gpus must be between 0 and 16",
        ),
        (
            {"model": "smollm2-135m", "resources": {"memory": "lots"}},
            "InvalidSpec",
            "not a valid non-negative quantity",
        ),
        (
            {"model": "smollm2-135m", "replicas": "3"},
            "InvalidSpec",
            "spec.replicas must be an integer",
        ),
        (
            {"model": "smollm2-135m", "engine": {"dtype": "int8"}},
            "InvalidSpec",
            "spec.engine.dtype must be one of",
        ),
        (
            {"model": "smollm2-135m", "engine": {"kvCacheDtype": "fp4"}},
            "InvalidSpec",
            "spec.engine.kvCacheDtype must be one of",
        ),
        (
            {"model": "smollm2-135m", "engine": {"quantization": "awq"}},
            "InvalidSpec",
            "spec.engine.quantization must be one of fp8",
        ),
        (
            {"model": "smollm2-135m", "engine": {"kvCacheDtype": "fp8"}},
            "InvalidSpec",
            "spec.engine.kvCacheDtype fp8 runs on GPU pods only",
        ),
        (
            {
                "model": "smollm2-135m",
                "resources": {"gpus": 1},
                "engine": {
                    "quantization": "fp8",
                    "kvCacheDtype": "fp8",
                    "attentionBackend": "torch",
                },
            },
            "InvalidSpec",
            "spec.engine.kvCacheDtype fp8 and quantization fp8 runs on GPU pods only",
        ),
        (  # the runtime refuses FP8 over a GGUF's own quantization (exit 2, a crash loop)
            {
                "model": "file:///m/x.gguf",
                "resources": {"gpus": 1},
                "engine": {"quantization": "fp8"},
            },
            "InvalidSpec",
            "spec.engine.quantization fp8 quantizes 16/32-bit safetensors checkpoints; spec.model",
        ),
        (
            {"model": "smollm2-135m", "resources": {"gpus": 1}, "engine": {"kvCacheDtype": "int8"}},
            "InvalidSpec",
            "kvCacheDtype int8 runs on CPU pods only",
        ),
        (
            {
                "model": "smollm2-135m",
                "engine": {"longPrefillTokenThreshold": 256, "enableChunkedPrefill": False},
            },
            "InvalidSpec",
            "spec.engine.longPrefillTokenThreshold (256) needs enableChunkedPrefill (or set "
            "longPrefillTokenThreshold to 0)",
        ),
        (
            {"model": "smollm2-135m", "engine": {"longPrefillTokenThreshold": True}},
            "InvalidSpec",
            "spec.engine.longPrefillTokenThreshold must be an integer",
        ),
        (
            {
                "model": "smollm2-135m",
                "engine": {"kvCacheDtype": "int8", "attentionBackend": "triton"},
            },
            "InvalidSpec",
            "kvCacheDtype int8 runs on CPU pods only",
        ),
        (
            {"model": "smollm2-135m", "engine": {"maxNumSeqs": 64, "maxNumBatchedTokens": 8}},
            "InvalidSpec",
            "must be >=",
        ),
        (
            {"model": "smollm2-135m", "env": [{"name": "A"}, {"name": "A"}]},
            "InvalidSpec",
            "duplicate",
        ),
        (
            {
                "model": "smollm2-135m",
                "apiKeySecretRef": {"name": "k"},
                "env": [{"name": "PAGODA_API_KEY", "value": "x"}],
            },
            "InvalidSpec",
            "keep one",
        ),
        (  # the runtime needs a prompt token and one generated (it refuses 1 at start)
            {"model": "smollm2-135m", "engine": {"maxModelLen": 1}},
            "InvalidSpec",
            "maxModelLen",
        ),
        ({}, "InvalidSpec", "spec.model is required"),
        ({"model": "nope"}, "UnknownModel", "unknown built-in model"),
        # a falsy non-object is refused, not read as "unset" (the schema may not be applied)
        (
            {"model": "smollm2-135m", "parallelism": []},
            "InvalidSpec",
            "spec.parallelism must be an object",
        ),
        (
            {"model": "smollm2-135m", "resources": ""},
            "InvalidSpec",
            "spec.resources must be an object",
        ),
        (
            {"model": "smollm2-135m", "engine": False},
            "InvalidSpec",
            "spec.engine must be an object",
        ),
        (
            {"model": "smollm2-135m", "autotune": []},
            "InvalidSpec",
            "spec.autotune must be an object",
        ),
        (
            {"model": "smollm2-135m", "engine": {"extraArgs": ""}},
            "InvalidSpec",
            "must be a list of strings",
        ),
        ({"model": "smollm2-135m", "env": {}}, "InvalidSpec", "spec.env must be a list of objects"),
        (
            {"model": "smollm2-135m", "env": [{"name": "A", "valueFrom": {"secretKeyRef": 1.5}}]},
            "InvalidSpec",
            "spec.env: A: valueFrom.secretKeyRef must be an object",
        ),
        (
            {"model": "smollm2-135m", "env": [{"name": "A", "valueFrom": {"fieldRef": ["x"]}}]},
            "InvalidSpec",
            "spec.env: A: valueFrom.fieldRef must be an object",
        ),
        (
            {"model": "smollm2-135m", "env": [{"name": "A", "value": 1}]},
            "InvalidSpec",
            "spec.env: A: value must be a string",
        ),
        (
            {
                "model": "smollm2-135m",
                "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s"}}}],
            },
            "InvalidSpec",
            "spec.env: A: valueFrom.secretKeyRef.key is required",
        ),
        (
            {"model": "smollm2-135m", "tolerations": [{"operator": "Exists", "value": {}}]},
            "InvalidSpec",
            "spec.tolerations[0].value must be a string",
        ),
        (
            {"model": "smollm2-135m", "tolerations": [{"key": "k", "operator": "exists"}]},
            "InvalidSpec",
            "spec.tolerations[0].operator must be one of Exists, Equal",
        ),
        (
            {"model": "smollm2-135m", "tolerations": [{"key": "k", "effect": "NoSchedul"}]},
            "InvalidSpec",
            "spec.tolerations[0].effect must be one of",
        ),
        (
            {
                "model": "smollm2-135m",
                "tolerations": [{"key": "k", "effect": "NoExecute", "tolerationSeconds": "60"}],
            },
            "InvalidSpec",
            "spec.tolerations[0].tolerationSeconds must be an integer",
        ),
        *(  # spec.engine.speculative: the runtime's bounds (spec/config.py), camelCase names
            ({"model": "smollm2-135m", "engine": {"speculative": bad}}, "InvalidSpec", words)
            for bad, words in (
                ({}, "spec.engine.speculative.numSpeculativeTokens is required"),
                ({"numSpeculativeTokens": 33}, "numSpeculativeTokens must be between 1 and 32"),
                ({"numSpeculativeTokens": True}, "numSpeculativeTokens must be an integer"),
                ({"numSpeculativeTokens": 4, "method": "eagle"}, "method must be one of ngram"),
                ({"numSpeculativeTokens": 4, "promptLookupMax": 65}, "between 1 and 64"),
                ({"numSpeculativeTokens": 4, "promptLookupMin": 0}, "between 1 and 64"),
                (
                    {"numSpeculativeTokens": 4, "promptLookupMax": 2, "promptLookupMin": 3},
                    "spec.engine.speculative.promptLookupMin (3) must be <= promptLookupMax (2)",
                ),
                ({"num_speculative_tokens": 4}, "unknown field(s) num_speculative_tokens"),
                ([4], "spec.engine.speculative must be an object"),
            )
        ),
    ],
)
def test_spec_errors(spec: dict[str, Any], reason: str, words: str) -> None:
    with pytest.raises(SpecError) as e:
        parse(spec)
    assert e.value.reason == reason and words in e.value.message, e.value


@pytest.mark.parametrize("name", ["Demo", "9lives", "a" * 53, "with_underscore"])
def test_invalid_names(name: str) -> None:
    with pytest.raises(SpecError) as e:
        parse({"model": "smollm2-135m"}, name=name)
    assert e.value.reason == "InvalidName"


def test_operator_config_is_validated() -> None:
    assert OperatorConfig().clusterwide and OperatorConfig(namespaces=("a",)).clusterwide is False
    assert OperatorConfig().service_url("x", "ns") == "http://x.ns.svc.cluster.local:8000/v1"
    for bad in (
        {"namespaces": ("Bad",)},
        {"namespaces": ("a", "a")},
        {"http_port": 70000},
        {"resync_interval_s": 0},
        {"log_format": "xml"},
        {"default_image": "has space"},
    ):
        with pytest.raises(ValueError):
            OperatorConfig(**bad)


def test_operator_config_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGODA_DEFAULT_IMAGE", "registry/pagoda:2")
    monkeypatch.setenv("PAGODA_OPERATOR_NAMESPACES", "a,b")
    config = OperatorConfig.from_env(resync_interval_s=5.0)
    assert config.default_image == "registry/pagoda:2" and config.namespaces == ("a", "b")
    assert config.resync_interval_s == 5.0


@pytest.mark.parametrize(
    ("resources", "words"),
    [
        ({"memory": "4Gi", "memoryLimit": "2Gi"}, "spec.resources.memory (4Gi) must be <= spec.resources.memoryLimit (2Gi)"),
        ({"cpu": "4", "cpuLimit": "2"}, "spec.resources.cpu (4) must be <= spec.resources.cpuLimit (2)"),
        ({"cpuLimit": "500m"}, "spec.resources.cpu (1) must be <= spec.resources.cpuLimit (500m)"),
    ],
)  # fmt: skip
def test_requests_above_limits_are_refused(resources: dict[str, Any], words: str) -> None:
    """The API server refuses such pods: say so in the spec's terms, not as a rejected child."""
    with pytest.raises(SpecError) as e:
        parse({"model": "smollm2-135m", "resources": resources})
    assert e.value.reason == "InvalidSpec" and words in e.value.message, e.value
    for fine in ({"cpu": "2", "cpuLimit": "2000m"}, {"memory": "1Gi", "memoryLimit": "1024Mi"}):
        parse({"model": "smollm2-135m", "resources": fine})
