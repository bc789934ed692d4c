"""LoRA adapters on an InferenceService (spec.adapters, spec.engine.lora): the spec's checks and
the CRD's rules agreeing on them, the rendered `pagoda serve` flags, the `adapter-download` init
container (its script run with a stand-in `pagoda`), volumes, the config hash, and a reconcile
against the API-server emulator (children, status.adapters, a Degraded condition)."""

from __future__ import annotations

import os
import pathlib
import stat
import subprocess
from typing import Any

import kubernetes_validate
import pytest
from crd_schema import validate
from operator_harness import DEPLOY, ISVC, load_crd, wait_for
from operator_helpers import condition, create_isvc
from pagoda.operator.children import serve_args
from pagoda.operator.children.build import build_children
from pagoda.operator.children.config_map import build_config_map, config_hash
from pagoda.operator.children.model_cache import ADAPTER_LINKS
from pagoda.operator.children.owner import Owner
from pagoda.operator.kube.names import ADAPTERS_MOUNT, CONFIG_HASH_ANNOTATION, MODEL_CACHE_MOUNT
from pagoda.operator.spec.fields import SpecError
from pagoda.operator.spec.inference_service import InferenceServiceSpec
from pagoda.operator.spec.pod_fields import OPERATOR_FLAGS
from pagoda.runtime import options

ADAPTER_CONTAINER, LINKS_VOLUME = ADAPTER_LINKS.container, ADAPTER_LINKS.volume

OWNER = Owner(name="llama", namespace="default", uid="uid-1")
SQL = {"name": "sql", "source": "hf://org/sql-lora@v1"}
CHAT = {"name": "chat", "source": "pvc://models/adapters/chat"}
S3 = {"name": "s3-ad", "source": "s3://bucket/adapters/x"}
BASE = {"model": "pvc://models/llama", "resources": {"gpus": 1}}


def parse(fields: dict[str, Any], name: str = "llama") -> InferenceServiceSpec:
    return InferenceServiceSpec.from_dict(fields, name=name, default_image="img:1")


def pod_spec(fields: dict[str, Any]) -> dict[str, Any]:
    return build_children(OWNER, parse(fields)).workload["spec"]["template"]["spec"]


