"""The tuning Job pulls the runtime image as the serving pods do. Those run under the namespace's
`default` ServiceAccount, whose `imagePullSecrets` a private registry needs (docs/deploy.md); the
Job runs under its own ServiceAccount, so the operator copies them onto the Job's pod."""

from __future__ import annotations

import kubernetes_validate
from kube_emulator import Emulator
from operator_helpers import create_isvc
from pagoda.operator.autotune import jobs
from pagoda.operator.autotune.keys import PRODUCT_LABEL, key_for
from pagoda.operator.autotune.loop import Autotuner
from pagoda.operator.kube import rbac
from pagoda.operator.kube.client import KubeApi
from pagoda.operator.spec.config import OperatorConfig
from pagoda.operator.spec.inference_service import InferenceServiceSpec
from test_autotune_e2e import H200, JOBS, add_node, spec

REGCRED = [{"name": "regcred"}]


def test_the_job_pod_gets_the_pull_secrets() -> None:
    parsed = InferenceServiceSpec.from_dict(spec(), name="a", default_image="img:1")
    key = key_for(parsed, H200)
    cm = {"metadata": {"name": key.profile_name, "uid": "u-1"}}
    job = jobs.build_job(key, parsed, "default", cm, pull_secrets=REGCRED)
    assert job["spec"]["template"]["spec"]["imagePullSecrets"] == REGCRED
    kubernetes_validate.validate(job, "1.32.0", strict=True)
    assert (
        "imagePullSecrets"
        not in jobs.build_job(key, parsed, "default", cm)["spec"]["template"]["spec"]
    )


async def test_the_tuning_job_pulls_with_the_default_service_accounts_secrets(
    emulator: Emulator, kube: KubeApi
) -> None:
    await kube.create(
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "default", "namespace": "default"}, "imagePullSecrets": REGCRED}
    )  # fmt: skip
    await add_node(kube, "n1", H200)
    await create_isvc(kube, "a", spec(nodeSelector={PRODUCT_LABEL: H200}))

    async def reconcile(body: object) -> None:
        return None

    await Autotuner(kube, OperatorConfig(), reconcile).tick()
    (job,) = emulator.live_all(JOBS)
    assert job["spec"]["template"]["spec"]["imagePullSecrets"] == REGCRED
    assert rbac.allowed("", "serviceaccounts", "get")  # the read is in the chart's RBAC
