"""SamplingParams: what a request asks of the sampler, validated once at the door.

Errors are `ParamError(field, message)`: the server answers 400 naming `field` without parsing
the message. Every number must be finite and in range, so no request can make the batched
sampler fail (an error inside a step would take every request down with it).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import Any

MAX_LOGPROBS = 20
MAX_STOP_STRINGS = 4
MAX_N = 16
MAX_TEMPERATURE = 100.0  # finite; above ~5 sampling is already near uniform
MAX_TOP_K = 2**31 - 1  # the sampler holds top_k in an int64 tensor; larger means "off" anyway
MAX_BAD_WORDS = 300  # words of one request's bad_words (each step matches them all)
MAX_LOGIT_BIAS = 300  # entries of one request's logit_bias
LOGIT_BIAS_LIMIT = 100.0  # values are clipped to [-this, this], as OpenAI defines them
MIN_SEED, MAX_SEED = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed accepts


class ParamError(ValueError):
    """A request value the engine cannot serve; `field` names it (as the request spells it)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass
class SamplingParams:
    """OpenAI's knobs plus vLLM's extras (`top_k`, `min_p`, `repetition_penalty`, `ignore_eos`).

    temperature 0 means greedy. `logprobs=k` returns the chosen token's log-probability and the
    top-k alternatives (k may be 0 for the chosen token only); None returns none.
    `prompt_logprobs=k` does the same for each prompt token after the first.
    """

    n: int = 1
    max_tokens: int | None = 16
    # vLLM's: stop tokens (EOS, stop_token_ids) cannot be sampled and stop strings cannot end
    # in the text of the first min_tokens tokens
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # lists, as vLLM's (`sp.stop.append(...)`); each validated copy has its own
    stop: list[str] = dataclasses.field(default_factory=list)
    stop_token_ids: list[int] = dataclasses.field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    # vLLM's: the log-probability of every prompt token after the first (and the top-k
    # alternatives at each position); the prompt then skips the prefix cache
    prompt_logprobs: int | None = None
    # pagoda's: vLLM's `Logprob.rank` of the chosen or prompt token in each logprobs entry (what
    # the offline API returns); False leaves it None and saves a second pass over each row
    # (scoring costs 1.4-1.75x as much with it on CPU): the OpenAI server's choice, as only
    # vLLM's `prompt_logprobs` field of its responses shows a rank
    logprob_ranks: bool = True
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # OpenAI's logit_bias: (token id, value) pairs, sorted by id; a {id: value} mapping (ids as
    # ints or decimal strings, as JSON spells them) is accepted and converted; values clipped
    logit_bias: tuple[tuple[int, float], ...] = ()
    # vLLM's: sampling only from these token ids (None: all); an empty list is an error, and
    # ids past the vocabulary are refused when an engine receives the params
    allowed_token_ids: list[int] | None = None
    # vLLM's: words the output must not contain (tokenized with and without a leading space
    # when an engine receives the params; see sampling/bad_words.py)
    bad_words: list[str] | None = None
    # `bad_words` tokenized (`bad_words_token_ids`), as vLLM's front end fills its
    # `_bad_words_token_ids`: the server does it on a worker thread, so an engine never spends
    # its step loop tokenizing a request's words (None: the engine tokenizes them)
    bad_words_token_ids: tuple[tuple[int, ...], ...] | None = None
    # pagoda.runtime.structured.params.StructuredOutputsParams: the grammar the output follows
    structured_outputs: Any = None
    # pagoda.runtime.lora_config.LoRARequest: the adapter the request runs with (None: the base
    # model); set by `LLM.generate(lora_request=...)` and the server's `model` name, as vLLM's
    # separate `lora_request` argument (carried here so that it travels with the request)
    lora_request: Any = None
    # pagoda.runtime.multimodal.inputs.MultiModalInputs: the prompt's images (pixels, where
    # their placeholder tokens sit, content hashes); set by `LLM.generate`'s
    # `multi_modal_data` and the server's image parts, carried here as `lora_request` is
    multi_modal: Any = None

    def __post_init__(self) -> None:
        if type(self.seed) is int and self.seed == -1:  # vLLM's "unseeded"
            object.__setattr__(self, "seed", None)
        if self.logprobs is True:  # vLLM's: the chosen token and its best alternative
            object.__setattr__(self, "logprobs", 1)
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", [self.stop])
        for name in ("stop", "stop_token_ids"):
            value = getattr(self, name) or ()
            if not isinstance(value, (list, tuple)):
                raise ParamError(name, f"{name} must be a list, got {_short(value)}")
            object.__setattr__(self, name, list(value))
        _check_int("n", self.n, 1, MAX_N)
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens, 1, None)
        _check_int("min_tokens", self.min_tokens, 0, self.max_tokens)
        self._check_sampling_knobs()
        if self.seed is not None:
            _check_int("seed", self.seed, MIN_SEED, MAX_SEED)
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, 0, MAX_LOGPROBS)
        if self.prompt_logprobs is not None:
            _check_int("prompt_logprobs", self.prompt_logprobs, 0, MAX_LOGPROBS)
        if not isinstance(self.logprob_ranks, bool):
            raise ParamError("logprob_ranks", f"logprob_ranks must be a bool, got "
                             f"{_short(self.logprob_ranks)}")  # fmt: skip
        self._check_stops()
        object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))
        if self.allowed_token_ids is not None:
            object.__setattr__(self, "allowed_token_ids", _token_ids(self.allowed_token_ids))
        if self.bad_words is not None:
            object.__setattr__(self, "bad_words", _bad_words(self.bad_words))
        if self.structured_outputs is not None:
            if not hasattr(self.structured_outputs, "key"):  # no import: structured needs us
                raise ParamError("structured_outputs", "structured_outputs must be a "
                                 "StructuredOutputsParams")  # fmt: skip
            for name in ("ignore_eos", "min_tokens"):
                if getattr(self, name):
                    raise ParamError(name, f"{name} cannot be combined with structured outputs: "
                                     "the output ends when the grammar is complete")  # fmt: skip

        if self.lora_request is not None and not hasattr(self.lora_request, "lora_int_id"):
            raise ParamError("lora_request", "lora_request must be a LoRARequest")
        if self.multi_modal is not None and not hasattr(self.multi_modal, "images"):
            raise ParamError("multi_modal", "multi_modal must be a MultiModalInputs")

    def _check_sampling_knobs(self) -> None:
        """The ranges of the knobs that shape the distribution: temperature, top_p, top_k (0 is
        stored as -1, off), min_p and the three penalties."""
        _check_num("temperature", self.temperature)
        if not 0 <= self.temperature <= MAX_TEMPERATURE:
            raise ParamError(
                "temperature",
                f"temperature must be in [0, {MAX_TEMPERATURE:g}], got {self.temperature}",
            )
        _check_num("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise ParamError("top_p", f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k != -1:
            _check_int("top_k", self.top_k, 0, MAX_TOP_K, "-1 or ")  # 0 and -1: off
            if self.top_k == 0:  # vLLM's preferred "off" (and transformers')
                object.__setattr__(self, "top_k", -1)
        _check_num("min_p", self.min_p)
        if not 0.0 <= self.min_p <= 1.0:
            raise ParamError("min_p", f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            _check_num(name, v)
            if not -2.0 <= v <= 2.0:
                raise ParamError(name, f"{name} must be in [-2, 2], got {v}")
        _check_num("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise ParamError(
                "repetition_penalty",
                f"repetition_penalty must be > 0, got {self.repetition_penalty}",
            )

    def _check_stops(self) -> None:
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ParamError(
                "stop", f"stop accepts at most {MAX_STOP_STRINGS} strings, got {len(self.stop)}"
            )
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ParamError("stop", "stop strings must be non-empty strings")
        if any(
            isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < 2**63
            for t in self.stop_token_ids
        ):
            raise ParamError("stop_token_ids", "stop_token_ids must be non-negative integers")

    # Mutable, as vLLM's (``sp.max_tokens = 64``): validated when made and again when an engine
    # receives it (`validated()`: the engine keeps that copy, so changing the object later does
    # not reach requests already sent). Assigning a name that is not a field: AttributeError.
    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _FIELDS:  # a typo or a vLLM field this runtime lacks: never ignored
            raise AttributeError(f"SamplingParams has no field {name!r}")
        object.__setattr__(self, name, value)

    def clone(self, **changes: Any) -> SamplingParams:
        """A copy, with `changes` applied, validated (vLLM's `clone()`, plus changes)."""
        return dataclasses.replace(self, **changes)

    def with_grammar(self, spec: Any) -> SamplingParams:
        """A copy whose `structured_outputs` is `spec`: the same spec with its grammar compiled
        or left out (the server's compile, the engine process's wire). Nothing else changes,
        so nothing is validated again (`clone` checks every field, ~15-25 us); the lists are
        shared, as with `copy.copy`: for params the engine already owns."""
        new = copy.copy(self)
        object.__setattr__(new, "structured_outputs", spec)
        return new

    def validated(self) -> SamplingParams:
        """A validated copy of the fields as they are now (ParamError if a later assignment made
        them invalid): what an engine keeps of the params it receives."""
        return dataclasses.replace(self)

    def __reduce__(self) -> tuple:
        """Pickled as its field values in order (the engine process receives one per request):
        ~3x faster both ways than a dataclass's default, which pickles a name → value dict."""
        return (_unpickle, (tuple(self.__dict__.values()),))  # in field order: __init__'s

    def __copy__(self) -> SamplingParams:
        new = object.__new__(SamplingParams)
        new.__dict__.update(self.__dict__)
        return new

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    @property
    def filtered(self) -> bool:
        """Whether top-k, top-p or min-p narrows the vocabulary a sampled token comes from."""
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0

    @property
    def needs_penalties(self) -> bool:
        return bool(
            self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
        )


_FIELD_ORDER = tuple(f.name for f in dataclasses.fields(SamplingParams))
_FIELDS = frozenset(_FIELD_ORDER)


def _unpickle(values: tuple) -> SamplingParams:
    """`SamplingParams.__reduce__`'s inverse: the fields as they were, not validated again
    (as a default unpickling would not either: the sender's copy was validated)."""
    params = object.__new__(SamplingParams)
    params.__dict__.update(zip(_FIELD_ORDER, values))
    return params


def sample_seed(seed: int, index: int) -> int:
    """The seed of sample `index` of a request seeded with `seed`: `seed + index`, as vLLM
    seeds a request's n samples, wrapped back into the accepted range past its top (so that
    the largest seeds with n > 1 are served, not refused inside the engine)."""
    s = seed + index
    return s - (MAX_SEED + 1) if s > MAX_SEED else s


def _logit_bias(value: object) -> tuple[tuple[int, float], ...]:
    """{token id: bias} (or pairs) → sorted (id, value clipped to ±100) pairs; ParamError for
    ids that are not non-negative integers, values that are not finite numbers, too many."""
    if not value:
        return ()
    pairs = list(value.items()) if isinstance(value, dict) else value
    if not isinstance(pairs, (list, tuple)):
        raise ParamError("logit_bias", f"logit_bias must map token ids to numbers, got "
                         f"{_short(value)}")  # fmt: skip
    if len(pairs) > MAX_LOGIT_BIAS:
        raise ParamError("logit_bias", f"logit_bias accepts at most {MAX_LOGIT_BIAS} token ids, "
                         f"got {len(pairs)}")  # fmt: skip
    out: dict[int, float] = {}
    for pair in pairs:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ParamError("logit_bias", f"logit_bias entries must be (token id, value), got "
                             f"{_short(pair)}")  # fmt: skip
        key, bias = pair
        token = key if isinstance(key, int) and not isinstance(key, bool) else None
        if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 18:
            token = int(key)
        if token is None or token < 0:
            raise ParamError("logit_bias", f"logit_bias keys must be token ids (non-negative "
                             f"integers), got {_short(key)}")  # fmt: skip
        _check_num("logit_bias", bias)
        if token in out:
            raise ParamError("logit_bias", f"logit_bias gives token {token} twice")
        out[token] = max(-LOGIT_BIAS_LIMIT, min(LOGIT_BIAS_LIMIT, float(bias)))
    return tuple(sorted(out.items()))


def _token_ids(value: object) -> list[int]:
    """allowed_token_ids as a new list; ParamError unless a non-empty list of non-negative
    integers."""
    name = "allowed_token_ids"
    if not isinstance(value, (list, tuple)):
        raise ParamError(name, f"{name} must be a list of token ids, got {_short(value)}")
    if not value:
        raise ParamError(name, f"{name} must not be empty (None allows every token)")
    for t in value:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < 2**63:
            raise ParamError(name, f"{name} must hold token ids (non-negative integers), got "
                             f"{_short(t)}")  # fmt: skip
    return list(value)


def _bad_words(value: object) -> list[str]:
    """bad_words as a new list; ParamError unless a list of at most `MAX_BAD_WORDS` strings
    with something besides spaces in each."""
    if not isinstance(value, (list, tuple)):
        raise ParamError("bad_words", f"bad_words must be a list of strings, got {_short(value)}")
    if len(value) > MAX_BAD_WORDS:
        raise ParamError("bad_words", f"bad_words accepts at most {MAX_BAD_WORDS} words, got "
                         f"{len(value)}")  # fmt: skip
    for w in value:
        if not isinstance(w, str) or not w.strip():
            raise ParamError("bad_words", f"bad_words must hold non-empty strings, got "
                             f"{_short(w)}")  # fmt: skip
    return list(value)


def _short(value: object) -> str:
    """repr(value), cut to a length fit for an error message."""
    text = repr(value)
    return text if len(text) <= 100 else text[:100] + "..."


def _check_num(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ParamError(name, f"{name} must be a number, got {_short(value)}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int too large for a float
        finite = False
    if not finite:
        raise ParamError(name, f"{name} must be a finite number, got {_short(value)}")


def _check_int(name: str, value: object, lo: int, hi: int | None, prefix: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ParamError(name, f"{name} must be {prefix}an integer, got {_short(value)}")
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        raise ParamError(name, f"{name} must be {prefix}{bound}, got {_short(value)}")
