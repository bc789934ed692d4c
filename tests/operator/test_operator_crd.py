"""The CRD itself, the examples against it, and its defaults against the operator's."""

from __future__ import annotations

import pathlib
from typing import Any

import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml
from crd_schema import apply_defaults, defaults, validate, version_schema
from operator_harness import ROOT, load_crd
from pagoda.operator.spec import inference_service as spec_mod
from pagoda.operator.spec.config import OperatorConfig
from pagoda.operator.spec.inference_service import InferenceServiceSpec
from pagoda.operator.spec.model_ref import LoraSpec
from pagoda.runtime.spec.config import SpeculativeConfig

K8S_VERSIONS = (
    "1.29.0",  # the oldest supported (charts/pagoda/Chart.yaml kubeVersion, README)
    "1.32.0",
    kubernetes_validate.utils.latest_version(),
)  # the oldest supported, kubectl's here, newest bundled
EXAMPLES = ROOT / "examples"


def _isvcs(path: pathlib.Path) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return [d for d in docs if d.get("kind") == "InferenceService"]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_crd_passes_kubernetes_validate_strict(version: str) -> None:
    kubernetes_validate.validate(load_crd(), version, strict=True)


def test_crd_shape() -> None:
    crd = load_crd()
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "inferenceservices.serving.pagoda.dev"
    assert (spec["group"], spec["scope"], spec["names"]["shortNames"]) == (
        "serving.pagoda.dev",
        "Namespaced",
        ["isvc"],
    )
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"]["status"] == {}
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    columns = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert columns == ["Ready", "Replicas", "Model", "URL", "Age"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert {
        "conditions",
        "replicas",
        "readyReplicas",
        "selector",
        "url",
        "observedGeneration",
        "autoscaling",
    } <= set(status)
    assert status["autoscaling"].get("x-kubernetes-preserve-unknown-fields") is True


def _walk(schema: Any, path: str = ""):
    if isinstance(schema, dict):
        yield path, schema
        for key, sub in (schema.get("properties") or {}).items():
            yield from _walk(sub, f"{path}.{key}")
        if isinstance(schema.get("items"), dict):
            yield from _walk(schema["items"], f"{path}[]")
        if isinstance(schema.get("additionalProperties"), dict):
            yield from _walk(schema["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural_and_preserves_unknown_fields_only_for_status_autoscaling() -> None:
    schema = version_schema(load_crd())
    for path, node in _walk(schema):
        int_or_string = node.get("x-kubernetes-int-or-string")
        assert "type" in node or int_or_string, f"{path} has no type (not structural)"
        if node.get("x-kubernetes-preserve-unknown-fields"):
            # the autoscaler's fields, and its versioned memory (autoscaling/memory.py)
            assert path in (".status.autoscaling", ".status.autoscaling.state"), path
        if int_or_string:
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path


@pytest.mark.parametrize(
    "name",
    [
        "smollm2-cpu.yaml",
        "llama-gpu.yaml",
        "llama-gpu-speculative.yaml",
        "llama-gpu-lora.yaml",
        "llama-gpu-draft.yaml",
        "qwen3-hf.yaml",
        "llama-70b-s3-multinode.yaml",
    ],
)
def test_examples_validate_against_the_crd(name: str) -> None:
    isvcs = _isvcs(EXAMPLES / name)
    assert isvcs, f"{name} has no InferenceService"
    for doc in isvcs:
        assert validate(load_crd(), doc) == []
        # and the operator accepts it, with or without the server's defaulting
        for body in (doc, apply_defaults(version_schema(load_crd()), doc)):
            InferenceServiceSpec.from_dict(
                body["spec"], name=doc["metadata"]["name"], default_image="img:1"
            )


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("min-greater-than-max.yaml", "spec.autoscaling: minReplicas must be <= maxReplicas"),
        ("negative-gpus.yaml", "spec.resources.gpus: -1 is less than the minimum of 0"),
        (
            "unknown-field.yaml",
            "spec: Additional properties are not allowed ('replica' was unexpected)",
        ),
    ],
)
def test_bad_examples_fail_with_a_readable_message(name: str, expected: str) -> None:
    (doc,) = _isvcs(EXAMPLES / "invalid" / name)
    assert validate(load_crd(), doc) == [expected]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {"model": "m", "engine": {"maxNumSeqs": 64, "maxNumBatchedTokens": 32}},
            "maxNumBatchedTokens must be >= maxNumSeqs",
        ),
        (
            {"model": "m", "autoscaling": {"maxReplicas": 3}},
            "set targetTTFTSeconds or targetQueueDepth",
        ),
        ({"model": "m", "engine": {"dtype": "int4"}}, "spec.engine.dtype: 'int4' is not one of"),
        (
            {"model": "m", "resources": {"gpus": 1}, "engine": {"kvCacheDtype": "int8"}},
            "kvCacheDtype int8 runs on CPU pods only",
        ),
        (
            {"model": "m", "engine": {"kvCacheDtype": "int8", "attentionBackend": "triton"}},
            "kvCacheDtype int8 runs on CPU pods only",
        ),
        (
            {"model": "m", "engine": {"kvCacheDtype": "fp8"}},
            "engine.kvCacheDtype fp8 and engine.quantization fp8 run on GPU pods only",
        ),
        (
            {
                "model": "m",
                "resources": {"gpus": 1},
                "engine": {"quantization": "fp8", "attentionBackend": "torch"},
            },
            "engine.kvCacheDtype fp8 and engine.quantization fp8 run on GPU pods only",
        ),
        ({"model": "m", "engine": {"quantization": "awq"}}, "'awq' is not one of ['fp8']"),
        (
            {
                "model": "m",
                "engine": {"longPrefillTokenThreshold": 256, "enableChunkedPrefill": False},
            },
            "longPrefillTokenThreshold needs enableChunkedPrefill (or set longPrefillTokenThreshold to 0)",
        ),
        (
            {"model": "m", "engine": {"longPrefillTokenThreshold": -1}},
            "-1 is less than the minimum of 0",
        ),
        (
            {"model": "m", "resources": {"memory": "-1Gi"}},
            "spec.resources.memory: '-1Gi' does not match",
        ),
        ({"model": "m", "env": [{"value": "x"}]}, "'name' is a required property"),
        (
            {"model": "m", "parallelism": {"nodes": 2, "tensorParallelSize": 3}},
            "tensorParallelSize must be a multiple of nodes",
        ),
        (
            {
                "model": "m",
                "resources": {"gpus": 8},
                "parallelism": {"nodes": 2, "tensorParallelSize": 8},
            },
            "tensorParallelSize must equal resources.gpus × parallelism.nodes",
        ),
        (
            {"model": "m", "resources": {"gpus": 2}, "autotune": {"enabled": True}},
            "cannot tune a tensor-parallel one",
        ),
        (
            {
                "model": "m",
                "resources": {"gpus": 1},
                "autotune": {"enabled": True},
                "parallelism": {"nodes": 2},
            },
            "cannot tune a tensor-parallel one",
        ),
        ({"model": "m", "parallelism": {"nodes": 65}}, "65 is greater than the maximum of 64"),
        (
            {
                "model": "m",
                "engine": {
                    "speculative": {
                        "numSpeculativeTokens": 4,
                        "promptLookupMax": 2,
                        "promptLookupMin": 3,
                    }
                },
            },
            "promptLookupMin must be <= promptLookupMax",
        ),
        *(
            (
                {
                    "model": "m",
                    "autoscaling": {"maxReplicas": 2, "targetQueueDepth": 1, "prometheusURL": url},
                },
                "spec.autoscaling.prometheusURL: ",
            )
            for url in ("http://p/admin?x=", "http://p/#f", "http://u:pw@p:9090")
        ),
        (
            {"model": "m", "modelCache": {"downloadDeadlineSeconds": -1}},
            "-1 is less than the minimum of 0",
        ),
        ({}, "spec: 'model' is a required property"),
    ],
)
def test_schema_and_cel_rules_reject(spec: dict[str, Any], expected: str) -> None:
    doc = {
        "apiVersion": "serving.pagoda.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "x"},
        "spec": spec,
    }
    errors = validate(load_crd(), doc)
    assert any(expected in e for e in errors), errors


