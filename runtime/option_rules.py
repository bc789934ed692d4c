"""What values the `pagoda serve` options accept: each size's range and the type checks the
configs run once (`check_int`, `check_integers`, `check_booleans`, `check_seconds`), and the rules
between engine flags, each stated once (`ENGINE_RULES`): the runtime's `SchedulerConfig` raises
their error, the operator checks an InferenceService's `spec.engine` with them and the CRD carries
them as CEL (`cel`).

Like `options` (whose defaults and limits it reads), it imports nothing but the standard library
(and `spec/config.py`, standard library only too): the operator image has no torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from pagoda.runtime.options import (
    DEFAULT_ENABLE_CHUNKED_PREFILL,
    DEFAULT_MAX_NUM_SEQS,
    MAX_MODEL_LEN_LIMIT,
    MAX_NUM_BATCHED_TOKENS_LIMIT,
    MAX_NUM_SEQS_LIMIT,
    MAX_TIMEOUT_S,
)
from pagoda.runtime.spec import config as spec_config

# --- the range of each size (stated once; the runtime's configs and the profile loader use it) -

SIZE_LIMITS: Mapping[str, int] = MappingProxyType(
    {
        "max_num_seqs": MAX_NUM_SEQS_LIMIT,
        "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS_LIMIT,
        "max_model_len": MAX_MODEL_LEN_LIMIT,
        "long_prefill_token_threshold": MAX_NUM_BATCHED_TOKENS_LIMIT,
    }
)


# The least of each size where it is more than 1: a context must hold a prompt token and the
# token generated after it.
SIZE_MINIMUMS: Mapping[str, int] = MappingProxyType({"max_model_len": 2})


def check_int(name: str, value: Any, low: int | None = None, high: int | None = None) -> int:
    """`value` when it is an integer in [low, high]; ValueError naming `name` otherwise.
    `low` defaults to `SIZE_MINIMUMS[name]` (else 1), `high` to `SIZE_LIMITS[name]` (else none).

    Strict: a bool is not an integer (JSON's `true`), nor is a float such as `1e9`.
    """
    low = SIZE_MINIMUMS.get(name, 1) if low is None else low
    high = SIZE_LIMITS.get(name) if high is None else high
    ok = isinstance(value, int) and not isinstance(value, bool)
    if not ok or value < low or (high is not None and value > high):
        bound = f"in {low}..{high}" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an integer {bound}, got {short_repr(value)}")
    return value


def check_integers(obj: Any, names: tuple[str, ...]) -> None:
    """ValueError naming the first of the fields `names` of `obj` that is not an integer (a bool,
    a float such as ``2.0`` or a string such as ``"2"`` is not one): the Python API's keyword
    arguments reach the configs unparsed; the CLI's are ints already."""
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{name} must be an integer, got {short_repr(value)}")


def check_booleans(obj: Any, names: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    """ValueError naming the first of the fields `names` of `obj` that is not a bool (`"no"`,
    ``0`` and ``1`` are not: a truthy string would silently turn a feature on); those in
    `optional` may also be None (the default's choice)."""
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, bool) and not (value is None and name in optional):
            what = "True, False or None" if name in optional else "True or False"
            raise ValueError(f"{name} must be {what}, got {short_repr(value)}")


def check_seconds(name: str, value: Any, low: float = 0.0, high: float = MAX_TIMEOUT_S) -> float:
    """A finite number of seconds in [low, high] (not a bool, not NaN); ValueError otherwise."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not low <= value <= high:  # NaN fails both comparisons
        raise ValueError(f"{name} must be a number of seconds in {low:g}..{high:g}, got "
                         f"{short_repr(value)}")  # fmt: skip
    return float(value)


def json_object(name: str, value: Any, example: str) -> Mapping[str, Any]:
    """A JSON-object flag's value (`--pooler-config`, `--hf-overrides`): its JSON text parsed,
    or the mapping itself (`LLM(name={...})`); ValueError, one line naming `name` and showing
    `example`, for text that is not JSON or a value that is not an object."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{name}: not JSON ({e})") from None
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must be a JSON object, e.g. {example}")
    return value


