"""Speculative decoding with a draft model on an InferenceService (spec.engine.speculative,
method draftModel): the spec's checks and the CRD's rules agreeing on them, the refusals
`pagoda serve` would make at start, the `draft-download` init container, volumes and mounts,
the `--speculative-config` JSON the real parser reads (the draft's path in the pod), the config
hash, and the hf:// pin read back from status.draftModel."""

from __future__ import annotations

import dataclasses
from typing import Any

import kubernetes_validate
import pytest
from crd_schema import validate
from lws_crd import lws_errors
from operator_harness import load_crd
from pagoda.operator.children.build import build_children
from pagoda.operator.children.config_map import build_config_map, config_hash
from pagoda.operator.children.model_cache import DRAFT_LINKS, INIT_CONTAINER
from pagoda.operator.children.owner import Owner
from pagoda.operator.kube.names import (
    DRAFT_MOUNT,
    LWS_LEADER_ADDRESS_ENV,
    LWS_WORKER_INDEX_ENV,
    MODEL_CACHE_MOUNT,
)
from pagoda.operator.reconcile import model_pin
from pagoda.operator.spec.config import OperatorConfig
from pagoda.operator.spec.fields import SpecError
from pagoda.operator.spec.inference_service import InferenceServiceSpec
from pagoda.runtime.option_rules import parse_speculative
from pagoda.runtime.parallelism import Parallelism
from pagoda.runtime.server.cli import build_parser, server_config
from pagoda.runtime.spec.config import SpeculativeConfig

DRAFT_CONTAINER, DRAFT_VOLUME = DRAFT_LINKS.container, DRAFT_LINKS.volume

OWNER = Owner(name="llama", namespace="default", uid="uid-1")
BASE = {"model": "pvc://models/llama", "resources": {"gpus": 1}}
HF = "hf://org/llama-1b"
COMMIT = "c" * 40


def draft(model: str = HF, k: int = 4, **more: Any) -> dict[str, Any]:
    return {"speculative": {"method": "draftModel", "model": model, "numSpeculativeTokens": k,
                            **more}}  # fmt: skip


def parse(fields: dict[str, Any]) -> InferenceServiceSpec:
    return InferenceServiceSpec.from_dict(fields, name="llama", default_image="img:1")


def pinned(spec: InferenceServiceSpec, commit: str = COMMIT) -> InferenceServiceSpec:
    return model_pin.pinned(spec, None, None, {"uri": spec.engine.draft.uri, "commit": commit})  # type: ignore[union-attr]


def pod_spec(spec: InferenceServiceSpec) -> dict[str, Any]:
    return build_children(OWNER, spec).workload["spec"]["template"]["spec"]


def crd_errors(fields: dict[str, Any]) -> list[str]:
    """What the CRD's schema and CEL say of an InferenceService with this spec."""
    meta = {"name": "llama"}
    return validate(load_crd(), {"apiVersion": "serving.pagoda.dev/v1alpha1",
                                 "kind": "InferenceService", "metadata": meta, "spec": fields})  # fmt: skip


def served_config(spec: InferenceServiceSpec) -> SpeculativeConfig:
    """The server container's args through the real `pagoda serve` parser and its checks."""
    (server,) = pod_spec(spec)["containers"]
    parsed = build_parser().parse_args(server["args"])
    server_config(parsed)
    got = parse_speculative(parsed.speculative_config)
    assert got is not None
    return got


def test_draft_sources_reach_the_server_as_a_local_path() -> None:
    """hf:// and s3:// drafts: the link the init container makes; a built-in name as is; a
    pvc:// draft on spec.model's claim under its mount; a path in the image as is."""
    for uri, path in (
        (HF, f"{DRAFT_MOUNT}/model"),
        ("s3://bucket/llama-1b", f"{DRAFT_MOUNT}/model"),
        ("smollm2-135m", "smollm2-135m"),
        ("pvc://models/llama-1b/hf", "/mnt/models/llama-1b/hf"),
        ("file:///opt/draft", "/opt/draft"),
    ):
        got = served_config(parse({**BASE, "engine": draft(uri, 5)}))
        assert got == SpeculativeConfig(num_speculative_tokens=5, method="draft_model", model=path)