def test_metadata_name_rule() -> None:
    doc = {
        "apiVersion": "serving.pagoda.dev/v1alpha1",
        "kind": "InferenceService",
        "spec": {"model": "m"},
    }
    assert validate(load_crd(), {**doc, "metadata": {"name": "ok-name"}}) == []
    for bad in ("Upper", "1starts-with-digit", "x" * 53):
        (error,) = validate(load_crd(), {**doc, "metadata": {"name": bad}})
        assert error.startswith("<root>: metadata.name must be a DNS-1035 label")
    group = {**doc, "spec": {"model": "m", "parallelism": {"nodes": 2}}}
    assert validate(load_crd(), {**group, "metadata": {"name": "x" * 45}}) == []
    (error,) = validate(load_crd(), {**group, "metadata": {"name": "x" * 46}})
    assert "multi-node service (spec.parallelism.nodes > 1) must be at most 45" in error
    assert validate(load_crd(), {**doc, "metadata": {"name": "x" * 52}}) == []


def test_crd_defaults_equal_the_operator_defaults() -> None:
    """One set of defaults: what the API server fills in is what the operator assumes."""
    declared = defaults(version_schema(load_crd())["properties"]["spec"])
    parsed = InferenceServiceSpec.from_dict(
        {
            "model": "smollm2-135m",
            "autoscaling": {"maxReplicas": 2, "targetQueueDepth": 1},
            "apiKeySecretRef": {"name": "s"},
        },
        name="x",
        default_image="img",
    )
    assert parsed.autoscaling is not None and parsed.api_key_secret is not None
    expected = {
        "imagePullPolicy": parsed.image_pull_policy,
        "replicas": parsed.replicas,
        "startupTimeoutSeconds": parsed.startup_timeout_seconds,
        "drainTimeoutSeconds": parsed.drain_timeout_seconds,
        "resources.gpus": parsed.resources.gpus,
        "engine.blockSize": parsed.engine.block_size,
        "engine.kvCacheDtype": parsed.engine.kv_cache_dtype,
        "engine.enablePrefixCaching": parsed.engine.enable_prefix_caching,
        "engine.enableChunkedPrefill": parsed.engine.enable_chunked_prefill,
        "engine.dtype": parsed.engine.dtype,
        "engine.attentionBackend": parsed.engine.attention_backend,
        "engine.speculative.method": SpeculativeConfig(num_speculative_tokens=1).method,
        "engine.lora.maxLoraRank": LoraSpec().max_lora_rank,
        "autoscaling.minReplicas": parsed.autoscaling.min_replicas,
        "autoscaling.scaleUpStabilizationSeconds": parsed.autoscaling.scale_up_stabilization_seconds,
        "autoscaling.scaleDownStabilizationSeconds": parsed.autoscaling.scale_down_stabilization_seconds,
        "autoscaling.tolerance": parsed.autoscaling.tolerance,
        "apiKeySecretRef.key": parsed.api_key_secret.key,
        "parallelism.nodes": parsed.parallelism.nodes,
    }
    assert declared == expected