MEDIA_IO_KWARGS_EXAMPLE = '{"video": {"num_frames": 16}}'


def parse_media_io_kwargs(value: Any) -> dict[str, Any] | None:
    """`--media-io-kwargs`' JSON text (`json_object`) or a mapping → its keys and values
    (None: none given); read into a `multimodal.chat_videos.VideoIO` by the engine's config."""
    if value is None:
        return None
    return {k: dict(v) if isinstance(v, Mapping) else v
            for k, v in json_object("media_io_kwargs", value, MEDIA_IO_KWARGS_EXAMPLE).items()}  # fmt: skip


MM_PROCESSOR_KWARGS_EXAMPLE = '{"min_pixels": 200704, "max_pixels": 1003520}'


def parse_processor_kwargs(value: Any) -> dict[str, Any] | None:
    """`--mm-processor-kwargs`' JSON text (`json_object`) or a mapping → its keys and values
    (None: none given, or an empty object); checked against the model's image processor where
    the model is read (`multimodal.processor_kwargs.apply`)."""
    if value is None:
        return None
    return dict(json_object("mm_processor_kwargs", value, MM_PROCESSOR_KWARGS_EXAMPLE)) or None


def parse_speculative(value: Any) -> spec_config.SpeculativeConfig | None:
    """`--speculative-config`'s JSON text (`json_object`), a mapping or a config → a checked
    `SpeculativeConfig`; None stays None."""
    if isinstance(value, str):
        value = json_object("speculative_config", value, spec_config.EXAMPLE)
    return spec_config.SpeculativeConfig.parse(value)


def short_repr(value: Any) -> str:
    """repr(value) cut to fit an error message (a huge int is not spelled out)."""
    text = repr(value) if not isinstance(value, int) or value.bit_length() < 200 else "a huge int"
    return text if len(text) <= 60 else text[:57] + "..."


# --- rules between engine flags (each stated once) --------------------------------------------


def camel(dest: str) -> str:
    """`max_num_seqs` → `maxNumSeqs` (the InferenceService's `spec.engine` field name)."""
    head, *rest = dest.split("_")
    return head + "".join(w.capitalize() for w in rest)


