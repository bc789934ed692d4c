"""Pure parts of autotuning: keys and GPU products, Job outcome, retry backoff, status, the
publisher's checks, and the predictive floor in the autoscaling policy."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib

import pytest
from pagoda.operator.autoscaling.policy import Metrics, Policy, decide
from pagoda.operator.autotune import jobs, loop, profiles, publish
from pagoda.operator.autotune.floor import prefill_floor
from pagoda.operator.autotune.keys import PRODUCT_LABEL, key_for, products_for
from pagoda.operator.spec.fields import SpecError
from pagoda.operator.spec.inference_service import InferenceServiceSpec


def parse(**spec: object) -> InferenceServiceSpec:
    base = {"model": "smollm2-135m", "resources": {"gpus": 1}, "autotune": {"enabled": True}}
    return InferenceServiceSpec.from_dict({**base, **spec}, name="svc", default_image="img:1")


def node(name: str, product: str | None, gpus: int, **labels: str) -> dict:
    if product:
        labels[PRODUCT_LABEL] = product
    return {"metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}}}  # fmt: skip


def test_products_follow_the_node_selector_and_gpu_capacity() -> None:
    nodes = [
        node("a", "H200", 8, pool="x"),
        node("b", "A100", 1),
        node("c", "L4", 0),
        node("d", None, 8),
    ]
    assert products_for(parse(), nodes) == ["A100", "H200"]
    two_gpus = parse(model="/opt/models/m", resources={"gpus": 2}, autotune={"enabled": False})
    assert products_for(two_gpus, nodes) == ["H200"]
    assert products_for(parse(nodeSelector={"pool": "x"}), nodes) == ["H200"]
    assert products_for(parse(nodeSelector={PRODUCT_LABEL: "B200"}), nodes) == ["B200"]


def test_key_changes_with_shapes_image_and_targets_only() -> None:
    k = key_for(parse(), "H200")
    assert key_for(parse(replicas=3, engine={"maxNumSeqs": 8}), "H200") == k  # not shapes
    for other in (parse(engine={"dtype": "float16"}), parse(engine={"maxModelLen": 512}),
                  parse(image="img:2"), parse(autotune={"enabled": True, "targets": {"ttftSeconds": 1}})):  # fmt: skip
        assert key_for(other, "H200").digest != k.digest
    assert key_for(parse(), "A100").profile_name != k.profile_name
    assert len(k.profile_name) <= 63 and k.job_name.startswith("pagoda-tune-")
    hf = "pvc://models/llama-3.1-8b/hf"  # --quantization fp8 refuses a GGUF (smollm2-135m)
    fp8 = [key_for(parse(model=hf, engine=e), "H200") for e in ({"quantization": "fp8"},
                                                                {"kvCacheDtype": "fp8"})]  # fmt: skip
    assert len({key_for(parse(model=hf), "H200").digest, *(f.digest for f in fp8)}) == 3
    assert fp8[0].describe().endswith("/ quantization fp8")
    # FP8 left unset: the digest of a key without the FP8 fields (existing profiles keep names)
    fields = {n: v for n, v in vars(k).items() if n not in ("quantization", "kv_cache_dtype")}
    raw = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    assert k.digest == hashlib.sha256(raw.encode()).hexdigest()[:12]


def test_autotune_needs_gpus_and_a_sane_budget() -> None:
    with pytest.raises(SpecError, match="gpus >= 1"):
        parse(resources={"gpus": 0})
    with pytest.raises(SpecError, match="timeBudgetSeconds"):
        parse(autotune={"enabled": True, "timeBudgetSeconds": 5})
    assert parse(autotune={"enabled": False}, resources={"gpus": 0}).autotune.enabled is False
    # a profile measured on one GPU does not describe a tensor-parallel server
    with pytest.raises(SpecError, match="cannot tune a tensor-parallel one"):
        parse(resources={"gpus": 2})


def test_job_outcome_and_backoff() -> None:
    assert jobs.job_outcome(None)[0] == "absent"
    assert jobs.job_outcome({"status": {"active": 1}})[0] == "running"
    failed = {
        "status": {
            "conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]
        }
    }
    assert jobs.job_outcome(failed)[:2] == ("failed", "DeadlineExceeded")
    assert jobs.job_outcome({"status": {"succeeded": 1}})[0] == "succeeded"
    a = profiles.Attempts(count=3, started=1000.0, failure="X: y", failed=2000.0)
    assert a.retry_at(10.0) == 2000.0 + 40.0  # base × 2^(n−1) after the failure
    assert (
        profiles.Attempts(count=30, started=0.0, failure=None).retry_at(300.0)
        == profiles.RETRY_MAX_S
    )
    assert profiles.Attempts(0, None, None).retry_at() == 0.0
    # hand-edited annotations: a huge count is the cap (2.0 ** 1023 once overflowed), a time that
    # is no time is none, a count below 0 is 0
    a = "serving.pagoda.dev/"
    edited = profiles.Attempts.of(
        {"metadata": {"annotations": {a + "tune-attempts": "5000", a + "tune-started": "7.0"}}}
    )
    assert edited.retry_at(300.0) == 7.0 + profiles.RETRY_MAX_S
    for bad in ("inf", "nan", "-inf"):
        ann = {a + "tune-attempts": "-3", a + "tune-failed": bad, a + "tune-started": bad}
        assert profiles.Attempts.of({"metadata": {"annotations": ann}}) == profiles.Attempts(
            0, None, None
        )
    long = {"metadata": {"annotations": {a + "tune-failure": "X: " + "y" * 100_000}}}
    assert len(profiles.Attempts.of(long).failure or "") == 1024  # it goes into the status
    stepped = profiles.Attempts(2, 10.0, "X: y", failed=100_000.0)  # the clock stepped back
    assert profiles.in_future(stepped, now=1000.0)
    assert not profiles.in_future(dataclasses.replace(stepped, failed=1000.0), now=1000.0)


def test_service_status_is_the_worst_key_and_mounts_only_one_product() -> None:
    spec = parse()
    h, a = key_for(spec, "H200"), key_for(spec, "A100")
    tuned = loop.KeyState(loop.TUNED, "ProfilePublished", "", "abc")
    failed = loop.KeyState(loop.FAILED, "DeadlineExceeded", "timed out")
    st = loop.service_status([h, a], [tuned, failed])
    assert (st["state"], st["reason"]) == (
        "TuningFailed",
        "DeadlineExceeded",
    ) and "profile" not in st
    one = loop.service_status([h], [tuned])
    assert one["state"] == "Tuned" and one["profile"] == h.profile_name
    assert loop.service_status([], [])["reason"] == "NoGPUNodes"


def test_publisher_refuses_a_missing_or_invalid_profile(tmp_path: pathlib.Path) -> None:
    with pytest.raises(publish.PublishError, match=r"profile\.json"):
        publish.profile_data(tmp_path)
    (tmp_path / "profile.json").write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(publish.PublishError):
        publish.profile_data(tmp_path)
    with pytest.raises(publish.PublishError, match="NAMESPACE/NAME"):
        publish.split_target("just-a-name")


def test_prefill_floor_rule() -> None:
    # 4000 queued tokens, V_P 1000 tok/s, TTFT 2 s, ISL 1000: 1 s left per replica → 4 replicas
    assert prefill_floor(4000, 1000.0, 2.0, 1000) == 4
    assert prefill_floor(0, 1000.0, 2.0, 1000) is None  # no queue
    assert prefill_floor(4000, None, 2.0, 1000) is None  # no profile
    assert prefill_floor(4000, 1000.0, 0.5, 1000) is None  # target unreachable for one prompt


def test_policy_floor_lifts_the_recommendation_past_the_step_cap() -> None:
    base = dict(min_replicas=1, max_replicas=40, target_ttft_s=0.5, target_queue=4.0)
    m = Metrics(ttft_p95_s=5.0, waiting=500, queued_prompt_tokens=500 * 30.0, mean_prompt_tokens=30)
    plain = decide(Policy(**base), m, current=5, ready=5, history=((0.0, 5),), now=15.0)
    floored = decide(Policy(**base, prefill_tokens_per_s=234.0), m, current=5, ready=5,
                     history=((0.0, 5),), now=15.0)  # fmt: skip
    assert plain.replicas == 10  # ×2 per step
    assert floored.replicas == 40  # ⌈15000 / (234 · (0.5 − 30/234))⌉ = 173, clamped
    idle = Metrics(ttft_p95_s=0.1, waiting=0, queued_prompt_tokens=0.0, mean_prompt_tokens=30)
    same = decide(Policy(**base, prefill_tokens_per_s=234.0), idle, current=5, ready=5,
                  history=((0.0, 5),), now=15.0)  # fmt: skip
    assert same.replicas == decide(Policy(**base), idle, current=5, ready=5,
                                   history=((0.0, 5),), now=15.0).replicas  # fmt: skip


def test_rendered_commands_parse_with_the_real_runtime_parsers() -> None:
    """The Job's `pagoda tune` line and the tuned Deployment's `pagoda serve` line."""
    import argparse

    from pagoda.operator.autotune.mount import MOUNT_PATH, TunedMount
    from pagoda.operator.children.build import build_children
    from pagoda.operator.children.owner import Owner
    from pagoda.runtime.server.cli import build_parser
    from pagoda.runtime.tune import cli as tune_cli

    spec = parse(engine={"maxModelLen": 512, "dtype": "bfloat16"})
    key = key_for(spec, "H200")
    tune_parser = argparse.ArgumentParser()
    tune_cli.add_arguments(tune_parser)
    t = tune_parser.parse_args(jobs.tune_args(key, spec))
    assert (t.model, t.dtype, t.max_model_len, t.output) == (
        "smollm2-135m",
        "bfloat16",
        512,
        "/profile",
    )
    assert tune_cli.parse_duration(t.time_budget) == spec.autotune.time_budget_seconds
    assert (t.quantization, t.kv_cache_dtype) == (None, "auto")
    fp8 = parse(model="pvc://models/m/hf", engine={"quantization": "fp8", "kvCacheDtype": "fp8"})
    t = tune_parser.parse_args(jobs.tune_args(key_for(fp8, "H200"), fp8))
    assert (t.quantization, t.kv_cache_dtype) == ("fp8", "fp8")  # the FP8 sweep runs
    owner = Owner("svc", "default", "uid-1")
    deploy = build_children(owner, spec, tuned=TunedMount("cm", "h")).get("Deployment")
    s = build_parser().parse_args(deploy["spec"]["template"]["spec"]["containers"][0]["args"])
    assert (s.tuned_profile, s.tuned_profile_mismatch) == (MOUNT_PATH, "warn")


def test_manifests_are_valid_kubernetes_objects() -> None:
    import kubernetes_validate

    spec = parse(
        model="pvc://models/llama", tolerations=[{"key": "dedicated", "operator": "Exists"}]
    )
    key = key_for(spec, "H200")
    cm = profiles.build_profile_config_map(key, "default")
    cm["metadata"]["uid"] = "uid-cm"
    for doc in (cm, *jobs.build_rbac(key, "default", cm), jobs.build_job(key, spec, "default", cm)):
        kubernetes_validate.validate(doc, "1.32.0", strict=True)
    job = jobs.build_job(key, spec, "default", cm)
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    assert volumes["model"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}


@pytest.mark.parametrize(
    ("autotune", "resources", "ok"),
    [({"enabled": True}, {"gpus": 1}, True), ({"enabled": True}, {}, False),
     ({"enabled": False}, {}, True), ({"enabled": True, "timeBudgetSeconds": 10}, {"gpus": 1}, False)],
)  # fmt: skip
def test_crd_rules_for_autotune(autotune: dict, resources: dict, ok: bool) -> None:
    from crd_schema import validate
    from operator_harness import load_crd

    doc = {"apiVersion": "serving.pagoda.dev/v1alpha1", "kind": "InferenceService",
           "metadata": {"name": "x"},
           "spec": {"model": "m", "autotune": autotune, "resources": resources}}  # fmt: skip
    errors = validate(load_crd(), doc)
    assert (not errors) == ok, errors


def test_a_remote_model_is_downloaded_before_tuning() -> None:
    """The tuning Job of an hf:// model gets what its serving pods get: the model-cache volume and
    the download init container (first), and `tune` reads the cache offline."""
    import argparse

    import kubernetes_validate
    from pagoda.operator.autotune.jobs import build_job
    from pagoda.operator.children.model_cache import add_model_download
    from pagoda.operator.kube.names import MODEL_CACHE_MOUNT
    from pagoda.runtime.tune import cli as tune_cli

    spec = parse(model="hf://org/llama@main", modelSecretRef={"name": "hf"})
    key = key_for(spec, "H200")
    cm = {"metadata": {"name": key.profile_name, "uid": "u-1"}}
    job = build_job(key, spec, "team-a", cm, pod_parts=add_model_download)
    pod = job["spec"]["template"]["spec"]
    download, tune = pod["initContainers"]
    assert (download["name"], tune["name"]) == ("model-download", "tune")
    assert tune["args"][tune["args"].index("--model") + 1] == "hf://org/llama@main"
    parser = argparse.ArgumentParser()
    tune_cli.add_arguments(parser)
    assert parser.parse_args(tune["args"]).download_dir == MODEL_CACHE_MOUNT  # as serve's
    assert {"HF_HUB_OFFLINE", "PAGODA_DOWNLOAD_DIR"} <= {e["name"] for e in tune["env"]}
    assert any(m["name"] == "model-cache" and m["readOnly"] for m in tune["volumeMounts"])
    assert not any(m["name"] == "model-cache" for m in pod["containers"][0]["volumeMounts"])
    kubernetes_validate.validate(job, "1.32.0", strict=True)
    assert "initContainers" in job["spec"]["template"]["spec"]
    plain = build_job(key_for(parse(), "H200"), parse(), "team-a", cm, pod_parts=add_model_download)
    assert [c["name"] for c in plain["spec"]["template"]["spec"]["initContainers"]] == ["tune"]
    assert "--download-dir" not in plain["spec"]["template"]["spec"]["initContainers"][0]["args"]


def test_profile_check_needs_no_writable_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator checks a published profile with serving's loader in a temporary folder;
    without a writable one (a read-only root and no /tmp volume) it mounts it unchecked, as
    before, instead of failing every reconcile and autotune pass."""
    from pagoda.operator.autotune import mount

    def read_only(*a: object, **kw: object) -> None:
        raise OSError(30, "Read-only file system")

    cm = {"metadata": {"name": "pagoda-tuned-x"}, "data": {"profile.json": '{"v": 0}'}}
    assert mount.profile_problem(cm, "smollm2-135m") is not None  # a real check: refused
    monkeypatch.setattr(mount.tempfile, "TemporaryDirectory", read_only)
    cm["data"]["profile.json"] = '{"v": 1}'  # another hash: not cached
    assert mount.profile_problem(cm, "smollm2-135m") is None