def test_crd_enums_equal_the_operator_enums() -> None:
    props = version_schema(load_crd())["properties"]["spec"]["properties"]
    engine = props["engine"]["properties"]
    assert tuple(engine["dtype"]["enum"]) == spec_mod.DTYPES
    assert tuple(engine["attentionBackend"]["enum"]) == spec_mod.ATTENTION_BACKENDS
    assert tuple(engine["blockSize"]["enum"]) == spec_mod.BLOCK_SIZES
    assert tuple(engine["kvCacheDtype"]["enum"]) == spec_mod.KV_CACHE_DTYPES
    assert tuple(engine["quantization"]["enum"]) == spec_mod.QUANTIZATIONS
    assert tuple(props["imagePullPolicy"]["enum"]) == spec_mod.PULL_POLICIES


def test_crd_speculative_bounds_are_the_runtimes() -> None:
    """spec.engine.speculative takes what `pagoda serve --speculative-config` takes."""
    from pagoda.runtime.spec import config as spec_config

    props = version_schema(load_crd())["properties"]["spec"]["properties"]
    spec = props["engine"]["properties"]["speculative"]
    from pagoda.operator.spec.engine import SPECULATIVE_METHODS
    from pagoda.operator.spec.model_ref import MAX_SOURCE

    assert tuple(spec["properties"]["method"]["enum"]) == tuple(SPECULATIVE_METHODS)
    # each CRD method is one of the runtime's, draftModel its draft_model
    assert set(SPECULATIVE_METHODS.values()) == {*spec_config.METHODS, spec_config.DRAFT_MODEL}
    assert spec["properties"]["model"]["maxLength"] == MAX_SOURCE
    tokens = spec["properties"]["numSpeculativeTokens"]
    assert tokens["maximum"] == spec_config.MAX_SPECULATIVE_TOKENS
    for key in ("promptLookupMax", "promptLookupMin"):
        assert spec["properties"][key]["maximum"] == spec_config.MAX_PROMPT_LOOKUP
    doc = {"apiVersion": "serving.pagoda.dev/v1alpha1", "kind": "InferenceService",
           "metadata": {"name": "x"}}  # fmt: skip
    spec_doc = {"model": "m", "resources": {"gpus": 1},  # one GPU, one rank
                "engine": {"speculative": {"numSpeculativeTokens": 32, "promptLookupMin": 64}}}  # fmt: skip
    assert validate(load_crd(), {**doc, "spec": spec_doc}) == []