@dataclass(frozen=True)
class AtLeast:
    """`larger >= smaller` whenever both are set (None: unset), unless the bool flag `unless` is
    on. The runtime's `SchedulerConfig` checks it; the CRD's CEL rule (`cel`) and the operator's
    spec check are tested against it (tests/operator/test_engine_rules.py)."""

    larger: str
    smaller: str
    unless: str | None = None
    why: str = ""  # appended to the error message
    # The runtime's value of `smaller` when the flag is unset (None: not known up front, e.g. the
    # model's context length). The CRD's CEL and the operator check with it filled in.
    smaller_default: Any = None

    def filled(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """`values` with `smaller` set to `smaller_default` where unset."""
        out = dict(values)
        if out.get(self.smaller) is None:
            out[self.smaller] = self.smaller_default
        return out

    def holds(self, values: Mapping[str, Any]) -> bool:
        if self.unless is not None and values.get(self.unless):
            return True
        big, small = values.get(self.larger), values.get(self.smaller)
        return big is None or small is None or big >= small

    def error(self, values: Mapping[str, Any]) -> str:
        """The message when `holds(values)` is False."""
        when = (
            f"without {self.unless.removeprefix('enable_').replace('_', ' ')}, "
            if self.unless
            else ""
        )
        return (
            f"{when}{self.larger} ({values.get(self.larger)}) must be >= {self.smaller} "
            f"({values.get(self.smaller)}){self.why}"
        )

    def lift(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """`values` with `larger` raised to `smaller` where the rule would fail (to fill a
        default that must fit, e.g. the token budget of a batch given explicitly)."""
        out = dict(values)
        if not self.holds(out):
            out[self.larger] = out[self.smaller]
        return out

    def cel(self) -> str:
        """The rule as the CRD's CEL on `spec.engine` (`self` is the engine object)."""
        big, small = camel(self.larger), camel(self.smaller)
        skip = [f"!has(self.{big})"]
        if self.smaller_default is None:
            skip.append(f"!has(self.{small})")
            bound = f"self.{small}"
        else:
            bound = f"(has(self.{small}) ? self.{small} : {self.smaller_default})"
        if self.unless is not None:
            skip.append(f"(!has(self.{camel(self.unless)}) || self.{camel(self.unless)})")
        return " || ".join([*skip, f"self.{big} >= {bound}"])

    def cel_message(self) -> str:
        unset = "" if self.smaller_default is None else f" ({self.smaller_default} when unset)"
        return f"{camel(self.larger)} must be >= {camel(self.smaller)}{unset}"


BATCH_COVERS_SEQS = AtLeast(
    "max_num_batched_tokens", "max_num_seqs", smaller_default=DEFAULT_MAX_NUM_SEQS
)
BATCH_COVERS_CONTEXT = AtLeast(
    "max_num_batched_tokens",
    "max_model_len",
    unless="enable_chunked_prefill",
    why=" so that any prompt fits in one step",
)
ENGINE_RULES = (BATCH_COVERS_SEQS, BATCH_COVERS_CONTEXT)
CRD_ENGINE_RULES = (BATCH_COVERS_SEQS,)  # max_model_len defaults to the model's: no CEL for it


@dataclass(frozen=True)
class NeedsOn:
    """`flag`, set above 0, needs the bool flag `on` (unset: `on_default`). The runtime's
    `SchedulerConfig` checks it; the CRD's CEL rule (`cel`) and the operator's spec check are
    tested against it (tests/operator/test_engine_rules.py)."""

    flag: str
    on: str
    on_default: bool
    why: str = ""  # appended to the runtime's error message

    def holds(self, values: Mapping[str, Any]) -> bool:
        on = values.get(self.on)
        return not values.get(self.flag) or (self.on_default if on is None else bool(on))

    def error(self, values: Mapping[str, Any]) -> str:
        """The runtime's message when `holds(values)` is False."""
        needs = self.on.removeprefix("enable_").replace("_", " ")
        return f"{self.flag} ({values.get(self.flag)}) needs {needs}{self.why}"

    def spec_error(self, values: Mapping[str, Any]) -> str:
        """The operator's message (spec.engine field names)."""
        flag, on = camel(self.flag), camel(self.on)
        return f"spec.engine.{flag} ({values.get(self.flag)}) needs {on} (or set {flag} to 0)"

    def cel(self) -> str:
        """The rule as the CRD's CEL on `spec.engine` (`self` is the engine object)."""
        flag, on = camel(self.flag), camel(self.on)
        enabled = f"self.{on}" if self.on_default else f"(has(self.{on}) && self.{on})"
        skip = [f"!has(self.{flag})", f"self.{flag} == 0"]
        if self.on_default:
            skip.append(f"!has(self.{on})")
        return " || ".join([*skip, enabled])

    def cel_message(self) -> str:
        flag, on = camel(self.flag), camel(self.on)
        return f"{flag} needs {on} (or set {flag} to 0)"


CHUNK_CAP_NEEDS_CHUNKED_PREFILL = NeedsOn(
    "long_prefill_token_threshold",
    "enable_chunked_prefill",
    DEFAULT_ENABLE_CHUNKED_PREFILL,
    why=": without it a prompt runs whole (set 0, or enable chunked prefill)",
)
CRD_FLAG_RULES = (CHUNK_CAP_NEEDS_CHUNKED_PREFILL,)