def test_the_shape_fingerprint_is_checked_before_mounting() -> None:
    """The operator loads a published profile with serving's loader: a malformed
    `shape_fingerprint` (a hand edit) is InvalidProfile, as serving would exit 2 on it; a
    well-formed one is mounted whatever its shapes (the operator does not read the model's files;
    serving compares them under --tuned-profile-mismatch warn)."""
    import json

    from pagoda.operator.autotune import mount

    base = {"schema_version": 1, "device": "NVIDIA H200", "model": "smollm2-135m",
            "dtype": "bfloat16", "created": "2026-12-05T00:00:00Z"}  # fmt: skip

    def problem(fingerprint: object) -> tuple[str, str] | None:
        data = {"profile.json": json.dumps({**base, "shape_fingerprint": fingerprint})}
        return mount.profile_problem({"metadata": {"name": "pagoda-tuned-f"}, "data": data},
                                     "smollm2-135m")  # fmt: skip

    reason, message = problem({"hidden_size": 4096.5}) or ("", "")
    assert reason == mount.INVALID and "shape_fingerprint.hidden_size must be" in message
    assert "ConfigMap pagoda-tuned-f" in message
    assert problem({"hidden_size": 4096, "num_layers": 32, "quantization": "none"}) is None


def test_a_failed_pass_does_not_end_the_autotune_loop() -> None:
    """Any error of one pass (a hand-edited annotation once overflowed) is logged and the next
    pass comes; the loop task once died with it, ending autotuning until a restart."""
    import asyncio

    from pagoda.operator.spec.config import OperatorConfig

    tuner = loop.Autotuner(None, OperatorConfig(autotune_interval_s=0.01), None)  # type: ignore[arg-type]
    passes = [0]

    async def tick() -> None:
        passes[0] += 1
        if passes[0] == 1:
            raise OverflowError("(34, 'Numerical result out of range')")

    tuner.tick = tick  # type: ignore[method-assign]

    async def run() -> None:
        task = asyncio.create_task(tuner.run())
        for _ in range(300):
            await asyncio.sleep(0.01)
            if passes[0] >= 3:
                break
        assert not task.done() and passes[0] >= 3
        task.cancel()

    asyncio.run(run())