def by_name(items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(i for i in items if i["name"] == name)


def test_flags_defaults_and_paths() -> None:
    """vLLM's flags: maxLoras min(adapters, 4), maxCpuLoras every adapter, rank 16; a downloaded
    adapter is read through its link, one on the model's claim where it is."""
    args = serve_args.server_args(parse({**BASE, "adapters": [SQL, CHAT, S3]}))
    i = args.index("--enable-lora")
    assert args[i:] == [
        "--enable-lora", "--max-loras", "3", "--max-lora-rank", "16", "--max-cpu-loras", "3",
        "--lora-modules", f"sql={ADAPTERS_MOUNT}/sql", "chat=/mnt/models/adapters/chat",
        f"s3-ad={ADAPTERS_MOUNT}/s3-ad",
    ]  # fmt: skip
    many = [{"name": f"a{k}", "source": f"/opt/lora/{k}"} for k in range(6)]
    values = serve_args.lora_values(parse({**BASE, "adapters": many}))
    assert (values["max_loras"], values["max_lora_rank"], values["max_cpu_loras"]) == (4, 16, 6)
    set_ = {"maxLoras": 2, "maxLoraRank": 64, "maxCpuLoras": 8}
    values = serve_args.lora_values(parse({**BASE, "adapters": many, "engine": {"lora": set_}}))
    assert (values["max_loras"], values["max_lora_rank"], values["max_cpu_loras"]) == (2, 64, 8)
    assert values["lora_modules"][0] == "a0=/opt/lora/0"
    assert serve_args.lora_values(parse(BASE)) == {}
    assert set(values) <= set(OPERATOR_FLAGS)  # and so refused in engine.extraArgs
    with pytest.raises(SpecError, match=r"--max-loras is set by spec\.engine\.lora\.maxLoras"):
        parse({**BASE, "engine": {"extraArgs": ["--max-loras", "2"]}})


def test_rendered_args_parse_with_the_runtimes_flags() -> None:
    """The operator ↔ runtime contract (test_serve_args_contract.py) for the LoRA flags."""
    if "enable_lora" not in options.SERVE_FLAGS:
        pytest.skip("pagoda serve has no LoRA flags yet (the runtime's branch lora adds them)")
    from pagoda.runtime.server.cli import build_parser

    spec = parse({**BASE, "adapters": [SQL, CHAT], "engine": {"lora": {"maxLoraRank": 32}}})
    parsed = build_parser().parse_args(serve_args.server_args(spec))
    assert parsed.enable_lora and (parsed.max_loras, parsed.max_lora_rank) == (2, 32)
    assert parsed.max_cpu_loras == 2 and len(parsed.lora_modules) == 2


def test_init_container_volumes_and_mounts() -> None:
    """One `adapter-download` init container for the hf:// and s3:// adapters, after the model's
    download, with its Secret and env; the server reads the cache offline and the links, both
    read-only. A model that is not downloaded still gets the cache for its adapters."""
    env = [{"name": "HF_ENDPOINT", "value": "http://mirror"}]
    ps = pod_spec({**BASE, "adapters": [SQL, CHAT, S3], "modelSecretRef": {"name": "hf"},
                   "modelCache": {"sizeLimit": "1Gi"}, "env": env})  # fmt: skip
    (init,) = ps["initContainers"]
    assert init["name"] == ADAPTER_CONTAINER and init["command"][:2] == ["sh", "-c"]
    assert f"--download-size-limit {1 << 30}" in init["command"][2]
    assert init["args"] == [ADAPTER_CONTAINER, MODEL_CACHE_MOUNT, ADAPTERS_MOUNT,
                            "sql", "hf://org/sql-lora@v1", "s3-ad", "s3://bucket/adapters/x"]  # fmt: skip
    assert init["envFrom"] == [{"secretRef": {"name": "hf"}}] and env[0] in init["env"]
    assert {"name": "model-cache", "mountPath": MODEL_CACHE_MOUNT} in init["volumeMounts"]
    assert {"name": LINKS_VOLUME, "mountPath": ADAPTERS_MOUNT} in init["volumeMounts"]
    assert by_name(ps["volumes"], "model-cache") == {"name": "model-cache", "emptyDir": {"sizeLimit": "1Gi"}}  # fmt: skip
    assert by_name(ps["volumes"], LINKS_VOLUME) == {"name": LINKS_VOLUME, "emptyDir": {}}
    (server,) = ps["containers"]
    assert "envFrom" not in server and {"name": "HF_HUB_OFFLINE", "value": "1"} in server["env"]
    for name, path in (("model-cache", MODEL_CACHE_MOUNT), (LINKS_VOLUME, ADAPTERS_MOUNT)):
        assert {"name": name, "mountPath": path, "readOnly": True} in server["volumeMounts"]

    ps = pod_spec({"model": "hf://org/llama", "adapters": [SQL]})  # the model's cache, shared
    assert [c["name"] for c in ps["initContainers"]] == ["model-download", ADAPTER_CONTAINER]
    assert [v["name"] for v in ps["volumes"]].count("model-cache") == 1
    mounts = [m["name"] for m in ps["containers"][0]["volumeMounts"]]
    assert mounts.count("model-cache") == 1 and LINKS_VOLUME in mounts
    ps = pod_spec({**BASE, "adapters": [CHAT]})  # nothing to download
    assert "initContainers" not in ps and LINKS_VOLUME not in [v["name"] for v in ps["volumes"]]
    deadline = lambda f: build_children(OWNER, parse(f)).workload["spec"]["progressDeadlineSeconds"]  # noqa: E731
    assert deadline({**BASE, "adapters": [SQL]}) == deadline({**BASE, "adapters": [CHAT]}) + 3600


def test_adapter_changes_roll_the_pods_and_other_services_keep_their_hash() -> None:
    def hashed(fields: dict[str, Any]) -> str:
        return config_hash(build_config_map(OWNER, parse(fields)))

    plain = hashed(BASE)
    one = hashed({**BASE, "adapters": [SQL]})
    moved = hashed({**BASE, "adapters": [{**SQL, "source": "hf://org/sql-lora@v2"}]})
    wider = hashed({**BASE, "adapters": [SQL], "engine": {"lora": {"maxLoraRank": 64}}})
    assert len({plain, one, moved, wider}) == 4  # the link's path is the same for v1 and v2
    assert hashed(BASE) == plain  # no adapters: the engine config has no key for them
    engine = build_config_map(OWNER, parse({**BASE, "adapters": [SQL]}))["data"]["engine.json"]
    assert '"adapters"' in engine and '"maxLoras": 1' in engine
    d = build_children(OWNER, parse({**BASE, "adapters": [SQL]})).workload
    assert d["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION] == one


def test_children_pass_kubernetes_validate() -> None:
    spec = parse({"model": "hf://org/llama", "adapters": [SQL, S3],
                  "modelCache": {"claimName": "cache"}, "modelSecretRef": {"name": "hf"}})  # fmt: skip
    for child in build_children(OWNER, spec).desired:
        kubernetes_validate.validate(child, "1.32.0", strict=True)


# Refused by the operator and by the CRD alike (the API server may not apply the schema).
REFUSED = [
    ({"adapters": [SQL, {**SQL, "source": "/opt/x"}]}, "unique", "duplicate name"),
    ({"adapters": [{**SQL, "name": "-x"}]}, "does not match", "must be at most 64 letters"),
    ({"adapters": [{**SQL, "name": "llama"}]}, "must differ from the base model", "served name"),
    ({"servedModelName": "base", "adapters": [{**SQL, "name": "base"}]},
     "must differ from the base model", "served name"),
    ({"adapters": [{**SQL, "source": "rel/path"}]}, "does not match", "expected hf://"),
    ({"adapters": [{**SQL, "source": "ftp://x/y"}]}, "does not match", "not supported"),
    ({"adapters": [{"name": f"a{k}", "source": "/x"} for k in range(65)]}, "is too long",
     "at most 64 adapters"),
    ({"engine": {"speculative": {"numSpeculativeTokens": 2}}, "adapters": [SQL]},
     "is not supported with engine.speculative", "spec.engine.speculative"),
    ({"engine": {"lora": {"maxLoras": 2}}}, "engine.lora configures adapters", "add adapters"),
    ({"engine": {"lora": {"maxLoraRank": 24}}, "adapters": [SQL]}, "is not one of",
     "maxLoraRank must be one of"),
    ({"engine": {"lora": {"maxLoras": 4, "maxCpuLoras": 2}}, "adapters": [SQL]},
     "maxCpuLoras must be >= maxLoras", "maxCpuLoras (2) must be >= maxLoras (4)"),
    ({"engine": {"lora": {"maxCpuLoras": 1}}, "adapters": [SQL, S3]},
     "maxCpuLoras must be >= maxLoras", "maxCpuLoras (1) must be >= maxLoras (2"),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "crd_says", "operator_says"), REFUSED)
def test_crd_and_operator_refuse_the_same_specs(
    extra: dict[str, Any], crd_says: str, operator_says: str
) -> None:
    fields = {"model": "/opt/models/llama", "resources": {"gpus": 1}, **extra}
    doc = {"apiVersion": "serving.pagoda.dev/v1alpha1", "kind": "InferenceService",
           "metadata": {"name": "llama"}, "spec": fields}  # fmt: skip
    errors = validate(load_crd(), doc)
    assert any(crd_says in e for e in errors), errors
    with pytest.raises(SpecError) as e:
        parse(fields)
    assert operator_says in e.value.message and e.value.reason in (
        "InvalidSpec",
        "UnsupportedModelURI",
    )


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({**BASE, "adapters": [{**CHAT, "source": "pvc://other/x"}]}, "on spec.model's"),
        ({"model": "hf://o/m", "adapters": [CHAT]}, "on spec.model's"),
        ({**BASE, "adapters": [CHAT], "modelCache": {"sizeLimit": "1Gi"}}, "models only (and to hf:// and s3:// spec.adapters)"),
        ({**BASE, "adapters": [{**SQL, "name": "smollm2-135m"}], "model": "smollm2-135m",
          "servedModelName": "x"}, "served name"),  # the CRD's rule sees spec.model too
    ],
)  # fmt: skip
def test_what_only_the_operator_refuses(fields: dict[str, Any], words: str) -> None:
    """The rules the CRD leaves to the operator (a condition): a pvc:// adapter off the model's
    claim; modelCache with nothing to download."""
    with pytest.raises(SpecError) as e:
        parse(fields)
    assert words in e.value.message