def test_default_image_comes_from_operator_settings() -> None:
    config = OperatorConfig(default_image="registry.example/pagoda:9")
    parsed = InferenceServiceSpec.from_dict(
        {"model": "smollm2-135m"}, name="x", default_image=config.default_image
    )
    assert parsed.image == "registry.example/pagoda:9"


def test_fp8_on_gpu_pods_is_valid() -> None:
    doc = {"apiVersion": "serving.pagoda.dev/v1alpha1", "kind": "InferenceService",
           "metadata": {"name": "x"}}  # fmt: skip
    for engine in ({"quantization": "fp8"}, {"kvCacheDtype": "fp8", "attentionBackend": "triton"},
                   {"quantization": "fp8", "kvCacheDtype": "fp8"}):  # fmt: skip
        spec = {"model": "m", "resources": {"gpus": 1}, "engine": engine}
        assert validate(load_crd(), {**doc, "spec": spec}) == [], engine


# Pod fields the API server would refuse in the Deployment (a ChildRejected service that never
# starts): the CRD refuses them at `kubectl apply`, and the operator with the same words.
_M = "smollm2-135m"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {"model": _M, "tolerations": [{"operator": "Equal", "value": "x"}]},
            "a toleration without a key must have operator Exists",
        ),
        (
            {"model": _M, "tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]},
            "a toleration with operator Exists must not set a value",
        ),
        (
            {"model": _M, "tolerations": [{"key": "k", "effect": "NoSchedule", "tolerationSeconds": 5}]},
            "tolerationSeconds needs effect NoExecute",
        ),
        (
            {"model": _M, "env": [{"name": "A", "value": "x",
                                   "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]},
            "value or valueFrom, not both",
        ),
        (
            {"model": _M, "env": [{"name": "A", "valueFrom": {}}]},
            "valueFrom must set exactly one of",
        ),
        (
            {"model": _M, "env": [{"name": "A", "valueFrom": {
                "fieldRef": {"fieldPath": "metadata.name"}, "secretKeyRef": {"name": "s", "key": "k"}}}]},
            "valueFrom must set exactly one of",
        ),
        (
            {"model": _M, "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"key": "k"}}}]},
            "name",
        ),
    ],
)  # fmt: skip
def test_pod_fields_the_api_server_would_refuse_are_refused_up_front(
    spec: dict[str, Any], expected: str
) -> None:
    refused_by_both(spec, expected, expected)


def refused_by_both(spec: dict[str, Any], crd_says: str, operator_says: str) -> None:
    """The CRD's schema and CEL refuse `spec` (`crd_says` in an error), and so does the
    operator (an API server without the schema): InvalidSpec, `operator_says` in its message."""
    doc = {"apiVersion": "serving.pagoda.dev/v1alpha1", "kind": "InferenceService",
           "metadata": {"name": "x"}, "spec": spec}  # fmt: skip
    errors = validate(load_crd(), doc)
    assert any(crd_says in e for e in errors), errors
    with pytest.raises(spec_mod.SpecError) as e:
        InferenceServiceSpec.from_dict(spec, name="x", default_image="img:1")
    assert e.value.reason == "InvalidSpec" and operator_says in e.value.message, e.value


def test_valid_tolerations_and_env_sources_pass_both() -> None:
    spec = {
        "model": _M,
        "tolerations": [
            {"operator": "Exists"},
            {"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
            {"key": "dedicated", "value": "llm", "effect": "NoSchedule"},
        ],
        "env": [
            {"name": "A", "value": ""},
            {"name": "B", "value": "", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "C", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
            {"name": "D", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k", "optional": True}}},
        ],
    }  # fmt: skip
    doc = {"apiVersion": "serving.pagoda.dev/v1alpha1", "kind": "InferenceService",
           "metadata": {"name": "x"}, "spec": spec}  # fmt: skip
    assert validate(load_crd(), doc) == []
    InferenceServiceSpec.from_dict(spec, name="x", default_image="img:1")


@pytest.mark.parametrize(
    ("selector", "crd_refuses"),
    [({"pool": "a b"}, True), ({"pool": "x" * 64}, True), ({"pool": "-gpu"}, True),
     ({"a/b/c": "x"}, False), ({"bad key": "x"}, False)],
)  # fmt: skip
def test_node_selector_must_be_labels(selector: dict[str, str], crd_refuses: bool) -> None:
    """The API server refuses pods whose nodeSelector is not labels; values are refused by the
    CRD's schema, keys (no CEL on map keys: its cost is unbounded) by the operator."""
    spec = {"model": _M, "nodeSelector": selector}
    doc = {"apiVersion": "serving.pagoda.dev/v1alpha1", "kind": "InferenceService",
           "metadata": {"name": "x"}, "spec": spec}  # fmt: skip
    errors = validate(load_crd(), doc)
    assert bool(errors) == crd_refuses and all("spec.nodeSelector" in e for e in errors), errors
    with pytest.raises(spec_mod.SpecError) as e:
        InferenceServiceSpec.from_dict(spec, name="x", default_image="img:1")
    assert e.value.reason == "InvalidSpec" and "spec.nodeSelector" in e.value.message
    good = {
        "kubernetes.io/arch": "amd64",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "e": "",
    }
    assert validate(load_crd(), {**doc, "spec": {"model": _M, "nodeSelector": good}}) == []
    InferenceServiceSpec.from_dict({"model": _M, "nodeSelector": good}, name="x", default_image="i")


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"model": _M, "image": "pagoda:dev "}, "spec.image"),
        ({"model": _M, "image": "registry.example/pagoda runtime:1"}, "spec.image"),
        ({"model": _M, "apiKeySecretRef": {"name": "API_Key"}}, "spec.apiKeySecretRef.name"),
        ({"model": _M, "apiKeySecretRef": {"name": "k", "key": "api key"}}, "spec.apiKeySecretRef.key"),
        ({"model": "hf://org/m", "modelSecretRef": {"name": "HF_Token"}}, "spec.modelSecretRef.name"),
    ],
)  # fmt: skip
def test_names_the_pods_would_carry_are_checked(spec: dict[str, Any], field: str) -> None:
    """An image with whitespace, or a Secret name or key the API server refuses in the pod's
    env, is refused at `kubectl apply` (and by the operator), not as a ChildRejected Deployment."""
    doc = {"apiVersion": "serving.pagoda.dev/v1alpha1", "kind": "InferenceService",
           "metadata": {"name": "x"}, "spec": spec}  # fmt: skip
    errors = validate(load_crd(), doc)
    assert errors and all(e.startswith(field + ":") for e in errors), errors
    with pytest.raises(spec_mod.SpecError) as e:
        InferenceServiceSpec.from_dict(spec, name="x", default_image="img:1")
    assert e.value.reason == "InvalidSpec" and field in e.value.message, e.value


@pytest.mark.parametrize(
    "toleration",
    [{"key": "bad key", "operator": "Exists"}, {"key": "a/b/c", "operator": "Exists"},
     {"key": "pool", "value": "gpu pool"}, {"key": "pool", "value": "x" * 64}],
)  # fmt: skip
def test_toleration_keys_and_values_are_labels(toleration: dict[str, Any]) -> None:
    spec = {"model": _M, "tolerations": [toleration]}
    doc = {"apiVersion": "serving.pagoda.dev/v1alpha1", "kind": "InferenceService",
           "metadata": {"name": "x"}, "spec": spec}  # fmt: skip
    errors = validate(load_crd(), doc)
    assert errors and all(e.startswith("spec.tolerations[0].") for e in errors), errors
    with pytest.raises(spec_mod.SpecError) as e:
        InferenceServiceSpec.from_dict(spec, name="x", default_image="img:1")
    assert e.value.message.startswith("spec.tolerations[0].")
    good = {"key": "nvidia.com/gpu.product", "value": "NVIDIA-H100", "effect": "NoSchedule"}
    assert validate(load_crd(), {**doc, "spec": {"model": _M, "tolerations": [good]}}) == []


@pytest.mark.parametrize(
    ("engine", "crd_says", "operator_says"),
    [
        ({"runner": "generate", "poolerConfig": {"poolingType": "MEAN"}},
         "poolerConfig applies to the pooling runner only", "applies to the pooling runner only"),
        ({"runner": "generate", "poolerConfig": {}},
         "poolerConfig applies to the pooling runner only", "applies to the pooling runner only"),
        ({"poolerConfig": {"poolingType": "MAX"}}, "'MAX' is not one of", "poolerConfig.poolingType"),
        ({"poolerConfig": {"dimensions": 0}}, "0 is less than the minimum of 1",
         "poolerConfig.dimensions"),
        ({"poolerConfig": {"normalize": "yes"}}, "'yes' is not of type 'boolean'",
         "poolerConfig.normalize must be true or false"),
        ({"poolerConfig": {"pooling_type": "MEAN"}}, "Additional properties are not allowed",
         "poolerConfig"),
    ],
)  # fmt: skip
def test_pooler_config_is_refused_by_the_crd_and_the_operator_alike(
    engine: dict[str, Any], crd_says: str, operator_says: str
) -> None:
    """spec.engine.poolerConfig: what the schema or its CEL refuses at `kubectl apply`, the
    operator refuses too (an API server without the schema): InvalidSpec, the field named."""
    refused_by_both({"model": "/opt/models/embed", "engine": engine}, crd_says, operator_says)


def test_pooler_config_keys_and_types_are_the_runtimes() -> None:
    """The CRD's poolerConfig is `--pooler-config`'s keys (camelCase) and pooling types; every
    valid one passes both the schema and the operator, with runner pooling, auto or unset."""
    from pagoda.runtime import pooler_config
    from pagoda.runtime.option_rules import camel

    props = version_schema(load_crd())["properties"]["spec"]["properties"]
    pooler = props["engine"]["properties"]["poolerConfig"]["properties"]
    assert tuple(pooler) == tuple(camel(k) for k in pooler_config.USER_KEYS)
    assert tuple(pooler["poolingType"]["enum"]) == pooler_config.POOLING_TYPES
    doc = {"apiVersion": "serving.pagoda.dev/v1alpha1", "kind": "InferenceService",
           "metadata": {"name": "x"}}  # fmt: skip
    for runner in ({"runner": "pooling"}, {"runner": "auto"}, {}):
        for kind in pooler_config.POOLING_TYPES:
            value = {"poolingType": kind, "normalize": False, "dimensions": 256}
            spec = {"model": "/opt/models/embed", "engine": {**runner, "poolerConfig": value}}
            assert validate(load_crd(), {**doc, "spec": spec}) == []
            parsed = InferenceServiceSpec.from_dict(spec, name="x", default_image="img:1")
            assert parsed.engine.pooler_config == pooler_config.PoolerConfig(
                pooling_type=kind, normalize=False, dimensions=256
            )
