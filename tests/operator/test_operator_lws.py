"""Tensor parallelism and multi-node groups, builders and spec: `resources.gpus` > 1 shards one
pod; `spec.parallelism.nodes` > 1 renders a LeaderWorkerSet, valid against the upstream CRD's
schema (kubernetes-sigs/lws v0.9.0, strict) with pod templates valid for kubernetes-validate
(strict), whose leader and worker command lines the real `pagoda serve` parser accepts once the
kubelet has expanded LWS's variables."""

from __future__ import annotations

import copy
import dataclasses
import re
from typing import Any

import kubernetes_validate.utils
import pytest
from lws_crd import lws_errors
from pagoda.operator.children.build import build_children
from pagoda.operator.children.owner import Owner
from pagoda.operator.kube import drift, names
from pagoda.operator.spec import status
from pagoda.operator.spec.fields import SpecError
from pagoda.operator.spec.inference_service import InferenceServiceSpec
from pagoda.operator.spec.validation import check_gpu_capacity, check_gpu_nodes
from pagoda.runtime.parallelism import Parallelism
from pagoda.runtime.server.cli import build_parser

OWNER = Owner(name="llama", namespace="team-a", uid="7c0e2f8e-1111-4c1e-9a34-5a1d2c3b4e5f")
K8S_VERSIONS = ("1.32.0", kubernetes_validate.utils.latest_version())


def parse(spec: dict[str, Any], name: str = OWNER.name) -> InferenceServiceSpec:
    return InferenceServiceSpec.from_dict(
        {"model": "pvc://models/llama-3.1-70b", **spec}, name=name, default_image="img:1"
    )


GROUP = parse(
    {
        "replicas": 2,
        "resources": {"gpus": 8, "cpu": 32, "memory": "256Gi"},
        "parallelism": {"nodes": 2},
        "engine": {"dtype": "bfloat16", "maxModelLen": 8192},
        "nodeSelector": {"gpu": "h200"},
        "env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
    }
)
CPU_GROUP = parse(
    {"model": "/opt/models/llama", "parallelism": {"nodes": 2, "tensorParallelSize": 4}}
)


def templates(lws: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    t = lws["spec"]["leaderWorkerTemplate"]
    return t["leaderTemplate"], t["workerTemplate"]


def server(template: dict[str, Any]) -> dict[str, Any]:
    (c,) = template["spec"]["containers"]
    return c


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def kubelet_expand(args: list[str], env: dict[str, str]) -> list[str]:
    """`$(VAR)` in container args as the kubelet expands them (unknown ones stay as written)."""
    return [
        re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), a) for a in args
    ]


# --- one pod, several GPUs ---------------------------------------------------------------------


