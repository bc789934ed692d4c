"""Each rule between engine flags is stated once, in `pagoda.runtime.option_rules`; the CRD's CEL
(crds/, copied into the chart), the operator's spec check and the runtime's config must agree with
that statement on every combination, an unset flag included: the runtime fills it with its
default (`smaller_default`), so a spec that `pagoda serve` would refuse at start (a pod in a crash
loop) is refused up front."""

from __future__ import annotations

import itertools

import pytest
from crd_schema import validate, version_schema
from operator_harness import load_crd
from pagoda.operator.spec.fields import SpecError
from pagoda.operator.spec.inference_service import InferenceServiceSpec
from pagoda.runtime import option_rules

VALUES = (None, 1, 8, 64, 100)


def engine_validations() -> list[dict[str, str]]:
    schema = version_schema(load_crd())
    return schema["properties"]["spec"]["properties"]["engine"]["x-kubernetes-validations"]


def test_the_crd_states_the_rules_as_options_renders_them() -> None:
    assert engine_validations() == [
        {"rule": r.cel(), "message": r.cel_message()}
        for r in (*option_rules.CRD_ENGINE_RULES, *option_rules.CRD_FLAG_RULES)
    ]


def _agree(crd: dict, rule, values: dict, holds: bool) -> None:
    """The CRD's CEL, the operator's spec check and the runtime's SchedulerConfig each accept
    `values` (engine flags; None: unset, the runtime's default) exactly when the rule `holds`."""
    from pagoda.runtime.config import SchedulerConfig

    engine = {option_rules.camel(k): v for k, v in values.items() if v is not None}
    doc = {
        "apiVersion": "serving.pagoda.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "chat", "namespace": "default"},
        "spec": {"model": "smollm2-135m", "engine": engine},
    }
    crd_errors = [e for e in validate(crd, doc) if rule.cel_message() in e]
    assert bool(crd_errors) != holds, (values, crd_errors)
    try:
        InferenceServiceSpec.from_dict(doc["spec"], name="chat", default_image="img:1")
        operator_ok = True
    except SpecError:
        operator_ok = False
    assert operator_ok == holds, values
    try:  # an unset flag: the runtime's default (the token budget is lifted to fit)
        SchedulerConfig(**{k: v for k, v in values.items() if v is not None})
        runtime_ok = True
    except ValueError:
        runtime_ok = False
    assert runtime_ok == holds, values


@pytest.mark.parametrize("rule", option_rules.CRD_ENGINE_RULES, ids=lambda r: r.cel_message())
def test_crd_operator_and_runtime_agree_with_the_rule(rule: option_rules.AtLeast) -> None:
    crd = load_crd()
    for big, small in itertools.product(VALUES, VALUES):
        values = {rule.larger: big, rule.smaller: small}
        _agree(crd, rule, values, rule.holds(rule.filled(values)))


@pytest.mark.parametrize("rule", option_rules.CRD_FLAG_RULES, ids=lambda r: r.cel_message())
def test_crd_operator_and_runtime_agree_with_the_flag_rule(rule: option_rules.NeedsOn) -> None:
    """A size that needs a bool flag on (longPrefillTokenThreshold > 0 needs chunked prefill):
    the CRD, the operator and the runtime refuse exactly the same combinations."""
    crd = load_crd()
    for size, on in itertools.product((None, 0, 256), (None, True, False)):
        values = {rule.flag: size, rule.on: on}
        holds = rule.holds(values)
        assert holds == (not size or on is not False)
        _agree(crd, rule, values, holds)


def test_the_runtime_default_is_the_one_the_rule_fills_in() -> None:
    from pagoda.runtime.config import SchedulerConfig

    assert option_rules.BATCH_COVERS_SEQS.smaller_default == SchedulerConfig().max_num_seqs
    # the gap this closes: a budget below the default batch with maxNumSeqs unset
    with pytest.raises(
        SpecError, match=r"maxNumBatchedTokens \(8\) must be >= maxNumSeqs \(64 when unset\)"
    ):
        InferenceServiceSpec.from_dict(
            {"model": "smollm2-135m", "engine": {"maxNumBatchedTokens": 8}},
            name="chat",
            default_image="img:1",
        )
    with pytest.raises(ValueError, match="must be >="):
        SchedulerConfig(max_num_batched_tokens=8)
