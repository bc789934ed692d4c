"""What the `spec.engine` field tests share (test_image_input.py, test_mm_processor_kwargs.py):
a spec's CRD schema errors, its server's command line, and the check that the CRD and the
operator refuse a value alike (a Degraded InvalidSpec condition naming the field). Imported by
tests (not a conftest)."""

from __future__ import annotations

from typing import Any

import pytest
from crd_schema import validate
from operator_harness import load_crd
from pagoda.operator.children.build import build_children
from pagoda.operator.children.owner import Owner
from pagoda.operator.spec.fields import SpecError
from pagoda.operator.spec.inference_service import InferenceServiceSpec
from pagoda.operator.spec.status import compute_status


def parse(fields: dict[str, Any], name: str) -> InferenceServiceSpec:
    return InferenceServiceSpec.from_dict(fields, name=name, default_image="img:1")


def crd_errors(fields: dict[str, Any], name: str) -> list[str]:
    doc = {"apiVersion": "serving.pagoda.dev/v1alpha1", "kind": "InferenceService",
           "metadata": {"name": name}, "spec": fields}  # fmt: skip
    return validate(load_crd(), doc)


def server_args(owner: Owner, spec: InferenceServiceSpec) -> list[str]:
    (server,) = build_children(owner, spec).workload["spec"]["template"]["spec"]["containers"]
    return server["args"]


def check_refused(fields: dict[str, Any], name: str, crd_says: str, operator_says: str) -> None:
    """What the schema refuses at `kubectl apply`, the operator refuses too (an API server
    without the schema): InvalidSpec, shown as Degraded=True with the field named."""
    errors = crd_errors(fields, name)
    assert any(crd_says in e for e in errors), errors
    with pytest.raises(SpecError) as e:
        parse(fields, name)
    assert e.value.reason == "InvalidSpec" and operator_says in e.value.message, e.value
    body = {"metadata": {"name": name, "generation": 3}}
    degraded = {c["type"]: c for c in compute_status(body, None, spec_error=e.value)["conditions"]}
    assert degraded["Degraded"]["status"] == "True"
    assert degraded["Degraded"]["reason"] == "InvalidSpec"
    assert operator_says in degraded["Degraded"]["message"]