def test_gpus_above_one_shard_one_pod() -> None:
    spec = parse({"resources": {"gpus": 4}})
    assert (spec.tensor_parallel_size, spec.multi_node, spec.workload_kind) == (
        4,
        False,
        "Deployment",
    )
    children = build_children(OWNER, spec)
    deploy = children.get("Deployment")
    args = server(deploy["spec"]["template"])["args"]
    assert flag(args, "--tensor-parallel-size") == "4" and "--nnodes" not in args
    assert server(deploy["spec"]["template"])["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert ("LeaderWorkerSet", "llama-lws") in children.absent
    parsed = build_parser().parse_args(args)
    assert Parallelism.from_values(vars(parsed)).tensor_parallel_size == 4


def test_one_gpu_or_cpu_renders_no_parallel_flag() -> None:
    """A flag added after the first release renders only when used: existing pods keep their
    command line and config hash."""
    for spec in (parse({"resources": {"gpus": 1}}), parse({})):
        args = server(build_children(OWNER, spec).get("Deployment")["spec"]["template"])["args"]
        assert not {"--tensor-parallel-size", "--nnodes", "--node-rank", "--master-addr"} & set(
            args
        )


# --- a multi-node group ------------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("spec", [GROUP, CPU_GROUP], ids=["gpus", "cpu"])
def test_leader_worker_set_is_valid_upstream(spec: InferenceServiceSpec, version: str) -> None:
    lws = build_children(OWNER, spec).get("LeaderWorkerSet")
    assert lws_errors(lws, version) == []
    autoscaled = parse(
        {"parallelism": {"nodes": 2}, "autoscaling": {"maxReplicas": 3, "targetQueueDepth": 4}}
    )
    assert (
        lws_errors(build_children(OWNER, autoscaled, current_replicas=2).get("LeaderWorkerSet"))
        == []
    )


def test_validation_against_the_upstream_schema_is_not_vacuous() -> None:
    lws = build_children(OWNER, GROUP).get("LeaderWorkerSet")
    bad = copy.deepcopy(lws)
    bad["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Always"
    bad["spec"]["startupPolicy"] = "WhenReady"
    bad["spec"]["leaderWorkerTemplate"]["sizee"] = 2
    errors = lws_errors(bad)
    assert any("restartPolicy" in e for e in errors) and any("startupPolicy" in e for e in errors)
    assert any("sizee" in e for e in errors)
    pod = copy.deepcopy(lws)
    server(templates(pod)[1])["securityContext"]["runAsNonRot"] = True
    assert any(e.startswith("workerTemplate") for e in lws_errors(pod))


def test_the_group_shape() -> None:
    children = build_children(OWNER, GROUP)
    lws = children.get("LeaderWorkerSet")
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert lws["metadata"]["name"] == "llama-lws"  # LWS's headless Service takes this name
    assert [c["kind"] for c in children.desired][:3] == ["ConfigMap", "LeaderWorkerSet", "Service"]
    assert ("Deployment", "llama") in children.absent and children.workload is lws
    spec = lws["spec"]
    assert spec["replicas"] == 2 and spec["startupPolicy"] == "LeaderCreated"
    assert spec["rolloutStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdateConfiguration": {"maxSurge": 0, "maxUnavailable": 1},
    }
    t = spec["leaderWorkerTemplate"]
    assert t["size"] == 2 and t["restartPolicy"] == "RecreateGroupOnPodRestart"
    (ref,) = lws["metadata"]["ownerReferences"]
    assert ref["uid"] == OWNER.uid and ref["controller"] is True


def test_leader_serves_and_workers_join_headless() -> None:
    leader, worker = templates(build_children(OWNER, GROUP).get("LeaderWorkerSet"))
    assert leader["metadata"]["labels"][names.LABEL_ROLE] == "leader"
    assert worker["metadata"]["labels"][names.LABEL_ROLE] == "worker"
    lead, work = server(leader), server(worker)
    for c in (lead, work):
        assert flag(c["args"], "--tensor-parallel-size") == "16"  # 8 GPUs x 2 nodes
        assert flag(c["args"], "--nnodes") == "2"
        assert flag(c["args"], "--master-addr") == "$(LWS_LEADER_ADDRESS)"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"  # per pod
        assert c["volumeMounts"] == lead["volumeMounts"] and c["env"] == lead["env"]
    assert "--node-rank" not in lead["args"]  # the leader is rank 0 of node 0
    assert flag(work["args"], "--node-rank") == "$(LWS_WORKER_INDEX)"
    assert lead["ports"] and lead["readinessProbe"] and lead["startupProbe"] and lead["lifecycle"]
    assert not {"ports", "readinessProbe", "livenessProbe", "startupProbe", "lifecycle"} & set(work)
    assert "prometheus.io/scrape" in leader["metadata"]["annotations"]
    assert not any(k.startswith("prometheus.io/") for k in worker["metadata"]["annotations"])
    for t in (leader, worker):  # the same pod otherwise: one pod-template builder for both kinds
        assert t["spec"]["nodeSelector"] == {"gpu": "h200"}
        assert t["metadata"]["annotations"][names.CONFIG_HASH_ANNOTATION]
    assert leader["spec"]["volumes"] == worker["spec"]["volumes"]


def test_service_selects_only_leaders_and_the_pdb_every_pod() -> None:
    children = build_children(OWNER, GROUP)
    assert children.get("Service")["spec"]["selector"] == {
        **names.selector_labels("llama"),
        names.LABEL_ROLE: "leader",
    }
    assert children.get("PodDisruptionBudget")["spec"]["selector"][
        "matchLabels"
    ] == names.selector_labels("llama")
    single = build_children(OWNER, parse({}))
    assert single.get("Service")["spec"]["selector"] == names.selector_labels("llama")


@pytest.mark.parametrize("spec", [GROUP, CPU_GROUP], ids=["gpus", "cpu"])
def test_every_rank_parses_with_the_real_parser(spec: InferenceServiceSpec) -> None:
    """The leader's and each worker's command line, as the kubelet runs them (LWS's variables
    expanded), are accepted by `pagoda serve` and describe the same group, one node rank each."""
    leader, worker = templates(build_children(OWNER, spec).get("LeaderWorkerSet"))
    nodes = spec.parallelism.nodes
    seen = []
    for index in range(nodes):
        env = {
            names.LWS_LEADER_ADDRESS_ENV: "llama-lws-0.llama-lws.team-a",
            names.LWS_GROUP_SIZE_ENV: str(nodes),
            names.LWS_WORKER_INDEX_ENV: str(index),
        }
        template = leader if index == 0 else worker
        args = kubelet_expand(server(template)["args"], env)
        layout = Parallelism.from_values(vars(build_parser().parse_args(args)))
        assert layout.tensor_parallel_size == spec.tensor_parallel_size
        assert (layout.nnodes, layout.master_addr) == (nodes, "llama-lws-0.llama-lws.team-a")
        assert layout.ranks_per_node == spec.tensor_parallel_size // nodes
        seen.append(layout.node_rank)
    assert seen == list(range(nodes))


def test_config_map_records_both_command_lines() -> None:
    cm = build_children(OWNER, GROUP).get("ConfigMap")
    assert "--node-rank" not in cm["data"]["serve-args"]
    assert "--node-rank '$(LWS_WORKER_INDEX)'" in cm["data"]["worker-serve-args"]
    assert '"tensorParallelSize": 16' in cm["data"]["engine.json"]
    assert "worker-serve-args" not in build_children(OWNER, parse({})).get("ConfigMap")["data"]


def test_replicas_count_groups_and_follow_the_autoscaler() -> None:
    auto = parse(
        {
            "parallelism": {"nodes": 2},
            "autoscaling": {"minReplicas": 2, "maxReplicas": 5, "targetQueueDepth": 4},
        }
    )
    assert build_children(OWNER, auto).get("LeaderWorkerSet")["spec"]["replicas"] == 2
    assert (
        "replicas"
        not in build_children(OWNER, auto, current_replicas=4).get("LeaderWorkerSet")["spec"]
    )
    assert auto.workload_kind == "LeaderWorkerSet"
    assert names.workload_name(auto.workload_kind, "llama") == "llama-lws"


def test_a_defaulted_live_group_is_in_sync() -> None:
    """What LWS's webhook and the API server add (defaults) is not drift; a changed field is."""
    lws = build_children(OWNER, GROUP).get("LeaderWorkerSet")
    live = copy.deepcopy(lws)
    live["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]["partition"] = 0
    live["spec"]["networkConfig"] = {"subdomainPolicy": "Shared"}
    live["metadata"].update(uid="u", resourceVersion="7", generation=1)
    server(templates(live)[1])["terminationMessagePath"] = "/dev/termination-log"
    assert not drift.needs_update(lws, live)
    templates(live)[0]["spec"]["nodeSelector"]["extra"] = "x"  # nodeSelector is ours whole
    assert drift.needs_update(lws, live)
    assert drift.merge_patch(lws, live)["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"][
        "nodeSelector"
    ] == {"gpu": "h200", "extra": None}


def test_switching_back_drops_the_leader_key_from_the_service_selector() -> None:
    group_svc = build_children(OWNER, GROUP).get("Service")
    single_svc = build_children(OWNER, parse({})).get("Service")
    assert drift.needs_update(single_svc, group_svc)
    patch = drift.merge_patch(single_svc, group_svc)
    assert patch["spec"]["selector"][names.LABEL_ROLE] is None


# --- spec rules ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"parallelism": {"nodes": 2, "tensorParallelSize": 3}}, "must be a multiple of nodes (2)"),
        (
            {"resources": {"gpus": 8}, "parallelism": {"nodes": 2, "tensorParallelSize": 8}},
            "must equal resources.gpus (8) × nodes (2) = 16",
        ),
        ({"parallelism": {"nodes": 0}}, "spec.parallelism.nodes must be between 1 and 64"),
        ({"parallelism": {"tensorParallelSize": 2000}}, "between 1 and 1024"),
        ({"parallelism": "two"}, "spec.parallelism must be an object"),
        (
            {"resources": {"gpus": 1}, "autotune": {"enabled": True}, "parallelism": {"nodes": 2}},
            "cannot tune a tensor-parallel one (tensor-parallel size 2)",
        ),
    ],
)
def test_impossible_layouts_are_invalid_specs(spec: dict[str, Any], words: str) -> None:
    with pytest.raises(SpecError, match=re.escape(words)) as e:
        parse(spec)
    assert e.value.reason == "InvalidSpec"


def test_a_built_in_model_is_sharded_only_as_it_can_be() -> None:
    """SmolLM2-135M's 9 heads (3 KV heads, MLP width 1536) split over 3 ranks only: another size
    is refused up front with the runtime's own reason, not by every pod exiting at start."""
    for fields in (
        {"parallelism": {"nodes": 2}},
        {"resources": {"gpus": 2}},
        {"resources": {"gpus": 3}, "parallelism": {"nodes": 3}},
    ):
        with pytest.raises(
            SpecError, match=r"does not divide the model's (9 attention heads|MLP width \(1536\))"
        ) as e:
            parse({"model": "smollm2-135m", **fields})
        assert e.value.reason == "InvalidSpec" and "spec.model smollm2-135m" in e.value.message
    assert parse({"model": "smollm2-135m", "parallelism": {"nodes": 3}}).tensor_parallel_size == 3
    assert parse({"model": "smollm2-135m", "resources": {"gpus": 3}}).tensor_parallel_size == 3
    assert (
        parse({"parallelism": {"nodes": 2}}).tensor_parallel_size == 2
    )  # unknown shape: the pod's


def test_a_group_needs_a_shorter_name() -> None:
    with pytest.raises(SpecError, match="at most 45 characters") as e:
        parse({"parallelism": {"nodes": 2}}, name="x" * 46)
    assert e.value.reason == "InvalidName"
    assert parse({"parallelism": {"nodes": 2}}, name="x" * 45).multi_node
    assert not parse({}, name="x" * 52).multi_node


def test_defaults() -> None:
    assert (parse({}).tensor_parallel_size, parse({}).parallelism.nodes) == (1, 1)
    assert parse({"parallelism": {"nodes": 3}}).tensor_parallel_size == 3  # CPU: a rank a pod
    assert parse({"resources": {"gpus": 2}, "parallelism": {"nodes": 3}}).tensor_parallel_size == 6


def test_gpu_capacity_of_a_group() -> None:
    check_gpu_capacity(GROUP, [8, 8])
    check_gpu_capacity(GROUP, [16])  # two pods of 8 fit on one 16-GPU node
    with pytest.raises(SpecError, match="have room for 1 such pod") as e:
        check_gpu_capacity(GROUP, [8, 4])
    assert e.value.reason == "InsufficientGPU"
    with pytest.raises(SpecError, match=r"no node matching spec\.nodeSelector offers that many"):
        check_gpu_capacity(GROUP, [4, 4])


# --- status ----------------------------------------------------------------------------------


def test_status_counts_groups_and_selects_leaders() -> None:
    lws = build_children(OWNER, GROUP).get("LeaderWorkerSet")
    lws["metadata"]["generation"] = 3
    body = {"metadata": {"name": "llama", "generation": 1}}
    starting = {**lws, "status": {"observedGeneration": 3, "replicas": 2}}
    st = status.compute_status(body, starting)
    ready = {c["type"]: c for c in st["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "Unavailable")
    assert ready["message"] == "0/2 groups of 2 pods ready, 0/2 updated"
    assert st["selector"].endswith(f"{names.LABEL_ROLE}=leader")
    one = {
        **lws,
        "status": {
            "observedGeneration": 3,
            "replicas": 2,
            "readyReplicas": 1,
            "updatedReplicas": 2,
        },
    }
    conds = {c["type"]: c for c in status.compute_status(body, one)["conditions"]}
    assert conds["Ready"]["status"] == "True" and conds["Progressing"]["status"] == "True"
    stale = {**lws, "status": {"observedGeneration": 2}}
    conds = {c["type"]: c for c in status.compute_status(body, stale)["conditions"]}
    assert conds["Progressing"]["message"] == "waiting for the LeaderWorkerSet controller"
    bad = status.compute_status(body, one, spec_error=SpecError("InvalidSpec", "x"))
    kept = {c["type"]: c for c in bad["conditions"]}["Progressing"]
    assert kept["message"] == "keeping the last valid LeaderWorkerSet"
    missing = {
        c["type"]: c
        for c in status.compute_status(body, None, kind="LeaderWorkerSet")["conditions"]
    }
    assert missing["Ready"]["reason"] == "LeaderWorkerSetMissing"


def test_a_remote_model_is_downloaded_by_every_pod_of_a_group() -> None:
    """The model-download init container lands in both templates (one pod-template builder)."""
    spec = parse({"model": "hf://org/llama@main", "parallelism": {"nodes": 2}})
    lws = build_children(OWNER, spec).get("LeaderWorkerSet")
    for template in templates(lws):
        (init,) = template["spec"]["initContainers"]
        assert init["name"] == "model-download"
        assert "--download-dir" in server(template)["args"]
    assert lws_errors(lws) == []


def test_the_multi_node_example_renders_a_valid_group() -> None:
    """examples/llama-70b-s3-multinode.yaml: 16 ranks over 2 pods, each pod downloading the
    weights with the Secret's keys, valid against the upstream CRD."""
    import pathlib

    import yaml

    path = pathlib.Path(__file__).resolve().parents[2] / "examples" / "llama-70b-s3-multinode.yaml"
    doc = next(d for d in yaml.safe_load_all(path.read_text()) if d["kind"] == "InferenceService")
    spec = InferenceServiceSpec.from_dict(doc["spec"], name="llama-70b", default_image="img:1")
    owner = Owner("llama-70b", "default", OWNER.uid)
    lws = build_children(owner, spec).get("LeaderWorkerSet")
    assert lws_errors(lws) == []
    for template in templates(lws):
        download = template["spec"]["initContainers"][0]
        assert download["envFrom"] == [{"secretRef": {"name": "s3-models"}}]
        assert flag(server(template)["args"], "--tensor-parallel-size") == "16"


def test_a_node_selector_no_node_matches_names_what_the_nodes_have() -> None:
    """A GPU product spelled as no node labels it (`H100` for `NVIDIA-H100-80GB-HBM3`) gets a
    message that says no node matches and what the nodes' labels are (it read "no node matching
    spec.nodeSelector offers that many (the most on one node: 0)", as if GPUs were short)."""

    def node(**labels: str) -> dict[str, Any]:
        return {"metadata": {"labels": labels}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}

    product = "nvidia.com/gpu.product"
    nodes = [node(**{product: "NVIDIA-H100-80GB-HBM3"}), node(**{product: "NVIDIA-A100-SXM4-80GB"})]
    spec = InferenceServiceSpec.from_dict(
        {"model": "/w", "resources": {"gpus": 1}, "nodeSelector": {product: "H100", "pool": "a"}},
        name="demo", default_image="img:1",
    )  # fmt: skip
    with pytest.raises(SpecError) as e:
        check_gpu_nodes(spec, nodes)
    assert e.value.reason == "InsufficientGPU"
    assert e.value.message == (
        "no node matches spec.nodeSelector (nvidia.com/gpu.product=H100, pool=a); the nodes' "
        "labels: nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB, NVIDIA-H100-80GB-HBM3; no node "
        "has pool"
    )
    ok = dataclasses.replace(spec, node_selector=((product, "NVIDIA-H100-80GB-HBM3"),))
    check_gpu_nodes(ok, nodes)