def test_the_draft_download_init_container() -> None:
    """One `draft-download` init container after the model's download, fetching the pinned
    commit into the cache and linking it; the server reads the cache offline and the link,
    read-only. A model that is not downloaded still gets the cache for its draft."""
    spec = pinned(parse({**BASE, "engine": draft(), "modelSecretRef": {"name": "hf"},
                         "modelCache": {"sizeLimit": "1Gi"}}))  # fmt: skip
    ps = pod_spec(spec)
    (init,) = ps["initContainers"]
    assert init["name"] == DRAFT_CONTAINER and init["command"][:2] == ["sh", "-c"]
    assert f"--download-size-limit {1 << 30}" in init["command"][2]
    assert init["args"] == [DRAFT_CONTAINER, MODEL_CACHE_MOUNT, DRAFT_MOUNT, "model",
                            f"{HF}@{COMMIT}"]  # fmt: skip
    assert init["envFrom"] == [{"secretRef": {"name": "hf"}}]
    assert {"name": DRAFT_VOLUME, "mountPath": DRAFT_MOUNT} in init["volumeMounts"]
    (server,) = ps["containers"]
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in server["env"] and "envFrom" not in server
    for name, path in (("model-cache", MODEL_CACHE_MOUNT), (DRAFT_VOLUME, DRAFT_MOUNT)):
        assert {"name": name, "mountPath": path, "readOnly": True} in server["volumeMounts"]
    assert {"name": DRAFT_VOLUME, "emptyDir": {}} in ps["volumes"]

    ps = pod_spec(parse({"model": "hf://org/llama", "engine": draft("s3://bucket/d")}))
    assert [c["name"] for c in ps["initContainers"]] == [INIT_CONTAINER, DRAFT_CONTAINER]
    assert ps["initContainers"][1]["args"][-1] == "s3://bucket/d"  # s3:// has no commits
    assert [v["name"] for v in ps["volumes"]].count("model-cache") == 1
    ps = pod_spec(parse({**BASE, "engine": draft("pvc://models/d")}))  # nothing to download
    assert "initContainers" not in ps and DRAFT_VOLUME not in [v["name"] for v in ps["volumes"]]


def test_children_pass_kubernetes_validate() -> None:
    spec = pinned(parse({"model": "hf://org/llama", "engine": draft(),
                         "modelCache": {"claimName": "cache"}, "modelSecretRef": {"name": "hf"}}))  # fmt: skip
    for child in build_children(OWNER, spec).desired:
        kubernetes_validate.validate(child, "1.32.0", strict=True)


def test_a_new_draft_or_pin_rolls_the_pods() -> None:
    def hashed(spec: InferenceServiceSpec) -> str:
        return config_hash(build_config_map(OWNER, spec))

    one = parse({**BASE, "engine": draft()})
    hashes = {
        hashed(one),
        hashed(pinned(one)),
        hashed(pinned(one, "d" * 40)),  # the same link path, another commit
        hashed(parse({**BASE, "engine": draft("hf://org/other")})),
        hashed(parse({**BASE, "engine": draft(k=8)})),
    }
    assert len(hashes) == 5
    recorded = build_config_map(OWNER, pinned(one))["data"]["engine.json"]
    assert '"model": "hf://org/llama-1b"' in recorded and f'"modelCommit": "{COMMIT}"' in recorded


def test_the_pin_is_read_back_from_status_for_the_current_request() -> None:
    """`recorded_spec` (a restored child) takes status.draftModel's pin only for this URI and
    resolve request, and waits (None) without one; a draft named by a commit needs none."""
    config = OperatorConfig(pin_models=True)
    spec = parse({**BASE, "engine": draft()})
    item = {"uri": HF, "commit": COMMIT, "resolvedAt": "2026-12-07T18:00:00Z"}
    got = model_pin.recorded_spec({"status": {"draftModel": item}}, spec, config)
    assert got is not None and got.engine.draft.pinned_uri == f"{HF}@{COMMIT}"  # type: ignore[union-attr]
    for status in ({}, {"draftModel": {**item, "uri": "hf://org/other"}},
                   {"draftModel": {**item, "commit": "main"}}):  # fmt: skip
        assert model_pin.recorded_spec({"status": status}, spec, config) is None
    asked = {"metadata": {"annotations": {model_pin.RESOLVE_ANNOTATION: "now"}}}
    assert model_pin.recorded_spec({**asked, "status": {"draftModel": item}}, spec, config) is None
    fixed = parse({**BASE, "engine": draft(f"{HF}@{COMMIT}")})
    assert model_pin.recorded_spec({}, fixed, config) is fixed


