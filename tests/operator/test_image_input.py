"""Image input on an InferenceService (spec.engine.limitMMPerPrompt, vLLM's
`--limit-mm-per-prompt`): the CRD and the operator refusing the same values (a Degraded
condition naming the field), the flag the real `pagoda serve` parser and the runtime's own reader
take, the ConfigMap's record and hash, and examples/llava-gpu-images.yaml rendered."""

from __future__ import annotations

import json
from typing import Any

import engine_field_testlib as lib
import kubernetes_validate
import pytest
import yaml
from crd_schema import validate
from operator_harness import ROOT, load_crd
from pagoda.operator.children.build import build_children
from pagoda.operator.children.config_map import build_config_map, config_hash
from pagoda.operator.children.owner import Owner
from pagoda.operator.spec.inference_service import InferenceServiceSpec
from pagoda.runtime.multimodal.config import DEFAULT_IMAGE_LIMIT, parse_limits
from pagoda.runtime.server.cli import build_parser, server_config

OWNER = Owner(name="llava", namespace="default", uid="uid-1")
MODEL = "hf://llava-hf/llava-1.5-7b-hf"
EXAMPLE = ROOT / "examples" / "llava-gpu-images.yaml"


def parse(fields: dict[str, Any]) -> InferenceServiceSpec:
    return lib.parse(fields, "llava")


def engine(limit: Any) -> dict[str, Any]:
    return {"model": MODEL, "resources": {"gpus": 1}, "engine": {"limitMMPerPrompt": limit}}


def crd_errors(fields: dict[str, Any]) -> list[str]:
    return lib.crd_errors(fields, "llava")


def server_args(spec: InferenceServiceSpec) -> list[str]:
    return lib.server_args(OWNER, spec)


@pytest.mark.parametrize(
    ("limit", "crd_says", "operator_says"),
    [
        ({"image": -1}, "-1 is less than the minimum of 0",
         "spec.engine.limitMMPerPrompt.image must be between 0 and 1048576, got -1"),
        ({"image": 1 << 21}, "is greater than the maximum of 1048576", "between 0 and 1048576"),
        ({"image": "4"}, "'4' is not of type 'integer'",
         "spec.engine.limitMMPerPrompt.image must be an integer, got '4'"),
        ({"image": True}, "True is not of type 'integer'", "must be an integer"),
        ({"image": 2, "video": 1}, "Additional properties are not allowed",
         "spec.engine.limitMMPerPrompt: unknown field(s) video (known: image)"),
        ([{"image": 2}], "is not of type 'object'", "spec.engine.limitMMPerPrompt must be an object"),
    ],
)  # fmt: skip
def test_bad_limits_are_refused_by_the_crd_and_the_operator(
    limit: Any, crd_says: str, operator_says: str
) -> None:
    """What the schema refuses at `kubectl apply`, the operator refuses too (an API server
    without the schema): InvalidSpec, shown as Degraded=True with the field named."""
    lib.check_refused(engine(limit), "llava", crd_says, operator_says)


@pytest.mark.parametrize("images", [0, 1, 4, 1 << 20])
def test_the_flag_is_the_runtimes(images: int) -> None:
    """`--limit-mm-per-prompt` as vLLM's JSON, which the real parser, the server's own checks
    and the runtime's reader (`multimodal.config.parse_limits`) take as the count asked."""
    assert crd_errors(engine({"image": images})) == []
    args = server_args(parse(engine({"image": images})))
    parsed = build_parser().parse_args(args)
    server_config(parsed)
    assert parse_limits(parsed.limit_mm_per_prompt)["image"] == images


def test_unset_renders_nothing_and_a_change_rolls_the_pods() -> None:
    """Unset, `{}` or null: no flag (the runtime's default, 999), no key in engine.json, the
    config hash of a service that never set it; each count its own hash."""
    plain = parse({"model": MODEL, "resources": {"gpus": 1}})
    hashes = set()
    for limit in ({}, None, {"image": None}):
        spec = parse(engine(limit))
        assert "--limit-mm-per-prompt" not in server_args(spec)
        assert config_hash(build_config_map(OWNER, spec)) == config_hash(
            build_config_map(OWNER, plain)
        )
    parsed = build_parser().parse_args(server_args(plain))
    assert parse_limits(parsed.limit_mm_per_prompt)["image"] == DEFAULT_IMAGE_LIMIT
    for images in (2, 4):
        cm = build_config_map(OWNER, parse(engine({"image": images})))
        assert json.loads(cm["data"]["engine.json"])["limitMMPerPrompt"] == {"image": images}
        hashes.add(config_hash(cm))
    hashes.add(config_hash(build_config_map(OWNER, plain)))
    assert len(hashes) == 3


def test_the_llava_example_renders_a_downloading_vision_server() -> None:
    """examples/llava-gpu-images.yaml: valid against the CRD, downloaded from hf:// by the
    model-download init container, served with its image cap; its children pass
    kubernetes-validate (strict)."""
    (doc,) = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d["kind"] == "InferenceService"]
    assert validate(load_crd(), doc) == []
    spec = InferenceServiceSpec.from_dict(doc["spec"], name="llava", default_image="img:1")
    assert spec.model.uri == MODEL and spec.engine.limit_mm_per_prompt == 4
    children = build_children(OWNER, spec)
    pod = children.workload["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["model-download"]
    (server,) = pod["containers"]
    assert server["args"][server["args"].index("--limit-mm-per-prompt") + 1] == '{"image": 4}'
    for child in children.desired:
        kubernetes_validate.validate(child, "1.32.0", strict=True)
