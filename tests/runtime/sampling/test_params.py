"""SamplingParams and EngineConfig reject bad values with a message naming the field."""

from __future__ import annotations

import pytest
from pagoda.runtime.config import CacheConfig, EngineConfig, SchedulerConfig
from pagoda.runtime.sampling.params import SamplingParams


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(max_tokens=0), "max_tokens"),
        (dict(temperature=-0.1), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-2), "top_k"),
        (dict(min_p=2.0), "min_p"),
        (dict(n=0), "n"),
        (dict(logprobs=21), "logprobs"),
        (dict(stop=["a", "b", "c", "d", "e"]), "stop"),
        (dict(presence_penalty=3.0), "presence_penalty"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(temperature="hot"), "temperature"),
        (dict(seed=1.5), "seed"),
        (dict(stop=5), "stop"),  # was a TypeError from tuple(5)
        (dict(stop_token_ids=7), "stop_token_ids"),
    ],
)
def test_bad_sampling_params(kwargs, field):
    with pytest.raises(ValueError, match=field) as e:
        SamplingParams(**kwargs)
    assert e.value.field == field


def test_clone_copies_and_validates_changes():
    """vLLM's `clone()`, plus changes (validated)."""
    p = SamplingParams(temperature=0.5, stop="x")
    q = p.clone()
    assert q == p and q is not p
    assert p.clone(max_tokens=3).max_tokens == 3 and p.max_tokens == 16
    with pytest.raises(ValueError, match="top_p"):
        p.clone(top_p=0)


def test_mutable_as_vllms_and_validated_when_received():
    """vLLM users assign fields; a bad value is caught by `validated()` (what an engine runs on
    receipt), and a name that is no field (a typo, a vLLM field not served here) is refused."""
    p = SamplingParams()
    p.max_tokens, p.temperature, p.stop = 64, 0, "x"
    q = p.validated()
    assert (q.max_tokens, q.temperature, q.stop) == (64, 0, ["x"]) and q is not p
    p.min_tokens = 100
    with pytest.raises(ValueError, match="min_tokens") as e:
        p.validated()
    assert e.value.field == "min_tokens"
    with pytest.raises(AttributeError, match="output_kind"):
        p.output_kind = 1
    with pytest.raises(TypeError, match="spaces_between_special_tokens"):
        SamplingParams(spaces_between_special_tokens=False)


def test_vllm_spellings():
    """seed=-1 is vLLM's "no seed"; logprobs=True asks for one alternative."""
    assert SamplingParams(seed=-1).seed is None and SamplingParams(seed=-2).seed == -2
    assert SamplingParams(logprobs=True).logprobs == 1


def test_top_k_0_is_off_as_in_vllm():
    """vLLM's "off" is 0 (-1 is accepted too): neither filters the vocabulary."""
    assert SamplingParams(top_k=0).top_k == -1 and not SamplingParams(top_k=0).filtered
    assert SamplingParams(top_k=-1).top_k == -1


def test_stops_are_lists_as_vllms():
    """A stop string becomes a list of one; each copy has its own list, so appending to the
    user's (as vLLM users do) reaches no request already received."""
    p = SamplingParams(stop="x", stop_token_ids=(5,))
    assert p.stop == ["x"] and p.stop_token_ids == [5]
    q = p.validated()
    p.stop.append("y")
    p.stop_token_ids.append(6)
    assert q.stop == ["x"] and q.stop_token_ids == [5] and p.validated().stop == ["x", "y"]


@pytest.mark.parametrize(
    "make,field",
    [
        (lambda: CacheConfig(block_size=12), "block_size"),
        (lambda: SchedulerConfig(max_num_seqs=0), "max_num_seqs"),
        (
            lambda: SchedulerConfig(max_num_batched_tokens=8, max_num_seqs=16),
            "max_num_batched_tokens",
        ),
        (
            lambda: SchedulerConfig(
                enable_chunked_prefill=False, max_num_batched_tokens=512, max_model_len=1024
            ),
            "max_num_batched_tokens",
        ),
        (lambda: EngineConfig.create(dtype="float8"), "dtype"),
        (lambda: EngineConfig.create(bogus=1), "bogus"),
        (lambda: EngineConfig.create(attention_backend="cuda"), "attention_backend"),
    ],
)
def test_bad_engine_config(make, field):
    with pytest.raises(ValueError, match=field):
        make()


@pytest.mark.parametrize(
    "kwargs,expected",
    [
        (dict(device="cuda"), True),  # a GPU's forward hides the next step's host work
        (dict(device="cpu"), False),  # the forward runs on the host: nothing to hide behind
        (dict(device="cuda", async_scheduling=False), False),
        (dict(device="cpu", async_scheduling=True), True),
    ],
)
def test_async_scheduling_default_follows_the_device(kwargs, expected):
    assert EngineConfig.create(**kwargs).uses_async_scheduling() is expected


def test_pickle_and_copy_keep_every_field_as_validated():
    """The engine process receives each request's params pickled (as field values, in order:
    `SamplingParams.__reduce__`); a copy is shallow, as `copy.copy` of a dataclass."""
    import copy
    import pickle

    p = SamplingParams(seed=-1, top_k=0, stop="x", logit_bias={"7": 200}, max_tokens=9)
    for q in (pickle.loads(pickle.dumps(p, protocol=5)), copy.copy(p), copy.deepcopy(p)):
        assert type(q) is SamplingParams and q == p and q is not p
        assert list(vars(q).items()) == list(vars(p).items())
        assert (q.seed, q.top_k, q.stop, q.logit_bias) == (None, -1, ["x"], ((7, 100.0),))
    c = copy.copy(p)
    c.seed = 3
    assert p.seed is None and c.stop is p.stop
