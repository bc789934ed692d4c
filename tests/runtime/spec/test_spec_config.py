"""`--speculative-config` / `speculative_config=`: vLLM's keys, defaults filled once, bad values
refused in one line naming the key; what it is refused beside."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pagoda.runtime import options
from pagoda.runtime.config import EngineConfig, SpeculativeConfig
from pagoda.runtime.engine.start_checks import check_speculative
from pagoda.runtime.option_rules import parse_speculative


def test_keys_and_defaults():
    c = EngineConfig.create(speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                                "prompt_lookup_max": 4})  # fmt: skip
    s = c.speculative_config
    assert (s.num_speculative_tokens, s.prompt_lookup_min, s.prompt_lookup_max) == (3, 4, 4)
    assert parse_speculative('{"num_speculative_tokens": 2}').prompt_lookup_min == 5
    assert s.adaptive and not parse_speculative(
        '{"num_speculative_tokens": 2, "adaptive": false}').adaptive  # fmt: skip
    assert not c.uses_async_scheduling()  # (on the CPU, by default)
    assert EngineConfig.create(speculative_config=s, async_scheduling=True).uses_async_scheduling()
    # left to its default: off with drafts on CUDA too (not run on a GPU with them yet)
    assert not EngineConfig.create(device="cuda", speculative_config=s).uses_async_scheduling()
    assert EngineConfig.create().speculative_config is None


def test_the_flag_reaches_the_engine_config():
    args = {"speculative_config": '{"method": "ngram", "num_speculative_tokens": 5, '
                                  '"prompt_lookup_max": 4, "prompt_lookup_min": 2}'}  # fmt: skip
    spec = EngineConfig.create(**options.engine_kwargs(args)).speculative_config
    assert spec == SpeculativeConfig(5, "ngram", 4, 2)


@pytest.mark.parametrize(
    "value, words",
    [
        ('{"method": "eagle", "num_speculative_tokens": 2}', "method 'eagle'"),
        ('{"method": "ngram"}', "num_speculative_tokens is required"),
        ('{"num_speculative_tokens": 0}', "num_speculative_tokens must be"),
        (
            '{"num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}',
            "prompt_lookup_min (4) is more",
        ),
        ('{"num_speculative_tokens": 2, "drafter": "x"}', "unknown key(s) drafter"),
        ('{"num_speculative_tokens": 2, "adaptive": 1}', "adaptive must be true or false"),
        ("{num_speculative_tokens: 2}", "not JSON"),
        ("[4]", "must be a JSON object"),
    ],
)
def test_bad_configs_are_refused_in_one_line(value, words):
    with pytest.raises(ValueError) as e:
        EngineConfig.create(speculative_config=value)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_refused_beside_stateful_models():
    spec = {"num_speculative_tokens": 2}
    # (tensor parallelism is served: tests/runtime/spec/test_draft_model.py, two ranks)
    EngineConfig.create(speculative_config=spec, tensor_parallel_size=2)
    mamba = SimpleNamespace(
        architecture="FalconH1ForCausalLM",
        family=SimpleNamespace(mamba=SimpleNamespace(num_layers=2), dsv4=None),
    )
    cfg = EngineConfig.create(speculative_config=spec)
    with pytest.raises(ValueError, match="not supported for FalconH1ForCausalLM"):
        check_speculative(cfg, mamba)