def test_valid_specs_pass_both() -> None:
    for fields in (
        {**BASE, "adapters": [SQL, CHAT, S3], "modelCache": {"claimName": "c"}},
        {"model": "smollm2-135m", "servedModelName": "base", "adapters": [{**SQL, "name": "llama"}],
         "engine": {"lora": {"maxLoras": 1, "maxLoraRank": 512, "maxCpuLoras": 1}}},
        {"model": "/opt/m", "adapters": [{"name": "a.b_c-1", "source": "file:///opt/lora/a"}]},
        # adapters on an FP8 base (the runtime serves them: tests/runtime/lora/test_lora_fp8.py)
        {**BASE, "adapters": [SQL], "resources": {"gpus": 1}, "engine": {"quantization": "fp8"}},
    ):  # fmt: skip
        doc = {"apiVersion": "serving.pagoda.dev/v1alpha1", "kind": "InferenceService",
               "metadata": {"name": "llama"}, "spec": fields}  # fmt: skip
        assert validate(load_crd(), doc) == []
        parse(fields)


def test_tensor_parallel_groups_serve_adapters_on_every_pod() -> None:
    """Tensor parallelism takes adapters (each rank reads its shard from the adapter's path):
    the CRD and the operator pass it, and a multi-node group's workers get the LoRA flags and
    the `adapter-download` init container as the leader does."""
    fields = {**BASE, "resources": {"gpus": 2}, "parallelism": {"nodes": 2}, "adapters": [SQL]}
    doc = {"apiVersion": "serving.pagoda.dev/v1alpha1", "kind": "InferenceService",
           "metadata": {"name": "llama"}, "spec": fields}  # fmt: skip
    assert validate(load_crd(), doc) == []
    lws = build_children(OWNER, parse(fields)).workload
    assert lws["kind"] == "LeaderWorkerSet"
    group = lws["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        pod = group[role]["spec"]
        args = next(c["args"] for c in pod["containers"] if "--enable-lora" in c["args"])
        assert args[args.index("--lora-modules") + 1] == f"sql={ADAPTERS_MOUNT}/sql", role
        assert ADAPTER_CONTAINER in [c["name"] for c in pod["initContainers"]], role
    assert "--node-rank" in " ".join(str(a) for c in group["workerTemplate"]["spec"]["containers"]
                                     for a in c.get("args", []))  # fmt: skip


def _stub_pagoda(tmp_path: pathlib.Path) -> dict[str, str]:
    """A `pagoda` that logs its argv and prints a snapshot path as `pagoda download` does (on
    stdout, logs on stderr); a URI with 'missing' fails as it would, exit 2 + its message."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "pagoda"
    stub.write_text(
        "#!/bin/sh\n"
        'echo "$@" >> "$LOG"\n'
        'case "$3" in *missing*) echo "ModelDownloadFailed/NotFound: $3" > "$TERM_LOG"; exit 2;; esac\n'
        'echo "downloading $3" >&2\n'
        'p="$5/snapshots/$(echo "$3" | tr -c "a-z0-9\\n" _)"; mkdir -p "$p"; echo "$p"\n'
    )
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "LOG": str(tmp_path / "argv.log"), "TERM_LOG": str(tmp_path / "termination")}  # fmt: skip


def _run_init(init: dict[str, Any], tmp_path: pathlib.Path, env: dict[str, str]) -> Any:
    cache, links = tmp_path / "cache", tmp_path / "links"
    cache.mkdir(exist_ok=True)
    links.mkdir(exist_ok=True)
    swap = {MODEL_CACHE_MOUNT: str(cache), ADAPTERS_MOUNT: str(links)}
    argv = [*init["command"], *(swap.get(a, a) for a in init["args"])]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)


def test_the_init_script_links_each_download_and_stops_at_a_failure(tmp_path: pathlib.Path) -> None:
    env = _stub_pagoda(tmp_path)
    init = pod_spec({**BASE, "adapters": [SQL, CHAT, S3]})["initContainers"][0]
    done = _run_init(init, tmp_path, env)
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "argv.log").read_text().splitlines()
    assert log == [f"download --model {u} --download-dir {tmp_path / 'cache'}"
                   for u in ("hf://org/sql-lora@v1", "s3://bucket/adapters/x")]  # fmt: skip
    for name in ("sql", "s3-ad"):
        link = tmp_path / "links" / name
        assert link.is_symlink() and link.resolve().is_dir()
        assert link.resolve().parent == (tmp_path / "cache" / "snapshots").resolve()
    assert _run_init(init, tmp_path, env).returncode == 0  # a restarted init container relinks

    bad = {"name": "bad", "source": "hf://org/missing"}
    init = pod_spec({**BASE, "adapters": [bad, SQL]})["initContainers"][0]
    done = _run_init(init, tmp_path, env)
    assert done.returncode == 2  # the kubelet keeps `pagoda download`'s termination message
    assert (tmp_path / "termination").read_text().startswith("ModelDownloadFailed/NotFound")
    assert not (tmp_path / "links" / "bad").exists()


async def test_reconcile_serves_adapters_and_reports_a_bad_one(
    emulator: Any, kube: Any, start_operator: Any
) -> None:
    """Against the API-server emulator: the Deployment runs the adapters, status.adapters lists
    them, a changed list rolls the pod template, and a spec only the operator can refuse (a
    pvc:// adapter on another claim) gets Degraded=InvalidSpec with the reason."""
    await start_operator()
    await create_isvc(kube, "llama", {"model": "hf://org/llama", "adapters": [SQL]})
    isvc = await wait_for(lambda: (emulator.live(ISVC, "default", "llama") or {}).get("status", {}).get("adapters"))  # fmt: skip
    assert isvc == [{"name": "sql", "source": "hf://org/sql-lora@v1"}]
    deploy = emulator.live(DEPLOY, "default", "llama")
    old_hash = deploy["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]
    assert (
        f"sql={ADAPTERS_MOUNT}/sql" in deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    )

    two = [SQL, {"name": "sql2", "source": "s3://bucket/sql2"}]
    await kube.patch("InferenceService", "default", "llama", {"spec": {"adapters": two}})
    status = lambda: emulator.live(ISVC, "default", "llama")["status"]  # noqa: E731
    await wait_for(lambda: len(status().get("adapters") or []) == 2)
    template = emulator.live(DEPLOY, "default", "llama")["spec"]["template"]
    assert template["metadata"]["annotations"][CONFIG_HASH_ANNOTATION] != old_hash
    assert template["spec"]["initContainers"][1]["args"][-2:] == ["sql2", "s3://bucket/sql2"]

    await create_isvc(kube, "bad", {"model": "pvc://models/m", "adapters": [{**CHAT, "source": "pvc://other/x"}]})  # fmt: skip
    cond = await wait_for(lambda: condition(emulator, "bad", "Degraded"))
    assert (cond["status"], cond["reason"]) == ("True", "InvalidSpec")
    assert "a pvc:// adapter must be on spec.model's PersistentVolumeClaim" in cond["message"]
    assert emulator.live(DEPLOY, "default", "bad") is None

    cached = {"model": "smollm2-135m", "adapters": [SQL], "modelCache": {"claimName": "nope"}}
    await create_isvc(kube, "cached", cached)  # the claim is checked for an adapter's download
    cond = await wait_for(lambda: condition(emulator, "cached", "Degraded"))
    assert (cond["status"], cond["reason"]) == ("True", "PVCNotFound")
