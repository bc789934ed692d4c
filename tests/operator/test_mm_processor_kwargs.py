"""The image processor's settings on an InferenceService (spec.engine.mmProcessorKwargs, vLLM's
`--mm-processor-kwargs`): the CRD and the operator refusing the same values (a Degraded
condition naming the field), the flag the real `pagoda serve` parser and the runtime's own
reader take, the ConfigMap's record and hash, and the keys being those the runtime's image
processors read."""

from __future__ import annotations

import json
from typing import Any

import engine_field_testlib as lib
import pytest
from operator_harness import load_crd
from pagoda.operator.children.config_map import build_config_map, config_hash
from pagoda.operator.children.owner import Owner
from pagoda.operator.spec.engine import MM_PROCESSOR_KWARGS
from pagoda.operator.spec.fields import SpecError
from pagoda.operator.spec.inference_service import InferenceServiceSpec
from pagoda.runtime.multimodal.inputs import FAMILIES
from pagoda.runtime.option_rules import parse_processor_kwargs
from pagoda.runtime.server.cli import build_parser, server_config

OWNER = Owner(name="qwen-vl", namespace="default", uid="uid-1")
MODEL = "hf://Qwen/Qwen2-VL-2B-Instruct"
FIELD = "spec.engine.mmProcessorKwargs"


def parse(fields: dict[str, Any]) -> InferenceServiceSpec:
    return lib.parse(fields, "qwen-vl")


def engine(kwargs: Any) -> dict[str, Any]:
    return {"model": MODEL, "resources": {"gpus": 1}, "engine": {"mmProcessorKwargs": kwargs}}


def crd_errors(fields: dict[str, Any]) -> list[str]:
    return lib.crd_errors(fields, "qwen-vl")


def server_args(spec: InferenceServiceSpec) -> list[str]:
    return lib.server_args(OWNER, spec)


def test_the_keys_are_those_the_runtimes_processors_read() -> None:
    """The operator's keys and the CRD's properties: the union of every image-input family's
    `PROCESSOR_KWARGS` (a family reading a new setting shows here)."""
    read = {k for family in FAMILIES.values() for k in family.PROCESSOR_KWARGS}
    assert set(MM_PROCESSOR_KWARGS) == read
    engine_schema = load_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    engine_schema = engine_schema["properties"]["spec"]["properties"]["engine"]
    assert set(engine_schema["properties"]["mmProcessorKwargs"]["properties"]) == read


@pytest.mark.parametrize(
    ("kwargs", "crd_says", "operator_says"),
    [
        ({"min_pixels": 0}, "0 is less than the minimum of 1",
         f"{FIELD}.min_pixels must be between 1 and 1073741824, got 0"),
        ({"max_pixels": 1 << 31}, "is greater than the maximum of 1073741824",
         "between 1 and 1073741824"),
        ({"max_pixels": "1003520"}, "'1003520' is not of type 'integer'",
         f"{FIELD}.max_pixels must be an integer, got '1003520'"),
        ({"min_pixels": True}, "True is not of type 'integer'", "must be an integer"),
        ({"min_pixels": 4096, "size": 1}, "Additional properties are not allowed",
         f"{FIELD}: unknown field(s) size (known: crop_to_patches, max_patches, max_pixels, "
         "min_patches, min_pixels, resize_to_max_canvas)"),
        ({"min_patches": 8, "max_patches": 4}, "min_patches must be <= max_patches",
         f"{FIELD}.min_patches (8) must be <= max_patches (4)"),
        ({"max_patches": 2000}, "is greater than the maximum of 1024", "between 1 and 1024"),
        ({"crop_to_patches": "no"}, "'no' is not of type 'boolean'",
         f"{FIELD}.crop_to_patches must be true or false, got 'no'"),
        ({"min_pixels": 8192, "max_pixels": 4096}, "min_pixels must be <= max_pixels",
         f"{FIELD}.min_pixels (8192) must be <= max_pixels (4096)"),
        ([{"min_pixels": 4096}], "is not of type 'object'", f"{FIELD} must be an object"),
    ],
)  # fmt: skip
def test_bad_kwargs_are_refused_by_the_crd_and_the_operator(
    kwargs: Any, crd_says: str, operator_says: str
) -> None:
    """What the schema refuses at `kubectl apply`, the operator refuses too (an API server
    without the schema): InvalidSpec, shown as Degraded=True with the field named."""
    lib.check_refused(engine(kwargs), "qwen-vl", crd_says, operator_says)


@pytest.mark.parametrize(
    "kwargs",
    [{"min_pixels": 200704, "max_pixels": 1003520}, {"max_pixels": 1}, {"min_pixels": 1 << 30},
     {"min_pixels": 4096, "max_pixels": 4096},
     {"min_patches": 1, "max_patches": 6, "crop_to_patches": True}, {"crop_to_patches": False}],
)  # fmt: skip
def test_the_flag_is_the_runtimes(kwargs: dict[str, int | bool]) -> None:
    """`--mm-processor-kwargs` as vLLM's JSON, which the real parser, the server's own checks
    and the runtime's reader (`option_rules.parse_processor_kwargs`) take as the settings asked."""
    assert crd_errors(engine(kwargs)) == []
    args = server_args(parse(engine(kwargs)))
    assert json.loads(args[args.index("--mm-processor-kwargs") + 1]) == kwargs
    parsed = build_parser().parse_args(args)
    server_config(parsed)
    assert parse_processor_kwargs(parsed.mm_processor_kwargs) == kwargs


def test_unset_renders_nothing_and_a_change_rolls_the_pods() -> None:
    """Unset, `{}`, null or null values: no flag (the checkpoint's settings), no key in
    engine.json, the config hash of a service that never set it; each setting its own hash."""
    plain = parse({"model": MODEL, "resources": {"gpus": 1}})
    for kwargs in ({}, None, {"min_pixels": None}):
        spec = parse(engine(kwargs))
        assert spec.engine.mm_processor_kwargs is None
        assert "--mm-processor-kwargs" not in server_args(spec)
        assert config_hash(build_config_map(OWNER, spec)) == config_hash(
            build_config_map(OWNER, plain)
        )
    assert build_parser().parse_args(server_args(plain)).mm_processor_kwargs is None
    hashes = {config_hash(build_config_map(OWNER, plain))}
    for kwargs in ({"max_pixels": 1003520}, {"min_pixels": 3136, "max_pixels": 1003520}):
        cm = build_config_map(OWNER, parse(engine(kwargs)))
        assert json.loads(cm["data"]["engine.json"])["mmProcessorKwargs"] == kwargs
        hashes.add(config_hash(cm))
    assert len(hashes) == 3


def test_extra_args_may_not_set_the_flag() -> None:
    """`--mm-processor-kwargs` in engine.extraArgs would win over the field (argparse's last
    word): refused, naming the field."""
    spec = {"model": MODEL, "engine": {"extraArgs": ["--mm-processor-kwargs", "{}"]}}
    with pytest.raises(SpecError) as e:
        parse(spec)
    assert e.value.reason == "InvalidSpec" and FIELD in e.value.message