# Refused by the operator and by the CRD alike (the API server may not apply the schema).
REFUSED = [
    ({"engine": {"speculative": {"method": "draftModel", "numSpeculativeTokens": 4}}},
     "model is required with method draftModel", "model is required with method draftModel"),
    ({"engine": {"speculative": {"method": "ngram", "model": HF, "numSpeculativeTokens": 4}}},
     "model is the draft checkpoint of method draftModel", "the draft checkpoint of method draftModel"),
    ({"engine": {"speculative": {"model": HF, "numSpeculativeTokens": 4}}},  # method: ngram
     "model is the draft checkpoint of method draftModel", "the draft checkpoint of method draftModel"),
    ({"engine": draft(promptLookupMax=4)},
     "n-gram drafting's, not for method draftModel", "n-gram drafting's, not for method draftModel"),
    ({"engine": {**draft(), "quantization": "fp8"}},
     "method draftModel is not supported with engine.quantization fp8", "quantization fp8"),
    ({"engine": {**draft(), "runner": "pooling"}},
     "not supported with the pooling runner", "not supported with the pooling runner"),
    ({"engine": {"speculative": {"numSpeculativeTokens": 2}, "runner": "pooling"}},
     "not supported with the pooling runner", "not supported with the pooling runner"),
    ({"engine": draft(), "adapters": [{"name": "sql", "source": "hf://org/sql"}]},
     "adapters (LoRA) is not supported with engine.speculative", "spec.engine.speculative"),
    ({"engine": {"speculative": {"method": "eagle", "numSpeculativeTokens": 4}}},
     "is not one of", "must be one of ngram, draftModel"),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "crd_says", "operator_says"), REFUSED)
def test_crd_and_operator_refuse_the_same_specs(
    extra: dict[str, Any], crd_says: str, operator_says: str
) -> None:
    fields = {**BASE, **extra}
    errors = crd_errors(fields)
    assert any(crd_says in e for e in errors), errors
    with pytest.raises(SpecError) as e:
        parse(fields)
    assert operator_says in e.value.message and e.value.reason == "InvalidSpec"


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({**BASE, "engine": draft("pvc://other/d")}, "a pvc:// draft model must be on spec.model's"),
        ({"model": "hf://o/m", "engine": draft("pvc://models/d")}, "(none here)"),
        ({**BASE, "engine": draft("ftp://x/y")}, "spec.engine.speculative.model: 'ftp://x/y'"),
        ({**BASE, "engine": draft("no-such-model")}, "unknown built-in model"),
        ({**BASE, "engine": draft("pvc://models/d"), "modelCache": {"sizeLimit": "1Gi"}},
         "draft models included"),
    ],
)  # fmt: skip
def test_what_only_the_operator_refuses(fields: dict[str, Any], words: str) -> None:
    """The rules the CRD leaves to the operator (a Degraded condition with the reason): the
    draft's URI grammar, a pvc:// draft off the model's claim,
    modelCache with nothing to download."""
    with pytest.raises(SpecError) as e:
        parse(fields)
    assert words in e.value.message


def test_valid_specs_pass_both() -> None:
    for fields in (
        {**BASE, "engine": draft(), "modelCache": {"sizeLimit": "1Gi"}},  # the draft's download
        {"model": "smollm2-135m", "engine": draft("smollm2-135m", 32)},
        {"model": "hf://org/m", "engine": draft("s3://bucket/d"), "modelSecretRef": {"name": "s"}},
        {**BASE, "engine": {**draft(), "kvCacheDtype": "fp8"}},
        {**BASE, "engine": {**draft(), "extraArgs": ["--async-scheduling"]}},  # (served)
    ):
        assert crd_errors(fields) == []
        spec = parse(fields)
        assert spec.engine.speculative is not None and spec.engine.speculative.adaptive is False
    ngram = parse({**BASE, "engine": {"speculative": {"numSpeculativeTokens": 4}}})
    assert (
        ngram.engine.draft is None and dataclasses.asdict(ngram.engine.speculative)["model"] is None
    )  # type: ignore[arg-type]


def test_tensor_parallelism_with_either_method_passes_both() -> None:
    """`pagoda serve` drafts on rank 0 with tensor parallelism (a draft model whole on it), in
    one pod or a multi-node group: the CRD and the operator accept it, the flags rendered."""
    for engine in (draft(), {"speculative": {"numSpeculativeTokens": 4}}):
        for layout in ({"resources": {"gpus": 2}}, {"resources": {"gpus": 0}, "parallelism": {"tensorParallelSize": 2}},
                       {"resources": {"gpus": 4}, "parallelism": {"nodes": 2}}):  # fmt: skip
            fields = {**BASE, **layout, "engine": engine}
            assert crd_errors(fields) == []
            assert parse(fields).engine.speculative is not None
    (server,) = pod_spec(parse({**BASE, "resources": {"gpus": 2}, "engine": draft()}))["containers"]
    assert server["args"][server["args"].index("--tensor-parallel-size") + 1] == "2"
    assert served_config(parse({**BASE, "resources": {"gpus": 2}, "engine": draft()})).model


def test_a_multi_node_group_downloads_the_draft_where_rank_0_runs() -> None:
    """A LeaderWorkerSet with an hf:// draft: the leader (node 0, rank 0: it drafts) has the
    `draft-download` init container and the server reads its link; a worker has it too (its
    start-up checks read the draft's config.json, as node 0's). Valid against the upstream LWS
    CRD and kubernetes-validate (strict); every rank's command line parses with the real
    parser into the same group and the same `--speculative-config`."""
    spec = pinned(parse({"model": "hf://org/llama-70b", "resources": {"gpus": 8},
                         "parallelism": {"nodes": 2}, "engine": draft(),
                         "modelSecretRef": {"name": "hf"}}))  # fmt: skip
    lws = build_children(OWNER, spec).get("LeaderWorkerSet")
    assert lws_errors(lws) == []
    t = lws["spec"]["leaderWorkerTemplate"]
    layouts = []
    for index, template in enumerate((t["leaderTemplate"], t["workerTemplate"])):
        ps = template["spec"]
        assert [c["name"] for c in ps["initContainers"]] == [INIT_CONTAINER, DRAFT_CONTAINER]
        assert ps["initContainers"][1]["args"][-1] == f"{HF}@{COMMIT}"
        (server,) = ps["containers"]
        assert {"name": DRAFT_VOLUME, "mountPath": DRAFT_MOUNT, "readOnly": True} in server[
            "volumeMounts"
        ]
        env = {LWS_LEADER_ADDRESS_ENV: "llama-lws-0.llama-lws", LWS_WORKER_INDEX_ENV: str(index)}
        args = [_expand(a, env) for a in server["args"]]
        parsed = build_parser().parse_args(args)
        assert parse_speculative(parsed.speculative_config) == SpeculativeConfig(
            num_speculative_tokens=4, method="draft_model", model=f"{DRAFT_MOUNT}/model"
        )
        layouts.append(Parallelism.from_values(vars(parsed)))
    assert [(p.tensor_parallel_size, p.nnodes, p.node_rank) for p in layouts] == [
        (16, 2, 0),
        (16, 2, 1),
    ]
    assert t["leaderTemplate"]["metadata"]["labels"]["serving.pagoda.dev/role"] == "leader"


def _expand(arg: str, env: dict[str, str]) -> str:
    """`$(VAR)` in a container's args as the kubelet expands it."""
    for key, value in env.items():
        arg = arg.replace(f"$({key})", value)
    return arg
